"""Dynamic int8 quantisation of a bundle's graphs (ONNX Runtime's `quantize_dynamic`).

Weights of the base model's MatMuls become int8 (per tensor, symmetric); activations are
quantised on the fly. The memory itself stays float32: the state, the read and write arithmetic,
and the memory's projections (W_Q, W_K, W_V, W_b), found by the name scope the exporter records
on every node. Imports neither torch nor transformers.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
from pathlib import Path

from edgemem.errors import EdgememError
from edgemem.export.bundle import GraphSpec, Manifest, read_manifest, write_manifest
from edgemem.files import sha256_file

MEMORY_SCOPE = ".memory.W_"  # name scope of the memory projections in the exported graphs


def memory_matmuls(path: Path) -> list[str]:
    """Names of the MatMul nodes that belong to the memory's projections."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return [
        node.name
        for node in model.graph.node
        if node.op_type == "MatMul"
        and any(p.key == "namespace" and MEMORY_SCOPE in p.value for p in node.metadata_props)
    ]


def quantize_graph(path: Path) -> None:
    """Quantise one graph in place (written beside it, then renamed)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = path.with_name(f".{path.name}.int8")
    root_logger = logging.getLogger()
    level = root_logger.level
    root_logger.setLevel(logging.ERROR)  # quantize_dynamic logs a pre-processing hint on the root logger
    try:
        quantize_dynamic(
            str(path),
            str(out),
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul"],
            nodes_to_exclude=memory_matmuls(path),
            extra_options={"MatMulConstBOnly": True},
        )
        os.replace(out, path)
    finally:
        root_logger.setLevel(level)
        if out.exists():
            out.unlink()


def quantize_graphs(root: Path, graphs: dict[str, GraphSpec]) -> dict[str, GraphSpec]:
    """Quantise every graph of a bundle folder; returns the specs with their new sha256 and size."""
    out = {}
    for name, spec in graphs.items():
        file = root / spec.file
        quantize_graph(file)
        out[name] = dataclasses.replace(spec, sha256=sha256_file(file), size=file.stat().st_size)
    return out


def quantize_bundle(src: str | Path, out: str | Path, force: bool = False) -> Manifest:
    """An int8 copy of a float32 bundle (the source is left as it is)."""
    src, out = Path(src).expanduser(), Path(out).expanduser()
    manifest = read_manifest(src)
    if manifest.quantization is not None:
        raise EdgememError(f"{src} is already quantized ({manifest.quantization})")
    if out.exists() and not force:
        raise EdgememError(f"{out} exists; choose another --out or pass --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    tmp.chmod(0o755)
    try:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        graphs = quantize_graphs(tmp, manifest.graphs)
        manifest = dataclasses.replace(manifest, graphs=graphs, quantization="int8")
        write_manifest(tmp, manifest)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
        return manifest
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
