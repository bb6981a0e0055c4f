"""`edgemem export` (engine bundles) and `edgemem bench runtimes`; registered in `edgemem.cli`.

Nothing heavy is imported at module level: `edgemem --help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from edgemem.cli_common import AdapterOpt, AnswerWindowOpt, ModelOpt, SegmentOpt, _out, err, user_errors
from edgemem.errors import EdgememError

EngineOpt = Annotated[
    str | None,
    typer.Option(
        "--engine",
        help="An engine bundle made by `edgemem export` (ONNX Runtime; TensorRT when it holds plans, "
        "on a GPU), or `torch`. Default: the model's exported engine when there is one (`edgemem "
        "export` without --out), else torch.",
    ),
]
OptionalModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="Registry name, or a path to a .gguf file or model folder (default smollm2-135m-instruct; "
        "with --engine: the bundle's model, checked).",
    ),
]
TARGETS = ("onnx", "tensorrt")


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


@user_errors
def export_cmd(
    out: Annotated[
        Path | None,
        typer.Option("--out", help="The bundle folder (default: the one ask and ingest use by default)."),
    ] = None,
    model: ModelOpt = "smollm2-135m-instruct",
    adapter: AdapterOpt = None,
    segment_len: SegmentOpt = None,
    answer_window: AnswerWindowOpt = None,
    to: Annotated[
        str, typer.Option("--to", help="onnx (portable bundle) or tensorrt (needs TensorRT).")
    ] = "onnx",
    quantize: Annotated[
        str | None, typer.Option("--quantize", help="int8: dynamic int8 weights (ONNX Runtime, CPU).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing bundle.")] = False,
    source: Annotated[
        Path | None,
        typer.Option("--from", help="With --quantize: quantize this float32 bundle (no re-export)."),
    ] = None,
) -> None:
    """Export the model with its memory into an engine bundle (ONNX graphs, manifest, tokenizer)."""
    if to not in TARGETS:
        raise EdgememError(f"unknown target {to!r}: use one of {', '.join(TARGETS)}")
    if quantize is not None and quantize != "int8":
        raise EdgememError(f"unknown quantization {quantize!r}: use int8")
    if to == "tensorrt" and quantize is not None:
        raise EdgememError("--quantize applies to ONNX Runtime bundles; TensorRT picks fp16/bf16 itself")
    if out is None:
        from edgemem.models import REGISTRY
        from edgemem.runtime import default_engine_dir

        if model not in REGISTRY or source is not None or to != "onnx":
            raise EdgememError("give --out: only a registry model's ONNX bundle has a default place")
        out = default_engine_dir(model, quantize)
    out = out.expanduser()
    if out.exists() and not force:
        raise EdgememError(f"{out} exists; choose another --out or pass --force to replace it")
    from edgemem.cli_swax import export_swax, is_swax_checkpoint

    if is_swax_checkpoint(model):  # a SWAX checkpoint: graphs of its own (edgemem/export/swax_onnx.py)
        if to != "onnx" or quantize is not None or source is not None or adapter is not None:
            raise EdgememError(
                "a SWAX checkpoint exports to an ONNX bundle only: drop --to, --quantize, --from, --adapter"
            )
        if answer_window is not None:
            raise EdgememError("--answer-window is for ARMT memories, not SWAX models")
        with err.status("exporting...") as status:
            manifest = export_swax(model, out, segment_len, force, log=lambda message: status.update(message))
        _report(out, manifest)
        return
    if source is not None:
        if quantize is None or to != "onnx":
            raise EdgememError("--from BUNDLE makes a quantized copy: give --quantize int8 (and no --to)")
        if answer_window is not None:
            raise EdgememError("--from BUNDLE keeps that bundle's answer window: drop --answer-window")
        from edgemem.export.quantize import quantize_bundle

        with err.status(f"quantizing {source} to {quantize}..."):
            manifest = quantize_bundle(source, out, force=force)
        _report(out, manifest)
        return
    if to == "tensorrt":
        from edgemem.export.tensorrt import require_tensorrt

        require_tensorrt()  # fail before the slow load and export
    import torch

    from edgemem.assistant import Assistant
    from edgemem.export.onnx import export_bundle
    from edgemem.files import sha256_file

    with err.status(f"loading {model}..."):
        assistant = Assistant.open(
            model, adapter, segment_len, dtype=torch.float32, answer_window=answer_window
        )
    assert assistant.loaded is not None and assistant.armt is not None
    adapter_sha = sha256_file(assistant.adapter_path) if assistant.adapter_path else None
    with err.status("exporting...") as status:
        manifest = export_bundle(
            assistant.armt,
            assistant.loaded.tokenizer,
            out,
            model_name=assistant.loaded.name,
            model_id=assistant.loaded.model_id,
            adapter_file_sha256=adapter_sha,
            quantize=quantize,
            force=force,
            log=lambda message: status.update(message),
        )
        if to == "tensorrt":
            from edgemem.export.tensorrt import build_engines

            status.update("building TensorRT engines...")
            build_engines(out, log=lambda message: status.update(message))
    _report(out, manifest)


def _report(out: Path, manifest) -> None:
    for name, spec in manifest.graphs.items():
        err.print(f"  {name}: {spec.file} ({_mb(spec.size)})", markup=False)
    config = manifest.armt_config  # None in a SWAX bundle
    window = json.loads(config).get("answer_window", 0) if config else 0
    quant = f", {manifest.quantization}" if manifest.quantization else ""
    shown = f", answer window {window} tokens" if window else ""
    err.print(
        f"wrote {out}: {manifest.model_name}{quant}, segment {manifest.segment_len} tokens{shown}, "
        f"opset {manifest.opset}; use it with `edgemem ask --engine {out} FILE QUESTION`",
        markup=False,
    )


@user_errors
def bench_runtimes(
    engines: Annotated[
        list[str] | None,
        typer.Option("--engine", help="An engine bundle to measure (repeat for fp32 and int8)."),
    ] = None,
    model: ModelOpt = "smollm2-135m-instruct",
    tokens: Annotated[int, typer.Option(min=1024, help="Tokens ingested per backend.")] = 4096,
    answer_tokens: Annotated[int, typer.Option(min=1, help="Tokens generated per answer.")] = 32,
    backends: Annotated[
        str,
        typer.Option(help="Comma-separated: torch-fp32, torch-bf16, ort (one per --engine), llama.cpp."),
    ] = "torch-fp32,torch-bf16,ort,llama.cpp",
    corpus: Annotated[
        str | None, typer.Option(help="Text file or folder (default: the Python standard library source).")
    ] = None,
    output: Annotated[
        str, typer.Option("--out", help="Where to write the JSON results.")
    ] = "bench-runtimes.json",
    rounds: Annotated[
        int, typer.Option(min=1, help="Runs per backend, in alternating order; the table shows medians.")
    ] = 1,
) -> None:
    """Ingest tokens/s and answer latency of every backend on the same model and text."""
    from edgemem.export.bench import run_runtime_bench

    names = [b.strip() for b in backends.split(",") if b.strip()]
    run_runtime_bench(names, engines or [], model, tokens, answer_tokens, corpus, output, _out(), rounds)
