"""Engine export (ONNX, TensorRT) of the segment recurrence, installed as `edgemem.export`.

- `bundle`: the bundle folder and its manifest; imports neither torch nor onnxruntime.
- `onnx`: the ONNX export (segment step and answer graphs), optional int8 quantisation.

What an engine must reproduce is the segment-step contract of `edgemem.armt`; `state_spec`
describes the state it carries so that a bundle manifest can be checked against a model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgemem.armt import ARMT


def state_spec(armt: ARMT) -> dict[str, object]:
    """Names, shapes and dtype of the memory state an engine takes and returns (batch 1)."""
    return {
        "segment_len": armt.config.segment_len,
        "num_write_tokens": armt.config.num_write_tokens,
        "memory_layers": list(armt.config.memory_layers),
        "state": {name: list(shape) for name, shape in armt.state_shapes(1).items()},
        "dtype": "float32",
    }


__all__ = ["state_spec"]
