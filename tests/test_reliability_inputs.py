"""Hostile and odd inputs to the file readers (`edgemem.documents`) and the CLI: each one is read,
skipped and counted, or refused in one line; nothing hangs, crashes or writes outside the
edgemem data directory. The corpus is built at test time (tests/fuzz/corpus.py)."""

import os
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from fuzz.corpus import SMALL_FILES, build, deep_tree, remove_deep
from fuzz.helpers import assert_same_state, run_unprivileged, tiny_model_folder
from tiny_assistant import tiny_assistant
from typer.testing import CliRunner

from edgemem import documents
from edgemem.cli import app
from edgemem.documents import DocumentChanged, iter_text, scan
from edgemem.errors import EdgememError
from edgemem.store import Library


def finishes_within(seconds: float, func, *args):
    """Run func in a thread; fail (instead of hanging the suite) if it does not return in time."""
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = func(*args)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{func.__name__} still running after {seconds} s (blocked?)"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def test_the_hostile_corpus_folder_is_read_with_every_skip_counted(tmp_path, request):
    """FIFO, symlink loops, links out of the tree, unreadable file and folder, binaries, a
    1100-level tree, undecodable names: the walk finishes and counts each skip."""
    root = tmp_path / "corpus"
    expected = build(root)
    request.addfinalizer(lambda: remove_deep(root / "d"))
    code = f"""
import json
from pathlib import Path
from edgemem.documents import iter_text, scan
s = scan(Path({str(root)!r}))
text = "".join(iter_text(s))
print(json.dumps({{"binary": s.skipped_binary, "special": s.skipped_special,
    "unreadable": s.skipped_unreadable, "files": [p.as_posix() for p in s.files],
    "invalid": s.invalid_utf8, "text": text}}))
"""
    got = run_unprivileged(code, timeout=60)  # a blocked FIFO open would hit the timeout
    assert {k: got[k] for k in expected} == expected
    files = got["files"]
    top = [f for f in files if "/" not in f]
    assert top == sorted(top) and files[: len(top)] == top  # a folder's files, then its subfolders
    assert not any(f.startswith(("loop-", "parent-link", "self-link", "etc-passwd", "locked")) for f in files)
    assert "root:" not in got["text"]  # /etc/passwd behind a link is never read
    assert sum(f.endswith("bottom.txt") for f in files) == 1 and "bottom of a deep tree" in got["text"]
    assert "===== bad-name-\ufffd\ufffd.txt =====" in got["text"]
    assert "nul-after-sniff.txt" in files and "\x00tail" in got["text"]
    assert set(got["invalid"]) >= {"latin1.txt", "one-invalid.txt", "truncated-utf8.txt"}


def test_a_fifo_named_directly_is_refused_at_once(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(EdgememError, match="not a regular file"):
        finishes_within(10, scan, fifo)  # a plain open() would wait for a writer forever


def test_a_fifo_replacing_a_file_after_the_scan_does_not_block_the_ingest(tmp_path):
    (tmp_path / "a.txt").write_text("first\n")
    (tmp_path / "b.txt").write_text("second\n")
    source = scan(tmp_path)
    (tmp_path / "b.txt").unlink()
    os.mkfifo(tmp_path / "b.txt")
    with pytest.raises(EdgememError, match="b.txt"):
        finishes_within(10, lambda: "".join(iter_text(source)))


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null", "/dev/urandom"])
def test_devices_are_not_read(device):
    with pytest.raises(EdgememError, match="not a regular file"):
        finishes_within(10, scan, device)  # /dev/zero would otherwise be read forever


def test_symlink_loop_and_dangling_link_are_one_line_errors(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    (tmp_path / "gone").symlink_to("nowhere")
    with pytest.raises(EdgememError, match="symbolic links"):
        scan(tmp_path / "a")
    with pytest.raises(EdgememError, match="broken symbolic link"):
        scan(tmp_path / "gone")


def test_a_tree_deeper_than_path_max_is_walked_and_its_unreachable_part_counted(tmp_path, request):
    (tmp_path / "top.txt").write_text("at the top\n")
    name = "n" * 200
    request.addfinalizer(lambda: remove_deep(tmp_path / name, name))
    deep_tree(tmp_path, 25, name)  # 5025 characters of path: past PATH_MAX (4096)
    source = finishes_within(120, scan, tmp_path)
    assert [p.as_posix() for p in source.files] == ["top.txt"]
    assert source.skipped_unreadable >= 1


def test_zero_and_one_byte_files(tmp_path):
    (tmp_path / "zero").write_bytes(b"")
    with pytest.raises(EdgememError, match="is empty"):
        scan(tmp_path / "zero")
    (tmp_path / "one").write_bytes(b"x")
    assert "".join(iter_text(scan(tmp_path / "one"))) == "x"
    (tmp_path / "nul").write_bytes(b"\x00")
    with pytest.raises(EdgememError, match="binary"):
        scan(tmp_path / "nul")
    (tmp_path / "ff").write_bytes(b"\xff")
    source = scan(tmp_path / "ff")
    assert source.invalid_utf8 == ["ff"] and "".join(iter_text(source)) == "\ufffd"


def test_a_single_100_mb_line_streams_in_bounded_memory(tmp_path):
    """No newline and no space in 100 MB: pieces are cut anyway and memory stays bounded."""
    path = tmp_path / "line.txt"
    with open(path, "wb") as handle:
        for _ in range(100):
            handle.write(b"x" * 1_000_000)
    source = scan(path)
    tracemalloc.start()
    try:
        total, longest = 0, 0
        for piece in iter_text(source):
            total, longest = total + len(piece), max(longest, len(piece))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total == 100_000_000
    assert longest <= documents.MAX_PIECE_CHARS + documents.BLOCK_BYTES
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.1f} MiB while streaming 100 MB"


def _long_text(lines: int) -> str:
    return "".join(f"line {i:06d}: some text to fill the block with.\n" for i in range(lines))


@pytest.mark.parametrize("change", ["edit-middle", "append", "truncate", "remove", "binary"])
def test_a_file_changed_after_the_scan_is_caught_before_any_changed_byte_is_used(tmp_path, change):
    path = tmp_path / "doc.txt"
    original = _long_text(20_000)  # about 1 MB: four blocks
    path.write_text(original)
    source = scan(path)
    data = bytearray(original.encode())
    if change == "edit-middle":
        data[len(data) // 2] = ord("#")
        path.write_bytes(data)
    elif change == "append":
        path.write_bytes(bytes(data) + b"one more line\n")
    elif change == "truncate":
        path.write_bytes(bytes(data[: len(data) - 10]))
    elif change == "remove":
        path.unlink()
    else:
        path.write_bytes(b"\x00" + bytes(data[1:]))
    seen = []
    with pytest.raises(DocumentChanged, match="during the ingest"):
        for piece in iter_text(source):
            seen.append(piece)
    assert original.startswith("".join(seen))  # everything handed on was the scanned content


def test_an_ingest_stopped_by_a_changed_file_resumes_to_the_uninterrupted_state(tmp_path, monkeypatch):
    """The checkpoint a changed file leaves holds only scanned content: once the file is back,
    the ingest resumes from it and ends bit-identical to an uninterrupted run."""
    monkeypatch.setattr(documents, "BLOCK_BYTES", 64)  # many blocks in a small file
    assistant = tiny_assistant(segment_len=16)
    text = _long_text(24)
    path = tmp_path / "doc.txt"
    path.write_text(text)
    with Library(tmp_path / "ref") as lib:
        _, reference, _ = assistant.ingest_scan(scan(path), lib)

    def edit_once(progress):
        if progress.segments == 12 and path.read_text() == text:
            path.write_text(text.replace("line 000020", "LINE 000020"))

    with Library(tmp_path / "lib") as lib:
        with pytest.raises(DocumentChanged):
            assistant.ingest_scan(scan(path), lib, progress=edit_once)
        (checkpoint,) = lib.checkpoints()
        assert 12 <= checkpoint.segments < reference.state.writes
        path.write_text(text)  # the content comes back (an editor's undo)
        seen = []
        _, result, _ = assistant.ingest_scan(scan(path), lib, progress=seen.append)
    assert seen[0].start_tokens == checkpoint.tokens
    assert_same_state(result, reference)


def test_unreadable_file_named_directly_is_one_line_error(tmp_path):
    path = tmp_path / "locked.txt"
    path.write_text("secret\n")
    path.chmod(0o000)
    code = f"""
import json
from edgemem.documents import scan
from edgemem.errors import EdgememError
try:
    scan({str(path)!r})
    print(json.dumps({{"error": None}}))
except EdgememError as exc:
    print(json.dumps({{"error": str(exc)}}))
"""
    assert "permission denied" in run_unprivileged(code)["error"]


def test_size_cap_refuses_a_document_over_the_limit(tmp_path):
    (tmp_path / "a.txt").write_text("a" * 600 + "\n")
    (tmp_path / "b.txt").write_text("b" * 600 + "\n")
    with pytest.raises(EdgememError, match="more than 1,000 bytes"):
        scan(tmp_path, max_bytes=1000)
    with pytest.raises(EdgememError, match="--max-size"):
        scan(tmp_path / "a.txt", max_bytes=100)
    assert scan(tmp_path, max_bytes=2000).total_bytes == 1202


# ----- through the CLI -----

runner = CliRunner()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model_folder(tmp_path_factory.mktemp("tiny-model"))


def _snapshot(root: Path, skip: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of everything under root but `skip` (iterative: the corpus is deep)."""
    out, stack = {}, [root]
    while stack:
        here = stack.pop()
        with os.scandir(here) as listing:
            for entry in listing:
                path = Path(entry.path)
                if path == skip:
                    continue
                st = entry.stat(follow_symlinks=False)
                out[entry.path] = (st.st_size, st.st_mtime_ns)
                if entry.is_dir(follow_symlinks=False):
                    stack.append(path)
    return out


def test_cli_ingest_of_the_hostile_corpus_succeeds_and_writes_only_in_its_home(tmp_path, model, monkeypatch):
    corpus = tmp_path / "corpus"
    build(corpus, unreadable=False, deep=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("EDGEMEM_HOME", str(home))
    before = _snapshot(tmp_path, home)
    args = ["ingest", str(corpus), "--model", str(model), "--segment-len", "512"]
    result = finishes_within(300, runner.invoke, app, args)
    assert result.exit_code == 0, result.output
    assert "skipped 3 binary file(s)" in result.stderr and "skipped 1 special file(s)" in result.stderr
    assert "not valid UTF-8" in result.stderr and "Traceback" not in result.output
    assert _snapshot(tmp_path, home) == before  # nothing written or touched outside EDGEMEM_HOME
    assert (home / "data" / "library.sqlite3").is_file()


def _member(tmp_path: Path, name: str) -> Path:
    if name == "fifo":
        os.mkfifo(tmp_path / "fifo")
    elif name == "loop":
        (tmp_path / "loop").symlink_to("loop")
    elif name not in SMALL_FILES:
        return Path(name)
    else:
        (tmp_path / name).write_bytes(SMALL_FILES[name])
    return tmp_path / name


@pytest.mark.parametrize("name", [*SMALL_FILES, "fifo", "loop", "/dev/zero"], ids=repr)
def test_each_corpus_member_alone_is_ingested_or_refused_in_one_line(tmp_path, model, name, monkeypatch):
    monkeypatch.setenv("EDGEMEM_HOME", str(tmp_path / "home"))
    target = _member(tmp_path, name)
    start = time.monotonic()
    result = runner.invoke(app, ["ingest", str(target), "--model", str(model), "--segment-len", "512"])
    assert time.monotonic() - start < 120
    assert (
        "Traceback" not in result.output
        and result.exception is None
        or isinstance(result.exception, SystemExit)
    ), result.output
    if result.exit_code == 0:
        assert "ingested" in result.stderr
    else:
        assert result.exit_code == 1
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, result.stderr
