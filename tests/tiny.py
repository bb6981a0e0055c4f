"""Tiny random Llama and Gemma3 models for fast unit tests (no weights on disk)."""

from __future__ import annotations

import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

VOCAB = 96


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=5,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval()


def tiny_gemma3(seed: int = 0) -> Gemma3ForCausalLM:
    """Gemma3 with sliding-window layers (window 8) interleaved with global ones."""
    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=6,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=8,
        max_position_embeddings=512,
        layer_types=["sliding_attention"] * 2
        + ["full_attention"]
        + ["sliding_attention"] * 2
        + ["full_attention"],
    )
    return Gemma3ForCausalLM(config).eval()


MAKERS = {"llama": tiny_llama, "gemma3": tiny_gemma3}
