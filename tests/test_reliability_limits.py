"""Resource limits: a cap on the size of what is taken in (`--max-size`, EDGEMEM_MAX_SIZE) and on
the time of an ingest (`--max-time`, EDGEMEM_MAX_TIME; the progress is kept and the same command
resumes), and memory that stays flat however large the document: a 1 GB text file is streamed,
never read whole (the full-size check runs with -m reliability; the default run checks the piece size)."""

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest
from fuzz.helpers import REPO, tiny_model_folder
from typer.testing import CliRunner

from edgemem.cli import app
from edgemem.store import Library

runner = CliRunner()


def one_line_error(result, text: str) -> None:
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and text in errors[0], result.stderr


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model_folder(tmp_path_factory.mktemp("tiny-model"))


def test_max_size_refuses_a_large_folder_before_any_model_loads(tmp_path, monkeypatch):
    for i in range(3):
        (tmp_path / f"{i}.txt").write_text("x" * 700 + "\n")
    monkeypatch.setenv("EDGEMEM_HOME", str(tmp_path / "home"))
    # an unknown model: the size error must come first, before the model is even looked up
    one_line_error(
        runner.invoke(app, ["ingest", str(tmp_path), "--max-size", "1k", "--model", "gpt-17"]), "--max-size"
    )
    monkeypatch.setenv("EDGEMEM_MAX_SIZE", "1.5k")
    one_line_error(
        runner.invoke(app, ["ask", str(tmp_path), "q?", "--model", "gpt-17"]), "more than 1,500 bytes"
    )
    monkeypatch.setenv("EDGEMEM_MAX_SIZE", "0")  # no limit: now the model is what fails
    one_line_error(runner.invoke(app, ["ingest", str(tmp_path), "--model", "gpt-17"]), "unknown model")


@pytest.mark.parametrize(
    ("option", "value", "text"),
    [("--max-size", "lots", "--max-size must be"), ("--max-time", "soon", "--max-time must be")],
)
def test_malformed_limits_are_one_line_errors(tmp_path, option, value, text):
    (tmp_path / "a.txt").write_text("a\n")
    one_line_error(runner.invoke(app, ["ingest", str(tmp_path / "a.txt"), option, value]), text)


def test_max_time_stops_the_ingest_keeps_its_progress_and_the_same_command_resumes(
    tmp_path, model, monkeypatch
):
    doc = tmp_path / "long.txt"
    doc.write_text("".join(f"line {i}: nothing to see here, keep going.\n" for i in range(3000)))
    monkeypatch.setenv("EDGEMEM_HOME", str(tmp_path / "home"))
    args = ["ingest", str(doc), "--model", str(model), "--segment-len", "16"]
    start = time.monotonic()
    result = runner.invoke(app, [*args, "--max-time", "2s"])
    elapsed = time.monotonic() - start
    one_line_error(result, "stopped at the --max-time limit (2s)")
    assert "run the same command again to resume" in result.stderr
    assert elapsed < 60  # the whole ingest would take minutes
    with Library(tmp_path / "home" / "data") as lib:
        (checkpoint,) = lib.checkpoints()
    assert checkpoint.tokens > 0
    result = runner.invoke(app, [*args, "--max-time", "1s"])
    assert f"from {checkpoint.tokens:,} tokens" in result.stderr  # went on from there
    with Library(tmp_path / "home" / "data") as lib:
        assert lib.checkpoints()[0].tokens > checkpoint.tokens


# ----- the chat app keeps to the same limits -----


def test_chat_refuses_a_path_over_max_size_before_the_screen_opens(tmp_path, monkeypatch):
    """`edgemem chat PATH` checks --max-size / EDGEMEM_MAX_SIZE like ingest and ask, in one line."""
    doc = tmp_path / "big.txt"
    doc.write_text("x" * 2000 + "\n")
    monkeypatch.setenv("EDGEMEM_HOME", str(tmp_path / "home"))
    one_line_error(runner.invoke(app, ["chat", str(doc), "--max-size", "1k"]), "more than 1,000 bytes")
    monkeypatch.setenv("EDGEMEM_MAX_SIZE", "1.5k")
    one_line_error(runner.invoke(app, ["chat", str(doc)]), "more than 1,500 bytes")
    one_line_error(runner.invoke(app, ["chat", str(doc), "--max-time", "soon"]), "--max-time must be")


def chat_app(assistant, paths=(), **limits):
    from edgemem.tui.app import EdgememApp

    return EdgememApp(list(paths), open_assistant=lambda settings: assistant, **limits)


@pytest.fixture(scope="module")
def assistant():
    from tiny_assistant import tiny_assistant

    return tiny_assistant(segment_len=16)


def test_chat_app_refuses_a_path_over_its_size_cap(assistant, tmp_path, monkeypatch):
    """A path added in the app (ctrl+o) over max_bytes is an error notification, never queued."""
    from test_tui import add_path, errors, until

    monkeypatch.setenv("EDGEMEM_HOME", str(tmp_path / "home"))
    doc = tmp_path / "big.txt"
    doc.write_text("y" * 2000 + "\n")

    async def session():
        app = chat_app(assistant, max_bytes=1000)
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.model_status == "ready", what="the model")
            await add_path(pilot, doc)
            await until(pilot, lambda: errors(app), what="the size error")
            assert "more than 1,000 bytes" in errors(app)[0] and app.is_running
            assert app.entries == {} and app.ingesting is None and not app.queue

    asyncio.run(session())


def test_chat_app_stops_an_ingest_at_its_time_limit_keeps_progress_and_resumes(
    assistant, tmp_path, monkeypatch
):
    """max_seconds (--max-time) stops the app's ingest between segments; the checkpoint is kept,
    the entry shows "partial", and ctrl+r goes on from it (stopping again at the limit)."""
    from test_tui import until

    monkeypatch.setenv("EDGEMEM_HOME", str(tmp_path / "home"))
    doc = tmp_path / "long.txt"
    doc.write_text("".join(f"line {i}: nothing to see here, keep going.\n" for i in range(3000)))

    def stops() -> int:
        return sum("stopped at the time limit (1 s)" in text for _, text in app.notices)

    async def session():
        async with app.run_test() as pilot:
            await until(pilot, lambda: stops() == 1 and app.ingesting is None, what="the time limit")
            assert app.status_of(doc) == "partial", app.notices
            with Library() as lib:
                (first,) = lib.checkpoints()
            assert 0 < first.tokens < 100_000
            await pilot.press("ctrl+r")
            await until(pilot, lambda: stops() == 2 and app.ingesting is None, what="the second limit")
            assert any(f"from {first.tokens:,} tokens" in text for _, text in app.notices)  # resumed
            assert app.status_of(doc) == "partial"
            with Library() as lib:
                (second,) = lib.checkpoints()
                assert second.tokens > first.tokens and lib.records() == []

    app = chat_app(assistant, [doc], max_seconds=1.0)
    asyncio.run(session())


MEMORY_PROBE = """
import json, resource, sys, time
sys.path.insert(0, {tests!r})
from tiny_assistant import tiny_assistant
from edgemem.armt import tokenize_stream
from edgemem.documents import iter_text, scan
from edgemem.store import Library

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

assistant = tiny_assistant(segment_len=64)
out = {{"base": peak_mb()}}
source = scan({path!r})
out["scan"] = peak_mb()
chars = tokens = 0
for piece in iter_text(source):
    chars += len(piece)
out["chars"] = chars
out["stream"] = peak_mb()
chunks = tokenize_stream(iter_text(source), assistant.loaded.tokenizer)
for chunk in chunks:
    tokens += len(chunk)
    if tokens > {tokenize_limit}:
        break
out["tokenize"] = peak_mb()
rss = []
deadline = time.monotonic() + {ingest_s}
try:
    with Library({lib!r}) as lib:
        assistant.ingest_scan(source, lib, progress=lambda p: rss.append(p.rss_bytes / 2**20),
                              should_stop=lambda: time.monotonic() > deadline)
except Exception as exc:
    out["stopped"] = type(exc).__name__
out["ingest"] = peak_mb()
out["rss_first"], out["rss_last"], out["rss_max"], out["segments"] = rss[0], rss[-1], max(rss), len(rss)
print(json.dumps(out))
"""


def memory_probe(tmp_path, size: int, ingest_s: float, tokenize_limit: int) -> dict:
    """Write a `size`-byte text file, then in a fresh process: scan it, stream all its text,
    tokenize a part of it and ingest for `ingest_s` seconds, noting the peak RSS after each."""
    path = tmp_path / "big.txt"
    line = b"".join(b"%06d the quick brown fox jumps over the lazy dog; " % i for i in range(40)) + b"\n"
    block = line * (4 * 2**20 // len(line))
    with open(path, "wb") as handle:
        written = 0
        while written < size:
            handle.write(block[: size - written])
            written += min(len(block), size - written)
    code = MEMORY_PROBE.format(
        tests=str(REPO / "tests"),
        path=str(path),
        lib=str(tmp_path / "lib"),
        ingest_s=ingest_s,
        tokenize_limit=tokenize_limit,
    )
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(REPO)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800
        )
    finally:
        path.unlink()
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(result))
    assert result["chars"] == size
    assert result["stopped"] == "IngestCancelled" and result["segments"] > 10
    return result


def assert_flat(result: dict, budget_mb: float) -> None:
    """Peak RSS grows by less than `budget_mb` over the model's baseline in every phase, and the
    ingest's RSS does not climb from its first segment to its last."""
    for phase in ("scan", "stream", "tokenize", "ingest"):
        assert result[phase] - result["base"] < budget_mb, (phase, result)
    assert result["rss_max"] - result["rss_first"] < 32, result


def test_text_reaches_the_tokenizer_in_small_pieces(tmp_path):
    """Pieces of at most 16k characters, ending at newlines: tokenizing 256 KB pieces grew glibc's
    heap by ~6 MB a call (1.3 GB extra for 20M tokens; the 1 GB probe below measures it), 16k
    pieces keep RSS level. Lines of every length, a line longer than a piece, a file without
    newline at the end."""
    from edgemem import documents
    from edgemem.documents import iter_text, scan

    lines = ["x" * n + "\n" for n in (0, 1, 100, 16383, 16384, 40000)] + ["word " * 9000, "tail"]
    text = "".join(lines * 3)
    (tmp_path / "doc.txt").write_text(text)
    pieces = list(iter_text(scan(tmp_path / "doc.txt")))
    assert "".join(pieces) == text
    assert documents.MAX_PIECE_CHARS <= 1 << 15 and max(map(len, pieces)) <= documents.MAX_PIECE_CHARS
    assert all(p.endswith(("\n", " ", "x")) for p in pieces[:-1])  # a newline, else a space, else anywhere


@pytest.mark.reliability
def test_memory_stays_flat_on_a_1_gb_file(tmp_path):
    assert_flat(memory_probe(tmp_path, 2**30, ingest_s=30, tokenize_limit=20_000_000), budget_mb=48)
