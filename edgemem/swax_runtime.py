"""SWAX models behind the runtime interface (`edgemem.runtime.Runtime`): PyTorch and ONNX Runtime.

A SWAX checkpoint (edgemem/swax_train.py) holds a byte-level `SwaxModel`. Its runtimes keep the
contract of ARMT's, so `armt.ingest` (checkpoints, resume, cancel), the library and
`runtime.answer` work unchanged:

    runtime.step(input_ids [1, S], state) -> (state', None)     # S bytes of the document
    runtime.generate_ids(state, prompt, stop_ids, ...) -> bytes   # the question, then the answer

The state is a `SwaxState` (the last W - 1 keys and values per attention layer, C, n, m per mLSTM
layer or S per Gated DeltaNet layer, the position), whose shapes never depend on the document.
The tokenizer is UTF-8 itself (`ByteTokenizer`). A SWAX model has its own question format, the one
it was trained on: the document's last bytes, a newline and the question; the answer ends at a
newline (`answer_prompt`).

`SwaxOrtEngine` runs a bundle of `edgemem export` (edgemem/export/swax_onnx.py) with onnxruntime
and numpy only; `SwaxOrtRuntime` puts it behind the interface. The float32 engine and the PyTorch
model store their states under the same key (same model id and segment length).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgemem.errors import EdgememError
from edgemem.export.bundle import ANSWER_GRAPH, STEP_GRAPH
from edgemem.runtime import NumpyState, OrtEngine, OrtRuntime, decode

if TYPE_CHECKING:
    import onnxruntime as ort
    import torch

    from edgemem.swax import SwaxModel, SwaxState

ARCHITECTURE = "swax"  # the manifest's architecture of a SWAX bundle
DEFAULT_SEGMENT = 512  # bytes per step while reading a document
M_EMPTY = -1.0e30  # the stabiliser of an empty mLSTM state (edgemem.swax.M_EMPTY, tested equal)
POSITION = "position"  # edgemem.swax.POSITION
NEWLINE = 10


@dataclass(frozen=True)
class SwaxRunConfig:
    """What the ingest driver reads from `runtime.config`."""

    segment_len: int = DEFAULT_SEGMENT


class ByteTokenizer:
    """UTF-8 bytes as token ids (vocabulary 256), with the methods of a transformers tokenizer that
    `tokenize_stream` and `stream_text` use. No special tokens, no chat template."""

    bos_token_id = None
    eos_token_id = None
    chat_template = None

    @dataclass(frozen=True)
    class _Encoding:
        input_ids: list[int]

    def __call__(self, text: str, add_special_tokens: bool = True) -> ByteTokenizer._Encoding:
        return self._Encoding(list(text.encode("utf-8")))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode("utf-8", "replace")

    def get_vocab(self) -> dict[str, int]:
        return {}


def answer_prompt(tail_ids: list[int], question: str) -> tuple[list[int], set[int]]:
    """The answer segment in the format SWAX models are trained on: the document's unwritten last
    bytes, a newline, the question; the answer stops at a newline. -> (prompt ids, stop ids)."""
    return list(tail_ids) + list(b"\n" + question.encode("utf-8")), {NEWLINE}


def segment_hash(segment_len: int) -> str:
    """The library's adapter hash of a SWAX runtime: a SWAX model has no adapter, but its stored
    states (whole segments written, the tail kept back) depend on the segment length."""
    return f"swax-segment-{segment_len}"


def swax_model_id(model: SwaxModel) -> str:
    """'swax@<sha256 prefix>' of the configuration and the weights (not of the checkpoint file,
    which also holds the optimizer state)."""
    digest = hashlib.sha256(model.config.to_json().encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return f"swax@{digest.hexdigest()[:16]}"


def swax_model_name(checkpoint: Path) -> str:
    return f"swax:{checkpoint.parent.name}/{checkpoint.name}"


def load_swax(path: Path) -> SwaxModel:
    """The model of a SWAX checkpoint, in eval mode, with the window it was trained to end with."""
    from edgemem.files import read_safetensors
    from edgemem.swax import SwaxConfig, SwaxModel

    meta, tensors = read_safetensors(path, "SWAX checkpoint")
    try:
        model = SwaxModel(SwaxConfig.from_json(meta["swax_config"]))
        model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise EdgememError(f"{path}: not a usable SWAX checkpoint ({exc})") from exc
    return model.eval()


def _check_segment(segment_len: int | None) -> int:
    segment = DEFAULT_SEGMENT if segment_len is None else segment_len
    if segment < 1:
        raise EdgememError(f"--segment-len must be at least 1, not {segment}")
    return segment


# ----- PyTorch -----


class SwaxTorchRuntime:
    """A SWAX checkpoint in PyTorch eager mode (float32, CPU)."""

    backend = "torch"
    trained = True

    def __init__(self, model: SwaxModel, name: str, segment_len: int | None = None) -> None:
        self.model = model
        self.name = name
        self.model_id = swax_model_id(model)
        self.config = SwaxRunConfig(_check_segment(segment_len))
        self.adapter_hash = segment_hash(self.config.segment_len)
        self.tokenizer = ByteTokenizer()

    @classmethod
    def open(cls, checkpoint: str | Path, segment_len: int | None = None) -> SwaxTorchRuntime:
        path = Path(checkpoint).expanduser()
        return cls(load_swax(path), swax_model_name(path), segment_len)

    @property
    def device(self) -> torch.device:
        return self.model.embed.weight.device

    def empty_state(self) -> SwaxState:
        return self.model.empty_state()

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return self.model.state_shapes()

    def step(self, input_ids: torch.Tensor, state: SwaxState) -> tuple[SwaxState, None]:
        new, _ = self.model.step(input_ids, state)
        return new, None

    answer_prompt = staticmethod(answer_prompt)

    def generate_ids(
        self,
        state: SwaxState,
        prompt: list[int],
        stop_ids: set[int],
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 0.95,
        seed: int | None = None,
    ) -> Iterator[int]:
        """The prompt in one step, then one byte at a time; greedy for temperature 0."""
        import torch

        from edgemem.armt import _sample

        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        device = self.device
        with torch.inference_mode():
            state, logits = self.model.step(torch.tensor([prompt], device=device), state, return_logits=True)
            for _ in range(max_new_tokens):
                byte = _sample(logits[0, -1], temperature, top_p, generator)
                if byte in stop_ids:
                    return
                yield byte
                state, logits = self.model.step(
                    torch.tensor([[byte]], device=device), state, return_logits=True
                )


# ----- ONNX Runtime -----


class SwaxOrtEngine(OrtEngine):
    """A SWAX bundle on ONNX Runtime, numpy in and out (imports neither torch nor transformers).

    `segment_step`: input_ids [1, S] + state -> state'; `answer`: one byte [1, 1] + state ->
    (logits [1, V], state'). Both graphs take `state_in.<name>` and return `state_out.<name>`.
    """

    def _check_io(self, graph: str, session: ort.InferenceSession) -> None:
        spec, m = self.manifest.graphs[graph], self.manifest
        inputs = {i.name: i.shape for i in session.get_inputs()}
        outputs = [o.name for o in session.get_outputs()]
        if list(inputs) != spec.inputs or outputs != spec.outputs:
            raise EdgememError(
                f"engine {self.root}: {spec.file} does not match its manifest; export it again"
            )
        bad = [n for n, shape in m.state_shapes.items() if inputs.get("state_in." + n) != shape]
        if inputs.get("input_ids") != [1, m.segment_len if graph == STEP_GRAPH else 1]:
            bad.append("input_ids")
        if bad:
            raise EdgememError(
                f"engine {self.root}: {spec.file} expects other shapes than its manifest ({bad[0]}); "
                "export it again"
            )

    def empty_state(self) -> NumpyState:
        """Zeros, the position 0 (int64), and every mLSTM stabiliser `m` at M_EMPTY."""
        state = {}
        for name, shape in self.manifest.state_shapes.items():
            if name == POSITION:
                state[name] = np.zeros(shape, np.int64)
            else:
                state[name] = np.full(shape, M_EMPTY if name.endswith(".m") else 0.0, np.float32)
        return state

    def _state_feed(self, state: NumpyState, prefix: str = "state_in.") -> dict[str, np.ndarray]:
        if state.keys() != self.manifest.state_shapes.keys():
            raise EdgememError(f"engine {self.root}: the state has other tensors than the engine's")
        return {
            prefix + name: np.ascontiguousarray(t, np.int64 if name == POSITION else np.float32)
            for name, t in state.items()
        }

    def _run(self, graph: str, ids: np.ndarray, state: NumpyState) -> tuple[np.ndarray | None, NumpyState]:
        """One graph call -> (its logits, or None; the new state). Outputs are matched by name: the
        manifest lists the state sorted, the graph in layer order."""
        feed = self._state_feed(state)
        feed["input_ids"] = ids
        outputs = dict(
            zip(self.manifest.graphs[graph].outputs, self.session(graph).run(None, feed), strict=True)
        )
        return outputs.get("logits"), {n: outputs[f"state_out.{n}"] for n in self.manifest.state_shapes}

    def step(self, ids: Sequence[int] | np.ndarray, state: NumpyState) -> NumpyState:
        """S bytes (the bundle's segment length) -> the new state."""
        return self._run(STEP_GRAPH, np.asarray(ids, dtype=np.int64).reshape(1, -1), state)[1]

    def read_byte(self, byte: int, state: NumpyState) -> tuple[np.ndarray, NumpyState]:
        """One byte -> (logits [V] after it, the new state)."""
        logits, new = self._run(ANSWER_GRAPH, np.array([[byte]], dtype=np.int64), state)
        assert logits is not None
        return logits[0], new

    def generate_ids(
        self,
        state: NumpyState,
        prompt: Sequence[int],
        stop_ids: set[int],
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 0.95,
        seed: int | None = None,
    ) -> Iterator[int]:
        """The prompt (its whole segments through the step graph, the rest byte by byte), then the
        answer one byte at a time. Greedy for temperature 0."""
        if not prompt:
            raise EdgememError("the prompt is empty")
        S = self.manifest.segment_len
        whole = (len(prompt) - 1) // S * S
        for a in range(0, whole, S):
            state = self.step(prompt[a : a + S], state)
        for byte in prompt[whole:]:
            logits, state = self.read_byte(byte, state)

        def advance(byte: int) -> np.ndarray:
            nonlocal state
            next_logits, state = self.read_byte(byte, state)
            return next_logits

        yield from decode(logits, advance, stop_ids, max_new_tokens, temperature, top_p, seed)


class SwaxOrtRuntime(OrtRuntime):
    """`SwaxOrtEngine` behind the runtime interface: `OrtRuntime` with SwaxState values, the byte
    tokenizer and SWAX's own question format."""

    def __init__(self, engine: SwaxOrtEngine) -> None:
        super().__init__(engine, ByteTokenizer())
        self.config = SwaxRunConfig(engine.manifest.segment_len)  # type: ignore[assignment]

    answer_prompt = staticmethod(answer_prompt)

    @staticmethod
    def _to_torch(state: NumpyState, writes: int) -> SwaxState:  # type: ignore[override]
        import torch

        from edgemem.swax import SwaxState

        return SwaxState.from_named_tensors({k: torch.from_numpy(v) for k, v in state.items()}, writes)

    @staticmethod
    def _to_numpy(state: SwaxState) -> NumpyState:  # type: ignore[override]
        return {k: v.detach().cpu().numpy() for k, v in state.named_tensors().items()}


def open_swax_engine(
    engine: OrtEngine, *, model: str | None = None, adapter: str | Path | None = None
) -> SwaxOrtRuntime:
    """The runtime of a SWAX bundle (`engine` opened as a plain bundle). `model`, when given, must
    be the checkpoint (or the model name or id) it was exported from; SWAX models take no adapter."""
    if adapter is not None:
        raise EdgememError("a SWAX model has no memory adapter: drop --adapter")
    swax = SwaxOrtEngine(engine.root, getattr(engine, "options", None))
    m = swax.manifest
    if model is not None and model not in (m.model_name, m.model_id):
        path = Path(model).expanduser()
        if not path.is_file() or swax_model_id(load_swax(path)) != m.model_id:
            raise EdgememError(
                f"engine {swax.root} was exported from {m.model_name}, not {model}; "
                f"export one for {model} or drop --model"
            )
    return SwaxOrtRuntime(swax)
