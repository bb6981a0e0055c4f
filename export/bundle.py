"""The engine bundle on disk: its manifest, and the checks that a bundle is whole and fits.

A bundle is a folder:

    manifest.json          what is inside and what built it (`Manifest`)
    segment_step.onnx      input_ids [1, S] + state -> state'          (ingest: read, run, write)
    answer.onnx            input_ids [1, T] + past key/values [1, H, P, hd] + state
                           -> logits [1, V] of the last position, present key/values [1, H, P+T, hd]
                           (read only; P = 0 is the prefill of the question segment, T = 1 a decode step)
    tokenizer/             the tokenizer files (tokenizer.json, its config, the chat template)
    tensorrt/              serialized TensorRT engines of both graphs (`--to tensorrt` only)

This module imports neither torch nor onnxruntime: a bundle can be read and checked anywhere.
Every path in a manifest is relative and must stay inside the bundle.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from edgemem.errors import EdgememError
from edgemem.files import atomic_write_text, sha256_file

FORMAT = "edgemem-bundle/1"
MANIFEST = "manifest.json"
STEP_GRAPH = "segment_step"
ANSWER_GRAPH = "answer"


@dataclass(frozen=True)
class GraphSpec:
    """One ONNX graph of the bundle: its file and its input/output names in order."""

    file: str
    inputs: list[str]
    outputs: list[str]
    sha256: str = ""
    size: int = 0


@dataclass(frozen=True)
class Manifest:
    """Everything a runtime needs to know about a bundle without opening its graphs.

    state_shapes: per state tensor ('layers.<i>.A' [1, K, D], 'layers.<i>.z' [1, K]), float32.
    kv: the answer graph's cache layout, {'layers': L, 'kv_heads': H, 'head_dim': hd}.
    """

    model_name: str
    model_id: str
    architecture: str
    adapter_hash: str
    adapter_file_sha256: str | None
    trained: bool
    segment_len: int
    num_write_tokens: int
    memory_layers: list[int]
    d_mem: int
    nu: int
    state_shapes: dict[str, list[int]]
    kv: dict[str, int]
    vocab_size: int
    graphs: dict[str, GraphSpec]
    tokenizer_files: list[str]
    opset: int
    quantization: str | None = None
    tensorrt: dict[str, str] = field(default_factory=dict)  # graph -> serialized engine (plan) path
    tensorrt_target: str | None = None  # the compute capability the plans were built for (None: this GPU)
    # the adapter's ARMTConfig JSON (None: a SWAX bundle, or one exported before it was recorded)
    armt_config: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    created: str = ""
    format: str = FORMAT

    @property
    def engine_id(self) -> str:
        """The model id under which this bundle's states are stored: fp32 engines share the torch
        model's states (same id); a quantized engine's states are its own."""
        return self.model_id if self.quantization is None else f"{self.model_id}+{self.quantization}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> Manifest:
        data = dict(data)
        data["graphs"] = {name: GraphSpec(**spec) for name, spec in data["graphs"].items()}
        return cls(**data)


_STR, _INT, _BOOL, _OPT_STR = "str", "int", "bool", "str or null"
_FIELD_TYPES = {
    **dict.fromkeys(("model_name", "model_id", "architecture", "adapter_hash", "created", "format"), _STR),
    **dict.fromkeys(("adapter_file_sha256", "quantization", "tensorrt_target", "armt_config"), _OPT_STR),
    **dict.fromkeys(("segment_len", "num_write_tokens", "d_mem", "nu", "vocab_size", "opset"), _INT),
    "trained": _BOOL,
}


def _is(value: object, kind: str) -> bool:
    if kind == _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == _BOOL:
        return isinstance(value, bool)
    return isinstance(value, str) or (kind == _OPT_STR and value is None)


def _ints(value: object) -> bool:
    return isinstance(value, list) and all(_is(v, _INT) for v in value)


def _strs(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _str_map(value: object, check) -> bool:  # type: ignore[no-untyped-def]
    return isinstance(value, dict) and all(isinstance(k, str) and check(v) for k, v in value.items())


def _graph(value: object) -> bool:
    if not isinstance(value, dict) or not {"file", "inputs", "outputs"} <= set(value) <= {
        "file",
        "inputs",
        "outputs",
        "sha256",
        "size",
    }:
        return False
    return (
        isinstance(value["file"], str)
        and _strs(value["inputs"])
        and _strs(value["outputs"])
        and isinstance(value.get("sha256", ""), str)
        and _is(value.get("size", 0), _INT)
    )


def _type_problem(data: dict) -> str | None:
    """The first manifest field whose JSON type is wrong, described in a few words, or None."""
    for name, kind in _FIELD_TYPES.items():
        if name in data and not _is(data[name], kind):
            return f"{name} should be {kind}"
    checks = {
        "memory_layers": (_ints, "a list of integers"),
        "tokenizer_files": (_strs, "a list of strings"),
        "state_shapes": (lambda v: _str_map(v, _ints), "names -> lists of integers"),
        "kv": (lambda v: _str_map(v, lambda x: _is(x, _INT)), "names -> integers"),
        "graphs": (lambda v: _str_map(v, _graph), "names -> graph specs"),
        "tensorrt": (lambda v: _str_map(v, lambda x: isinstance(x, str)), "graph names -> paths"),
        "versions": (lambda v: _str_map(v, lambda x: isinstance(x, str)), "names -> strings"),
    }
    for name, (check, what) in checks.items():
        if name in data and not check(data[name]):
            return f"{name} should be {what}"
    return None


def inside(root: Path, relative: str) -> Path:
    """`root / relative`, refusing absolute paths and anything that resolves outside `root`."""
    if not relative or Path(relative).is_absolute() or "\\" in relative or "\x00" in relative:
        raise EdgememError(f"bundle {root}: manifest path {relative!r} is not a relative path")
    path = (root / relative).resolve()
    if not path.is_relative_to(root.resolve()):
        raise EdgememError(f"bundle {root}: manifest path {relative!r} points outside the bundle")
    return path


def read_manifest(root: str | Path, verify: bool = False) -> Manifest:
    """Read and check a bundle's manifest: format, fields, paths inside the bundle, files present
    with their recorded sizes (and sha256 when `verify`). Any problem is one EdgememError line."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise EdgememError(f"engine {root} does not exist (make one with `edgemem export`)")
    path = root / MANIFEST
    if not path.is_file():
        raise EdgememError(f"{root} is not an edgemem engine bundle (no {MANIFEST})")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EdgememError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise EdgememError(f"{path}: format {found!r} is not {FORMAT!r}; export the bundle again")
    problem = _type_problem(data)
    if problem is not None:
        raise EdgememError(f"{path}: invalid manifest ({problem}); export the bundle again")
    try:
        manifest = Manifest.from_dict(data)
    except (TypeError, KeyError, AttributeError) as exc:
        raise EdgememError(f"{path}: invalid manifest ({exc}); export the bundle again") from exc
    missing = {STEP_GRAPH, ANSWER_GRAPH} - set(manifest.graphs)
    if missing:
        raise EdgememError(f"{path}: no {sorted(missing)[0]} graph listed; export the bundle again")
    for name, spec in manifest.graphs.items():
        file = inside(root, spec.file)
        if not file.is_file():
            raise EdgememError(f"bundle {root}: graph {name} ({spec.file}) is missing")
        if spec.size and file.stat().st_size != spec.size:
            raise EdgememError(f"bundle {root}: {spec.file} has the wrong size (damaged); export it again")
        if verify and spec.sha256 and sha256_file(file) != spec.sha256:
            raise EdgememError(f"bundle {root}: {spec.file} does not match its sha256; export it again")
    for relative in manifest.tokenizer_files:
        if not inside(root, relative).is_file():
            raise EdgememError(f"bundle {root}: tokenizer file {relative} is missing")
    for graph, relative in manifest.tensorrt.items():
        if not inside(root, relative).is_file():
            raise EdgememError(f"bundle {root}: TensorRT engine {relative} of {graph} is missing")
    return manifest


def check_fits(
    manifest: Manifest,
    root: Path,
    *,
    model: str | None = None,
    adapter_file_sha256: str | None = None,
    state_shapes: dict[str, tuple[int, ...]] | None = None,
) -> None:
    """Refuse a bundle that was built for another model, adapter or state layout than asked for."""
    if model is not None and model not in (manifest.model_name, manifest.model_id):
        raise EdgememError(
            f"engine {root} was exported from {manifest.model_name}, not {model}; "
            f"export one for {model} or drop --model"
        )
    if adapter_file_sha256 is not None and adapter_file_sha256 != manifest.adapter_file_sha256:
        built = "the untrained memory" if manifest.adapter_file_sha256 is None else "another adapter"
        raise EdgememError(
            f"engine {root} was exported with {built}, not this --adapter; export it again with this adapter"
        )
    if state_shapes is not None:
        expected = {k: list(v) for k, v in state_shapes.items()}
        if expected != manifest.state_shapes:
            raise EdgememError(
                f"engine {root} carries a memory state of another shape than this model's; export it again"
            )


def write_manifest(root: Path, manifest: Manifest) -> None:
    """Write manifest.json atomically (temporary file, fsync, rename)."""
    atomic_write_text(root / MANIFEST, manifest.to_json())
