#!/usr/bin/env bash
# The GPU paths of issues 4 and 8 that the CPU development machine could not run, checked and timed
# in one short run on a machine with an NVIDIA GPU. Run from the repository root:
#
#     scripts/gpu_check.sh [OUT]            # OUT: where the logs go (default gpu-check/)
#     GPU_CHECK_REAL=1 scripts/gpu_check.sh # also SmolLM2: export with TensorRT plans, bench runtimes
#
# Needs (nothing is installed here): a CUDA build of torch (`pip install torch==2.13.0` from the
# CUDA index), triton, onnxruntime-gpu in place of onnxruntime (`pip install 'edgemem[gpu]'`), and
# tensorrt or tensorrt-rtx-cu13. A missing one turns its step into a skip with the reason, never a
# failure of the others. About 4 minutes without GPU_CHECK_REAL (most of it the tiny bundle's
# export inside the tests); SmolLM2 adds its export (~5 CPU-minutes) and the benchmark (~3 min).
#
# Steps, each with its own log in OUT and one line in OUT/summary.txt:
#   env       the GPU, torch/CUDA, ONNX Runtime providers, TensorRT module, triton versions
#   kernels   the Triton kernels compiled on the device against the PyTorch reference
#             (tests/test_kernels.py with TRITON_INTERPRET=0), then timed at SmolLM2's shapes
#   engines   tests/test_export.py -k "tensorrt or cuda": TensorRT plans built for this GPU and run
#             against ONNX Runtime (state, logits, greedy ids, `ask --engine`); the CUDA execution
#             provider against the CPU provider
#   plugin    scripts/trt_plugin_probe.py: whether this TensorRT can register and build a plugin
#   train-bN  the training step on the GPU: 3 steps of the recall-longer stage (64 written segments
#             of 128, bf16 autocast, recomputation; a fresh memory, as its `init` is not in git) at
#             batch 4 and 16; OUT/train-bN/log.jsonl has each step's seconds, tokens/s, peak_cuda_mb
#   train-window  3 steps of smollm2-135m-long.toml's first task stage (0-8 segments, unwritten tails
#             of up to 1024 tokens, batch 16; a fresh memory), its log as train-bN's
#   real      (GPU_CHECK_REAL=1) SmolLM2 exported with --to tensorrt, `edgemem bench runtimes` on
#             torch fp32 (the PyTorch backend runs on the CPU) and the TensorRT plans
# Run it here with no GPU and every step reports its skip: that is the dry run of this script.
set -u
OUT=${1:-gpu-check}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
export OMP_WAIT_POLICY=PASSIVE

step() { # step NAME COMMAND...: run, log, one summary line
    local name=$1
    shift
    local start=$SECONDS
    "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    local tail_line
    tail_line=$(grep -E "passed|failed|skipped|error" "$OUT/$name.log" | tail -1)
    echo "$name: exit $rc, $((SECONDS - start)) s${tail_line:+; $tail_line}" | tee -a "$SUMMARY"
}

step env python - <<'EOF'
import importlib, shutil, subprocess
smi = shutil.which("nvidia-smi")
print(subprocess.run([smi, "-L"], capture_output=True, text=True).stdout.strip() if smi else "no nvidia-smi")
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0))
import onnxruntime as ort
print("onnxruntime", ort.__version__, ort.get_available_providers())
for name in ("tensorrt", "tensorrt_rtx", "triton"):
    try:
        print(name, importlib.import_module(name).__version__)
    except ImportError as exc:
        print(name, "not installed:", exc)
EOF

GPU=$(python -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
if [ "$GPU" = 1 ]; then
    step kernels env TRITON_INTERPRET=0 python -m pytest -q -rs tests/test_kernels.py
else # compiled Triton kernels cannot launch without a GPU; the interpreted run is the CPU test-suite's
    echo "kernels: skipped: torch sees no CUDA GPU" | tee -a "$SUMMARY"
fi

step kernels-time env TRITON_INTERPRET=0 python - <<'EOF'
# Fused Triton kernels vs the PyTorch reference at SmolLM2's shapes: DPFP-3 of d_mem 64 (K = 384),
# D = 576, a 512-token read, a 16-token write; median of 50 CUDA-event timings after 10 warm-ups.
import json, statistics, torch
if not torch.cuda.is_available():  # before importing triton, which a CPU machine may not have
    print("skipped: no GPU")
    raise SystemExit(0)
from edgemem.kernels import reference, triton_ops as fused
dev = "cuda"
B, T, M, d, D = 1, 512, 16, 64, 576
x = torch.randn(B, T, d, device=dev)
k = reference.dpfp(torch.randn(B, M, d, device=dev) * 0.3)
v, beta = torch.randn(B, M, D, device=dev), torch.rand(B, M, device=dev)
A, z = reference.memory_write(k, v, beta, torch.zeros(B, 384, D, device=dev), torch.zeros(B, 384, device=dev), True)
phi = reference.dpfp(x)
cases = {
    "dpfp [1,512,64]": (lambda m: m.dpfp(x)),
    "memory_read T=512": (lambda m: m.memory_read(phi, A, z)),
    "memory_write M=16": (lambda m: m.memory_write(k, v, beta, A, z, False)),
}
def ms(fn):
    for _ in range(10):
        fn()
    times = []
    for _ in range(50):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)
out = {name: {"reference_ms": round(ms(lambda: f(reference)), 4), "triton_ms": round(ms(lambda: f(fused)), 4)}
       for name, f in cases.items()}
print(json.dumps({"device": torch.cuda.get_device_name(0), "results": out}, indent=1))
EOF

step engines python -m pytest -q -rs tests/test_export.py -k "tensorrt or cuda"

if python -c "import tensorrt" 2>/dev/null || python -c "import tensorrt_rtx" 2>/dev/null; then
    step plugin python scripts/trt_plugin_probe.py
else # the probe itself exits 1 without TensorRT; here that is a missing package: a skip
    echo "plugin: skipped: no TensorRT module imports" | tee -a "$SUMMARY"
fi

for B in 4 16; do
    if [ "$GPU" != 1 ]; then
        echo "train-b$B: skipped: torch sees no CUDA GPU" | tee -a "$SUMMARY"
        continue
    fi
    mkdir -p "$OUT/train-b$B"
    rm -f "$OUT/train-b$B"/{log.jsonl,checkpoint.safetensors,adapter.safetensors}
    sed -e '/^init = /d' -e 's/^segments = .*/segments = [64]/' -e "s/^batch_size = .*/batch_size = $B/" \
        -e 's/^eval_every = .*/eval_every = 0/' configs/train/smollm2-135m-recall-longer.toml \
        >"$OUT/train-b$B/config.toml"
    step "train-b$B" edgemem train "$OUT/train-b$B/config.toml" --out "$OUT/train-b$B" --max-steps 3
    python -c "import json,sys; [print({k: r[k] for k in ('step', 'seconds', 'tokens_per_s', 'peak_cuda_mb') if k in r}) for r in map(json.loads, open(sys.argv[1]))]" \
        "$OUT/train-b$B/log.jsonl" 2>/dev/null | tee -a "$OUT/train-b$B.log"
done

# the GPU recipe's first stage in the answer window's shape (tails of up to 1024 tokens, items in
# view), batch 16 as configured, a fresh memory: what a step of smollm2-135m-long.toml costs
if [ "$GPU" = 1 ]; then
    mkdir -p "$OUT/train-window"
    rm -f "$OUT/train-window"/{log.jsonl,checkpoint.safetensors,adapter.safetensors}
    # its "view" stage (nothing written) left out: the steps timed are the first task stage's
    sed -e '/^init = /d' -e 's/^eval_every = .*/eval_every = 0/' configs/train/smollm2-135m-long.toml |
        awk '/^\[\[stage\]\]/ { skip = ($0 ~ /# view:/) } !skip' >"$OUT/train-window/config.toml"
    step train-window edgemem train "$OUT/train-window/config.toml" --out "$OUT/train-window" --max-steps 3
    python -c "import json,sys; [print({k: r[k] for k in ('step', 'segments', 'seconds', 'tokens_per_s', 'peak_cuda_mb') if k in r}) for r in map(json.loads, open(sys.argv[1]))]" \
        "$OUT/train-window/log.jsonl" 2>/dev/null | tee -a "$OUT/train-window.log"
else
    echo "train-window: skipped: torch sees no CUDA GPU" | tee -a "$SUMMARY"
fi

if [ "${GPU_CHECK_REAL:-0}" = 1 ]; then
    BUNDLE="$OUT/smol-trt"
    rm -rf "$BUNDLE"
    step real-export edgemem export --model smollm2-135m-instruct --to tensorrt --out "$BUNDLE"
    step real-bench edgemem bench runtimes --engine "$BUNDLE" --backends torch-fp32,ort \
        --tokens 4096 --answer-tokens 32 --out "$OUT/bench-runtimes-gpu.json"
fi
echo "logs in $OUT/; summary:"
cat "$SUMMARY"
