"""Crash safety of the library: an ingest killed with SIGKILL at a random moment leaves the
library consistent (SQLite integrity check; every entry's and checkpoint's state file present,
with its recorded sha256, loading as a valid state) and the same ingest resumes from the last
saved checkpoint to the state an uninterrupted run reaches, bit for bit. Several processes
ingesting and asking at the same time do not corrupt the store. The other writes get the same
treatment: `edgemem library --remove` killed in the middle of removing 40 entries, and a process
appending chat messages (what the chat app does for each question and answer) killed between or
inside its writes, leave a consistent store, every conversation whole or (with its last entry)
removed, and no message half-written.

The default run does one kill trial of each kind (1-3 kills for an ingest); `python -m pytest -m
reliability` runs the full sets (EDGEMEM_CRASH_TRIALS, 24 by default). Each trial prints its seed:
`EDGEMEM_CRASH_SEED=<seed>` replays it. The processes are forked from one that imported torch
once (see `Zygote`).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
S = 16
TEXT = "".join(f"line {i}: the quick brown fox {i * 7 % 13} jumps over the lazy dog.\n" for i in range(30))
OTHER = "".join(f"entry {i}: a second document, for the other process.\n" for i in range(12))


class Zygote:
    """This file run as a script: a process that imports torch and builds the tiny assistant once,
    then forks one worker per ingest or ask (a separate process with its own SQLite connection and
    file handles, running the real library and ingest code). Starting a fresh Python for each
    trial would cost 10 s of imports; forking costs milliseconds."""

    def __init__(self) -> None:
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
        env["PYTHONPATH"] = str(HERE.parent)
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "zygote"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: dict[int, list[str]] = {}
        assert self._line() == "zygote ready"

    def _line(self) -> str:
        line = self.process.stdout.readline()
        if not line:
            raise AssertionError(f"zygote exited ({self.process.wait()})")
        return line.rstrip("\n")

    def start(self, mode: str, root: Path, doc: Path | str) -> int:
        """Fork a worker: `mode` (see `_worker`) on the library at `root`, with `doc` (a path, or
        the mode's argument)."""
        self.process.stdin.write(f"start\t{mode}\t{root}\t{doc}\n")
        self.process.stdin.flush()
        while not (line := self._line()).startswith("started "):
            self._keep(line)
        return int(line.split()[1])

    def wait(self, pid: int) -> tuple[int, list[str]]:
        """-> (exit code, or -9 when killed; the lines the worker printed)."""
        self.process.stdin.write(f"wait\t{pid}\n")
        self.process.stdin.flush()
        while not (line := self._line()).startswith(f"exited {pid} "):
            self._keep(line)
        return int(line.split()[2]), self.lines.pop(pid, [])

    def expect(self, pid: int, prefix: str) -> str:
        """Wait for the worker's line that starts with `prefix` (a worker of `remove` or `chat`
        prints "begin <time.monotonic()>" when its work starts, "end <...>" when it is done)."""
        while True:
            for text in self.lines.get(pid, []):
                if text.startswith(prefix):
                    return text
            self._keep(self._line())

    def _keep(self, line: str) -> None:
        pid, _, text = line.partition(": ")
        assert pid.isdigit(), f"a line from no worker: {line!r}"
        self.lines.setdefault(int(pid), []).append(text)

    def run(self, mode: str, root: Path, doc: Path | str) -> list[str]:
        code, lines = self.wait(self.start(mode, root, doc))
        assert code == 0, lines
        return lines

    def close(self) -> None:
        self.process.stdin.close()
        self.process.kill()  # nothing left to wait for: every worker was reaped
        self.process.wait(timeout=60)


@pytest.fixture(scope="module")
def zygote():
    z = Zygote()
    yield z
    z.close()


@pytest.fixture(scope="module")
def shapes():
    from tiny_assistant import tiny_assistant

    return tiny_assistant(segment_len=S).armt.state_shapes()


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    root = tmp_path_factory.mktemp("docs")
    (root / "notes.txt").write_text(TEXT)
    (root / "other.txt").write_text(OTHER)
    return root


def stored(root: Path, shapes, name: str):
    from edgemem.store import Library

    with Library(root) as lib:
        (record,) = [r for r in lib.records() if Path(r.path).name == name]
        return lib.load(record, shapes)


@pytest.fixture(scope="module")
def reference(zygote, docs, shapes, tmp_path_factory):
    """Uninterrupted runs: what every killed-and-resumed run must end in. -> (results, seconds)."""
    root = tmp_path_factory.mktemp("reference")
    start = time.monotonic()
    zygote.run("ingest", root, docs / "notes.txt")
    seconds = time.monotonic() - start
    zygote.run("ingest", root, docs / "other.txt")
    return {name: stored(root, shapes, name) for name in ("notes.txt", "other.txt")}, seconds


def crash_trial(seed: int, zygote: Zygote, docs: Path, shapes, reference, root: Path) -> str:
    """Kill 1-3 ingests of notes.txt at random moments, checking the library after each; then
    let one finish and compare with the uninterrupted run. -> what the last kill left."""
    from fuzz.helpers import assert_library_consistent, assert_same_state

    from edgemem.store import Library

    rng = random.Random(seed)
    results, seconds = reference
    left = "nothing saved"
    for kill in range(rng.randint(1, 3)):
        pid = zygote.start("ingest", root, docs / "notes.txt")
        time.sleep(rng.uniform(0, seconds * (1.0 if kill == 0 else 0.5)))
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        zygote.wait(pid)
        assert_library_consistent(root, shapes)
        with Library(root) as lib:
            checkpoints, records = lib.checkpoints(), lib.records()
        left = "finished" if records else f"checkpoint {checkpoints[0].segments}" if checkpoints else left
    with Library(root) as lib:
        saved = lib.checkpoints()
    lines = zygote.run("ingest", root, docs / "notes.txt")
    if saved:  # it went on from the last checkpoint, not from the start
        assert f"start {saved[0].tokens}" in lines, lines
    with Library(root) as lib:
        assert lib.orphans() == [], "files a killed process left were not swept"
        assert lib.checkpoints() == []
    assert_library_consistent(root, shapes)
    assert_same_state(stored(root, shapes, "notes.txt"), results["notes.txt"])
    return left


def _seeds(count: int) -> list[int]:
    fixed = os.environ.get("EDGEMEM_CRASH_SEED")
    return [int(fixed)] if fixed else [1000 + i for i in range(count)]


@pytest.mark.parametrize("seed", _seeds(1))
def test_sigkill_during_ingest_leaves_a_consistent_library_that_resumes_bit_identically(
    seed, zygote, docs, shapes, reference, tmp_path
):
    left = crash_trial(seed, zygote, docs, shapes, reference, tmp_path / "lib")
    print(f"seed {seed}: the last kill left {left}")


@pytest.mark.reliability
def test_sigkill_trials_full_set(zygote, docs, shapes, reference, tmp_path):
    """The full set of kill trials (EDGEMEM_CRASH_TRIALS, default 24), each in a fresh library."""
    count = int(os.environ.get("EDGEMEM_CRASH_TRIALS", "24"))
    outcomes = [
        crash_trial(seed, zygote, docs, shapes, reference, tmp_path / f"lib-{seed}") for seed in _seeds(count)
    ]
    kinds = {k: sum(o.startswith(k) for o in outcomes) for k in ("nothing", "checkpoint", "finished")}
    print(f"{len(outcomes)} trials (ingest {reference[1]:.1f} s); the last kill left: {kinds}")
    assert len(outcomes) == len(_seeds(count))


def test_processes_ingesting_and_asking_at_once_do_not_corrupt_the_store(
    zygote, docs, shapes, reference, tmp_path
):
    """Two processes ingest the same document while a third ingests another and asks about it
    in a loop, all on one library with a checkpoint after every segment."""
    from fuzz.helpers import assert_library_consistent, assert_same_state

    from edgemem.store import Library

    root = tmp_path / "lib"
    pids = [
        zygote.start("ingest", root, docs / "notes.txt"),
        zygote.start("ingest", root, docs / "notes.txt"),
        zygote.start("ask", root, docs / "other.txt"),
    ]
    outcomes = [zygote.wait(pid) for pid in pids]
    assert [code for code, _ in outcomes] == [0, 0, 0], outcomes
    assert sum(line.startswith("answer:") for line in outcomes[2][1]) == 4
    assert_library_consistent(root, shapes)
    with Library(root) as lib:
        assert sorted(Path(r.path).name for r in lib.records()) == ["notes.txt", "other.txt"]
        assert lib.checkpoints() == [] and lib.orphans() == []
        assert (
            len(lib.history(lib.records()[0].content_hash) + lib.history(lib.records()[1].content_hash)) == 4
        )
    for name, result in reference[0].items():
        assert_same_state(stored(root, shapes, name), result)


# ----- the other writes: `library --remove` and chat messages -----

REMOVE_CONTENTS = 20  # documents, each stored for two models: 40 entries, 3 messages each


def library_to_remove(root: Path, shapes) -> tuple[list[int], dict[str, list[int]], dict[str, list]]:
    """A library of REMOVE_CONTENTS documents, each stored for models m@1 and m@2, each with a
    3-message conversation. -> (ids in removal order: every m@1 entry, then every m@2 entry;
    content hash -> its entries' ids; content hash -> its conversation as (role, text) pairs)."""
    from edgemem.store import Library

    result = random_result(shapes)
    first, second, entries, talks = [], [], {}, {}
    with Library(root) as lib:
        for i in range(REMOVE_CONTENTS):
            content = f"{i:064x}"
            for model, ids in (("m@1", first), ("m@2", second)):
                record = lib.save(f"/docs/{i}.txt", content, model, "a", result)
                ids.append(record.id)
                entries.setdefault(content, []).append(record.id)
            talks[content] = [(role, f"about document {i}, {role} {j}") for j, role in enumerate(ROLES * 2)][
                :3
            ]
            for role, text in talks[content]:
                lib.add_message(content, role, text)
    return first + second, entries, talks


ROLES = ("user", "assistant")


def random_result(shapes):
    from edgemem.armt import IngestResult, MemoryState

    state = MemoryState.from_named_tensors({k: torch.rand(v) for k, v in shapes.items()}, 3)
    return IngestResult(state, [5, 6], 50)


def chat_message(seed: int, i: int) -> tuple[str, str]:
    """The i-th message of a chat trial: alternating roles, 1 to 300 KB of text (a long answer
    spans many database pages), ending in a marker so that a cut message would be seen."""
    size = random.Random(seed * 100_003 + i).randint(1, 300_000)
    return ROLES[i % 2], f"message {i}: " + ("lorem ipsum dolor " * (size // 18 + 1))[:size] + f" [end {i}]"


def check_removal(root: Path, shapes, order: list[int], entries: dict, talks: dict) -> tuple[int, int]:
    """After a kill during `library --remove`: the store is consistent, the entries left are the
    ones not yet removed (each removal all or nothing, in order), every conversation is whole
    while an entry of its document is left and gone once the last one is, and at most the file of
    the last removal is left unreferenced. -> (entries removed, files left unreferenced)."""
    from fuzz.helpers import assert_library_consistent

    from edgemem.store import Library

    assert_library_consistent(root, shapes)
    with Library(root) as lib:
        left = [r.id for r in lib.records()]
        removed = len(order) - len(left)
        assert sorted(left) == sorted(order[removed:]), (left, removed)
        for content, ids in entries.items():
            history = [(m.role, m.content) for m in lib.history(content)]
            assert history == (talks[content] if set(ids) & set(left) else []), content
        orphans = lib.orphans()
    assert len(orphans) <= 1, orphans
    return removed, len(orphans)


def remove_trial(seed: int, zygote: Zygote, shapes, seconds: float, home: Path) -> str:
    """Kill `library --remove` (40 ids) at a random moment; check; remove the rest; check that
    the next write sweeps what the kill left. -> what the kill left."""
    from fuzz.helpers import assert_library_consistent

    from edgemem.store import Library

    rng = random.Random(seed)
    root = home / "data"
    order, entries, talks = library_to_remove(root, shapes)
    pid = zygote.start("remove", home, ",".join(map(str, order)))
    zygote.expect(pid, "begin")
    time.sleep(rng.uniform(0, seconds))
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    zygote.wait(pid)
    removed, orphans = check_removal(root, shapes, order, entries, talks)
    if removed < len(order):
        zygote.run("remove", home, ",".join(map(str, order[removed:])))
    with Library(root) as lib:  # the next write (another document saved) sweeps any orphan
        assert lib.records() == [] and all(lib.history(c) == [] for c in entries)
        lib.save("/docs/next.txt", "f" * 64, "m@1", "a", random_result(shapes))
        assert lib.orphans() == []
    assert_library_consistent(root, shapes)
    return f"{removed} of {len(order)} removed" + (", its file left and swept" if orphans else "")


def chat_trial(seed: int, zygote: Zygote, seconds: float, root: Path, count: int) -> str:
    """Kill a process appending `count` chat messages at a random moment; the conversation is
    every message it had committed (in order, each whole) and at most one more; appending the
    rest completes it exactly. -> how many messages the kill left."""
    from fuzz.helpers import assert_library_consistent

    from edgemem.store import Library

    rng = random.Random(seed)
    content = f"{seed:064x}"
    expected = [chat_message(seed, i) for i in range(count)]
    pid = zygote.start("chat", root, f"{content},0,{count},{seed}")
    zygote.expect(pid, "begin")
    time.sleep(rng.uniform(0, seconds))
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _, lines = zygote.wait(pid)
    committed = sum(line.startswith("committed ") for line in lines)
    assert_library_consistent(root)
    with Library(root) as lib:
        history = [(m.role, m.content) for m in lib.history(content)]
    assert committed <= len(history) <= committed + 1, (committed, len(history))
    assert history == expected[: len(history)]  # nothing lost, reordered or cut
    kept = len(history)
    zygote.run("chat", root, f"{content},{kept},{count},{seed}")
    with Library(root) as lib:
        assert [(m.role, m.content) for m in lib.history(content)] == expected
    return f"{kept} of {count} messages"


@pytest.fixture(scope="module")
def remove_seconds(zygote, shapes, tmp_path_factory):
    """How long an uninterrupted `library --remove` of the 40 entries takes (the command's run)."""
    home = tmp_path_factory.mktemp("remove-reference")
    order, entries, talks = library_to_remove(home / "data", shapes)
    lines = zygote.run("remove", home, ",".join(map(str, order)))
    assert check_removal(home / "data", shapes, order, entries, talks) == (len(order), 0)
    return work_seconds(lines)


def work_seconds(lines: list[str]) -> float:
    """From a worker's "begin" line to its "end" line."""
    (begin,) = [float(line.split()[1]) for line in lines if line.startswith("begin ")]
    (end,) = [float(line.split()[1]) for line in lines if line.startswith("end ")]
    return end - begin


CHAT_MESSAGES = 60


@pytest.fixture(scope="module")
def chat_seconds(zygote, tmp_path_factory):
    """How long appending CHAT_MESSAGES messages takes, uninterrupted."""
    root = tmp_path_factory.mktemp("chat-reference")
    lines = zygote.run("chat", root, f"{'0' * 64},0,{CHAT_MESSAGES},1")
    assert sum(line.startswith("committed ") for line in lines) == CHAT_MESSAGES
    return work_seconds(lines)


@pytest.mark.parametrize("seed", _seeds(2))
def test_sigkill_during_library_remove_keeps_entries_files_and_conversations_consistent(
    seed, zygote, shapes, remove_seconds, tmp_path
):
    left = remove_trial(seed, zygote, shapes, remove_seconds, tmp_path / "home")
    print(f"seed {seed}: the kill left {left} (uninterrupted: {remove_seconds:.2f} s)")


@pytest.mark.parametrize("seed", _seeds(2))
def test_sigkill_during_chat_history_writes_loses_no_committed_message_and_cuts_none(
    seed, zygote, chat_seconds, tmp_path
):
    left = chat_trial(seed, zygote, chat_seconds, tmp_path / "lib", CHAT_MESSAGES)
    print(f"seed {seed}: the kill left {left} (uninterrupted: {chat_seconds:.2f} s)")


@pytest.mark.reliability
def test_sigkill_trials_of_remove_and_chat_full_set(zygote, shapes, remove_seconds, chat_seconds, tmp_path):
    """The full sets (EDGEMEM_CRASH_TRIALS each, default 24), each in a fresh library."""
    count = int(os.environ.get("EDGEMEM_CRASH_TRIALS", "24"))
    removals = [
        remove_trial(seed, zygote, shapes, remove_seconds, tmp_path / f"home-{seed}")
        for seed in _seeds(count)
    ]
    chats = [
        chat_trial(seed, zygote, chat_seconds, tmp_path / f"chat-{seed}", CHAT_MESSAGES)
        for seed in _seeds(count)
    ]
    print(f"remove ({remove_seconds:.2f} s uninterrupted): {removals}")
    print(f"chat ({chat_seconds:.2f} s uninterrupted): {chats}")
    assert len(removals) == len(chats) == len(_seeds(count))


def _tell(line: str) -> None:
    """One line to the test process, in one write: with PYTHONUNBUFFERED a `print` is two writes
    (text, then newline), and a forked worker's line could land between them."""
    sys.__stdout__.write(line + "\n")  # the pipe, even where a worker redirects sys.stdout
    sys.__stdout__.flush()


def _say(text: str) -> None:
    """A worker's line, prefixed with its pid."""
    _tell(f"{os.getpid()}: {text}")


def _worker(assistant, mode: str, root: str, doc: str) -> None:
    """`ingest`: the document, resuming a checkpoint, saving one after every segment;
    `ask`: ingest (or reuse) then answer a question, four times;
    `remove`: `edgemem library --remove ID ...` (the CLI itself) with EDGEMEM_HOME=root, `doc`
    being the ids; `chat`: append the messages `doc` = "HASH,START,STOP,SEED" says (see
    `chat_message`), printing each once it is committed."""
    from edgemem.documents import scan
    from edgemem.store import Library

    if mode == "remove":
        import io

        from edgemem.cli import app

        os.environ["EDGEMEM_HOME"] = root
        args = [arg for i in doc.split(",") for arg in ("--remove", i)]
        remove = Library.remove

        def announced(self, *a, **k):  # "begin" as the first removal starts, past the CLI's start-up
            if not getattr(announced, "said", False):
                announced.said = True
                _say(f"begin {time.monotonic()}")
            return remove(self, *a, **k)

        Library.remove = announced  # the real removal, only announced
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # the table; stdout is the zygote's pipe
                app(["library", *args])
        except SystemExit as exc:
            if exc.code:
                raise
        _say(f"end {time.monotonic()}")
        return
    if mode == "chat":
        content_hash, start, stop, seed = doc.split(",")
        messages = [chat_message(int(seed), i) for i in range(int(start), int(stop))]
        with Library(Path(root)) as lib:
            _say(f"begin {time.monotonic()}")
            for i, message in enumerate(messages, int(start)):
                lib.add_message(content_hash, *message)
                _say(f"committed {i}")
        _say(f"end {time.monotonic()}")
        return
    seen = []
    with Library(Path(root)) as lib:
        if mode == "ingest":
            assistant.ingest_scan(scan(doc), lib, progress=seen.append, checkpoint_every_s=0.0)
            if seen:
                _say(f"start {seen[0].start_tokens}")
            return
        for i in range(4):
            record, result, _ = assistant.ingest_scan(scan(doc), lib, checkpoint_every_s=0.0)
            text = "".join(assistant.ask(result, f"question {i}?", max_new_tokens=4))
            lib.add_message(record.content_hash, "user", f"question {i}?")
            _say(f"answer: {text!r}")


def _zygote() -> None:
    """Read `start MODE ROOT DOC` / `wait PID` lines; fork a worker for each start."""
    import traceback

    import torch

    sys.path.insert(0, str(HERE))
    from tiny_assistant import tiny_assistant

    import edgemem.cli  # noqa: F401  (the `remove` workers run the CLI: imported once, not per fork)

    torch.set_num_threads(1)  # no OpenMP thread pool before fork
    assistant = tiny_assistant(segment_len=S)
    _tell("zygote ready")
    for line in sys.stdin:
        command, *args = line.rstrip("\n").split("\t")
        if command == "start":
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    _worker(assistant, *args)
                except BaseException:
                    traceback.print_exc()
                    code = 1
                finally:
                    sys.stdout.flush()
                    os._exit(code)
            _tell(f"started {pid}")
        elif command == "wait":
            pid = int(args[0])
            _, status = os.waitpid(pid, 0)
            _tell(f"exited {pid} {os.waitstatus_to_exitcode(status)}")


if __name__ == "__main__":
    _zygote()
