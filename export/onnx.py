"""ONNX export of an ARMT model into an engine bundle (`edgemem.export.bundle` describes the folder).

Two graphs, standard ONNX ops at opset 18, made by the dynamo exporter (`torch.onnx.export(...,
dynamo=True)`):

- `segment_step.onnx`: `ARMT.step` for one segment, input_ids [1, S] (S fixed by the bundle) and
  the state in, the state out. The graph always reads and uses the general write rule: on an empty
  state (A = 0, z = 0) that is exactly the first-write rule (the read is 0 / eps = 0 and gamma is 1),
  so one graph serves every segment.
- `answer.onnx`: `ARMT.read_only_forward` with a KV cache: input_ids [1, T], past key/values
  [1, H, P, hd] per layer and the state in; logits [1, V] of the last position and the present
  key/values [1, H, P + T, hd] out. P = 0 is the prefill of the question segment, T = 1 a decode step.

Example inputs are distinct random tensors (torch.export merges identical objects, REFERENCE.md
section 5) and a non-empty state, so that no branch of the step is specialised away.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from edgemem.armt import ARMT, MemoryState
from edgemem.errors import EdgememError
from edgemem.export.bundle import (
    ANSWER_GRAPH,
    MANIFEST,
    STEP_GRAPH,
    GraphSpec,
    Manifest,
    sha256_file,
    write_manifest,
)
from edgemem.export.quantize import quantize_graphs

OPSET = 18
QUANTIZATIONS = ("int8",)


def state_names(armt: ARMT) -> list[str]:
    """Flat state names in graph order: 'layers.<i>.A', 'layers.<i>.z' per memory layer."""
    return list(armt.empty_state().named_tensors())


def kv_names(num_layers: int, prefix: str) -> list[str]:
    """'<prefix>.<i>.key', '<prefix>.<i>.value' per decoder layer."""
    return [f"{prefix}.{i}.{kind}" for i in range(num_layers) for kind in ("key", "value")]


def _state(armt: ARMT, tensors: tuple[Tensor, ...]) -> MemoryState:
    # writes=1: the graph always reads and uses the general write rule (exact on an empty state too)
    return MemoryState.from_named_tensors(dict(zip(state_names(armt), tensors, strict=True)), writes=1)


class SegmentStepGraph(nn.Module):
    """input_ids [1, n] (n = S, or 1..S for a document's tail), state tensors -> new state tensors
    (same names and shapes)."""

    def __init__(self, armt: ARMT) -> None:
        super().__init__()
        self.armt = armt

    def forward(self, input_ids: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        new, _ = self.armt.step(input_ids, _state(self.armt, state))
        return tuple(new.named_tensors().values())


class AnswerGraph(nn.Module):
    """input_ids [1, T], past key/values [1, H, P, hd] per layer, state
    -> logits [1, V] of the last position, present key/values [1, H, P + T, hd]."""

    def __init__(self, armt: ARMT) -> None:
        super().__init__()
        self.armt = armt

    def forward(
        self, input_ids: Tensor, past: tuple[Tensor, ...], state: tuple[Tensor, ...]
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        from transformers import DynamicCache

        # Full (unwindowed) cache layers for every layer type: sliding-window layers still attend
        # through their mask, and every layer's cache has the same length P + T.
        cache = DynamicCache()
        for i in range(len(past) // 2):
            cache.update(past[2 * i], past[2 * i + 1], i)
        logits = self.armt.read_only_forward(input_ids, _state(self.armt, state), cache)
        present = tuple(t for layer in cache.layers for t in (layer.keys, layer.values))
        return logits, present


def kv_layout(armt: ARMT) -> dict[str, int]:
    cfg = armt.base.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return {"layers": cfg.num_hidden_layers, "kv_heads": cfg.num_key_value_heads, "head_dim": head_dim}


def _example_state(armt: ARMT, generator: torch.Generator) -> tuple[Tensor, ...]:
    shapes = armt.state_shapes(1).values()
    return tuple(torch.rand(shape, generator=generator) for shape in shapes)


def _export(
    module: nn.Module, args: tuple, dynamic_shapes: dict | None, names: tuple[list, list], path: Path
) -> None:
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module,
            args,
            dynamo=True,
            opset_version=OPSET,
            dynamic_shapes=dynamic_shapes,
            input_names=names[0],
            output_names=names[1],
            verbose=False,
        )
        program.save(str(path))


def export_step(armt: ARMT, path: Path) -> GraphSpec:
    """Write segment_step.onnx; returns its spec (file name relative to the bundle)."""
    from torch.export import Dim

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, armt.base.config.vocab_size, (1, armt.config.segment_len), generator=g)
    names = state_names(armt)
    inputs = ["input_ids"] + [f"state_in.{n}" for n in names]
    outputs = [f"state_out.{n}" for n in names]
    state = _example_state(armt, g)
    # 1..S tokens: whole segments at ingest, the document's tail before an answer (`answer_state`)
    tokens = Dim("tokens", min=1, max=armt.config.segment_len)
    dynamic = {"input_ids": {1: tokens}, "state": tuple({} for _ in state)}
    with torch.no_grad():
        _export(SegmentStepGraph(armt), (ids, state), dynamic, (inputs, outputs), path)
    return GraphSpec(path.name, inputs, outputs)


def export_answer(armt: ARMT, path: Path) -> GraphSpec:
    """Write answer.onnx (prefill and decode with dynamic T and P); returns its spec."""
    from torch.export import Dim

    g = torch.Generator().manual_seed(1)
    kv = kv_layout(armt)
    limit = int(getattr(armt.base.config, "max_position_embeddings", 8192))
    past = tuple(
        torch.randn(1, kv["kv_heads"], 7, kv["head_dim"], generator=g) for _ in range(2 * kv["layers"])
    )
    ids = torch.randint(0, armt.base.config.vocab_size, (1, 5), generator=g)
    state = _example_state(armt, g)
    T, P = Dim("tokens", min=1, max=limit), Dim("past", min=1, max=limit)
    dynamic = {
        "input_ids": {1: T},
        "past": tuple({2: P} for _ in past),
        # {} rather than None: an all-None tuple does not match the inputs' structure in torch.export
        "state": tuple({} for _ in state),
    }
    inputs = ["input_ids", *kv_names(kv["layers"], "past")] + [f"state.{n}" for n in state_names(armt)]
    outputs = ["logits", *kv_names(kv["layers"], "present")]
    with torch.no_grad():
        _export(AnswerGraph(armt), (ids, past, state), dynamic, (inputs, outputs), path)
    return GraphSpec(path.name, inputs, outputs)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in ("edgemem", "torch", "transformers", "onnx", "onnxscript", "onnxruntime"):
        with contextlib.suppress(PackageNotFoundError):
            out[package] = version(package)
    return out


def replace_folder(built: Path, out: Path) -> None:
    """Move the folder `built` to `out`, replacing what is there: the old one is renamed aside
    first and removed last, so `out` is the old bundle or the new one at any moment."""
    old = out.with_name(f".{out.name}.old")
    if out.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
    os.replace(built, out)
    shutil.rmtree(old, ignore_errors=True)


def export_bundle(
    armt: ARMT,
    tokenizer: object,
    out: Path,
    *,
    model_name: str,
    model_id: str,
    adapter_file_sha256: str | None = None,
    quantize: str | None = None,
    force: bool = False,
    log: Callable[[str], None] = lambda message: None,
) -> Manifest:
    """Export `armt` (float32) and its tokenizer into the bundle folder `out`.

    The bundle is built in a temporary folder beside `out` and renamed into place at the end, so
    `out` is either the old bundle, the new one, or absent. An existing `out` is replaced only
    with `force`.
    """
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise EdgememError(f"unknown quantization {quantize!r}: use one of {', '.join(QUANTIZATIONS)}")
    out = Path(out).expanduser()
    if out.exists() and not force:
        raise EdgememError(f"{out} exists; choose another --out or pass --force to replace it")
    if next(armt.parameters()).dtype != torch.float32 or next(armt.base.parameters()).dtype != torch.float32:
        raise EdgememError("export needs the model in float32")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    tmp.chmod(0o755)
    try:
        log("exporting the segment step graph...")
        step = export_step(armt, tmp / f"{STEP_GRAPH}.onnx")
        log("exporting the answer graph...")
        ans = export_answer(armt, tmp / f"{ANSWER_GRAPH}.onnx")
        tokenizer.save_pretrained(str(tmp / "tokenizer"))  # type: ignore[attr-defined]
        tok_files = sorted(str(p.relative_to(tmp)) for p in (tmp / "tokenizer").rglob("*") if p.is_file())
        graphs = {}
        for name, spec in ((STEP_GRAPH, step), (ANSWER_GRAPH, ans)):
            file = tmp / spec.file
            digest, size = sha256_file(file), file.stat().st_size
            graphs[name] = GraphSpec(spec.file, spec.inputs, spec.outputs, digest, size)
        if quantize == "int8":
            log("quantizing to int8...")
            graphs = quantize_graphs(tmp, graphs)
        cfg = armt.config
        manifest = Manifest(
            model_name=model_name,
            model_id=model_id,
            architecture=str(armt.base.config.model_type),
            adapter_hash=armt.adapter_hash(),
            adapter_file_sha256=adapter_file_sha256,
            trained=armt.is_trained(),
            segment_len=cfg.segment_len,
            num_write_tokens=cfg.num_write_tokens,
            memory_layers=list(cfg.memory_layers),
            d_mem=cfg.d_mem,
            nu=cfg.nu,
            state_shapes={k: list(v) for k, v in armt.state_shapes(1).items()},
            kv=kv_layout(armt),
            vocab_size=int(armt.base.config.vocab_size),
            graphs=graphs,
            tokenizer_files=tok_files,
            opset=OPSET,
            quantization=quantize,
            armt_config=cfg.to_json(),
            versions=_versions(),
            created=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        write_manifest(tmp, manifest)
        assert (tmp / MANIFEST).is_file()
        replace_folder(tmp, out)
        return manifest
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
