"""TensorRT engines from a bundle's ONNX graphs (`edgemem export --to tensorrt`).

Uses the `tensorrt` module, or `tensorrt_rtx` where that is what is installed (`pip install
tensorrt-rtx-cu13`): TensorRT-RTX builds engines without a GPU for a compute capability named
here; running one needs that GPU. The plans are written into the bundle's `tensorrt/` folder and
listed in its manifest (`tensorrt`: graph -> plan path), next to the ONNX graphs they come from.

Optimisation profiles: the segment step gets input_ids [1, 1..S] (opt S: ingest; fewer for a
document's tail before an answer), its state static; the answer graph gets one
profile with input_ids [1, 1..S + answer budget] (opt S: the prefill) and past [1, H, 0..max, hd]
(opt S: a decode step after the prefill). Precision follows the graph's types (TensorRT-RTX
networks are strongly typed): these are the float32 graphs; fp16/bf16 engines need fp16/bf16
graphs, which the exporter does not make yet.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from edgemem.errors import EdgememError
from edgemem.export.bundle import ANSWER_GRAPH, STEP_GRAPH, read_manifest, write_manifest

MODULES = ("tensorrt", "tensorrt_rtx")
ANSWER_BUDGET = 1024  # most tokens an answer adds to the cache after the prefill
DEFAULT_TARGET = "SM89"  # TensorRT-RTX without a GPU: Ada (RTX 40xx)


def tensorrt_module() -> ModuleType | None:
    """The TensorRT Python module that imports here (`tensorrt` first), or None."""
    for name in MODULES:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def require_tensorrt() -> ModuleType:
    module = tensorrt_module()
    if module is None:
        raise EdgememError(
            "TensorRT is not installed: `pip install tensorrt-rtx-cu13` (builds engines without a GPU) "
            "or `pip install tensorrt` (needs NVIDIA's package index)"
        )
    return module


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def build_plan(
    trt: ModuleType,
    onnx_path: Path,
    plan_path: Path,
    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]],
    target: str | None,
) -> int:
    """Parse one ONNX graph and write its serialized engine; returns its size in bytes.

    shapes: per dynamic input (min, opt, max); inputs the graph has static are left out. target: a
    compute capability name ('SM89') for a build without a GPU (TensorRT-RTX), or None for the GPU
    of this machine.
    """
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EdgememError(f"TensorRT cannot parse {onnx_path.name}: {errors[:300]}")
    config = builder.create_builder_config()
    if target is not None:
        if not hasattr(trt, "ComputeCapability"):
            raise EdgememError("building without a GPU needs TensorRT-RTX (pip install tensorrt-rtx-cu13)")
        known = list(trt.ComputeCapability.__members__)
        if target not in known:
            raise EdgememError(f"unknown compute capability {target!r}: use one of {', '.join(known[2:])}")
        config.num_compute_capabilities = 1
        config.set_compute_capability(trt.ComputeCapability.__members__[target], 0)
    dynamic = {
        network.get_input(i).name
        for i in range(network.num_inputs)
        if -1 in tuple(network.get_input(i).shape)
    }
    shapes = {name: shape for name, shape in shapes.items() if name in dynamic}  # an older static graph: none
    if shapes:
        profile = builder.create_optimization_profile()
        for name, (low, opt, high) in shapes.items():
            profile.set_shape(name, low, opt, high)
        config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EdgememError(f"TensorRT could not build an engine from {onnx_path.name}")
    tmp = plan_path.with_name(f".{plan_path.name}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(serialized)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, plan_path)
    return plan_path.stat().st_size


def step_profile(manifest) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """Profile of the segment step: input_ids [1, 1..S] (opt S: ingest; a tail before an answer)."""
    S = manifest.segment_len
    return {"input_ids": ((1, 1), (1, S), (1, S))}


def answer_profile(manifest) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """Profile of the answer graph: tokens 1..S+budget (opt S), past 0..S+budget (opt S)."""
    S, kv = manifest.segment_len, manifest.kv
    most = S + ANSWER_BUDGET
    shapes = {"input_ids": ((1, 1), (1, S), (1, most))}
    for name in manifest.graphs[ANSWER_GRAPH].inputs:
        if name.startswith("past."):
            dims = lambda n: (1, kv["kv_heads"], n, kv["head_dim"])  # noqa: E731
            shapes[name] = (dims(0), dims(S), dims(most))
    return shapes


def build_engines(
    bundle: str | Path, target: str | None = None, log: Callable[[str], None] = lambda m: None
) -> dict[str, str]:
    """Build a TensorRT plan for each graph of the bundle; record them in its manifest.

    target None: the GPU of this machine if there is one, else DEFAULT_TARGET (TensorRT-RTX).
    """
    trt = require_tensorrt()
    root = Path(bundle).expanduser()
    manifest = read_manifest(root)
    if manifest.quantization is not None:
        raise EdgememError("TensorRT engines are built from a float32 bundle, not an int8 one")
    if target is None and not _has_gpu():
        target = DEFAULT_TARGET
    (root / "tensorrt").mkdir(exist_ok=True)
    plans = {}
    for graph, shapes in ((STEP_GRAPH, step_profile(manifest)), (ANSWER_GRAPH, answer_profile(manifest))):
        relative = f"tensorrt/{graph}.plan"
        log(f"building the TensorRT engine of {graph}...")
        build_plan(trt, root / manifest.graphs[graph].file, root / relative, shapes, target)
        plans[graph] = relative
    versions = {**manifest.versions, trt.__name__: trt.__version__}
    write_manifest(
        root, dataclasses.replace(manifest, tensorrt=plans, tensorrt_target=target, versions=versions)
    )
    return plans
