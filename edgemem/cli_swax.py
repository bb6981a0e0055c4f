"""`edgemem ask --model CHECKPOINT.safetensors`: answering with a trained SWAX model.

A SWAX checkpoint (edgemem/swax_train.py) holds a byte-level model. The document streams through
`SwaxModel.step` in segments, into the fixed-size state (attention keys/values of the last W - 1
bytes, the mLSTM or Gated DeltaNet matrices); then the question runs as the last segment and the
answer is decoded greedily (or sampled), byte by byte, from the same state, until a newline.

Not yet: the library (states are not stored; a small model re-reads a document quickly), the chat
app and engines (ONNX export of the SWAX step waits for the export work).
"""

from __future__ import annotations

import codecs
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from edgemem.errors import EdgememError

if TYPE_CHECKING:
    from edgemem.documents import Scan
    from edgemem.swax import SwaxModel

SEGMENT = 4096  # bytes per step while reading the document


def is_swax_checkpoint(model: str) -> bool:
    """True when `model` names a safetensors file written by the SWAX trainer."""
    path = Path(model).expanduser()
    if path.suffix != ".safetensors" or not path.is_file():
        return False
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as handle:
            return "swax_config" in (handle.metadata() or {})
    except Exception:  # not a safetensors file: let the normal loader report it
        return False


def load_swax(path: Path) -> SwaxModel:
    """The model of a SWAX checkpoint, in eval mode, with the window it was trained to end with."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from edgemem.swax import SwaxConfig, SwaxModel

    try:
        with safe_open(str(path), "pt") as handle:
            config = SwaxConfig.from_json(handle.metadata()["swax_config"])
        tensors = load_file(str(path))
        model = SwaxModel(config)
        model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    except (OSError, KeyError, ValueError, RuntimeError) as exc:
        raise EdgememError(f"{path}: not a usable SWAX checkpoint ({exc})") from exc
    return model.eval()


def answer_bytes(
    model: SwaxModel,
    context: Iterable[bytes],
    question: str,
    max_new: int = 256,
    temperature: float = 0.0,
    seed: int | None = None,
) -> Iterator[int]:
    """Read the context (pieces of any size), then the question; yield answer bytes until a newline
    or `max_new` bytes. Held at any time: one piece, one segment and the fixed-size state."""
    import torch

    from edgemem.armt import _sample

    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    prompt = b"\n" + question.encode("utf-8")
    with torch.inference_mode():
        state, buffer = model.empty_state(), b""
        for piece in context:
            buffer += piece
            while len(buffer) >= SEGMENT:
                state, _ = model.step(torch.tensor([list(buffer[:SEGMENT])]), state)
                buffer = buffer[SEGMENT:]
        if buffer:
            state, _ = model.step(torch.tensor([list(buffer)]), state)
        state, logits = model.step(torch.tensor([list(prompt)]), state, return_logits=True)
        for _ in range(max_new):
            byte = _sample(logits[0, -1], temperature, 0.95, generator)
            if byte == ord("\n"):
                return
            yield byte
            state, logits = model.step(torch.tensor([[byte]]), state, return_logits=True)


def swax_ask(
    source: Scan,
    question: str,
    checkpoint: str,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    seed: int | None = None,
) -> None:
    """What `edgemem ask` does with a SWAX checkpoint as --model: `source` is the documents.scan of
    the path; the answer streams to stdout."""
    from edgemem.cli_common import err
    from edgemem.documents import iter_text

    context = (piece.encode("utf-8") for piece in iter_text(source))
    model = load_swax(Path(checkpoint).expanduser())
    state_kib = model.empty_state().nbytes() / 1024
    err.print(
        f"SWAX byte model ({model.num_parameters():,} parameters, window {model.config.window}): "
        f"the document streams into a {state_kib:.0f} KiB state",
        markup=False,
    )
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    for byte in answer_bytes(model, context, question, max_new_tokens, temperature, seed):
        sys.stdout.write(decoder.decode(bytes([byte])))
        sys.stdout.flush()
    sys.stdout.write(decoder.decode(b"", final=True) + "\n")
