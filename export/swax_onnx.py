"""ONNX export of a SWAX model (edgemem/swax.py) into an engine bundle.

The folder and manifest are ARMT's (`edgemem.export.bundle`), with architecture "swax" and two
graphs at opset 18 from the dynamo exporter:

- `segment_step.onnx`: input_ids [1, S] + state -> state' (ingest, S bytes a step);
- `answer.onnx`: input_ids [1, 1] + state -> logits [1, V], state' (the question and the answer,
  one byte at a time).

Both take `state_in.<name>` and return `state_out.<name>`, the names of `SwaxState.named_tensors()`:
per attention layer `k`, `v` [1, H, W - 1, d] (the window's keys and values), per mLSTM layer `C`
[1, H, d, d], `n` [1, H, d], `m` [1, H] (per Gated DeltaNet layer `S` [1, H, d, d]), and
`position` [1] (int64: the bytes read, which RoPE and the window's padding mask need). The state
is the whole memory: nothing about a document lives in the graphs.

mLSTM layers run in their chunkwise form. Gated DeltaNet's chunkwise form needs a triangular solve,
which has no ONNX operator, so its step graph runs the token-by-token recurrence (the same outputs,
tested; the graph grows with S). The byte vocabulary needs no tokenizer files.
"""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from edgemem.errors import EdgememError
from edgemem.export.bundle import ANSWER_GRAPH, STEP_GRAPH, GraphSpec, Manifest, write_manifest
from edgemem.export.onnx import OPSET, _export, _versions, replace_folder
from edgemem.files import sha256_file
from edgemem.swax import POSITION, SwaxModel, SwaxState
from edgemem.swax_runtime import ARCHITECTURE, segment_hash, swax_model_id


def state_names(model: SwaxModel) -> list[str]:
    """The state's tensor names in graph order (the position last)."""
    return list(model.state_shapes())


class SwaxStepGraph(nn.Module):
    """input_ids [1, T] + state tensors -> (logits [1, V] of the last byte, if asked) + state'."""

    def __init__(self, model: SwaxModel, logits: bool) -> None:
        super().__init__()
        self.model = model
        self.logits = logits
        self.names = [n for n in state_names(model) if n != POSITION]
        # the recurrence for Gated DeltaNet (no ONNX triangular solve), chunkwise for the mLSTM
        self.recurrent = model.config.recurrent == "gdn"

    def forward(self, input_ids: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        *tensors, position = state
        start = SwaxState(dict(zip(self.names, tensors, strict=True)), position[0])  # type: ignore[arg-type]
        new, logits = self.model.step(input_ids, start, return_logits=self.logits, recurrent=self.recurrent)
        out = (*new.tensors.values(), torch.as_tensor(new.tokens).reshape(1))
        return (logits[:, -1], *out) if self.logits else out


def _example_state(model: SwaxModel, generator: torch.Generator) -> tuple[Tensor, ...]:
    """Distinct random tensors (torch.export merges identical objects) and a position past the window."""
    shapes = model.state_shapes()
    tensors = tuple(torch.rand(s, generator=generator) for n, s in shapes.items() if n != POSITION)
    return (*tensors, torch.tensor([3 * model.config.window + 5]))


def export_graph(model: SwaxModel, path: Path, tokens: int, logits: bool) -> GraphSpec:
    """Write one graph reading `tokens` bytes a call; returns its spec."""
    g = torch.Generator().manual_seed(tokens)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=g)
    names = state_names(model)
    inputs = ["input_ids"] + [f"state_in.{n}" for n in names]
    outputs = (["logits"] if logits else []) + [f"state_out.{n}" for n in names]
    with torch.no_grad():
        _export(SwaxStepGraph(model, logits), (ids, _example_state(model, g)), None, (inputs, outputs), path)
    return GraphSpec(path.name, inputs, outputs)


def export_swax_bundle(
    model: SwaxModel,
    out: Path,
    *,
    model_name: str,
    segment_len: int,
    force: bool = False,
    log: Callable[[str], None] = lambda message: None,
) -> Manifest:
    """Export `model` (float32) with `segment_len` bytes a step into the bundle folder `out`.

    Built in a temporary folder beside `out` and renamed into place, like `export_bundle`."""
    out = Path(out).expanduser()
    if out.exists() and not force:
        raise EdgememError(f"{out} exists; choose another --out or pass --force to replace it")
    if next(model.parameters()).dtype != torch.float32:
        raise EdgememError("export needs the model in float32")
    model = model.eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    tmp.chmod(0o755)
    try:
        log("exporting the segment step graph...")
        step = export_graph(model, tmp / f"{STEP_GRAPH}.onnx", segment_len, logits=False)
        log("exporting the answer graph...")
        ans = export_graph(model, tmp / f"{ANSWER_GRAPH}.onnx", 1, logits=True)
        graphs = {}
        for name, spec in ((STEP_GRAPH, step), (ANSWER_GRAPH, ans)):
            file = tmp / spec.file
            graphs[name] = GraphSpec(
                spec.file, spec.inputs, spec.outputs, sha256_file(file), file.stat().st_size
            )
        cfg = model.config
        manifest = Manifest(
            model_name=model_name,
            model_id=swax_model_id(model),
            architecture=ARCHITECTURE,
            adapter_hash=segment_hash(segment_len),
            adapter_file_sha256=None,
            trained=True,
            segment_len=segment_len,
            num_write_tokens=0,
            memory_layers=[i for i, block in enumerate(model.blocks) if not block.attention],
            d_mem=cfg.d_head,
            nu=0,
            state_shapes={k: list(v) for k, v in model.state_shapes(1).items()},
            kv={"layers": cfg.n_layers, "heads": cfg.n_heads, "head_dim": cfg.d_head, "window": cfg.window},
            vocab_size=cfg.vocab_size,
            graphs=graphs,
            tokenizer_files=[],
            opset=OPSET,
            versions=_versions(),
            created=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        write_manifest(tmp, manifest)
        replace_folder(tmp, out)
        return manifest
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
