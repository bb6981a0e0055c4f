"""The ARMT wrapper and the segment driver, on tiny random Llama and Gemma3 models."""

import pytest
import torch
from tiny import MAKERS, VOCAB

from edgemem.armt import (
    ARMT,
    ARMTConfig,
    MemoryLayer,
    answer_state,
    default_memory_layers,
    generate_ids,
    ingest,
    iter_segments,
    parse_config,
    read_adapter,
    save_adapter,
    segment_bounds,
    sentence_end_ids,
    written_segments,
)
from edgemem.errors import EdgememError

ARCHS = sorted(MAKERS)


def make(arch: str, segment_len: int = 12, layers=None, write_tokens: int = 3) -> ARMT:
    base = MAKERS[arch]()
    n = base.config.num_hidden_layers
    config = ARMTConfig.for_model(
        n,
        segment_len=segment_len,
        num_write_tokens=write_tokens,
        d_mem=8,
        **({"memory_layers": layers} if layers else {}),
    )
    return ARMT(base, config)


def randomise_memory(armt: ARMT, seed: int = 1) -> None:
    """Give the memory non-zero W_V (a fresh one reads zeros) so that it carries information."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mem in armt.memories.values():
            mem.W_V.weight.copy_(torch.randn(mem.W_V.weight.shape, generator=g) * 0.1)


@pytest.mark.parametrize("arch", ARCHS)
def test_fresh_memory_one_segment_equals_base_model(arch):
    # gemma3: memory on a sliding-window layer (1) and a global one (2)
    armt = make(arch, layers=(1, 2))
    ids = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        expected = armt.base(ids).logits  # wrapped layers without a context are the original layers
        state, logits = armt.step(ids, armt.empty_state(2), return_logits=True)
        # ... and the next segments too, since an untrained memory reads exactly zero
        _, logits2 = armt.step(ids, state, return_logits=True)
    assert torch.allclose(logits, expected, atol=1e-5)
    assert torch.allclose(logits2, expected, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_wrapping_does_not_copy_base_weights(arch):
    base = MAKERS[arch]()
    layer = base.model.layers[2]
    ARMT(base, ARMTConfig.for_model(base.config.num_hidden_layers, memory_layers=(2,), d_mem=8))
    wrapped = base.model.layers[2]
    assert isinstance(wrapped, MemoryLayer) and wrapped.layer is layer


def test_a_new_armt_on_the_same_base_replaces_the_old_wrappers():
    base = MAKERS["llama"]()
    original = list(base.model.layers)
    ARMT(base, ARMTConfig.for_model(5, memory_layers=(1, 2), d_mem=8, segment_len=12))
    newer = ARMT(base, ARMTConfig.for_model(5, memory_layers=(3,), d_mem=8, segment_len=12))
    layers = base.model.layers
    assert [isinstance(x, MemoryLayer) for x in layers] == [False, False, False, True, False]
    assert layers[3].memory is newer.memories["3"] and layers[3].layer is original[3]
    assert layers[1] is original[1]
    newer.step(torch.randint(0, VOCAB, (1, 12)), newer.empty_state())  # no stale layer asks for its state


def test_memory_changes_the_output_once_trained():
    armt = make("llama", layers=(2,))
    randomise_memory(armt)
    ids = torch.randint(0, VOCAB, (1, 12))
    with torch.no_grad():
        state, first = armt.step(ids, armt.empty_state(), return_logits=True)
        _, second = armt.step(ids, state, return_logits=True)
    assert not torch.allclose(first, second, atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_state_shapes_do_not_depend_on_segment_count(arch):
    armt = make(arch)
    randomise_memory(armt)
    state = armt.empty_state()
    shapes = {}
    with torch.no_grad():
        for t in range(1, 51):
            state, _ = armt.step(torch.randint(0, VOCAB, (1, 12)), state)
            if t in (2, 50):
                shapes[t] = {k: v.shape for k, v in state.named_tensors().items()}
    assert shapes[2] == shapes[50]
    assert state.writes == 50
    assert all(bool(torch.isfinite(v).all()) for v in state.named_tensors().values())


def test_gradient_from_next_segment_reaches_write_path():
    armt = make("llama", layers=(1, 3))
    randomise_memory(armt)
    state = armt.empty_state()
    state, _ = armt.step(torch.randint(0, VOCAB, (1, 12)), state)  # segment t: writes
    _, logits = armt.step(torch.randint(0, VOCAB, (1, 12)), state, return_logits=True)  # t + 1 reads
    logits.sum().backward()
    for mem in armt.memories.values():
        for name in ("W_K", "W_V", "W_b", "W_Q"):
            grad = getattr(mem, name).weight.grad
            assert grad is not None and grad.abs().sum() > 0, name
    assert armt.write_embeddings.grad is not None and armt.write_embeddings.grad.abs().sum() > 0


def test_default_memory_layers_are_about_a_fifth_in_the_upper_part():
    assert default_memory_layers(30) == (12, 15, 18, 21, 24, 27)
    layers = default_memory_layers(18)
    assert len(layers) == 4 and min(layers) >= 7 and max(layers) < 18


def test_out_of_range_memory_layer_is_refused():
    from edgemem.errors import EdgememError

    base = MAKERS["llama"]()
    with pytest.raises(EdgememError, match="out of range"):
        ARMT(base, ARMTConfig(memory_layers=(99,)))


def test_iter_segments_keeps_a_tail_of_one_to_s_tokens():
    tail: list[int] = []
    chunks = [list(range(0, 7)), list(range(7, 25)), list(range(25, 30))]
    segments = list(iter_segments(chunks, 10, tail))
    assert segments == [list(range(0, 10)), list(range(10, 20))]
    assert tail == list(range(20, 30))  # exactly S left: kept for the answer segment
    assert list(iter_segments([[1, 2, 3]], 10, tail)) == [] and tail == [1, 2, 3]


def test_iter_segments_with_an_answer_window_keeps_its_last_w_minus_s_plus_one_to_w_tokens():
    """An answer window W keeps the last W - S + 1..W ids back as the tail (whole segments before
    them are written), whatever the chunking; a stream of at most W ids is all tail."""
    S, W = 10, 25
    for n in range(1, 80):
        for step in (1, 7, 100):
            ids = list(range(n))
            tail: list[int] = []
            segments = list(iter_segments([ids[i : i + step] for i in range(0, n, step)], S, tail, W))
            written = [i for seg in segments for i in seg]
            assert all(len(seg) == S for seg in segments) and written + tail == ids
            assert W - S < len(tail) <= W if n > W else tail == ids
            assert len(segments) == written_segments(n, S, W)
            assert len(list(iter_segments([ids], S, tail))) == written_segments(n, S) == (n - 1) // S


def test_aligned_segments_end_after_a_sentence_and_never_cut_one_of_up_to_n_tokens():
    """With segment_align N each segment ends just after the last sentence end among the last N ids
    of its S (S - N + 1..S ids; S when there is none), whatever the chunking; `segment_bounds`
    says the same ends; the tail keeps W - S + 1..W ids. A text of sentences of up to N ids is
    never cut inside one (a needle is written whole, with its key)."""
    import random

    S, N, END = 10, 4, 1
    rng = random.Random(0)
    ids = [rng.choice([END, 2, 3, 4, 5, 6, 7, 8]) for _ in range(300)]
    for W in (0, 25):
        keep = max(S, W)
        for step in (1, 7, 300):
            tail: list[int] = []
            chunks = [ids[i : i + step] for i in range(0, len(ids), step)]
            segments = list(iter_segments(chunks, S, tail, W, N, frozenset({END})))
            assert [i for seg in segments for i in seg] + tail == ids and keep - S < len(tail) <= keep
            bounds = segment_bounds(ids, S, W, N, frozenset({END}))
            assert [b - a for a, b in zip([0, *bounds], bounds, strict=False)] == [len(g) for g in segments]
            for a, seg in zip([0, *bounds], segments, strict=False):
                window = ids[a + S - N : a + S]
                if END in window:
                    assert seg[-1] == END and END not in ids[a + len(seg) : a + S]
                else:
                    assert len(seg) == S
    sentences = []
    while len(sentences) < 300:
        sentences += [rng.randrange(2, 9) for _ in range(rng.randrange(0, N))] + [END]
    tail = []
    segments = list(iter_segments([sentences], S, tail, 0, N, frozenset({END})))
    assert segments and all(seg[-1] == END and S - N < len(seg) <= S for seg in segments)
    fixed = list(iter_segments([sentences], S, [], 0))
    assert any(seg[-1] != END for seg in fixed)  # fixed segments do cut sentences
    assert segment_bounds(ids, S, W) == [S * (k + 1) for k in range(written_segments(len(ids), S, W))]


def test_sentence_end_ids_are_the_tokens_that_end_a_sentence_or_a_line():
    """The real tokenizer's sentence ends: '.', '!', '?' and newline tokens, not words or digits."""
    from dataclasses import replace

    from edgemem.armt import alignment_ends
    from edgemem.models import load_tokenizer

    tok = load_tokenizer("smollm2-135m-instruct")
    ends = sentence_end_ids(tok)
    for text in (".", "!", "?", "\n"):
        assert tok(text, add_special_tokens=False).input_ids[-1] in ends
    for text in (" the", " 7", " magic", ":"):
        assert tok(text, add_special_tokens=False).input_ids[-1] not in ends
    assert 10 < len(ends) < len(tok) // 10
    # what an ingest is handed: these ends for an aligned config, none (no vocabulary scan) otherwise
    config = ARMTConfig.for_model(30, segment_len=128)
    assert alignment_ends(config, tok) == frozenset()
    assert alignment_ends(replace(config, segment_align=48), tok) == ends


def test_aligned_ingest_resumes_to_the_uninterrupted_state_and_needs_the_sentence_ends():
    """An aligned ingest stopped after k segments and resumed from their state and token count
    reaches the uninterrupted state and tail; a resume whose token count no k aligned segments can
    hold is refused, and so is an aligned ingest without the tokenizer's sentence ends."""
    from dataclasses import replace

    armt = make("llama")
    randomise_memory(armt)
    S = armt.config.segment_len
    armt.config = replace(armt.config, segment_align=S // 2)
    ends = frozenset({5})
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 12, (9 * S + 5,), generator=g).tolist()
    full = ingest(armt, [ids], ends=ends)
    bounds = segment_bounds(ids, S, 0, S // 2, ends)
    assert len(bounds) == full.state.writes and any(b % S for b in bounds)
    first = ingest(armt, [ids[: bounds[3] + 1]], ends=ends)
    assert first.state.writes == 4
    resumed = ingest(armt, [ids], first.state, start_tokens=bounds[3], ends=ends)
    assert resumed.tail_ids == full.tail_ids and resumed.state.writes == full.state.writes
    for name, tensor in full.state.named_tensors().items():
        torch.testing.assert_close(resumed.state.named_tensors()[name], tensor)
    with pytest.raises(EdgememError, match="resumed"):
        ingest(armt, [ids], first.state, start_tokens=4 * S + 1, ends=ends)
    with pytest.raises(EdgememError, match="sentence ends"):
        ingest(armt, [ids])


@pytest.mark.parametrize(
    ("option", "value", "refused"), [("answer_window", 1024, 64), ("segment_align", 48, 128)]
)
def test_window_and_alignment_travel_with_the_config_and_keep_old_hashes(option, value, refused):
    """answer_window and segment_align are part of the adapter's config (and so of every stored
    state's key), left out of the JSON when 0 so older adapters keep their hashes; a window shorter
    than a segment, or an alignment of a whole segment or more, is refused when a config is read."""
    config = ARMTConfig.for_model(30, segment_len=128)
    assert option not in config.to_json()
    changed = ARMTConfig.for_model(30, segment_len=128, **{option: value})
    assert parse_config(changed.to_json(), "x") == changed and changed.to_json() != config.to_json()
    with pytest.raises(EdgememError, match=option):
        parse_config(ARMTConfig.for_model(30, segment_len=128, **{option: refused}).to_json(), "x")


def test_ingest_with_an_answer_window_writes_only_the_segments_before_it_and_answers_unwritten():
    """With an answer window the ingested state is the one of the whole segments before the tail
    (the same as ingesting that prefix alone), and `answer_state` leaves it as it is: the tail is
    read in view only. Without one the tail is written."""
    from dataclasses import replace

    armt = make("llama")
    randomise_memory(armt)
    S = armt.config.segment_len
    ids = torch.randint(0, VOCAB, (5 * S + 3,)).tolist()
    plain = ingest(armt, [ids])
    prefix = ingest(armt, [ids[: 4 * S + 1]]).state  # its 4 whole segments
    armt.config = replace(armt.config, answer_window=2 * S)
    doc = ingest(armt, [ids[i : i + 5] for i in range(0, len(ids), 5)])
    assert doc.tail_ids == ids[4 * S :] and doc.state.writes == 4 and doc.tokens == len(ids)
    assert all(torch.equal(t, prefix.named_tensors()[k]) for k, t in doc.state.named_tensors().items())
    assert answer_state(armt, doc.state, doc.tail_ids) is doc.state
    armt.config = replace(armt.config, answer_window=0)
    assert answer_state(armt, plain.state, plain.tail_ids).writes == plain.state.writes + 1


def test_ingest_is_equivalent_whatever_the_chunking():
    armt = make("llama")
    randomise_memory(armt)
    ids = torch.randint(0, VOCAB, (100,)).tolist()
    a = ingest(armt, [ids])
    b = ingest(armt, [ids[i : i + 7] for i in range(0, 100, 7)])
    assert a.tail_ids == b.tail_ids and a.tokens == b.tokens == 100
    assert a.state.writes == b.state.writes == 8
    for name, tensor in a.state.named_tensors().items():
        assert torch.equal(tensor, b.state.named_tensors()[name])


def test_ingest_reports_progress():
    armt = make("llama")
    seen = []
    ingest(armt, [list(range(40))], progress=seen.append)
    assert [p.tokens for p in seen] == [12, 24, 36] and seen[-1].rss_bytes > 0


def test_generation_is_bounded_and_greedy_is_deterministic():
    armt = make("llama")
    randomise_memory(armt)
    doc = ingest(armt, [torch.randint(0, VOCAB, (50,)).tolist()])
    run = lambda: list(generate_ids(armt, doc.state, doc.tail_ids, stop_ids=set(), max_new_tokens=7))  # noqa: E731
    first = run()
    assert len(first) == 7 and first == run()
    sampled = list(generate_ids(armt, doc.state, doc.tail_ids, set(), 7, temperature=1.0, seed=3))
    assert len(sampled) == 7


def test_an_answer_reads_the_memory_with_the_tail_written_as_one_more_partial_segment():
    """The tail stays in the prompt and is also written first: the answer is generated from the
    state after one more step on the tail's 1..S ids, not from the ingested state."""
    armt = make("llama")
    randomise_memory(armt)
    doc = ingest(armt, [torch.randint(0, VOCAB, (41,)).tolist()])  # 3 segments of 12, a tail of 5
    assert len(doc.tail_ids) == 5 and doc.state.writes == 3
    written = answer_state(armt, doc.state, doc.tail_ids)
    with torch.inference_mode():
        expected, _ = armt.step(torch.tensor([doc.tail_ids]), doc.state)
    assert written.writes == 4
    for name, tensor in written.named_tensors().items():
        assert torch.equal(tensor, expected.named_tensors()[name])
        assert not torch.equal(tensor, doc.state.named_tensors()[name])  # the tail changed the memory
    assert answer_state(armt, doc.state, []) is doc.state  # nothing left to write


def test_adapter_round_trip(tmp_path):
    armt = make("gemma3")
    randomise_memory(armt)
    path = tmp_path / "adapter.safetensors"
    save_adapter(armt, path)
    config, tensors = read_adapter(path)
    assert config == armt.config
    other = make("gemma3")
    assert other.adapter_hash() != armt.adapter_hash()
    other.load_adapter_tensors(tensors)
    assert other.adapter_hash() == armt.adapter_hash()
    assert other.is_trained() and not make("gemma3").is_trained()


def test_fresh_adapter_is_deterministic():
    assert make("llama").adapter_hash() == make("llama").adapter_hash()


@pytest.mark.parametrize("arch", ARCHS)
def test_fresh_lora_changes_nothing_and_round_trips(arch, tmp_path):
    """LoRA wraps every projection of every layer; with B = 0 the model is the base model; the
    matrices travel in the adapter file and a new ARMT on the same base unwraps the old ones."""
    base = MAKERS[arch]()
    ids = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        expected = MAKERS[arch]()(ids).logits  # the same random weights, never wrapped
    config = ARMTConfig.for_model(base.config.num_hidden_layers, segment_len=12, d_mem=8, lora_rank=4)
    armt = ARMT(base, config)
    assert len(armt.lora) == 7 * base.config.num_hidden_layers
    assert not armt.is_trained()
    with torch.no_grad():
        _, logits = armt.step(ids, armt.empty_state(2), return_logits=True)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        for module in armt.lora.values():
            module.B.normal_(0, 0.1)
        _, changed = armt.step(ids, armt.empty_state(2), return_logits=True)
    assert armt.is_trained() and not torch.allclose(changed, expected, atol=1e-3)
    save_adapter(armt, tmp_path / "a.safetensors")
    loaded_config, tensors = read_adapter(tmp_path / "a.safetensors")
    assert loaded_config.lora_rank == 4 and any(k.startswith("lora.") for k in tensors)
    again = ARMT(base, loaded_config)  # replaces the first ARMT's wrappers on the same base
    again.load_adapter_tensors(tensors)
    assert again.adapter_hash() == armt.adapter_hash()
    with torch.no_grad():
        _, reloaded = again.step(ids, again.empty_state(2), return_logits=True)
    torch.testing.assert_close(reloaded, changed)
    plain = ARMT(base, ARMTConfig.for_model(base.config.num_hidden_layers, segment_len=12, d_mem=8))
    with torch.no_grad():
        _, unwrapped = plain.step(ids, plain.empty_state(2), return_logits=True)
    torch.testing.assert_close(unwrapped, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_merged_lora_computes_the_same_states_and_logits(arch):
    """merge_lora folds B A into the base weights for inference: the same segment step (float32),
    the same adapter hash; the changed base refuses another adapter or another ARMT."""
    base = MAKERS[arch]()
    config = ARMTConfig.for_model(base.config.num_hidden_layers, segment_len=12, d_mem=8, lora_rank=4)
    armt = ARMT(base, config)
    randomise_memory(armt)
    with torch.no_grad():
        for module in armt.lora.values():
            module.B.normal_(0, 0.1)
    ids = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        state, _ = armt.step(ids, armt.empty_state(2))
        expected_state, expected = armt.step(ids, state, return_logits=True)
        tensors, digest = armt.adapter_tensors(), armt.adapter_hash()
        armt.merge_lora()
        merged_state, merged = armt.step(ids, armt.step(ids, armt.empty_state(2))[0], return_logits=True)
    torch.testing.assert_close(merged, expected, atol=1e-5, rtol=1e-5)
    for name, tensor in expected_state.named_tensors().items():
        torch.testing.assert_close(merged_state.named_tensors()[name], tensor, atol=1e-4, rtol=1e-4)
    assert armt.adapter_hash() == digest
    with pytest.raises(EdgememError, match="merged"):
        armt.load_adapter_tensors(tensors)
    with pytest.raises(EdgememError, match="merged"):
        ARMT(base, config)


def test_config_without_lora_keeps_its_json():
    """Adapters and stored states made before LoRA existed keep their hashes."""
    config = ARMTConfig.for_model(30)
    assert "lora" not in config.to_json()
    assert ARMTConfig.from_json(config.to_json()) == config
    with_lora = ARMTConfig.for_model(30, lora_rank=8)
    assert ARMTConfig.from_json(with_lora.to_json()) == with_lora


@pytest.mark.parametrize("arch", ARCHS)
def test_norm_inputs_memory_sees_the_layers_input_norm(arch, tmp_path):
    """With norm_inputs the memory works in the layer's normalised space: its keys, values and
    queries come from the layer's own input RMSNorm, so scaling the residual stream leaves its
    write unchanged (the raw memory's write scales with it), and its read is scaled back to each
    token's rms. A fresh memory is still the base model, and the flag travels in the adapter."""
    armt = make(arch, layers=(2,))
    normed = ARMT(
        armt.base,
        ARMTConfig.for_model(
            armt.base.config.num_hidden_layers,
            segment_len=12,
            num_write_tokens=3,
            d_mem=8,
            memory_layers=(2,),
            norm_inputs=True,
        ),
    )
    ids = torch.randint(0, VOCAB, (1, 12))
    with torch.no_grad():
        expected = MAKERS[arch]()(ids).logits
        _, fresh = normed.step(ids, normed.empty_state(), return_logits=True)
    torch.testing.assert_close(fresh, expected, atol=1e-5, rtol=1e-5)

    layer = normed.base.model.layers[2]
    m = torch.randn(1, 3, normed.base.config.hidden_size)
    A, z = normed.memories["2"].empty_state()
    randomise_memory(normed)
    with torch.no_grad():
        small = normed.memories["2"].write(layer._memory_input(m), A, z, first=True)
        large = normed.memories["2"].write(layer._memory_input(1000 * m), A, z, first=True)
        raw_small = normed.memories["2"].write(m, A, z, first=True)
        raw_large = normed.memories["2"].write(1000 * m, A, z, first=True)
    torch.testing.assert_close(large[0], small[0], rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(large[1], small[1], rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(raw_large[1], 1e6 * raw_small[1], rtol=1e-3, atol=1e-3)  # z: phi is quadratic
    # ... and what it reads comes back at the scale of the stream it joins: read(c h) = c read(h)
    h = torch.randn(1, 5, normed.base.config.hidden_size)
    with torch.no_grad():
        state = normed.memories["2"].write(layer._memory_input(m), A, z, first=True)
        torch.testing.assert_close(
            layer._read(1000 * h, *state), 1000 * layer._read(h, *state), rtol=1e-3, atol=1e-3
        )

    save_adapter(normed, tmp_path / "n.safetensors")
    config, _ = read_adapter(tmp_path / "n.safetensors")
    assert config.norm_inputs and '"norm_inputs": true' in config.to_json()
    assert "norm_inputs" not in ARMTConfig.for_model(30).to_json()  # old adapters keep their hashes


@pytest.mark.parametrize("arch", ARCHS)
def test_segment_write_source_writes_every_tokens_output(arch, tmp_path):
    """write_source = "segment": a step writes the layer outputs of every token of the segment and
    the write tokens (the default writes the write tokens' only). A fresh memory is still the base
    model, the choice travels in the adapter (and is left out of the JSON when default, so older
    adapters keep their hashes), and an unknown source is refused."""
    base = MAKERS[arch]()
    n = base.config.num_hidden_layers
    ids = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        expected_logits = base(ids).logits
    for source, written in (("write_tokens", slice(-3, None)), ("segment", slice(None))):
        armt = ARMT(
            base,
            ARMTConfig.for_model(
                n, segment_len=12, num_write_tokens=3, d_mem=8, memory_layers=(2,), write_source=source
            ),
        )
        layer = armt.base.model.layers[2]
        outputs: list[torch.Tensor] = []
        hook = layer.layer.register_forward_hook(lambda _m, _a, out, seen=outputs: seen.append(out))
        with torch.no_grad():
            _, fresh = armt.step(ids, armt.empty_state(2), return_logits=True)
            torch.testing.assert_close(fresh, expected_logits, atol=1e-5, rtol=1e-5)
            randomise_memory(armt)
            outputs.clear()
            state, _ = armt.step(ids, armt.empty_state(2))
            A, z = armt.memories["2"].empty_state(2)
            want = armt.memories["2"].write(outputs[0][:, written], A, z, first=True)
        hook.remove()
        torch.testing.assert_close(state.A[2], want[0])
        torch.testing.assert_close(state.z[2], want[1])
        save_adapter(armt, tmp_path / f"{source}.safetensors")
        assert read_adapter(tmp_path / f"{source}.safetensors")[0].write_source == source
    assert "write_source" not in ARMTConfig.for_model(30).to_json()
    from edgemem.errors import EdgememError

    with pytest.raises(EdgememError, match="write_source"):
        ARMT(base, ARMTConfig.for_model(n, memory_layers=(2,), write_source="everything"))


def _gated_pair(arch: str) -> tuple[ARMT, ARMT]:
    """The same tiny model wrapped without and with a read gate (same seed), W_V made non-zero."""
    armts = []
    for gate in (False, True):
        base = MAKERS[arch]()
        n = base.config.num_hidden_layers
        config = ARMTConfig.for_model(n, segment_len=12, num_write_tokens=3, d_mem=8, read_gate=gate)
        armt = ARMT(base, config)
        randomise_memory(armt)
        armts.append(armt)
    return armts[0], armts[1]


@pytest.mark.parametrize("arch", ARCHS)
def test_a_fresh_read_gate_is_open_and_changes_nothing(arch):
    """A gate added to a memory starts at g = 1: the other weights init as without it (no RNG
    drawn), and states and logits equal the ungated memory's."""
    plain, gated = _gated_pair(arch)
    tensors = gated.adapter_tensors()
    gate_keys = {k for k in tensors if ".gate_" in k}
    assert gate_keys and all(torch.count_nonzero(tensors[k]) == 0 for k in gate_keys)
    assert {k: v for k, v in tensors.items() if k not in gate_keys}.keys() == plain.adapter_tensors().keys()
    for name, value in plain.adapter_tensors().items():
        assert torch.equal(value, tensors[name]), name
    ids = torch.randint(0, VOCAB, (1, 12))
    with torch.no_grad():
        s_plain, _ = plain.step(ids, plain.empty_state())
        s_gated, _ = gated.step(ids, gated.empty_state())
        logits_plain = plain.read_only_forward(ids, s_plain)
        logits_gated = gated.read_only_forward(ids, s_gated)
    assert torch.allclose(logits_plain, logits_gated, atol=1e-5)


def test_a_closed_read_gate_reads_nothing():
    """With its gate shut the memory adds nothing: the answer equals the one over an empty memory,
    where the same memory with the gate open answers otherwise."""
    _, gated = _gated_pair("llama")
    ids = torch.randint(0, VOCAB, (1, 12))
    with torch.no_grad():
        state, _ = gated.step(ids, gated.empty_state())
        empty = gated.read_only_forward(ids, gated.empty_state())
        assert not torch.allclose(gated.read_only_forward(ids, state), empty, atol=1e-4)
        for memory in gated.memories.values():
            memory.gate_b.fill_(-100.0)
        assert torch.allclose(gated.read_only_forward(ids, state), empty, atol=1e-5)


def test_read_gate_travels_with_the_config_and_keeps_old_hashes(tmp_path):
    """read_gate is left out of the config's JSON when off (older adapters keep their hashes); a
    gated adapter round-trips and an ungated model does not take its tensors."""
    config = ARMTConfig.for_model(30, segment_len=128)
    assert "read_gate" not in config.to_json()
    gated_config = ARMTConfig.for_model(30, segment_len=128, read_gate=True)
    assert parse_config(gated_config.to_json(), "x") == gated_config
    plain, gated = _gated_pair("gemma3")
    assert plain.adapter_hash() != gated.adapter_hash()
    path = tmp_path / "gated.safetensors"
    save_adapter(gated, path)
    read_config, tensors = read_adapter(path)
    assert read_config == gated.config and read_config.read_gate
    with pytest.raises(EdgememError, match="does not fit"):
        plain.load_adapter_tensors(tensors)
