"""The evaluation harness: prefix state reuse, resumable JSONL runs, summary, table, plot, CLI."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from test_armt import make, randomise_memory
from typer.testing import CliRunner

from edgemem.armt import ingest
from edgemem.cli import app
from edgemem.data.tasks import Item
from edgemem.errors import EdgememError
from edgemem.evaluate import (
    ARMT_ANSWER,
    TABLE_BEGIN,
    TABLE_END,
    UNTRAINED,
    _done_ids,
    adapter_id,
    item_lock,
    load_records,
    markdown_table,
    method_label,
    parse_lengths,
    plot,
    run,
    summarize,
    update_results_md,
)
from edgemem.methods import PrefixStateCache, kv_bytes_per_token


def _same_state(a, b) -> bool:
    ta, tb = a.named_tensors(), b.named_tensors()
    return ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta) and a.writes == b.writes


def test_prefix_state_reuse_reaches_the_state_of_a_fresh_ingest():
    armt = make("llama", segment_len=8)
    randomise_memory(armt)
    g = torch.Generator().manual_seed(0)
    first = torch.randint(3, 90, (70,), generator=g).tolist()
    second = first[:37] + torch.randint(3, 90, (41,), generator=g).tolist()  # shares 4 whole segments
    cache = PrefixStateCache(armt)
    for ids in (first, second, second[:50], first):
        before = cache.segments_run
        state, tail, _, _ = cache.ingest(ids)
        fresh = ingest(armt, [ids])
        assert _same_state(state, fresh.state) and tail == fresh.tail_ids
        if ids is second:
            assert cache.segments_run - before == (len(second) - 1) // 8 - 4  # only what follows the prefix


def test_prefix_state_reuse_with_aligned_segments_reaches_the_state_of_a_fresh_ingest():
    """With aligned segments (`ARMTConfig.segment_align`) a cached state is reused only where the
    contexts share the ids its segments' ends were chosen from; the states, tails and stepped
    tokens are those of a fresh aligned ingest, one context at a time or side by side."""
    from dataclasses import replace

    from edgemem.armt import segment_bounds

    armt = make("llama", segment_len=8)
    randomise_memory(armt)
    armt.config = replace(armt.config, segment_align=4)
    ends = frozenset({5})
    g = torch.Generator().manual_seed(1)
    first = torch.randint(3, 12, (90,), generator=g).tolist()
    second = first[:41] + torch.randint(3, 12, (40,), generator=g).tolist()
    cache = PrefixStateCache(armt, ends=ends)
    for ids in (first, second, second[:50], first):
        before = cache.segments_run
        got = cache.ingest(ids)
        fresh = ingest(armt, [ids], ends=ends)
        bounds = segment_bounds(ids, 8, 0, 4, ends)
        assert _same_state(got.state, fresh.state) and got.tail == fresh.tail_ids
        assert got.stepped_tokens == bounds[-1] - ([0, *bounds][len(bounds) - got.stepped])
        if ids is second:  # the segments whose S ids lie inside the shared 41 are reused
            reusable = sum(1 for a in [0, *bounds][:-1] if a + 8 <= 41)
            assert cache.segments_run - before == len(bounds) - reusable > 0
    done = cache.ingest_many([second, first[:60]])
    for ids, got in zip([second, first[:60]], done, strict=True):
        assert _close_state(got.state, ingest(armt, [ids], ends=ends).state)


def _close_state(a, b) -> bool:
    ta, tb = a.named_tensors(), b.named_tensors()
    return (
        ta.keys() == tb.keys()
        and all(torch.allclose(ta[k], tb[k], atol=1e-5, rtol=1e-4) for k in ta)
        and a.writes == b.writes
    )


def test_contexts_ingested_side_by_side_reach_the_states_of_one_by_one_ingests():
    armt = make("llama", segment_len=8)
    randomise_memory(armt)
    g = torch.Generator().manual_seed(0)
    haystack = torch.randint(3, 90, (70,), generator=g).tolist()
    cache = PrefixStateCache(armt)
    cache.ingest(haystack)
    # a needle at two depths of the same haystack, a context that ends sooner, one under a segment
    deep = haystack[:60] + [1, 2, 1] + haystack[60:]
    shallow = haystack[:37] + [1, 2, 1] + haystack[37:]
    contexts = [deep, shallow, haystack[:30], haystack[:5]]
    before = cache.segments_run
    done = cache.ingest_many(contexts)
    for ids, got in zip(contexts, done, strict=True):
        fresh = ingest(armt, [ids])
        assert _close_state(got.state, fresh.state) and got.tail == fresh.tail_ids
        assert got.stepped == (len(ids) - 1) // 8  # the shortest context shares no whole cached segment
    assert cache.segments_run - before == sum(got.stepped for got in done)
    # the cache now holds the last context's states: a deeper needle in its prefix resumes from them
    state, tail, stepped, _ = cache.ingest(haystack[:5] + [2] * 20)
    assert stepped == 3 and _close_state(state, ingest(armt, [haystack[:5] + [2] * 20]).state)
    # the batch starts from the prefix every context shares with the previous call's last context
    cache.ingest(deep)
    done = cache.ingest_many([deep[:61] + [1] * 30, deep[:50] + [2] * 9])
    assert [got.stepped for got in done] == [(91 - 1) // 8 - 6, (59 - 1) // 8 - 6]
    assert _close_state(done[1].state, ingest(armt, [deep[:50] + [2] * 9]).state)


def test_prefix_state_cache_keeps_a_bounded_number_of_states():
    armt = make("llama", segment_len=8)
    cache = PrefixStateCache(armt, max_states=4)
    cache.ingest(list(range(3, 90)) * 2)
    assert len(cache._states) <= 5  # the empty state and at most 4 more


def test_lengths_are_bins_given_as_k_or_tokens():
    assert parse_lengths("4k,1k,1024") == [1024, 4096]
    for bad in ("3k", "abc", ""):
        with pytest.raises(EdgememError):
            parse_lengths(bad)


def _record(method, length, correct, seconds=2.0):
    return {
        "id": f"niah-{length}-{int(correct)}-{method}",
        "task": "niah",
        "length": length,
        "method": method,
        "model": "m",
        "correct": correct,
        "score": float(correct),
        "seconds": seconds,
        "computed_tokens": 1000,
        "peak_rss_mb": 900.0,
        "memory_mb": 5.3,
        "kv_full_mb": 23.0,
    }


def test_summary_table_plot_and_results_file_update(tmp_path):
    records = [_record("armt", 1024, True), _record("armt", 1024, False), _record("window", 1024, True)]
    rows = summarize(records)
    armt = next(r for r in rows if r["method"] == "armt")
    assert armt["n"] == 2 and armt["accuracy"] == 0.5 and armt["tokens_per_s"] == 500
    table = markdown_table(rows)
    assert "| m | niah | armt | 1k | 2 | 0.50 |" in table
    png = plot(rows, tmp_path / "acc.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = tmp_path / "RESULTS.md"
    md.write_text("# Results\n\nabove\n")
    update_results_md(md, table)
    update_results_md(md, table)  # replaced in place, not appended twice
    text = md.read_text()
    assert (
        text.count(TABLE_BEGIN) == 1 and text.count(TABLE_END) == 1 and text.startswith("# Results\n\nabove")
    )


def test_eval_plot_writes_only_beside_its_out_and_leaves_the_results_folder_untouched(tmp_path):
    """`eval plot --results DIR --out X.png` reads DIR and writes X.png with summary.json beside it:
    following a RESULTS command on a committed results folder leaves the checkout as it was."""
    results = tmp_path / "committed" / "m"
    results.mkdir(parents=True)
    (results / "niah.armt.jsonl").write_text(json.dumps(_record("armt", 1024, True)) + "\n")
    before = sorted(p.name for p in results.parent.rglob("*"))
    out = tmp_path / "elsewhere" / "acc.png"
    result = CliRunner().invoke(app, ["eval", "plot", "--results", str(results.parent), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in results.parent.rglob("*")) == before
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((out.parent / "summary.json").read_text())
    assert [(r["task"], r["length"], r["accuracy"]) for r in summary] == [("niah", 1024, 1.0)]


def test_armt_lines_are_kept_apart_by_the_memory_that_made_them(tmp_path):
    """A new adapter re-runs the items an older memory answered (resume skips only its own), and
    the table shows the fresh memory as armt-untrained and only the latest trained adapter as armt."""
    path = tmp_path / "m" / "niah.armt.jsonl"
    path.parent.mkdir()
    old = {**_record("armt", 1024, False), "id": "a"}  # before adapters were recorded: untrained
    first = {**_record("armt", 1024, False), "id": "a", "adapter": "1111"}
    second = {**_record("armt", 1024, True), "id": "a", "adapter": "2222"}
    path.write_text("".join(json.dumps(r) + "\n" for r in (old, first, second)))
    assert _done_ids(path, UNTRAINED) == _done_ids(path, "2222") == {"a"}
    assert _done_ids(path, "3333") == set()
    rows = summarize(load_records(tmp_path))
    assert [(r["method"], r["accuracy"]) for r in rows] == [("armt", 1.0), ("armt-untrained", 0.0)]
    # The answer path is part of the memory: lines from before the tail was written run again,
    # and once the file has lines of the new path, they alone are the armt row.
    assert _done_ids(path, f"2222+{ARMT_ANSWER}") == set()
    new = {**_record("armt", 1024, False), "id": "a", "adapter": "2222", "answer": ARMT_ANSWER}
    with path.open("a") as out:
        out.write(json.dumps(new) + "\n")
    assert _done_ids(path, f"2222+{ARMT_ANSWER}") == {"a"} and _done_ids(path, "2222") == {"a"}
    rows = summarize(load_records(tmp_path))
    assert [(r["method"], r["accuracy"]) for r in rows] == [("armt", 0.0), ("armt-untrained", 0.0)]
    adapter = tmp_path / "a.safetensors"
    adapter.write_bytes(b"x")
    assert adapter_id("smollm2-135m-instruct", str(adapter)) == "2d711642b726b044"
    assert adapter_id(str(tmp_path / "model-folder"), None) == UNTRAINED
    with pytest.raises(EdgememError, match="does not exist"):
        adapter_id("smollm2-135m-instruct", str(tmp_path / "missing.safetensors"))


def test_lines_of_another_corpora_build_run_again_and_a_row_holds_one_build(tmp_path):
    """An id fixes the needle, the corpora build the haystack around it: a results folder copied
    from a machine with another build re-runs those items instead of skipping them, and the row
    then counts the latest build's lines only (lines from before builds were recorded stay)."""
    path = tmp_path / "m" / "niah.window.jsonl"
    path.parent.mkdir()
    there = {**_record("window", 1024, True), "id": "a", "corpora": "there"}
    legacy = {**_record("window", 1024, False), "id": "b"}
    path.write_text("".join(json.dumps(r) + "\n" for r in (there, legacy)))
    assert _done_ids(path, corpora="there") == _done_ids(path) == {"a", "b"}
    assert _done_ids(path, corpora="here") == {"b"}
    assert [r["n"] for r in summarize(load_records(tmp_path))] == [2]
    here = {**there, "correct": False, "corpora": "here"}
    with path.open("a") as out:
        out.write(json.dumps(here) + "\n")
    assert _done_ids(path, corpora="here") == {"a", "b"}
    [row] = summarize(load_records(tmp_path))
    assert (row["n"], row["accuracy"]) == (2, 0.0)


def test_two_runs_of_one_bin_share_its_items_and_run_each_once(tmp_path):
    """The same eval started twice (one process per core) shares the bin: a run passes over an item
    the other holds, and one the other has written a line for since this run read the file, so
    no item runs twice and no row counts one twice. Here the other run is played by this test:
    it holds item 1's claim and writes item 2's line after the run has read the file; item 0 is
    already in it. Nothing is left for the run, so it never loads a model (there is none named
    `m`); once the claim is let go, item 1 is this run's to take."""
    import contextlib

    from edgemem.evaluate import _claim

    target = tmp_path / "m" / f"niah.{method_label('oracle', 'hf', None)}.jsonl"
    target.parent.mkdir()
    items = [Item("niah", 1024, i, "ctx", "q?", ["1"], "p", meta={"depth": 0.5}) for i in range(3)]
    target.write_text(json.dumps({"id": items[0].id, "corpora": "here"}) + "\n")

    def built_while_the_other_run_writes(length):
        with target.open("a") as out:  # the other run finishes item 2 after this one read the file
            out.write(json.dumps({"id": items[2].id, "corpora": "here"}) + "\n")
        return items

    kwargs = dict(log=lambda s: None, items=built_while_the_other_run_writes, corpora="here")
    with contextlib.ExitStack() as other:
        assert _claim(other, iter(items[1:2]), 1, target, None, "here") == ([items[1]], 0)
        report = run("niah", [1024], "oracle", 3, "m", "hf", None, tmp_path, **kwargs)
        assert (report.ran, report.skipped, report.elsewhere) == (0, 1, 2)
        with contextlib.ExitStack() as mine:  # while held, the claim is the other run's alone
            assert _claim(mine, iter(items[1:2]), 1, target, None, "here") == ([], 1)
    with contextlib.ExitStack() as mine:
        assert _claim(mine, iter(items), 2, target, None, "here") == ([items[1]], 2)


def test_an_items_lock_file_goes_once_its_line_is_written_and_a_claim_on_the_old_file_passes(tmp_path):
    """The lock folder does not grow with every item run: the file goes once the item's line is
    written (still locked). A run that opened the old file before it went, and locks it after,
    passes the item over (the file is no longer the one at the path), and so does a run that
    claims the item anew once its line is there, removing the file its claim made."""
    import contextlib

    from edgemem.evaluate import _claim, _same_file, drop_item_lock
    from edgemem.files import try_lock

    target = tmp_path / "m" / "niah.oracle.jsonl"
    target.parent.mkdir()
    target.touch()
    item = Item("niah", 1024, 0, "ctx", "q?", ["1"], "p")
    lock = item_lock(target, item.id)
    with contextlib.ExitStack() as first:
        assert _claim(first, iter([item]), 1, target, None, None) == ([item], 0)
        assert lock.is_file()
        early = open(lock, "a")  # noqa: SIM115 (closed below) another run opens it before the line
        target.write_text(json.dumps({"id": item.id}) + "\n")
        drop_item_lock(target, item.id)
        assert not lock.exists()
    with early, contextlib.ExitStack() as second:  # the first run let go; the old file is free
        assert try_lock(early) and not _same_file(early, lock)
        assert _claim(second, iter([item]), 1, target, None, None) == ([], 1)
    assert not lock.exists()


def test_a_claim_whose_lock_file_was_removed_before_it_locked_passes_the_item_over(tmp_path, monkeypatch):
    """Another run may remove an item's lock file (its line written) between this run's open and
    its lock: the lock is then on a file no longer at the path, which a third run can create and
    lock too, so the claim passes the item over even where no line of its own kind records it
    (here a line of another corpora build). With the file in place the item is this run's."""
    import contextlib

    from edgemem import evaluate
    from edgemem.evaluate import _claim, drop_item_lock

    target = tmp_path / "m" / "niah.oracle.jsonl"
    target.parent.mkdir()
    item = Item("niah", 1024, 0, "ctx", "q?", ["1"], "p")
    target.write_text(json.dumps({"id": item.id, "corpora": "there"}) + "\n")
    real = evaluate.try_lock

    def removed_first(handle):  # the other run drops the file just before this run locks
        drop_item_lock(target, item.id)
        return real(handle)

    monkeypatch.setattr(evaluate, "try_lock", removed_first)
    with contextlib.ExitStack() as mine:
        assert _claim(mine, iter([item]), 1, target, None, "here") == ([], 1)
    monkeypatch.setattr(evaluate, "try_lock", real)
    with contextlib.ExitStack() as mine:
        assert _claim(mine, iter([item]), 1, target, None, "here") == ([item], 0)


def test_answer_window_has_its_own_label_and_answer_and_is_armt_only():
    """`--answer-window 768` answers another way than the adapter's own: its own file and row
    (`armt-w768`), and its lines record another `answer`, so they never count as, or resume, the
    tail-written ones."""
    from edgemem.evaluate import armt_answer, is_armt

    assert method_label("armt", "hf", None, 768) == "armt-w768"
    assert method_label("armt", "hf", 64, 768) == "armt-s64-w768"
    assert method_label("armt", "hf", None, 0) == "armt-w0"
    assert is_armt("armt-w768") and is_armt("armt-s64-w768") and not is_armt("window-hf")
    assert armt_answer(0) == "tail-written" and armt_answer(768) == "window768-unwritten"
    with pytest.raises(EdgememError, match="armt only"):
        method_label("window", "llama", None, 768)


def test_an_eval_answers_with_the_adapters_own_window_unless_told_otherwise(tmp_path):
    """Without --answer-window an armt run answers (and records that it answered) with the window
    its adapter carries; with it, with the one given."""
    from dataclasses import replace

    from tiny_assistant import tiny_assistant

    from edgemem.armt import save_adapter
    from edgemem.evaluate import answer_window_of

    armt = tiny_assistant(segment_len=16).armt
    plain, windowed = tmp_path / "plain.safetensors", tmp_path / "windowed.safetensors"
    save_adapter(armt, plain)
    armt.config = replace(armt.config, answer_window=64)
    save_adapter(armt, windowed)
    assert answer_window_of("tiny", str(plain)) == 0 and answer_window_of("tiny", str(windowed)) == 64
    assert answer_window_of("tiny", str(windowed), 0) == 0 and answer_window_of("tiny", str(plain), 32) == 32


def test_armt_method_and_ask_with_an_answer_window_leave_the_last_tokens_unwritten_and_in_view(monkeypatch):
    """With an answer window W (`ARMTConfig.answer_window`) the evaluation's armt and `edgemem ask`
    both answer from the memory of the whole segments before the context's last W - S + 1..W
    tokens, write nothing of those, and show them beside the question; a context of at most W
    tokens answers from an empty memory with all of it in view. The real ingest and generation
    run; a wrapper records what generation was given."""
    from tiny_assistant import tiny_assistant

    from edgemem import armt as armt_module
    from edgemem import methods
    from edgemem.armt import prompt_ids
    from edgemem.runtime import answer

    assistant = tiny_assistant(segment_len=16, answer_window=40)
    armt, tokenizer = assistant.armt, assistant.loaded.tokenizer
    seen = []
    real = armt_module.generate_ids

    def recording(model, state, prompt, *args, **kwargs):
        seen.append((state, prompt))
        return real(model, state, prompt, *args, **kwargs)

    def same(a, b) -> bool:
        return a.writes == b.writes and all(
            torch.equal(t, b.named_tensors()[k]) for k, t in a.named_tensors().items()
        )

    monkeypatch.setattr(methods, "generate_ids", recording)
    method = methods.ARMTMethod(armt, tokenizer)
    context = " ".join(f"word{i} is {i * 7 % 13}." for i in range(40))
    item = Item("docqa", 1024, 0, context, "What is word3?", ["8"], "", "")
    ids = method._ids(context)
    assert len(ids) > 100
    method.predict(item, 2)
    cut = -(-(len(ids) - 40) // 16) * 16  # whole segments before the window
    assert len(ids) - 40 <= cut < len(ids) - 40 + 16
    state, prompt = seen[-1]
    doc = ingest(armt, [ids])
    assert doc.tail_ids == ids[cut:] and doc.state.writes == cut // 16
    assert same(state, doc.state) and prompt == prompt_ids(tokenizer, ids[cut:], item.question)

    runtime = assistant.runtime
    real_runtime = runtime.generate_ids
    monkeypatch.setattr(
        runtime,
        "generate_ids",
        lambda state, prompt, *a, **k: seen.append((state, prompt)) or real_runtime(state, prompt, *a, **k),
    )
    "".join(answer(runtime, doc, item.question, max_new_tokens=2))
    assert same(seen[-1][0], doc.state) and seen[-1][1] == prompt_ids(tokenizer, ids[cut:], item.question)

    short = Item("docqa", 1024, 1, "word1 is 7. word2 is 1.", "What is word2?", ["1"], "", "")
    method.predict(short, 2)
    state, prompt = seen[-1]
    assert state.writes == 0 and all(not t.any() for t in state.named_tensors().values())
    assert prompt == prompt_ids(tokenizer, method._ids(short.context), short.question)


def test_armt_read_in_other_segments_has_its_own_label_file_and_row(tmp_path):
    """`--segment-len 64` reads the same adapter in 64-token segments: its lines go to their own
    file (niah.armt-s64.jsonl) and row, kept apart by memory like armt's, so they neither skip the
    adapter's own items on resume nor replace its row in the table."""
    assert method_label("armt", "llama") == "armt" and method_label("armt", "hf", 64) == "armt-s64"
    assert method_label("window", "hf") == "window-hf"
    with pytest.raises(EdgememError, match="armt only"):
        method_label("window", "llama", 64)
    (tmp_path / "m").mkdir()
    own = {**_record("armt", 1024, True), "id": "a", "adapter": "2222", "segment_len": 128}
    short = {**_record("armt-s64", 1024, False), "id": "a", "adapter": "2222", "segment_len": 64}
    older = {**short, "adapter": "1111", "correct": True}
    fresh = {**short, "adapter": UNTRAINED}
    (tmp_path / "m" / "niah.armt.jsonl").write_text(json.dumps(own) + "\n")
    (tmp_path / "m" / "niah.armt-s64.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in (older, short, fresh))
    )
    rows = summarize(load_records(tmp_path))
    assert [(r["method"], r["accuracy"]) for r in rows] == [
        ("armt", 1.0),
        ("armt-s64", 0.0),
        ("armt-s64-untrained", 0.0),
    ]


def test_armt_read_with_other_alignment_has_its_own_label_and_config():
    """`--segment-align N` reads the same adapter with segments ending after a sentence in their
    last N tokens (0: fixed segments, as before alignment shipped): its own file and row
    (`armt-a0`, `armt-s256-a96-w768`); a given N is taken as it is, while a `--segment-len` alone
    scales the adapter's alignment with the segment (48 of 128 is 96 of 256); an N the segment
    cannot hold is refused in one line."""
    from edgemem.armt import ARMTConfig, override_config

    assert method_label("armt", "hf", segment_align=0) == "armt-a0"
    assert method_label("armt", "hf", 256, 768, "validation", segment_align=96) == "armt-s256-a96-w768-val"
    with pytest.raises(EdgememError, match="armt only"):
        method_label("window", "llama", segment_align=0)
    aligned = ARMTConfig.for_model(30, segment_len=128, segment_align=48, answer_window=512)
    assert override_config(aligned) == aligned
    assert override_config(aligned, segment_align=0).segment_align == 0
    scaled = override_config(aligned, segment_len=256)
    assert (scaled.segment_len, scaled.segment_align, scaled.answer_window) == (256, 96, 512)
    both = override_config(aligned, segment_len=256, segment_align=10, answer_window=1024)
    assert (both.segment_len, both.segment_align, both.answer_window) == (256, 10, 1024)
    with pytest.raises(EdgememError, match="segment_align 128"):
        override_config(aligned, segment_align=128)
    with pytest.raises(EdgememError, match="answer_window 64"):
        override_config(aligned, answer_window=64)


def test_validation_items_have_their_own_label_file_and_row(tmp_path):
    """`--split validation` draws items whose ids are the test items' (`niah-1024-0`) from other
    documents and seeds: their lines go to their own file and row (`armt-val`, `window-val`), kept
    apart by memory like armt's, so choosing between adapters never touches the test rows."""
    from edgemem.evaluate import is_armt

    assert method_label("armt", "hf", None, None, "validation") == "armt-val"
    assert method_label("armt", "hf", 64, 1024, "validation") == "armt-s64-w1024-val"
    assert method_label("window", "llama", split="validation") == "window-val"
    assert method_label("window", "hf", split="test") == "window-hf"
    assert is_armt("armt-val") and is_armt("armt-w1024-val") and not is_armt("window-val")
    with pytest.raises(EdgememError, match="unknown split"):
        method_label("armt", "hf", split="train")  # training's items are not an evaluation's
    (tmp_path / "m").mkdir()
    test = {**_record("armt", 1024, True), "id": "a", "adapter": "2222"}
    val = {**_record("armt-val", 1024, False), "id": "a", "adapter": "2222", "split": "validation"}
    (tmp_path / "m" / "niah.armt.jsonl").write_text(json.dumps(test) + "\n")
    (tmp_path / "m" / "niah.armt-val.jsonl").write_text(json.dumps(val) + "\n")
    rows = summarize(load_records(tmp_path))
    assert [(r["method"], r["accuracy"]) for r in rows] == [("armt", 1.0), ("armt-val", 0.0)]


def test_eval_cli_mistakes_are_one_line_errors():
    runner = CliRunner()
    for args, message in (
        (["eval"], "--task is required"),
        (["eval", "--task", "poems"], "unknown task"),
        (["eval", "--task", "niah", "--lengths", "3k"], "not a bin"),
        (["eval", "--task", "niah", "--dtype", "float16"], "unknown --dtype"),
        (["eval", "--task", "niah", "--method", "window", "--batch", "4"], "only with armt"),
        (["eval", "--task", "niah", "--batch", "0"], "batch 0"),
        (["eval", "--task", "niah", "--method", "rag", "--segment-len", "64"], "armt only"),
        (["eval", "--task", "niah", "--method", "window", "--segment-align", "0"], "armt only"),
        (["eval", "--task", "niah", "--split", "train"], "unknown --split"),
        (["eval", "plot", "--results", "/nonexistent-results"], "no results"),
        (["data", "show", "poems"], "unknown task"),
        (["data", "show", "niah", "5k"], "not a bin"),
        (["data", "show", "niah", "--split", "dev"], "unknown --split"),
        (["data", "prepare", "wikipedia"], "unknown corpus"),
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 1, args
        assert result.output.strip().startswith("error:") and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


def test_kv_cache_size_of_smollm2_config():
    class Config:
        num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size, head_dim = 30, 9, 3, 576, 64

    assert kv_bytes_per_token(Config()) == 23_040  # 30 layers x K,V x 3 heads x 64 x fp16


def test_the_oracle_cuts_a_passage_longer_than_the_window_around_its_focus():
    """A passage longer than the model's window (a types file at 16k+) is cut to fit, keeping its
    focus (the masked line) when the item names one, else its end; a short one is kept whole."""
    from types import SimpleNamespace

    from edgemem.methods import OracleMethod
    from edgemem.models import load_tokenizer

    class Recorder:  # the generator only records the prompt: what is tested is what the oracle shows
        def __init__(self) -> None:
            self.prompts: list[list[int]] = []

        def generate(self, prompt, max_new_tokens, stop_ids):
            self.prompts.append(prompt)
            return [], len(prompt)

    config = SimpleNamespace(num_hidden_layers=1, num_attention_heads=1, hidden_size=8)
    loaded = SimpleNamespace(tokenizer=load_tokenizer(), model=SimpleNamespace(config=config))
    generator = Recorder()
    oracle = OracleMethod(loaded, generator, window=400)
    passage = "".join(f"row{i:04d} = {i}\n" for i in range(600))
    focus = passage.index("row0300")
    tokenizer = loaded.tokenizer
    for meta, inside, outside in (({"focus": focus}, "row0300", "row0599"), ({}, "row0599", "row0300")):
        oracle.predict(Item("types", 16384, 0, passage, "Which row?", ["x"], passage, "", 0, meta), 8)
        prompt = generator.prompts[-1]
        text = tokenizer.decode(prompt)
        assert inside in text and outside not in text and len(prompt) + 8 <= 400
    short = "row0001 = 1\n"
    oracle.predict(Item("niah", 1024, 0, short, "Which row?", ["x"], short, "", 0, {}), 8)
    assert short.strip() in tokenizer.decode(generator.prompts[-1])


@pytest.mark.real_model
def test_every_method_runs_end_to_end_on_a_two_item_slice(tmp_path):
    from test_tasks import LICENSES, _write

    from edgemem.armt import read_adapter
    from edgemem.assistant import shipped_adapter
    from edgemem.data.tasks import Builder
    from edgemem.models import load_tokenizer, preferred_dtype

    root = tmp_path / "corpora"
    root.mkdir()
    prose = [{"name": p.name, "kind": "prose", "text": p.read_text()} for p in sorted(LICENSES.glob("GPL-*"))]
    _write(root, "linux-doc", prose)
    builder = Builder(load_tokenizer(), root, prose=("linux-doc",), code=())
    items = list(builder.build("niah", 1024, 2))
    runs = [("armt", "hf"), ("window", "hf"), ("rag", "hf"), ("oracle", "hf")]
    if importlib.util.find_spec("llama_cpp") is not None:
        runs.append(("window", "llama"))
    results = tmp_path / "results"
    # armt reads in segments twice the shipped adapter's own (`--segment-len`), which is all that
    # tells it from the default run: its own label and file, the length on its lines.
    shipped = read_adapter(shipped_adapter("smollm2-135m-instruct"))[0]
    segment_len = 2 * shipped.segment_len

    corpora = builder.corpora_id("niah")

    def run_slice(method: str, engine: str, corpora: str = corpora):
        model = "smollm2-135m-instruct"
        dtype = torch.float32 if method == "armt" else None  # armt asks for one; the others take the default
        return run(
            "niah",
            [1024],
            method,
            2,
            model,
            engine,
            None,
            results,
            log=lambda s: None,
            items=lambda n: items,
            dtype=dtype,
            batch=2 if method == "armt" else 1,  # armt ingests both items side by side
            segment_len=segment_len if method == "armt" else None,
            corpora=corpora,
        )

    for method, engine in runs:
        report = run_slice(method, engine)
        assert report.ran == 2, method
        assert not any(item_lock(report.path, it.id).exists() for it in items)  # none left behind
        lines = [json.loads(x) for x in report.path.read_text().splitlines()]
        deepest_first = sorted(items, key=lambda it: -it.meta["depth"])
        assert [r["id"] for r in lines] == [it.id for it in deepest_first] != [it.id for it in items]
        assert {r["batch"] for r in lines} == {2 if method == "armt" else 1}
        for r in lines:
            assert r["gold"] == items[int(r["id"].rsplit("-", 1)[1])].answers
            assert r["seconds"] > 0 and r["computed_tokens"] > 0 and r["peak_rss_mb"] > 100
            # each line says which torch dtype computed it; llama.cpp runs its own GGUF weights
            expected = {"armt": "float32", "hf": str(preferred_dtype()).removeprefix("torch."), "llama": None}
            assert r.get("dtype") == expected["armt" if method == "armt" else engine], (method, engine)
        assert {r["corpora"] for r in lines} == {corpora}  # each line names the haystacks' build
        again = run_slice(method, engine)
        assert again.ran == 0 and again.skipped == 2  # resumable: nothing runs twice
    # the same ids from another build are other haystacks: they run again
    assert run_slice("oracle", "hf", corpora="another-build").ran == 2
    # the same ids on the validation split are other items: their own file, not skipped as done
    val = run("niah", [1024], "oracle", 2, "smollm2-135m-instruct", "hf", None, results, log=lambda s: None,
              items=lambda n: items, corpora=corpora, split="validation")  # fmt: skip
    assert val.ran == 2 and val.path.name == "niah.oracle-hf-val.jsonl"
    assert {json.loads(x)["split"] for x in val.path.read_text().splitlines()} == {"validation"}
    oracle = [
        json.loads(x)
        for x in (results / "smollm2-135m-instruct/niah.oracle-hf.jsonl").read_text().splitlines()
    ]
    assert all(r["correct"] for r in oracle)  # given only the needle, the base model reads it back
    armt = [
        json.loads(x)
        for x in (results / f"smollm2-135m-instruct/niah.armt-s{segment_len}.jsonl").read_text().splitlines()
    ]
    # armt holds its state (5.3 MB) and the KV of what the answer reads: the tail (with the shipped
    # adapter's answer window all of a 1k item), the question's chat template and the answer
    assert all(r["memory_mb"] < r["kv_full_mb"] + 8 for r in armt)
    assert {r["adapter"] for r in armt} == {adapter_id("smollm2-135m-instruct", None)}
    assert {r["segment_len"] for r in armt} == {segment_len}  # each armt line says how it was read
    assert {r.get("segment_align", 0) for r in armt} == {2 * shipped.segment_align}  # scaled with it
    rows = summarize(load_records(results))
    armt_label = f"armt-s{segment_len}" + ("-untrained" if armt[0]["adapter"] == UNTRAINED else "")
    assert {r["method"] for r in rows} >= {armt_label, "window-hf", "rag-hf", "oracle-hf"}
    assert Path(plot(rows, tmp_path / "a.png")).is_file()


def test_armt_method_and_ask_answer_from_the_state_with_the_tail_written(monkeypatch):
    """The evaluation's armt and `edgemem ask` (runtime.answer) both generate from the memory with
    the document's tail written (`answer_state`), not from the ingested state. The real generation
    runs; a wrapper records the state it was given."""
    from tiny_assistant import tiny_assistant

    from edgemem import armt as armt_module
    from edgemem import methods
    from edgemem.armt import answer_state
    from edgemem.runtime import answer

    assistant = tiny_assistant(segment_len=16)
    armt, tokenizer = assistant.armt, assistant.loaded.tokenizer
    context = "The access code for the Lisbon vault is 4417. Ask the porter for the key at 9."
    item = Item("niah", 1024, 0, context, "What is the code?", ["4417"], "", "The code is")
    seen = []

    def recording(model, state, *args, **kwargs):
        seen.append(state)
        return real(model, state, *args, **kwargs)

    def same(a, b) -> bool:
        return a.writes == b.writes and all(
            torch.equal(t, b.named_tensors()[k]) for k, t in a.named_tensors().items()
        )

    real = armt_module.generate_ids
    monkeypatch.setattr(methods, "generate_ids", recording)
    method = methods.ARMTMethod(armt, tokenizer)
    ids = method._ids(context)
    method.predict(item, 4)
    doc = ingest(armt, [ids])
    assert 1 <= len(doc.tail_ids) < 16
    written = answer_state(armt, doc.state, doc.tail_ids)
    assert not same(written, doc.state) and same(seen[-1], written)

    runtime = assistant.runtime
    real_runtime = runtime.generate_ids
    monkeypatch.setattr(
        runtime, "generate_ids", lambda state, *a, **k: seen.append(state) or real_runtime(state, *a, **k)
    )
    "".join(answer(runtime, doc, item.question, max_new_tokens=4))
    assert same(seen[-1], written)


def test_an_eval_on_the_validation_split_builds_validation_items(tmp_path, monkeypatch):
    """`run(..., split="validation")` builds its items from the validation split (other documents,
    keys and numbers), not the test items that share their ids."""
    from test_tasks import LICENSES

    from edgemem.data import corpora
    from edgemem.data.tasks import PROSE, Builder
    from edgemem.models import load_tokenizer

    root = tmp_path / "corpora"
    root.mkdir()
    with open(root / "linux-doc.jsonl", "w") as handle:
        for k, p in enumerate(sorted(LICENSES.glob("GPL-*"))):
            row = {"name": p.name, "kind": "prose", "split": ("test", "validation")[k % 2], "sha256": "-"}
            handle.write(json.dumps(row | {"text": p.read_text()}) + "\n")
    for other in PROSE[1:]:  # the other prose corpora, empty
        (root / f"{other}.jsonl").write_text("")
    monkeypatch.setattr(corpora, "corpora_dir", lambda: root)
    report = run("niah", [1024], "oracle", 1, "smollm2-135m-instruct", "hf", None, tmp_path / "r",
                 log=lambda s: None, split="validation")  # fmt: skip
    (line,) = [json.loads(x) for x in report.path.read_text().splitlines()]
    tokenizer = load_tokenizer()
    val, test = (Builder(tokenizer, split=s).item("niah", 1024, 0, 1) for s in ("validation", "test"))
    assert line["gold"] == val.answers != test.answers and line["split"] == "validation"
