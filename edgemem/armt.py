"""ARMT: an associative recurrent memory wrapped around a pretrained decoder.

The input is cut into segments of S tokens. Each segment runs through the base model as usual,
with M learned write tokens appended at its end. In every memory layer the hidden states are
first given what the memory returns for them (the read), and after the layer the outputs of the
write tokens are written into the memory with the delta rule (`edgemem.memory`).

The one contract everything else builds on:

    step(input_ids [B, S], state) -> state'       # read, run the segment, write
    answer(state, question) -> iterator of text   # the question is the last segment: read only

`MemoryState` is a plain value (per memory layer A [B, K, D] and z [B, K]) that functions take
and return; nothing about a document is stored on a module.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import psutil
import torch
from safetensors.torch import save
from torch import Tensor, nn

from edgemem.errors import EdgememError
from edgemem.files import atomic_write_bytes, read_safetensors, require_file
from edgemem.memory import AssociativeMemory

ADAPTER_FORMAT = "edgemem-adapter/1"


def default_memory_layers(num_layers: int, fraction: float = 0.2) -> tuple[int, ...]:
    """About `fraction` of the layers, evenly spread over the middle and upper part (from 40% depth).

    30 layers (SmolLM2) -> (12, 15, 18, 21, 24, 27); 18 layers (Gemma-3-270M) -> (7, 9, 12, 15).
    """
    count = max(1, round(fraction * num_layers))
    start = int(0.4 * num_layers)
    step = (num_layers - start) / count
    return tuple(sorted({start + int(i * step) for i in range(count)}))


WRITE_SOURCES = ("write_tokens", "segment")


@dataclass(frozen=True)
class ARMTConfig:
    """Memory hyper-parameters. They travel with the adapter file.

    segment_len: 512 tokens by default. The segment is the attention window of each step: long
    enough for a passage and a question to sit together, short enough that attention stays cheap
    on a CPU, and 16 write tokens add only 3% to every segment (256 would add 6%, and give the
    memory twice as many writes to compress).
    """

    memory_layers: tuple[int, ...]
    segment_len: int = 512
    num_write_tokens: int = 16
    d_mem: int = 64
    nu: int = 3
    lora_rank: int = 0  # > 0: low-rank adapters on every decoder layer's projections (LORA_TARGETS)
    lora_alpha: float = 16.0
    # The memory works in the layer's normalised space: its projections see the hidden states
    # through the layer's own input RMSNorm (`input_layernorm`, frozen base weights), and what it
    # reads is scaled back by each token's rms before it joins the residual stream. Without it the
    # memory sees the raw stream, whose scale in SmolLM2 runs from rms ~5 to a max of ~25,000 (a
    # segment's first token), and W_V's gradients reach hundreds; with the norm but no rescaling
    # the read is ~1/200 of the stream and the memory gets no gradient worth the name
    # (docs/RESULTS.md, "Training the memory").
    norm_inputs: bool = False
    # What each segment writes: "write_tokens" (the paper: the layer outputs of the M write tokens)
    # or "segment" (those of every token of the segment and the write tokens; the delta rule and
    # the gate beta choose what stays). Untrained write tokens attend to nothing in particular and
    # carry the segment's facts at chance, so the memory has no signal to learn from; the
    # segment's own tokens carry them (docs/RESULTS.md, "Training the memory").
    write_source: str = "write_tokens"
    # The answer window (0: off). An answer reads the document's last 1..S tokens (the tail) in its
    # prompt and writes them into memory first (`answer_state`). With W > 0 the tail is the last
    # W - S + 1..W tokens (whole segments before it are written, W >= S) and it is not written: it
    # sits beside the question, read by attention only, as in `p_view` training items. The adapters
    # trained so far do not copy well from there (docs/RESULTS.md, "Twenty-eighth session"). It
    # changes which segments a stored state holds, so it travels with the adapter and its hash.
    answer_window: int = 0
    # A per-token gate on each memory read (`AssociativeMemory.gate`), so that a token can read
    # nothing: the read is otherwise a full-size mean of the memory for every token, and reading a
    # document's first part at the question takes away the copy of an answer in view
    # (docs/RESULTS.md, "Twenty-ninth session"). Starts open (g = 1): training may add it to an
    # ungated adapter (`TrainConfig.read_gate`, `init`).
    read_gate: bool = False
    # Sentence-aligned segments (0: off, every segment S tokens). With N > 0 a written segment ends
    # after the last sentence end (a token ending in . ! ? or holding a newline:
    # `sentence_end_ids`) among its last N tokens, so it holds S - N + 1..S tokens, and a sentence
    # of up to N tokens is never cut in two. A needle cut by a segment boundary writes its number
    # without its key beside it, and the adapters never saw one in training (their needles sit
    # inside a segment): the shipped adapter answered 2 of the 12 test items at 2k-32k whose
    # needle a fixed boundary cut, and all 12 with N = 48 (docs/RESULTS.md, "Forty-second
    # session"). It changes which segments a stored state holds, so it travels with the adapter
    # and its hash, as answer_window does.
    segment_align: int = 0

    @classmethod
    def for_model(cls, num_layers: int, **overrides: object) -> ARMTConfig:
        overrides.setdefault("memory_layers", default_memory_layers(num_layers))
        overrides["memory_layers"] = tuple(overrides["memory_layers"])  # type: ignore[arg-type]
        return cls(**overrides)  # type: ignore[arg-type]

    def to_json(self) -> str:
        """JSON of the config; without LoRA the LoRA fields are left out, and so are norm_inputs when
        off and write_source when "write_tokens", so adapters and stored states keyed by the config
        keep the hashes they had before those options existed (answer_window and segment_align too,
        when 0, and read_gate when off)."""
        data = asdict(self)
        if not self.lora_rank:
            del data["lora_rank"], data["lora_alpha"]
        if not self.norm_inputs:
            del data["norm_inputs"]
        if self.write_source == "write_tokens":
            del data["write_source"]
        if not self.answer_window:
            del data["answer_window"]
        if not self.read_gate:
            del data["read_gate"]
        if not self.segment_align:
            del data["segment_align"]
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ARMTConfig:
        data = json.loads(text)
        data["memory_layers"] = tuple(data["memory_layers"])
        return cls(**data)


@dataclass(frozen=True)
class MemoryState:
    """The whole memory of a document: per memory layer A [B, K, D] and z [B, K] (float32).

    `writes` counts the segments written so far; the first write follows its own rule.
    The shapes never depend on how many segments were written.
    """

    A: dict[int, Tensor]
    z: dict[int, Tensor]
    writes: int = 0

    def named_tensors(self) -> dict[str, Tensor]:
        """Flat names for saving: 'layers.<i>.A', 'layers.<i>.z'."""
        out: dict[str, Tensor] = {}
        for layer in sorted(self.A):
            out[f"layers.{layer}.A"] = self.A[layer]
            out[f"layers.{layer}.z"] = self.z[layer]
        return out

    @classmethod
    def from_named_tensors(cls, tensors: dict[str, Tensor], writes: int) -> MemoryState:
        A, z = {}, {}
        for name, tensor in tensors.items():
            parts = name.split(".")
            if len(parts) != 3 or parts[0] != "layers" or parts[2] not in ("A", "z"):
                continue
            (A if parts[2] == "A" else z)[int(parts[1])] = tensor
        return cls(A, z, writes)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.named_tensors().values())

    def rows(self, rows: list[int]) -> MemoryState:
        """The states of some batch rows, in that order ([B, ...] -> [len(rows), ...], a copy)."""
        index = torch.tensor(rows, device=next(iter(self.A.values())).device)
        return MemoryState(
            {i: a.index_select(0, index) for i, a in self.A.items()},
            {i: z.index_select(0, index) for i, z in self.z.items()},
            self.writes,
        )

    @classmethod
    def cat(cls, states: list[MemoryState]) -> MemoryState:
        """Batch rows side by side: states of equal `writes`, [B_i, ...] each -> [sum B_i, ...]."""
        if len({s.writes for s in states}) != 1:
            raise ValueError("only states with the same number of writes can be batched")
        first = states[0]
        return cls(
            {i: torch.cat([s.A[i] for s in states]) for i in first.A},
            {i: torch.cat([s.z[i] for s in states]) for i in first.z},
            first.writes,
        )


@dataclass
class _SegmentContext:
    """Per-call carrier of the state through the decoder (passed as a forward kwarg, never stored)."""

    state: MemoryState
    write_tokens: int  # 0: read only (the answer segment)
    new_A: dict[int, Tensor] = field(default_factory=dict)
    new_z: dict[int, Tensor] = field(default_factory=dict)
    # given: each memory layer puts its write input m here instead of writing (`ARMT.write_inputs`)
    write_inputs: dict[int, Tensor] | None = None


class MemoryLayer(nn.Module):
    """Wraps one decoder layer: memory read at its input, memory write from its write-token outputs
    (from every token's outputs with `write_segment`, ARMTConfig.write_source = "segment").

    Holds a reference to the original layer (no copy of base weights). Without an `armt` context
    it is exactly the original layer.
    """

    def __init__(
        self,
        layer: nn.Module,
        memory: AssociativeMemory,
        index: int,
        norm: nn.Module | None = None,
        write_segment: bool = False,
    ) -> None:
        super().__init__()
        self.layer = layer
        self.memory = memory
        self.index = index
        self.write_segment = write_segment  # write every token's output, not only the write tokens'
        # The layer's own input RMSNorm when config.norm_inputs. Held in a tuple so that it is not
        # registered a second time: it already belongs to `layer`, and state dicts stay as they were.
        self._norm = (norm,) if norm is not None else ()

    def _memory_input(self, h: Tensor) -> Tensor:
        return self._norm[0](h) if self._norm else h

    def _read(self, h: Tensor, A: Tensor, z: Tensor) -> Tensor:
        """What the memory adds to the layer input h [B, T, D] (float32)."""
        read = self.memory.read(self._memory_input(h), A, z)
        if self._norm:  # back from the normalised space to the scale of each token's stream
            read = read * h.float().pow(2).mean(-1, keepdim=True).sqrt()
        return read

    def forward(self, hidden_states: Tensor, *args: object, armt: _SegmentContext | None = None, **kwargs):
        if armt is None:
            return self.layer(hidden_states, *args, **kwargs)
        A, z = armt.state.A[self.index], armt.state.z[self.index]
        if armt.state.writes > 0:  # an empty memory reads exactly zero: skip the work
            hidden_states = hidden_states + self._read(hidden_states, A, z).to(hidden_states.dtype)
        out = self.layer(hidden_states, *args, **kwargs)
        if armt.write_tokens:
            m = self._memory_input(out if self.write_segment else out[:, -armt.write_tokens :])
            if armt.write_inputs is not None:
                armt.write_inputs[self.index] = m
            else:
                armt.new_A[self.index], armt.new_z[self.index] = self.memory.write(
                    m, A, z, first=armt.state.writes == 0
                )
        return out


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update: y = W x + (alpha / r) B A x.

    A [r, in] is random, B [out, r] starts at zero, so a fresh LoRA changes nothing. Holds a
    reference to the original layer (no copy of base weights). The update runs in float32.
    """

    def __init__(self, linear: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.linear = linear
        self.scale = alpha / rank
        self.A = nn.Parameter(torch.randn(rank, linear.in_features) / linear.in_features**0.5)
        self.B = nn.Parameter(torch.zeros(linear.out_features, rank))
        self.merged = False  # the update is folded into linear.weight (ARMT.merge_lora)

    def merge(self) -> None:
        """W <- W + (alpha / r) B A, summed in float32 and stored in W's dtype; forward is then
        W x alone. A and B stay (the adapter's hash and file do not change)."""
        with torch.no_grad():
            weight = self.linear.weight
            delta = self.scale * (self.B.detach().float() @ self.A.detach().float())
            weight.copy_((weight.float() + delta.to(weight.device)).to(weight.dtype))
        self.merged = True

    def forward(self, x: Tensor) -> Tensor:
        if self.merged:
            return self.linear(x)
        update = (x.float() @ self.A.t()) @ self.B.t()
        return self.linear(x) + (self.scale * update).to(x.dtype)


def _lora_sites(layer: nn.Module) -> list[tuple[nn.Module, str]]:
    """(parent module, attribute) of every LoRA target inside one decoder layer, in a fixed order."""
    sites = []
    for module in layer.modules():
        for attr in LORA_TARGETS:
            child = getattr(module, attr, None)
            if isinstance(child, nn.Linear | LoRALinear) and attr in dict(module.named_children()):
                sites.append((module, attr))
    return sites


def _decoder_layers(base: nn.Module) -> nn.ModuleList:
    layers = getattr(getattr(base, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise EdgememError(f"{type(base).__name__}: no decoder-layer list at .model.layers")
    return layers


class ARMT(nn.Module):
    """A base causal LM with associative memory in `config.memory_layers`.

    The memory parameters (per layer W_Q, W_K, W_V, W_b, and the M write embeddings) are float32
    and are the only new weights; they are created deterministically from `seed` so an untrained
    memory always has the same adapter hash. Wrapping replaces any wrappers an earlier ARMT left
    on the same base model: a base model serves one ARMT at a time.
    """

    def __init__(self, base: nn.Module, config: ARMTConfig, seed: int = 0) -> None:
        super().__init__()
        layers = _decoder_layers(base)
        bad = [i for i in config.memory_layers if not 0 <= i < len(layers)]
        if bad:
            raise EdgememError(f"memory layers {bad} out of range: the model has {len(layers)} layers")
        if config.write_source not in WRITE_SOURCES:
            raise EdgememError(
                f"write_source must be one of {', '.join(WRITE_SOURCES)}, not {config.write_source!r}"
            )
        self.base = base
        self.config = config
        d_model = base.config.hidden_size
        embed = base.get_input_embeddings()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.memories = nn.ModuleDict(
                {
                    str(i): AssociativeMemory(d_model, config.d_mem, config.nu, gate=config.read_gate)
                    for i in config.memory_layers
                }
            )
            std = embed.weight.detach().float().std().item()
            self.write_embeddings = nn.Parameter(torch.randn(config.num_write_tokens, d_model) * std)
        for j, layer in enumerate(layers):  # a base model serves one ARMT at a time: the newest
            if isinstance(layer, MemoryLayer):
                layers[j] = layer.layer
            for parent, attr in _lora_sites(layers[j]):
                child = getattr(parent, attr)
                if isinstance(child, LoRALinear):
                    if child.merged:
                        raise EdgememError("this base model holds merged LoRA weights: load it again")
                    setattr(parent, attr, child.linear)
        self.lora = nn.ModuleDict()
        if config.lora_rank:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed + 1)
                for j, layer in enumerate(layers):
                    for parent, attr in _lora_sites(layer):
                        wrapped = LoRALinear(getattr(parent, attr), config.lora_rank, config.lora_alpha)
                        setattr(parent, attr, wrapped)
                        self.lora[f"{j}_{attr}"] = wrapped
        for i in config.memory_layers:
            norm = getattr(layers[i], "input_layernorm", None) if config.norm_inputs else None
            if config.norm_inputs and not isinstance(norm, nn.Module):
                raise EdgememError(f"norm_inputs: layer {i} of {type(base).__name__} has no input_layernorm")
            write_segment = config.write_source == "segment"
            layers[i] = MemoryLayer(layers[i], self.memories[str(i)], i, norm, write_segment)

    # ----- the state -----

    def empty_state(self, batch: int = 1) -> MemoryState:
        device = self.write_embeddings.device
        A, z = {}, {}
        for i in self.config.memory_layers:
            A[i], z[i] = self.memories[str(i)].empty_state(batch, device)
        return MemoryState(A, z, 0)

    def state_shapes(self, batch: int = 1) -> dict[str, tuple[int, ...]]:
        return {name: tuple(t.shape) for name, t in self.empty_state(batch).named_tensors().items()}

    @property
    def device(self) -> torch.device:
        """Where the segment ids go (the device of the memory parameters)."""
        return self.write_embeddings.device

    # ----- the segment step -----

    def _embed(self, input_ids: Tensor, write: bool) -> Tensor:
        """[B, S] ids -> [B, S (+ M), D] input embeddings, write tokens appended when `write`."""
        embeds = self.base.get_input_embeddings()(input_ids)
        if write:
            batch = input_ids.shape[0]
            mem = self.write_embeddings.to(embeds.dtype).unsqueeze(0).expand(batch, -1, -1)
            embeds = torch.cat([embeds, mem], dim=1)
        return embeds

    def step(
        self, input_ids: Tensor, state: MemoryState, return_logits: bool = False
    ) -> tuple[MemoryState, Tensor | None]:
        """Run one segment: read memory, run the base model, write the segment into memory.

        input_ids [B, S] -> (new state, logits [B, S, V] for the segment tokens if asked).
        """
        ctx = _SegmentContext(state, self.config.num_write_tokens)
        embeds = self._embed(input_ids, write=True)
        if return_logits:
            out = self.base(inputs_embeds=embeds, use_cache=False, armt=ctx)
            logits = out.logits[:, : input_ids.shape[1]]
        else:  # ingest needs no logits: skip the LM head
            self.base.model(inputs_embeds=embeds, use_cache=False, armt=ctx)
            logits = None
        return MemoryState(ctx.new_A, ctx.new_z, state.writes + 1), logits

    def write_inputs(self, input_ids: Tensor, state: MemoryState) -> dict[int, Tensor]:
        """Run one segment as `step` does, reading `state`, and return what each memory layer would
        write from instead of writing it: {layer: m}, m [B, M, D] (the write tokens' outputs) or,
        with write_source = "segment", [B, S + M, D]. `self.memories[str(layer)].write(m, A, z,
        first)` is then the layer's new (A, z), as `step` computes it.
        """
        ctx = _SegmentContext(state, self.config.num_write_tokens, write_inputs={})
        self.base.model(inputs_embeds=self._embed(input_ids, write=True), use_cache=False, armt=ctx)
        assert ctx.write_inputs is not None
        return ctx.write_inputs

    def read_only_forward(self, input_ids: Tensor, state: MemoryState, cache: object | None = None) -> Tensor:
        """The answer segment and each generated token: read memory, never write.

        input_ids [B, T] -> logits [B, V] of the last position; `cache` (a DynamicCache) grows by T.
        """
        ctx = _SegmentContext(state, 0)
        out = self.base(
            inputs_embeds=self._embed(input_ids, write=False),
            cache=cache,
            use_cache=cache is not None,
            logits_to_keep=1,
            armt=ctx,
        )
        return out.logits[:, -1]

    def read_only_hidden(self, input_ids: Tensor, state: MemoryState) -> Tensor:
        """The answer segment for training: read memory, never write, no cache.

        input_ids [B, T] -> final hidden states [B, T, D] (after the last norm; apply
        `base.lm_head` to the positions that carry a loss).
        """
        ctx = _SegmentContext(state, 0)
        out = self.base.model(inputs_embeds=self._embed(input_ids, write=False), use_cache=False, armt=ctx)
        return out.last_hidden_state

    # ----- the adapter (memory parameters) -----

    def adapter_parameters(self) -> list[nn.Parameter]:
        """What training changes: the memories, the write embeddings and the LoRA matrices."""
        lora = [p for m in self.lora.values() for p in (m.A, m.B)]
        return [*self.memories.parameters(), self.write_embeddings, *lora]

    def adapter_tensors(self) -> dict[str, Tensor]:
        tensors = {f"memory.{k}": v.detach().contiguous() for k, v in self.memories.state_dict().items()}
        tensors["write_embeddings"] = self.write_embeddings.detach().contiguous()
        for name, module in self.lora.items():
            tensors[f"lora.{name}.A"] = module.A.detach().contiguous()
            tensors[f"lora.{name}.B"] = module.B.detach().contiguous()
        return tensors

    def merge_lora(self) -> None:
        """Fold every LoRA update into its base weight, for inference: one matrix product per
        projection instead of three, and no float32 round trip (`scripts/armt_batch_speed.py`).
        The same function up to rounding in the weights' dtype (float32: logits to 1e-5, tested).
        The adapter's tensors and hash stay; the base model is changed for good: no other adapter
        can be loaded into this ARMT, and no other ARMT built on its base."""
        for module in self.lora.values():
            if not module.merged:
                module.merge()

    def load_adapter_tensors(self, tensors: dict[str, Tensor]) -> None:
        if any(m.merged for m in self.lora.values()):
            raise EdgememError("this memory's LoRA is merged into the base weights: load the model again")
        expected = self.adapter_tensors()
        if set(tensors) != set(expected):
            missing, extra = set(expected) - set(tensors), set(tensors) - set(expected)
            raise EdgememError(
                f"adapter does not fit this model (missing {sorted(missing)[:3]}, extra {sorted(extra)[:3]})"
            )
        for name, tensor in tensors.items():
            if tensor.shape != expected[name].shape:
                raise EdgememError(
                    f"adapter tensor {name} has shape {tuple(tensor.shape)}, "
                    f"expected {tuple(expected[name].shape)}"
                )
        with torch.no_grad():
            self.write_embeddings.copy_(tensors["write_embeddings"])
            self.memories.load_state_dict(
                {k[len("memory.") :]: v for k, v in tensors.items() if k.startswith("memory.")}
            )
            for name, module in self.lora.items():
                module.A.copy_(tensors[f"lora.{name}.A"])
                module.B.copy_(tensors[f"lora.{name}.B"])

    def adapter_bytes(self, metadata: dict[str, str] | None = None) -> bytes:
        meta = {"format": ADAPTER_FORMAT, "config": self.config.to_json(), **(metadata or {})}
        return save(self.adapter_tensors(), metadata=meta)

    def adapter_hash(self) -> str:
        """sha256 of the memory parameters and config: part of every stored state's key."""
        return adapter_hash(self.config, self.adapter_tensors())

    def is_trained(self) -> bool:
        """An untrained memory has W_V == 0 everywhere and therefore always reads zeros (and an
        untrained LoRA has B == 0)."""
        return any(bool(m.W_V.weight.abs().sum() > 0) for m in self.memories.values()) or any(
            bool(m.B.abs().sum() > 0) for m in self.lora.values()
        )


def adapter_hash(config: ARMTConfig, tensors: dict[str, Tensor]) -> str:
    """sha256 of a memory config and its adapter tensors (as float32), without a base model:
    equal to `ARMT.adapter_hash()` of a model that loaded them."""
    digest = hashlib.sha256(config.to_json().encode())
    for name, tensor in sorted(tensors.items()):
        digest.update(name.encode())
        digest.update(tensor.float().contiguous().numpy().tobytes())
    return digest.hexdigest()


def save_adapter(armt: ARMT, path: Path, metadata: dict[str, str] | None = None) -> None:
    """Write the memory parameters as safetensors (temporary file, then rename)."""
    atomic_write_bytes(Path(path), armt.adapter_bytes(metadata))


def read_adapter(path: Path) -> tuple[ARMTConfig, dict[str, Tensor]]:
    """Read an adapter file: (its memory config, its tensors). Refuses anything that is not one."""
    path = Path(path)
    require_file(path, "adapter")
    meta, tensors = read_safetensors(path, "adapter")
    if meta.get("format") != ADAPTER_FORMAT or "config" not in meta:
        raise EdgememError(f"adapter {path} has no edgemem adapter metadata")
    config = parse_config(meta["config"], f"adapter {path}")
    for name, tensor in tensors.items():
        if not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
            raise EdgememError(f"adapter {path}: tensor {name} is not finite floating point")
    return config, tensors


def parse_config(text: str, owner: str) -> ARMTConfig:
    """An ARMTConfig from its JSON as stored in an adapter or a bundle manifest (`owner` names it in
    the one-line error a damaged or forged one gets)."""
    try:
        config = ARMTConfig.from_json(text)
    except (ValueError, TypeError, KeyError) as exc:
        raise EdgememError(f"{owner} has an invalid memory config: {exc}") from exc
    if problem := config_problem(config):
        raise EdgememError(f"{owner} has an invalid memory config: {problem}")
    return config


MAX_ANSWER_WINDOW = 1 << 20


def answer_window_problem(window: object, segment_len: int) -> str | None:
    """Why `window` cannot be an answer window over segments of `segment_len` tokens, or None: it is
    0 (off) or a whole number of tokens from one segment up (`ARMTConfig.answer_window`)."""
    whole = isinstance(window, int) and not isinstance(window, bool)
    if whole and (window == 0 or segment_len <= window <= MAX_ANSWER_WINDOW):
        return None
    return (
        f"answer_window {window!r} is neither 0 nor a whole number from segment_len ({segment_len}) "
        f"to {MAX_ANSWER_WINDOW}"
    )


def config_problem(config: ARMTConfig) -> str | None:
    """What makes a memory config unusable (a forged or damaged file, or a user's override of its
    segment length or answer window), or None."""

    def whole(value: object, low: int, high: int) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high

    layers = config.memory_layers
    if not layers or not all(whole(i, 0, 4096) for i in layers) or len(set(layers)) != len(layers):
        return f"memory_layers {list(layers)[:8]!r}"
    limits = {"segment_len": (1, 1 << 16), "num_write_tokens": (1, 1024), "d_mem": (1, 4096), "nu": (1, 16)}
    for name, (low, high) in limits.items():
        if not whole(getattr(config, name), low, high):
            return f"{name} {getattr(config, name)!r} is not a whole number from {low} to {high}"
    if not isinstance(config.norm_inputs, bool):
        return f"norm_inputs {config.norm_inputs!r} is not true or false"
    if not isinstance(config.read_gate, bool):
        return f"read_gate {config.read_gate!r} is not true or false"
    if config.write_source not in WRITE_SOURCES:
        return f"write_source {config.write_source!r} is not one of {', '.join(WRITE_SOURCES)}"
    if problem := answer_window_problem(config.answer_window, config.segment_len):
        return problem
    if not whole(config.segment_align, 0, config.segment_len - 1):
        return f"segment_align {config.segment_align!r} is not a whole number from 0 to segment_len - 1"
    if not whole(config.lora_rank, 0, 1024):
        return f"lora_rank {config.lora_rank!r} is not a whole number from 0 to 1024"
    alpha = config.lora_alpha
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < 1e6:
        return f"lora_alpha {alpha!r} is not a positive number"
    return None


def override_config(
    config: ARMTConfig,
    segment_len: int | None = None,
    segment_align: int | None = None,
    answer_window: int | None = None,
) -> ARMTConfig:
    """`config` read another way (None: the config's own). A `segment_len` alone keeps an aligned
    config's alignment at its share of the segment (48 of 128 is 96 of 256); a `segment_align` is
    taken as given (0: fixed segments). Raises EdgememError (one line) when the result is unusable,
    e.g. a window shorter than a segment or an alignment as long as one."""
    if segment_len is not None:
        align = config.segment_align * segment_len // config.segment_len
        config = replace(config, segment_len=segment_len, segment_align=align)
    if segment_align is not None:
        config = replace(config, segment_align=segment_align)
    if answer_window is not None:
        config = replace(config, answer_window=answer_window)
    if problem := config_problem(config):
        raise EdgememError(f"memory settings: {problem}")
    return config


# ----- the segment driver -----


@dataclass(frozen=True)
class Progress:
    """What the ingest driver reports after each segment.

    `tokens` counts every token written so far, those of a resumed checkpoint included;
    `start_tokens` is where this run started (0, or the checkpoint it resumed from), so the rate is
    measured on this run's own work.
    """

    tokens: int
    segments: int
    seconds: float
    rss_bytes: int
    start_tokens: int = 0

    @property
    def tokens_per_s(self) -> float:
        return (self.tokens - self.start_tokens) / self.seconds if self.seconds > 0 else 0.0


class IngestCancelled(EdgememError):
    """The ingest was asked to stop between segments; its state up to there was checkpointed."""

    def __init__(self, tokens: int, saved: bool) -> None:
        how = "saved: ingest again to resume" if saved else "nothing was saved"
        super().__init__(f"ingest cancelled after {tokens:,} tokens ({how})")
        self.tokens = tokens
        self.saved = saved


@dataclass(frozen=True)
class IngestResult:
    """A document after ingest: its memory, and its last (unwritten) tokens, 1..S of them (with an
    answer window W, `ARMTConfig.answer_window`: W - S + 1..W of them, or the whole of a shorter one).

    The tail is not written at ingest: the state stays one of whole segments (resumable, and the
    prefix of any longer document). An answer shows it beside the question, as the reference ARMT
    generation does, and without an answer window also writes it first (`answer_state`).
    """

    state: MemoryState
    tail_ids: list[int]
    tokens: int


def tokenize_stream(text_chunks: Iterable[str], tokenizer: object) -> Iterator[list[int]]:
    """Token ids for a stream of text pieces, with the model's BOS token first if it uses one."""
    bos = getattr(tokenizer, "bos_token_id", None)
    probe = tokenizer("a").input_ids  # type: ignore[operator]
    if bos is not None and probe and probe[0] == bos:
        yield [bos]
    for chunk in text_chunks:
        if chunk:
            yield tokenizer(chunk, add_special_tokens=False).input_ids  # type: ignore[operator]


def text_ids(text: str, tokenizer: object) -> list[int]:
    """All token ids of one text as an ingest reads them (`tokenize_stream`: BOS first where the
    model uses one): what the evaluation's armt method and the probes cut into segments."""
    return [i for chunk in tokenize_stream([text], tokenizer) for i in chunk]


def sentence_end_ids(tokenizer: object) -> frozenset[int]:
    """Ids of the tokens that end a sentence or a line (`ARMTConfig.segment_align`): their text,
    trailing spaces aside, ends in . ! or ?, or holds a newline."""
    ends = set()
    for i in range(len(tokenizer)):  # type: ignore[arg-type]
        text = tokenizer.decode([i])  # type: ignore[attr-defined]
        if "\n" in text or text.rstrip(" ").endswith((".", "!", "?")):
            ends.add(i)
    return frozenset(ends)


def alignment_ends(config: object, tokenizer: object) -> frozenset[int]:
    """The `ends` an ingest with this memory config needs: the tokenizer's `sentence_end_ids` when
    it aligns its segments (`ARMTConfig.segment_align`), else none (and no scan of the vocabulary;
    a SWAX runtime's config has no alignment)."""
    return sentence_end_ids(tokenizer) if getattr(config, "segment_align", 0) else frozenset()


def segment_end(ids: list[int], start: int, segment_len: int, align: int, ends: frozenset[int]) -> int:
    """Where the segment that starts at `start` ends (exclusive): start + S, or with `align` N > 0
    just after the last of `ends` among its last N ids (start + S - N + 1..start + S). Needs
    ids[start : start + S]; depends on nothing after them."""
    end = start + segment_len
    if align:
        for j in range(end - 1, end - 1 - align, -1):
            if ids[j] in ends:
                return j + 1
    return end


def iter_segments(
    token_chunks: Iterable[list[int]],
    segment_len: int,
    tail: list[int],
    window: int = 0,
    align: int = 0,
    ends: frozenset[int] = frozenset(),
) -> Iterator[list[int]]:
    """Segments of `segment_len` ids from chunks of any sizes, always keeping >= 1 token back
    (with an answer `window` >= S: keeping the last W - S + 1..W ids back, `ARMTConfig.answer_window`);
    with `align` N > 0 each one ends after its last id of `ends` among its last N ids
    (`segment_end`, `ARMTConfig.segment_align`), so it holds S - N + 1..S of them.

    When the chunks run out, the remaining 1..S ids (W - S + 1..W; all of them when there are
    fewer; with `align`, 1..S or W - S + 1..W as well, of the ids after the last segment) are left
    in `tail` (cleared first). Holds at most one pending chunk plus max(S, W) ids: nothing grows
    with the document.
    """
    tail.clear()
    buffer = tail
    keep = max(segment_len, window)  # written while more than this remain: `written_segments`
    for chunk in token_chunks:
        buffer.extend(chunk)
        offset = 0
        while len(buffer) - offset > keep:
            end = segment_end(buffer, offset, segment_len, align, ends)
            yield buffer[offset:end]
            offset = end
        del buffer[:offset]


def segment_bounds(
    ids: list[int], segment_len: int, window: int = 0, align: int = 0, ends: frozenset[int] = frozenset()
) -> list[int]:
    """Where each segment `iter_segments` writes of `ids` ends: [e_1, .., e_n], segment k being
    ids[e_{k-1} : e_k] (e_0 = 0); the tail is ids[e_n:]. Without `align`, e_k = k * S."""
    bounds, offset, keep = [], 0, max(segment_len, window)
    while len(ids) - offset > keep:
        offset = segment_end(ids, offset, segment_len, align, ends)
        bounds.append(offset)
    return bounds


def written_segments(n_tokens: int, segment_len: int, window: int = 0) -> int:
    """How many whole segments `iter_segments` writes of `n_tokens` ids (the rest is the tail), with
    fixed segments (aligned ones: `segment_bounds`)."""
    return max(0, -(-(n_tokens - max(segment_len, window)) // segment_len))


def _skip_tokens(token_chunks: Iterable[list[int]], count: int) -> Iterator[list[int]]:
    """The same stream without its first `count` ids (the part a checkpoint already holds)."""
    for chunk in token_chunks:
        if count >= len(chunk):
            count -= len(chunk)
            continue
        yield chunk[count:] if count else chunk
        count = 0


def ingest(
    armt: ARMT,
    token_chunks: Iterable[list[int]],
    state: MemoryState | None = None,
    progress: Callable[[Progress], None] | None = None,
    *,
    start_tokens: int = 0,
    checkpoint: Callable[[MemoryState, int], None] | None = None,
    checkpoint_every_s: float = 30.0,
    should_stop: Callable[[], bool] | None = None,
    ends: frozenset[int] = frozenset(),
) -> IngestResult:
    """Stream token chunks of any sizes through memory, one segment of S tokens at a time (with the
    config's `segment_align` N, S - N + 1..S tokens, each ending after a sentence: `ends` are the
    tokenizer's `sentence_end_ids`).

    `armt` is the model, or any engine with the same `config`, `device`, `empty_state` and `step`
    (the backends of `edgemem.runtime`). The last 1..S tokens are kept as the tail (see `IngestResult`;
    W - S + 1..W with the config's answer window W).

    Resuming: `state` is a checkpoint's state and `start_tokens` the number of ids it already
    holds (its writes times S, or with aligned segments its writes times S - N + 1..S); that many
    ids are skipped from the start of the same stream (a segment's end: the next one starts there), and
    the result is the one an uninterrupted run reaches. `checkpoint(state, tokens)` is called with
    the state after a whole segment at most every `checkpoint_every_s` seconds, when
    `should_stop()` says so between segments (then `IngestCancelled` is raised), and when anything
    else (Ctrl-C, a read error) interrupts the run.
    """
    S = armt.config.segment_len
    window = getattr(armt.config, "answer_window", 0)  # a SWAX runtime's config has none
    align = getattr(armt.config, "segment_align", 0)
    if align and not ends:
        raise EdgememError("aligned segments (segment_align) need the tokenizer's sentence ends")
    if start_tokens:
        writes = 0 if state is None else state.writes
        if not writes * (S - align + 1 if align else S) <= start_tokens <= writes * S:
            raise EdgememError(f"a resumed ingest needs a state with {start_tokens} / {S} writes")
        token_chunks = _skip_tokens(token_chunks, start_tokens)
    state = state or armt.empty_state()
    device = armt.device
    process = psutil.Process()
    tail: list[int] = []
    start = last_saved_at = time.perf_counter()
    written = saved = start_tokens

    def save() -> None:
        nonlocal saved, last_saved_at
        if checkpoint is not None and written > saved:
            checkpoint(state, written)
            saved, last_saved_at = written, time.perf_counter()

    try:
        with torch.inference_mode():
            for segment in iter_segments(token_chunks, S, tail, window, align, ends):
                state, _ = armt.step(torch.tensor([segment], dtype=torch.long, device=device), state)
                written += len(segment)
                if progress is not None:
                    seconds, rss = time.perf_counter() - start, process.memory_info().rss
                    progress(Progress(written, state.writes, seconds, rss, start_tokens))
                if should_stop is not None and should_stop():
                    save()
                    raise IngestCancelled(written, checkpoint is not None)
                if time.perf_counter() - last_saved_at >= checkpoint_every_s:
                    save()
    except IngestCancelled:
        raise
    except BaseException:
        # Ctrl-C, a read error, a crash in a step: `state` is still the last whole segment's.
        with contextlib.suppress(Exception):
            save()
        raise
    if start_tokens and not tail:
        raise EdgememError("the document is shorter than its saved checkpoint; ingest it again with --force")
    return IngestResult(state, tail, written + len(tail))


# ----- answering -----


def answer_state(model: object, state: MemoryState, tail_ids: list[int]) -> MemoryState:
    """The memory an answer reads: `state` with the document's unwritten tail written as one more,
    partial segment (input_ids [1, len(tail)], 1..S tokens). The tail is also in the prompt.

    The adapter learned to recall from memory: a needle left only in the visible tail was answered
    0 of 14 times, and 13 of 14 once written, with the written needles unchanged (66 of 80;
    `scripts/niah_tail_write.py`, docs/RESULTS.md). `model` is an `ARMT` or any runtime with
    `step(input_ids, state) -> (state, _)`, `device` and `config`. With an answer window
    (`ARMTConfig.answer_window`) the tail is left unwritten: `state` as it is.
    """
    if not tail_ids or getattr(model.config, "answer_window", 0):  # type: ignore[attr-defined]
        return state
    with torch.inference_mode():
        ids = torch.tensor([tail_ids], dtype=torch.long, device=model.device)  # type: ignore[attr-defined]
        new, _ = model.step(ids, state)  # type: ignore[attr-defined]
    return new


def stop_token_ids(tokenizer: object) -> set[int]:
    """End-of-sequence and end-of-turn ids of the model."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()  # type: ignore[attr-defined]
    vocab = tokenizer.get_vocab()  # type: ignore[attr-defined]
    ids.update(vocab[t] for t in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>") if t in vocab)
    return ids


def prompt_ids(tokenizer: object, tail_ids: list[int], question: str) -> list[int]:
    """The answer segment: the document's tail and the question, in the chat template when there is one."""
    if getattr(tokenizer, "chat_template", None):
        tail = tokenizer.decode(tail_ids, skip_special_tokens=True).strip()  # type: ignore[attr-defined]
        content = f"{tail}\n\nQuestion: {question}" if tail else question
        text = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
        return tokenizer(text, add_special_tokens=False).input_ids  # type: ignore[operator]
    suffix = tokenizer(f"\n\nQuestion: {question}\nAnswer:", add_special_tokens=False).input_ids  # type: ignore[operator]
    prefix = tail_ids or list(next(tokenize_stream([], tokenizer), []))
    return prefix + suffix


def _sample(logits: Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> int:
    """Greedy for temperature 0; otherwise nucleus sampling. logits [V] -> token id."""
    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sorted_probs, order = probs.sort(descending=True)
    keep = sorted_probs.cumsum(0) - sorted_probs < top_p
    sorted_probs = sorted_probs * keep
    choice = torch.multinomial(sorted_probs / sorted_probs.sum(), 1, generator=generator)
    return int(order[choice])


def generate_ids(
    armt: ARMT,
    state: MemoryState,
    prompt: list[int],
    stop_ids: set[int],
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 0.95,
    seed: int | None = None,
) -> Iterator[int]:
    """Generated token ids, one at a time: the prompt runs as the last segment reading memory,
    then decoding with a KV cache bounded by len(prompt) + max_new_tokens."""
    from transformers import DynamicCache

    device = armt.write_embeddings.device
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    with torch.inference_mode():
        cache = DynamicCache(config=armt.base.config)
        logits = armt.read_only_forward(torch.tensor([prompt], device=device), state, cache)
        for _ in range(max_new_tokens):
            token = _sample(logits[0], temperature, top_p, generator)
            if token in stop_ids:
                return
            yield token
            logits = armt.read_only_forward(torch.tensor([[token]], device=device), state, cache)


def answer(
    armt: ARMT,
    tokenizer: object,
    doc: IngestResult,
    question: str,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 0.95,
    seed: int | None = None,
) -> Iterator[str]:
    """Stream the answer to `question` about an ingested document, as pieces of text."""
    prompt = prompt_ids(tokenizer, doc.tail_ids, question)
    tokens = generate_ids(
        armt,
        answer_state(armt, doc.state, doc.tail_ids),
        prompt,
        stop_token_ids(tokenizer),
        max_new_tokens,
        temperature,
        top_p,
        seed,
    )
    return stream_text(tokenizer, tokens)


def stream_text(tokenizer: object, tokens: Iterable[int]) -> Iterator[str]:
    """Generated token ids -> the new pieces of text, never cutting a UTF-8 sequence."""
    ids: list[int] = []
    shown = ""
    for token in tokens:
        ids.append(token)
        text = tokenizer.decode(ids, skip_special_tokens=True)  # type: ignore[attr-defined]
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            continue
        if len(text) > len(shown):
            yield text[len(shown) :]
            shown = text
