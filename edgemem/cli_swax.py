"""What the CLI does with a SWAX checkpoint given as `--model CHECKPOINT.safetensors`.

`edgemem ingest`, `ask` and `export` take a SWAX checkpoint (edgemem/swax_train.py) where they take
a model: `open_swax_assistant` puts its `SwaxTorchRuntime` in an `Assistant`, so the document
streams into the fixed-size state through the same ingest driver and library as ARMT's (stored,
resumed, reused by the next `ask`), and `export_swax` writes an engine bundle that `--engine DIR`
runs on ONNX Runtime. Not yet: the chat app.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from edgemem.errors import EdgememError

if TYPE_CHECKING:
    from edgemem.assistant import Assistant
    from edgemem.export.bundle import Manifest


def is_swax_checkpoint(model: str | None) -> bool:
    """True when `model` names a safetensors file written by the SWAX trainer."""
    if model is None:
        return False
    path = Path(model).expanduser()
    if path.suffix != ".safetensors" or not path.is_file():
        return False
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as handle:
            return "swax_config" in (handle.metadata() or {})
    except Exception:  # not a safetensors file: let the normal loader report it
        return False


def open_swax_assistant(checkpoint: str, adapter: str | None, segment_len: int | None) -> Assistant:
    """An `Assistant` on a SWAX checkpoint in PyTorch (`segment_len` bytes a step)."""
    from edgemem.assistant import Assistant
    from edgemem.cli_common import err
    from edgemem.swax_runtime import SwaxTorchRuntime

    if adapter is not None:
        raise EdgememError("a SWAX model has no memory adapter: drop --adapter")
    runtime = SwaxTorchRuntime.open(checkpoint, segment_len)
    model = runtime.model
    state_kib = model.empty_state().nbytes() / 1024
    err.print(
        f"SWAX byte model ({model.num_parameters():,} parameters, window {model.config.window}): "
        f"the document streams into a {state_kib:.0f} KiB state",
        markup=False,
    )
    return Assistant(None, None, None, runtime.adapter_hash, runtime)


def export_swax(
    checkpoint: str, out: Path, segment_len: int | None, force: bool, log=lambda message: None
) -> Manifest:
    """`edgemem export --model CHECKPOINT --to onnx --out DIR` for a SWAX checkpoint."""
    from edgemem.export.swax_onnx import export_swax_bundle
    from edgemem.swax_runtime import SwaxTorchRuntime, swax_model_name

    runtime = SwaxTorchRuntime.open(checkpoint, segment_len)
    name = swax_model_name(Path(checkpoint).expanduser())
    return export_swax_bundle(
        runtime.model, out, model_name=name, segment_len=runtime.config.segment_len, force=force, log=log
    )
