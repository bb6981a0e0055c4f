"""A whole `Assistant` on the tiny random Llama: a real character-level tokenizer (built in memory
with `tokenizers`, nothing downloaded) and a memory that carries information (non-zero W_V)."""

from __future__ import annotations

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


def tiny_assistant(segment_len: int = 16, seed: int = 0) -> Assistant:
    base = tiny_llama(seed)
    config = ARMTConfig.for_model(
        base.config.num_hidden_layers, segment_len=segment_len, num_write_tokens=3, d_mem=8
    )
    armt = ARMT(base, config)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # a trained-looking memory: its state changes what the model says
        for mem in armt.memories.values():
            mem.W_V.weight.copy_(torch.randn(mem.W_V.weight.shape, generator=g) * 0.1)
    loaded = LoadedModel("tiny-llama", f"tiny-llama@{seed}", base, tiny_tokenizer(), torch.float32)
    return Assistant(loaded, armt, None, armt.adapter_hash())
