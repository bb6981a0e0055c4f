"""`edgemem bench runtimes`: every backend on the same model and the same text, one run.

Each backend runs in its own child process (its own peak RSS, nothing shared between them):

- `torch-fp32`, `torch-bf16`: PyTorch eager (`TorchRuntime`) with the weights in that dtype;
- `ort` (one per `--engine`): an engine bundle on ONNX Runtime, CPU provider (fp32 or int8), or
  on TensorRT when the bundle holds plans (`--to tensorrt`; a GPU);
- `llama.cpp`: llama-cpp-python on the model's GGUF file (its own Q4_1 weights). It has no memory:
  its "ingest" is the prompt processing of the same segments, each from an empty KV cache, i.e.
  the plain base model over the same text, the work ARMT adds its memory to.

Measured per backend, after one warm-up segment and one warm-up answer (sessions created, caches
warm): ingest tokens/s over `tokens` tokens of real text in S-token segments; the answer on the
document's last 256 tokens and a question: time to first token (for armt the write of that
256-token tail into memory, then the prefill of the answer segment, ~290 tokens; before the tail
was written, results measured the prefill alone) and decode tokens/s over `answer_tokens`
greedy tokens (stop tokens ignored, so every backend generates the same count); peak RSS; the
threads used.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from edgemem.errors import EdgememError
from edgemem.files import atomic_write_text

QUESTION = "What does this code do?"
TAIL = 256  # tokens of the document left for the answer segment
BACKENDS = ("torch-fp32", "torch-bf16", "ort", "llama.cpp")


def _text_ids(tokenizer: Any, corpus: str | None, count: int) -> list[int]:
    from edgemem.armt import tokenize_stream
    from edgemem.bench import _limited, corpus_pieces

    return [i for chunk in _limited(tokenize_stream(corpus_pieces(corpus), tokenizer), count) for i in chunk]


def _runtime(spec: dict[str, Any]) -> Any:
    backend = spec["backend"]
    if backend == "ort":
        from edgemem.runtime import open_engine

        runtime = open_engine(spec["engine"])
        runtime.engine.session("segment_step")  # open both sessions outside the measurement
        runtime.engine.session("answer")
        return runtime
    import torch

    from edgemem.assistant import Assistant

    dtype = {"torch-fp32": torch.float32, "torch-bf16": torch.bfloat16}[backend]
    return Assistant.open(spec["model"], dtype=dtype).runtime


def _measure_armt(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from edgemem.armt import answer_state, ingest, prompt_ids

    runtime = _runtime(spec)
    S = runtime.config.segment_len
    ids = _text_ids(runtime.tokenizer, spec["corpus"], S + spec["tokens"] + TAIL)
    warm, text = ids[:S], ids[S:]
    process = psutil.Process()
    with torch.inference_mode():
        runtime.step(torch.tensor([warm]), runtime.empty_state())
        start = time.perf_counter()
        doc = ingest(runtime, [text])
        ingest_s = time.perf_counter() - start
        peak = process.memory_info().rss
        prompt = prompt_ids(runtime.tokenizer, doc.tail_ids, QUESTION)
        list(runtime.generate_ids(doc.state, prompt, set(), max_new_tokens=2))  # warm-up
        start = time.perf_counter()  # the first token waits for the tail's write, as in `answer`
        state = answer_state(runtime, doc.state, doc.tail_ids)
        tokens = runtime.generate_ids(state, prompt, set(), max_new_tokens=spec["answer_tokens"])
        next(tokens)
        first = time.perf_counter()
        rest = len(list(tokens))
        end = time.perf_counter()
    return {
        "ingest_tokens": doc.state.writes * S,
        "ingest_tokens_per_s": round(doc.state.writes * S / ingest_s, 1),
        "prompt_tokens": len(prompt),
        "tail_tokens": len(doc.tail_ids),
        "first_token_s": round(first - start, 3),
        "decode_tokens_per_s": round(rest / (end - first), 1) if rest else None,
        "peak_rss_mb": round(max(peak, process.memory_info().rss) / 1e6, 1),
        "threads": torch.get_num_threads()
        if runtime.backend == "torch"
        else runtime.engine.options.session_options().intra_op_num_threads
        if runtime.engine.backend == "onnxruntime"
        else None,
        "segment_len": S,
        "model_id": runtime.model_id,
    }


def _measure_llama(spec: dict[str, Any]) -> dict[str, Any]:
    from edgemem.armt import iter_segments, prompt_ids
    from edgemem.methods import LlamaGenerator
    from edgemem.models import load_tokenizer, resolve_source
    from edgemem.runtime import physical_cores

    S = spec["segment_len"]
    tokenizer = load_tokenizer(spec["model"])
    _name, gguf = resolve_source(spec["model"])
    threads = physical_cores()
    generator = LlamaGenerator(gguf, n_ctx=2 * S, threads=threads)
    llm = generator.llm
    ids = _text_ids(tokenizer, spec["corpus"], S + spec["tokens"] + TAIL)
    llm.reset()
    llm.eval(ids[:S])  # warm-up
    tail: list[int] = []
    segments = list(iter_segments([ids[S:]], S, tail))
    process = psutil.Process()
    start = time.perf_counter()
    for segment in segments:
        llm.reset()
        llm.eval(segment)
    ingest_s = time.perf_counter() - start
    peak = process.memory_info().rss
    prompt = prompt_ids(tokenizer, tail, QUESTION)

    def answer() -> tuple[float, float, int]:
        llm.reset()
        start = time.perf_counter()
        tokens = llm.generate(prompt, top_k=1, temp=0.0, repeat_penalty=1.0)
        next(tokens)
        first = time.perf_counter()
        count = 0
        for _ in tokens:
            count += 1
            if count >= spec["answer_tokens"] - 1:
                break
        return start, first, count

    answer()  # warm-up
    start, first, rest = answer()
    end = time.perf_counter()
    return {
        "ingest_tokens": len(segments) * S,
        "ingest_tokens_per_s": round(len(segments) * S / ingest_s, 1),
        "prompt_tokens": len(prompt),
        "first_token_s": round(first - start, 3),
        "decode_tokens_per_s": round(rest / (end - first), 1) if rest else None,
        "peak_rss_mb": round(max(peak, process.memory_info().rss) / 1e6, 1),
        "threads": threads,
        "segment_len": S,
        "model_id": f"{gguf.name} (llama.cpp, no memory)",
    }


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    return _measure_llama(spec) if spec["backend"] == "llama.cpp" else _measure_armt(spec)


def _label(spec: dict[str, Any]) -> str:
    if spec["backend"] != "ort":
        return spec["backend"]
    from edgemem.export.bundle import read_manifest

    manifest = read_manifest(spec["engine"])
    return "tensorrt" if manifest.tensorrt else f"ort-{manifest.quantization or 'fp32'}"


def _labels(runs: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["backend"] for r in runs))


def _median(label: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One backend's runs -> the median of each rate and latency, the highest peak RSS."""
    out = dict(runs[0])
    for key in ("ingest_tokens_per_s", "first_token_s", "decode_tokens_per_s"):
        values = [r[key] for r in runs if r[key] is not None]
        out[key] = statistics.median(values) if values else None
        out[f"{key}_all"] = values
    out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    out["rounds"] = len(runs)
    out.pop("round", None)
    return out


def run_runtime_bench(
    backends: list[str],
    engines: list[str],
    model: str,
    tokens: int,
    answer_tokens: int,
    corpus: str | None,
    output: str,
    console: Any,
    rounds: int = 1,
) -> list[dict[str, Any]]:
    """Run each backend in a child process (`rounds` times, in alternating order), print the
    medians, write the JSON report (every run included) atomically."""
    from rich.table import Table

    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        raise EdgememError(f"unknown backend {unknown[0]!r}: use {', '.join(BACKENDS)}")
    if "ort" in backends and not engines:
        raise EdgememError("backend ort needs --engine BUNDLE (make one with `edgemem export`)")
    specs: list[dict[str, Any]] = []
    base = {"model": model, "tokens": tokens, "answer_tokens": answer_tokens, "corpus": corpus}
    for backend in backends:
        if backend == "ort":
            specs.extend({**base, "backend": "ort", "engine": str(Path(e).resolve())} for e in engines)
        else:
            specs.append({**base, "backend": backend})
    runs: list[dict[str, Any]] = []
    segment_len = 512  # the llama.cpp child takes the ARMT runtimes' segment length
    llama_last = sorted(specs, key=lambda spec: spec["backend"] == "llama.cpp")
    for round_index in range(rounds):
        # alternate the order so that a load change on the shared machine hits every backend alike
        for spec in llama_last if round_index % 2 == 0 else llama_last[::-1]:
            spec["segment_len"] = segment_len
            label = _label(spec)
            console.print(f"round {round_index + 1}/{rounds}: running {label}...")
            env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
            proc = subprocess.run(
                [sys.executable, "-m", "edgemem.export.bench", json.dumps(spec)],
                capture_output=True,
                text=True,
                env=env,
            )
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                raise EdgememError(f"benchmark child ({label}) failed: {last}")
            measured = json.loads(proc.stdout.strip().splitlines()[-1])
            result = {"backend": label, "round": round_index, **measured}
            if spec["backend"] != "llama.cpp":
                segment_len = result["segment_len"]
            runs.append(result)
    results = [_median(label, [r for r in runs if r["backend"] == label]) for label in _labels(runs)]
    table = Table("backend", "ingest tok/s", "first token (s)", "decode tok/s", "peak RSS (MB)", "threads")
    for r in results:
        decode = f"{r['decode_tokens_per_s']:,.1f}" if r["decode_tokens_per_s"] else "-"
        table.add_row(
            r["backend"],
            f"{r['ingest_tokens_per_s']:,.0f}",
            f"{r['first_token_s']:.2f}",
            decode,
            f"{r['peak_rss_mb']:,.0f}",
            str(r["threads"]),
        )
    console.print(table)
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    report = {
        "command": "edgemem bench runtimes " + " ".join(sys.argv[3:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{cpu}, {os.cpu_count()} cpus, {psutil.virtual_memory().total / 2**30:.0f} GiB",
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "rounds": rounds,
        "results": results,
        "runs": runs,
    }
    atomic_write_text(Path(output), json.dumps(report, indent=1))
    console.print(f"wrote {output}")
    return results


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))))
