"""Runtime backends behind one interface: PyTorch eager, and an engine bundle on ONNX Runtime or
TensorRT.

The interface (`Runtime`) is the segment-step contract of `edgemem.armt` plus what identifies a
model to the library:

    runtime.step(input_ids [1, S], state) -> (state', None)        # ingest: read, run, write
    runtime.generate_ids(state, prompt, stop_ids, ...) -> ids       # answer: read only
    runtime.config (segment_len, ...), runtime.device, runtime.empty_state(), runtime.state_shapes()
    runtime.name, runtime.model_id, runtime.adapter_hash, runtime.tokenizer, runtime.trained

`armt.ingest(runtime, ...)` drives any backend (checkpoints, resume and cancel included);
`answer(runtime, doc, question)` streams text. States are `MemoryState` values for every backend,
so a state ingested by one can be answered by another (the library key is the same for the torch
model and its float32 engine; an int8 engine keys its states apart).

`OrtEngine` is the engine itself: numpy in, numpy out, and it imports neither torch nor
transformers (a bundle runs with onnxruntime and numpy alone). `TrtEngine` is the same contract on
the bundle's TensorRT plans (`edgemem export --to tensorrt`; an NVIDIA GPU, device buffers as torch
CUDA tensors). `OrtRuntime` adapts either to the interface above; `open_engine` picks TensorRT for a
bundle that holds plans. Importing this module imports neither torch nor onnxruntime nor TensorRT.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from edgemem.errors import EdgememError
from edgemem.export.bundle import (
    ANSWER_GRAPH,
    STEP_GRAPH,
    Manifest,
    check_fits,
    inside,
    read_manifest,
)
from edgemem.files import require_file, sha256_file

if TYPE_CHECKING:
    import onnxruntime as ort
    import torch

    from edgemem.armt import ARMT, ARMTConfig, IngestResult, MemoryState
    from edgemem.models import LoadedModel

BACKENDS = ("torch", "onnxruntime", "tensorrt")
NumpyState = dict[str, np.ndarray]


class Runtime(Protocol):
    """What the ingest driver, the answer loop, the store and the CLI need from a backend."""

    backend: str  # "torch", "onnxruntime", "onnxruntime-int8", "tensorrt"
    name: str  # the model's display name
    model_id: str  # part of every stored state's key
    adapter_hash: str
    tokenizer: Any
    config: ARMTConfig
    device: torch.device

    @property
    def trained(self) -> bool: ...

    def empty_state(self) -> MemoryState: ...

    def state_shapes(self) -> dict[str, tuple[int, ...]]: ...

    def step(self, input_ids: torch.Tensor, state: MemoryState) -> tuple[MemoryState, None]: ...

    def generate_ids(
        self,
        state: MemoryState,
        prompt: list[int],
        stop_ids: set[int],
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 0.95,
        seed: int | None = None,
    ) -> Iterator[int]: ...


def answer(runtime: Runtime, doc: IngestResult, question: str, **generation: Any) -> Iterator[str]:
    """Stream the answer to `question` about an ingested document through any backend.

    A runtime whose model has a question format of its own (SWAX byte models) says so with
    `answer_prompt(tail_ids, question) -> (prompt ids, stop ids)` (its recurrence reads the tail
    in the prompt); the others write the tail into memory first (`armt.answer_state`) and get the
    chat prompt."""
    from edgemem.armt import answer_state, prompt_ids, stop_token_ids, stream_text

    own_prompt = getattr(runtime, "answer_prompt", None)
    if own_prompt is not None:
        state = doc.state
        prompt, stop_ids = own_prompt(doc.tail_ids, question)
    else:
        state = answer_state(runtime, doc.state, doc.tail_ids)
        prompt = prompt_ids(runtime.tokenizer, doc.tail_ids, question)
        stop_ids = stop_token_ids(runtime.tokenizer)
    ids = runtime.generate_ids(state, prompt, stop_ids, **generation)
    return stream_text(runtime.tokenizer, ids)


# ----- PyTorch eager -----


class TorchRuntime:
    """The reference backend: `ARMT` in PyTorch eager mode (float32, or bf16 where it is native)."""

    backend = "torch"

    def __init__(self, loaded: LoadedModel, armt: ARMT, adapter_hash: str | None = None) -> None:
        self.loaded = loaded
        self.armt = armt
        self.name = loaded.name
        self.model_id = loaded.model_id
        self.tokenizer = loaded.tokenizer
        self.adapter_hash = adapter_hash or armt.adapter_hash()
        self.config = armt.config

    @property
    def device(self) -> torch.device:
        return self.armt.device

    @property
    def trained(self) -> bool:
        return self.armt.is_trained()

    def empty_state(self) -> MemoryState:
        return self.armt.empty_state()

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return self.armt.state_shapes()

    def step(self, input_ids: torch.Tensor, state: MemoryState) -> tuple[MemoryState, None]:
        new, _ = self.armt.step(input_ids, state)
        return new, None

    def generate_ids(
        self, state: MemoryState, prompt: list[int], stop_ids: set[int], **gen: Any
    ) -> Iterator[int]:
        from edgemem.armt import generate_ids

        return generate_ids(self.armt, state, prompt, stop_ids, **gen)


# ----- ONNX Runtime -----


def physical_cores() -> int:
    """Cores this process may use, counting each physical core once."""
    import psutil

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    physical = psutil.cpu_count(logical=False) or usable
    return max(1, min(usable, physical))


@dataclass(frozen=True)
class OrtOptions:
    """ONNX Runtime session settings, tuned for one document at a time on a CPU.

    threads: intra-op threads (0: one per physical core; hyper-threads only add contention).
    spinning: idle threads busy-wait for work. Off by default: on a shared or small machine
    spinning threads steal the cores from everything else (the chat app's screen, torch).
    optimization: the graph optimisation level ('none', 'basic', 'extended', 'all').
    device: 'cpu', or 'cuda' (the CUDA provider first, when onnxruntime-gpu finds a GPU).
    one_session: keep one graph's session open at a time (opening the answer graph closes the
    segment step's): a one-shot `ask` peaks at one graph's weights instead of both; the chat app,
    which alternates ingests and answers, keeps both.
    """

    threads: int = 0
    spinning: bool = False
    optimization: str = "all"
    device: str = "cpu"
    one_session: bool = False

    def session_options(self) -> ort.SessionOptions:
        import onnxruntime as ort

        levels = {
            "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }
        if self.optimization not in levels:
            known = ", ".join(levels)
            raise EdgememError(f"unknown optimization level {self.optimization!r}: use one of {known}")
        so = ort.SessionOptions()
        so.graph_optimization_level = levels[self.optimization]
        so.intra_op_num_threads = self.threads or physical_cores()
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.log_severity_level = 3
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if self.spinning else "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "1" if self.spinning else "0")
        return so

    def providers(self) -> list[str]:
        import onnxruntime as ort

        if self.device == "cpu":
            return ["CPUExecutionProvider"]
        if self.device == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise EdgememError("device cuda needs onnxruntime-gpu (pip install 'edgemem[gpu]')")
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        raise EdgememError(f"unknown device {self.device!r}: use cpu or cuda")


def sample(logits: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator | None) -> int:
    """Greedy for temperature 0; otherwise nucleus sampling. logits [V] -> token id."""
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    ranked = probs[order]
    ranked = ranked * (np.cumsum(ranked) - ranked < top_p)
    rng = rng or np.random.default_rng()
    return int(order[rng.choice(len(ranked), p=ranked / ranked.sum())])


def decode(
    logits: np.ndarray,
    advance: Callable[[int], np.ndarray],
    stop_ids: set[int],
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None,
) -> Iterator[int]:
    """The answer loop of the numpy engines: pick a token from `logits` [V], stop at a stop id, else
    yield it and get the next logits from `advance(token)`. Greedy for temperature 0."""
    rng = np.random.default_rng(seed) if temperature > 0 else None
    for _ in range(max_new_tokens):
        token = sample(logits, temperature, top_p, rng)
        if token in stop_ids:
            return
        yield token
        logits = advance(token)


class BundleEngine:
    """What every engine on a bundle shares: the manifest, the state layout and the answer loop.

    A subclass provides `session(graph)` (open a graph), `step(ids, state)` and `forward(ids, past,
    state)`; states are numpy arrays named as in the manifest.
    """

    backend = ""

    def __init__(self, root: str | Path, *, verify: bool = False) -> None:
        self.root = Path(root).expanduser()
        self.manifest: Manifest = read_manifest(self.root, verify=verify)

    def empty_state(self) -> NumpyState:
        return {name: np.zeros(shape, np.float32) for name, shape in self.manifest.state_shapes.items()}

    def _state_feed(self, state: NumpyState, prefix: str) -> dict[str, np.ndarray]:
        if state.keys() != self.manifest.state_shapes.keys():
            raise EdgememError(f"engine {self.root}: the memory state has other tensors than the engine's")
        return {prefix + name: np.ascontiguousarray(t, np.float32) for name, t in state.items()}

    def empty_past(self) -> list[np.ndarray]:
        kv = self.manifest.kv
        return [np.zeros((1, kv["kv_heads"], 0, kv["head_dim"]), np.float32) for _ in range(2 * kv["layers"])]

    def step(self, ids: Sequence[int] | np.ndarray, state: NumpyState) -> NumpyState:
        raise NotImplementedError

    def partial_segments(self) -> bool:
        """Whether the step graph takes 1..S tokens (an answer writes the document's tail) and not
        only whole S-token segments (bundles exported before answers wrote the tail)."""
        raise NotImplementedError

    def _segment_ids(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """ids [n] or [1, n] -> [1, n] int64, refused in one line where the step graph cannot take n."""
        out = np.asarray(ids, dtype=np.int64).reshape(1, -1)
        n, S = out.shape[1], self.manifest.segment_len
        if n == S:
            return out
        partial = self.partial_segments()
        if 1 <= n < S:
            if partial:
                return out
            raise EdgememError(
                f"engine {self.root} steps only whole segments of {S} tokens (it predates answers "
                "that write the tail); export it again"
            )
        what = f"segments of 1..{S}" if partial else f"whole segments of {S}"
        raise EdgememError(f"engine {self.root} steps {what} tokens, not {n}")

    def forward(
        self, ids: Sequence[int] | np.ndarray, past: list[Any], state: NumpyState
    ) -> tuple[np.ndarray, list[Any]]:
        raise NotImplementedError

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
        """Generated ids one at a time: the prompt runs as the last segment reading memory, then
        each new token with the growing cache. Greedy for temperature 0."""
        logits, past = self.forward(prompt, self.empty_past(), state)

        def advance(token: int) -> np.ndarray:
            nonlocal past
            next_logits, past = self.forward([token], past, state)
            return next_logits

        yield from decode(logits, advance, stop_ids, max_new_tokens, temperature, top_p, seed)


class OrtEngine(BundleEngine):
    """An engine bundle on ONNX Runtime: numpy state in, numpy state out.

    Sessions open on first use (an ingest never loads the answer graph). Each session's inputs and
    outputs are checked against the manifest when it opens.
    """

    backend = "onnxruntime"

    def __init__(self, root: str | Path, options: OrtOptions | None = None, *, verify: bool = False) -> None:
        super().__init__(root, verify=verify)
        self.options = options or OrtOptions()
        self._sessions: dict[str, ort.InferenceSession] = {}

    # ----- sessions -----

    def session(self, graph: str) -> ort.InferenceSession:
        if graph not in self._sessions:
            import onnxruntime as ort

            if self.options.one_session:
                self._sessions.clear()  # before loading the next one: one graph's weights at a time

            spec = self.manifest.graphs[graph]
            path = self.root / spec.file
            try:
                session = ort.InferenceSession(
                    str(path), sess_options=self.options.session_options(), providers=self.options.providers()
                )
            except (ort.capi.onnxruntime_pybind11_state.Fail, RuntimeError) as exc:  # type: ignore[attr-defined]
                detail = str(exc).strip().splitlines()[0][:200]
                raise EdgememError(f"engine {self.root}: cannot load {spec.file}: {detail}") from exc
            self._check_io(graph, session)
            self._sessions[graph] = session
        return self._sessions[graph]

    def _check_io(self, graph: str, session: ort.InferenceSession) -> None:
        spec, m = self.manifest.graphs[graph], self.manifest
        inputs = {i.name: i.shape for i in session.get_inputs()}
        outputs = [o.name for o in session.get_outputs()]
        if list(inputs) != spec.inputs or outputs != spec.outputs:
            raise EdgememError(
                f"engine {self.root}: {spec.file} does not match its manifest; export it again"
            )
        prefix = "state_in." if graph == STEP_GRAPH else "state."
        bad = [n for n, shape in m.state_shapes.items() if inputs.get(prefix + n) != shape]
        ids = inputs["input_ids"]
        # [1, S] (whole segments only: an older export) or [1, tokens] (1..S: a tail too)
        if graph == STEP_GRAPH and not (ids[0] == 1 and (ids[1] == m.segment_len or isinstance(ids[1], str))):
            bad.append("input_ids")
        if bad:
            raise EdgememError(
                f"engine {self.root}: {spec.file} expects other shapes than its manifest ({bad[0]}); "
                "export it again"
            )

    def close(self) -> None:
        self._sessions.clear()

    def partial_segments(self) -> bool:
        shapes = {i.name: i.shape for i in self.session(STEP_GRAPH).get_inputs()}
        return not isinstance(shapes["input_ids"][1], int)

    # ----- the contract -----

    def step(self, ids: Sequence[int] | np.ndarray, state: NumpyState) -> NumpyState:
        """One segment: ids [n] or [1, n], n = S (the bundle's segment length), or 1..S for a tail
        -> the new state."""
        session = self.session(STEP_GRAPH)
        feed = self._state_feed(state, "state_in.")
        feed["input_ids"] = self._segment_ids(ids)
        outputs = session.run(None, feed)
        return dict(zip(self.manifest.state_shapes, outputs, strict=True))

    def forward(
        self, ids: Sequence[int] | np.ndarray, past: list[np.ndarray], state: NumpyState
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Read-only forward: ids [T] with the cache `past` (P tokens) -> (logits [V] of the last
        position, the cache grown to P + T tokens)."""
        session = self.session(ANSWER_GRAPH)
        spec = self.manifest.graphs[ANSWER_GRAPH]
        feed = self._state_feed(state, "state.")
        feed["input_ids"] = np.asarray(ids, dtype=np.int64).reshape(1, -1)
        feed.update(zip(spec.inputs[1 : 1 + len(past)], past, strict=True))
        logits, *present = session.run(None, feed)
        return logits[0], present


# ----- TensorRT -----

_TORCH_DTYPES = {  # TensorRT DataType name -> torch dtype name
    "FLOAT": "float32",
    "HALF": "float16",
    "BF16": "bfloat16",
    "INT64": "int64",
    "INT32": "int32",
    "INT8": "int8",
    "UINT8": "uint8",
    "BOOL": "bool",
}


def cuda_device(root: Path, manifest: Manifest) -> torch.device:
    """The GPU that runs a bundle's TensorRT plans; one clear error where there is none, or where
    the plans were built for another compute capability."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        torch = None  # type: ignore[assignment]
    if torch is None or not torch.cuda.is_available():
        raise EdgememError(
            f"engine {root} holds TensorRT plans, which run only on an NVIDIA GPU (with a CUDA build of "
            "PyTorch) and none is available here; on this machine use an ONNX bundle "
            "(`edgemem export` without --to tensorrt)"
        )
    major, minor = torch.cuda.get_device_capability()
    here = f"SM{major}{minor}"
    if manifest.tensorrt_target is not None and manifest.tensorrt_target != here:
        raise EdgememError(
            f"engine {root}: its TensorRT plans were built for {manifest.tensorrt_target}, this GPU is "
            f"{here}; build them again here with `edgemem export --to tensorrt`"
        )
    return torch.device("cuda")


def plan_module(root: Path, manifest: Manifest) -> Any:
    """The TensorRT module that built the plans (`tensorrt_rtx` or `tensorrt`): only it reads them."""
    import importlib

    name = "tensorrt_rtx" if "tensorrt_rtx" in manifest.versions else "tensorrt"
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        package = "tensorrt-rtx-cu13" if name == "tensorrt_rtx" else "tensorrt"
        raise EdgememError(f"engine {root}: its plans need {name} (pip install {package})") from exc


class TrtEngine(BundleEngine):
    """A bundle's TensorRT plans on an NVIDIA GPU: the contract of `OrtEngine` (numpy state in and
    out, logits to the host), device buffers held as torch CUDA tensors, the answer's key/value
    cache kept on the GPU between decode steps.

    Each plan is deserialized on first use by the module that built it, with one execution context;
    its tensors are checked against the manifest. Shapes outside the plan's optimisation profile
    (an answer longer than `edgemem.export.tensorrt.ANSWER_BUDGET` tokens) are one clear error.
    """

    backend = "tensorrt"

    def __init__(self, root: str | Path, *, verify: bool = False) -> None:
        super().__init__(root, verify=verify)
        if not self.manifest.tensorrt:
            raise EdgememError(f"engine {self.root} has no TensorRT plans (export it with --to tensorrt)")
        self.device = cuda_device(self.root, self.manifest)
        self.trt = plan_module(self.root, self.manifest)
        self._runtime = self.trt.Runtime(self.trt.Logger(self.trt.Logger.ERROR))
        self._contexts: dict[str, tuple[Any, Any]] = {}
        self._placeholder: Any = None  # an address for tensors with no elements

    def session(self, graph: str) -> tuple[Any, Any]:
        """(ICudaEngine, IExecutionContext) of one graph's plan, loaded on first use."""
        if graph not in self._contexts:
            relative = self.manifest.tensorrt[graph]
            engine = self._runtime.deserialize_cuda_engine(inside(self.root, relative).read_bytes())
            if engine is None:
                raise EdgememError(
                    f"engine {self.root}: cannot load {relative} (built by another TensorRT version or "
                    "for another GPU); build it again with `edgemem export --to tensorrt`"
                )
            names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
            inputs = {n for n in names if engine.get_tensor_mode(n) == self.trt.TensorIOMode.INPUT}
            spec = self.manifest.graphs[graph]
            if inputs != set(spec.inputs) or set(names) - inputs != set(spec.outputs):
                raise EdgememError(
                    f"engine {self.root}: {relative} does not match its manifest; export it again"
                )
            self._contexts[graph] = (engine, engine.create_execution_context())
        return self._contexts[graph]

    def close(self) -> None:
        self._contexts.clear()

    def partial_segments(self) -> bool:
        engine, _ = self.session(STEP_GRAPH)
        return engine.get_tensor_shape("input_ids")[1] == -1

    def _address(self, tensor: torch.Tensor) -> int:
        if tensor.numel():
            return tensor.data_ptr()
        if self._placeholder is None:
            import torch

            self._placeholder = torch.empty(64, dtype=torch.float32, device=self.device)
        return self._placeholder.data_ptr()

    def _run(self, graph: str, feed: dict[str, Any]) -> list[torch.Tensor]:
        """Run one plan: inputs (numpy or CUDA tensors) -> its outputs as CUDA tensors, in order."""
        import torch

        engine, context = self.session(graph)
        spec = self.manifest.graphs[graph]
        held = []  # the inputs' device copies live until the run is over
        for name in spec.inputs:
            value = feed[name]
            tensor = (
                value if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value))
            )
            dtype = getattr(torch, _TORCH_DTYPES[engine.get_tensor_dtype(name).name])
            tensor = tensor.to(self.device, dtype).contiguous()
            if not context.set_input_shape(name, tuple(tensor.shape)):
                raise EdgememError(
                    f"engine {self.root}: {name} of shape {tuple(tensor.shape)} is outside the TensorRT "
                    f"plan's profile (answers are limited to its token budget)"
                )
            context.set_tensor_address(name, self._address(tensor))
            held.append(tensor)
        outputs = []
        for name in spec.outputs:
            dtype = getattr(torch, _TORCH_DTYPES[engine.get_tensor_dtype(name).name])
            tensor = torch.empty(tuple(context.get_tensor_shape(name)), dtype=dtype, device=self.device)
            context.set_tensor_address(name, self._address(tensor))
            outputs.append(tensor)
        stream = torch.cuda.current_stream(self.device)
        if not context.execute_async_v3(stream.cuda_stream):
            raise EdgememError(f"engine {self.root}: TensorRT could not run {graph}")
        stream.synchronize()
        return outputs

    def step(self, ids: Sequence[int] | np.ndarray, state: NumpyState) -> NumpyState:
        """One segment: ids [n] or [1, n] (as `OrtEngine.step`) -> the new state (on the host)."""
        feed: dict[str, Any] = self._state_feed(state, "state_in.")
        feed["input_ids"] = self._segment_ids(ids)
        outputs = self._run(STEP_GRAPH, feed)
        return {n: t.float().cpu().numpy() for n, t in zip(self.manifest.state_shapes, outputs, strict=True)}

    def forward(
        self, ids: Sequence[int] | np.ndarray, past: list[Any], state: NumpyState
    ) -> tuple[np.ndarray, list[Any]]:
        """As `OrtEngine.forward`; the returned cache stays on the GPU."""
        spec = self.manifest.graphs[ANSWER_GRAPH]
        feed: dict[str, Any] = self._state_feed(state, "state.")
        feed["input_ids"] = np.asarray(ids, dtype=np.int64).reshape(1, -1)
        feed.update(zip(spec.inputs[1 : 1 + len(past)], past, strict=True))
        logits, *present = self._run(ANSWER_GRAPH, feed)
        return logits[0].float().cpu().numpy(), present


class OrtRuntime:
    """An engine (`OrtEngine`, or `TrtEngine`) behind the `Runtime` interface (MemoryState values, a
    transformers tokenizer).

    numpy and torch share the state's memory on the way in and out: nothing is copied per segment
    beyond what ONNX Runtime writes.
    """

    def __init__(self, engine: BundleEngine, tokenizer: Any) -> None:
        from edgemem.armt import ARMTConfig, parse_config

        m = engine.manifest
        self.engine = engine
        self.backend = engine.backend
        self.tokenizer = tokenizer
        self.name = m.model_name
        self.model_id = m.engine_id
        self.adapter_hash = m.adapter_hash
        if m.armt_config is not None:
            self.config = parse_config(m.armt_config, f"engine {engine.root}")
        else:  # a SWAX bundle or an older export: the fields the manifest lists
            self.config = ARMTConfig(tuple(m.memory_layers), m.segment_len, m.num_write_tokens, m.d_mem, m.nu)
        if m.quantization:
            self.backend = f"{engine.backend}-{m.quantization}"

    @property
    def device(self) -> torch.device:
        import torch

        return torch.device("cpu")

    @property
    def trained(self) -> bool:
        return self.engine.manifest.trained

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v) for k, v in self.engine.manifest.state_shapes.items()}

    def _to_torch(self, state: NumpyState, writes: int) -> MemoryState:
        import torch

        from edgemem.armt import MemoryState

        return MemoryState.from_named_tensors({k: torch.from_numpy(v) for k, v in state.items()}, writes)

    @staticmethod
    def _to_numpy(state: MemoryState) -> NumpyState:
        return {k: v.detach().cpu().float().numpy() for k, v in state.named_tensors().items()}

    def empty_state(self) -> MemoryState:
        return self._to_torch(self.engine.empty_state(), 0)

    def step(self, input_ids: torch.Tensor, state: MemoryState) -> tuple[MemoryState, None]:
        new = self.engine.step(input_ids.cpu().numpy(), self._to_numpy(state))
        return self._to_torch(new, state.writes + 1), None

    def generate_ids(
        self, state: MemoryState, prompt: list[int], stop_ids: set[int], **gen: Any
    ) -> Iterator[int]:
        return self.engine.generate_ids(self._to_numpy(state), prompt, stop_ids, **gen)


def bundle_engine(
    path: str | Path, options: OrtOptions | None = None, backend: str | None = None
) -> BundleEngine:
    """The engine for a bundle: TensorRT when it holds plans (`--to tensorrt`), else ONNX Runtime;
    `backend` ('onnxruntime' or 'tensorrt') overrides the choice (a TensorRT bundle keeps its ONNX
    graphs)."""
    if backend is None:
        backend = "tensorrt" if read_manifest(path).tensorrt else "onnxruntime"
    if backend == "tensorrt":
        return TrtEngine(path)
    if backend == "onnxruntime":
        return OrtEngine(path, options)
    raise EdgememError(f"unknown engine backend {backend!r}: use onnxruntime or tensorrt")


def open_engine(
    path: str | Path,
    *,
    model: str | None = None,
    adapter: str | Path | None = None,
    options: OrtOptions | None = None,
    backend: str | None = None,
) -> OrtRuntime:
    """Open an engine bundle for the app (see `bundle_engine` for the backend). `model` and
    `adapter`, when given, must be what the bundle was exported from; anything else is refused with
    a one-line message."""
    engine = bundle_engine(path, options, backend)
    if engine.manifest.architecture == "swax":  # a SWAX bundle: a byte model with graphs of its own
        from edgemem.swax_runtime import open_swax_engine

        return open_swax_engine(engine, model=model, adapter=adapter)  # type: ignore[return-value]
    adapter_sha = None
    if adapter is not None:
        adapter_path = Path(adapter).expanduser()
        require_file(adapter_path, "adapter")
        adapter_sha = sha256_file(adapter_path)
    check_fits(engine.manifest, engine.root, model=model, adapter_file_sha256=adapter_sha)
    return OrtRuntime(engine, load_tokenizer(engine))


def default_engine_dir(model_name: str, quantization: str | None = None) -> Path:
    """Where `edgemem export` puts a registry model's bundle when no --out is given."""
    from edgemem.paths import data_dir

    return data_dir() / "engines" / (f"{model_name}-{quantization}" if quantization else model_name)


def find_default_engine(model: str, adapter: str | Path | None = None) -> Path | None:
    """The exported float32 engine of a registry model, if there is one that fits: built from the
    same model file and the same adapter (the one given, else the one shipped, else none)."""
    from edgemem.export.bundle import MANIFEST
    from edgemem.models import REGISTRY

    root = default_engine_dir(model)
    if model not in REGISTRY or not (root / MANIFEST).is_file():
        return None
    try:
        manifest = read_manifest(root)
    except EdgememError:
        return None
    if manifest.quantization is not None or manifest.tensorrt:
        return None  # the default is the float32 CPU engine: int8 changes answers, plans need a GPU
    if adapter is None:
        from edgemem.assistant import shipped_adapter

        adapter = shipped_adapter(model)
    adapter_sha = sha256_file(Path(adapter).expanduser()) if adapter is not None else None
    if adapter_sha != manifest.adapter_file_sha256:
        return None
    if manifest.model_id != f"{model}@{sha256_file(REGISTRY[model].locate())[:16]}":
        return None
    return root


def load_tokenizer(engine: BundleEngine) -> Any:
    """The bundle's tokenizer through transformers (chat template included), from its files only."""
    import warnings

    from transformers import AutoTokenizer

    folder = engine.root / "tokenizer"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise EdgememError(f"engine {engine.root}: cannot read its tokenizer: {exc}") from exc
