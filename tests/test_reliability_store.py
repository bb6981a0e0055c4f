"""The store's rules for sharing a library between processes: a state file is written only while
the SQLite write lock is held, so a file that no row refers to can only be an orphan of a killed
process, and the next writer sweeps it; files that rows refer to are never touched."""

import sqlite3
import threading
import time

import torch

from edgemem.armt import IngestResult, MemoryState
from edgemem.store import Library


def state(writes: int = 2) -> MemoryState:
    return MemoryState({3: torch.ones(1, 6, 4)}, {3: torch.ones(1, 6)}, writes)


def test_a_writer_writes_no_file_while_another_process_holds_the_write_lock(tmp_path):
    with Library(tmp_path) as lib:
        lib.save_checkpoint("/d.txt", "h", "m@1", "a", state(1), 10)
    before = sorted(p.name for p in (tmp_path / "states").iterdir())
    other = sqlite3.connect(tmp_path / "library.sqlite3")  # another process, in the middle of a write
    other.execute("BEGIN IMMEDIATE")
    done = threading.Event()

    def write():
        with Library(tmp_path) as lib:
            lib.save_checkpoint("/d.txt", "h", "m@1", "a", state(2), 20)
        done.set()

    thread = threading.Thread(target=write)
    thread.start()
    time.sleep(1.0)
    try:
        assert not done.is_set()
        assert sorted(p.name for p in (tmp_path / "states").iterdir()) == before  # nothing written yet
    finally:
        other.rollback()
        other.close()
    thread.join(30)
    assert done.is_set()
    with Library(tmp_path) as lib:
        (checkpoint,) = lib.checkpoints()
        assert checkpoint.segments == 2
        assert sorted(p.name for p in lib.states.iterdir()) == [checkpoint.state_file]  # old one deleted


def test_orphans_of_a_killed_process_are_swept_by_the_next_write_and_nothing_else(tmp_path):
    with Library(tmp_path) as lib:
        kept = lib.save("/a.txt", "ha", "m@1", "a", IngestResult(state(), [1, 2], 34))
        lib.save_checkpoint("/b.txt", "hb", "m@1", "a", state(1), 10)
        orphan = lib.states / ("0" * 24 + ".partial-7.0123abcd.safetensors")  # renamed, never committed
        orphan.write_bytes(b"x")
        tmp = lib.states / f".{'1' * 24}.safetensors.4242.tmp"  # killed while writing
        tmp.write_bytes(b"half")
        foreign = lib.states / "notes-the-user-left-here.txt"  # not a name the store makes
        foreign.write_text("keep\n")
        assert set(lib.orphans()) == {orphan.name, tmp.name, foreign.name}
        assert lib.verify() == []  # orphans are not damage
        lib.save_checkpoint("/b.txt", "hb", "m@1", "a", state(2), 20)
        assert lib.orphans() == [foreign.name]
        assert (lib.states / kept.state_file).is_file() and lib.verify() == []
