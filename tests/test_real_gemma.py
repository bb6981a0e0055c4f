"""Real Gemma-3-270M (sliding-window layers included). Slow (first load dequantises ~1 GB), so it is
not in the default run: `python -m pytest -m gemma`."""

import sysconfig
from pathlib import Path

import pytest
import torch

from edgemem.armt import ARMT, ARMTConfig

pytestmark = pytest.mark.gemma


def test_fresh_memory_equals_base_model_on_real_gemma():
    from edgemem.models import load_model

    gemma = load_model("gemma3-270m", dtype=torch.float32)
    assert "sliding_attention" in gemma.model.config.layer_types
    text = (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text()[:4000]
    ids = torch.tensor([gemma.tokenizer(text).input_ids[:128]])
    with torch.no_grad():
        expected = gemma.model(ids).logits
        armt = ARMT(gemma.model, ARMTConfig.for_model(gemma.model.config.num_hidden_layers, segment_len=128))
        _, logits = armt.step(ids, armt.empty_state(), return_logits=True)
    assert torch.allclose(logits, expected, atol=1e-4)
