"""A whole `Assistant` on the tiny random Llama: a real character-level tokenizer (built in memory
with `tokenizers`, nothing downloaded) and a memory that carries information (non-zero W_V)."""

from __future__ import annotations

import time

import torch
from tiny import VOCAB, tiny_llama
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from edgemem.armt import ARMT, ARMTConfig
from edgemem.assistant import Assistant
from edgemem.models import LoadedModel

SPECIALS = ["<unk>", "<s>", "</s>"]
CHARS = ["\n"] + [chr(c) for c in range(32, 123)]  # space .. 'z': 3 + 1 + 91 = 95 ids <= VOCAB


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate(SPECIALS + CHARS)}
    assert len(vocab) <= VOCAB
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def tiny_assistant(
    segment_len: int = 16, seed: int = 0, answer_window: int = 0, read_gate: bool = False
) -> Assistant:
    base = tiny_llama(seed)
    config = ARMTConfig.for_model(
        base.config.num_hidden_layers,
        segment_len=segment_len,
        num_write_tokens=3,
        d_mem=8,
        answer_window=answer_window,
        read_gate=read_gate,
    )
    armt = ARMT(base, config)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # a trained-looking memory: its state changes what the model says
        for mem in armt.memories.values():
            mem.W_V.weight.copy_(torch.randn(mem.W_V.weight.shape, generator=g) * 0.1)
            if read_gate:  # a gate that opens and closes by token, not the fresh g = 1
                mem.gate_w.copy_(torch.randn(mem.gate_w.shape, generator=g))
    loaded = LoadedModel("tiny-llama", f"tiny-llama@{seed}", base, tiny_tokenizer(), torch.float32)
    return Assistant(loaded, armt, None, armt.adapter_hash())


class PacedRuntime:
    """A runtime whose segment steps take at least `seconds` each; everything else is the wrapped
    runtime's. UI tests that watch an ingest in progress (the bar moving, a cancel, a resume) use
    it: the tiny model alone ingests 7k tokens in 0.6 s on a fast CPU, before the UI looks."""

    def __init__(self, runtime: object, seconds: float) -> None:
        self._runtime = runtime
        self.seconds = seconds

    def step(self, input_ids, state):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        out = self._runtime.step(input_ids, state)  # type: ignore[attr-defined]
        time.sleep(max(0.0, self.seconds - (time.perf_counter() - started)))
        return out

    def __getattr__(self, name: str) -> object:
        return getattr(self._runtime, name)


def paced_assistant(segment_len: int = 16, seconds: float = 0.01) -> Assistant:
    """`tiny_assistant` with every segment step taking at least `seconds`."""
    fast = tiny_assistant(segment_len)
    return Assistant(fast.loaded, fast.armt, None, fast.adapter_hash, PacedRuntime(fast.runtime, seconds))
