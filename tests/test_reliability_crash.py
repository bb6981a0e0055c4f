"""Crash safety of the library: an ingest killed with SIGKILL at a random moment leaves the
library consistent (SQLite integrity check; every entry's and checkpoint's state file present,
with its recorded sha256, loading as a valid state) and the same ingest resumes from the last
saved checkpoint to the state an uninterrupted run reaches, bit for bit. Several processes
ingesting and asking at the same time do not corrupt the store.

The default run does one kill trial (1-3 kills); `python -m pytest -m reliability` runs the full set
(EDGEMEM_CRASH_TRIALS, 24 by default). Each trial prints its seed: `EDGEMEM_CRASH_SEED=<seed>`
replays it. The processes are forked from one that imported torch once (see `Zygote`).
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

    def start(self, mode: str, root: Path, doc: Path) -> int:
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

    def _keep(self, line: str) -> None:
        pid, _, text = line.partition(": ")
        self.lines.setdefault(int(pid), []).append(text)

    def run(self, mode: str, root: Path, doc: Path) -> list[str]:
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


def _worker(assistant, mode: str, root: str, doc: str) -> None:
    """`ingest`: the document, resuming a checkpoint, saving one after every segment;
    `ask`: ingest (or reuse) then answer a question, four times."""
    from edgemem.documents import scan
    from edgemem.store import Library

    seen = []
    with Library(Path(root)) as lib:
        if mode == "ingest":
            assistant.ingest_scan(scan(doc), lib, progress=seen.append, checkpoint_every_s=0.0)
            if seen:
                print(f"{os.getpid()}: start {seen[0].start_tokens}", flush=True)
            return
        for i in range(4):
            record, result, _ = assistant.ingest_scan(scan(doc), lib, checkpoint_every_s=0.0)
            text = "".join(assistant.ask(result, f"question {i}?", max_new_tokens=4))
            lib.add_message(record.content_hash, "user", f"question {i}?")
            print(f"{os.getpid()}: answer: {text!r}", flush=True)


def _zygote() -> None:
    """Read `start MODE ROOT DOC` / `wait PID` lines; fork a worker for each start."""
    import traceback

    import torch

    sys.path.insert(0, str(HERE))
    from tiny_assistant import tiny_assistant

    torch.set_num_threads(1)  # no OpenMP thread pool before fork
    assistant = tiny_assistant(segment_len=S)
    print("zygote ready", flush=True)
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
            print(f"started {pid}", flush=True)
        elif command == "wait":
            pid = int(args[0])
            _, status = os.waitpid(pid, 0)
            print(f"exited {pid} {os.waitstatus_to_exitcode(status)}", flush=True)


if __name__ == "__main__":
    _zygote()
