"""The library store: keyed by content, atomic, and never trusting a damaged state file."""

import errno
import os

import pytest
import torch

from edgemem.armt import IngestResult, MemoryState
from edgemem.errors import EdgememError
from edgemem.store import Library

SHAPES = {"layers.3.A": (1, 6, 4), "layers.3.z": (1, 6)}


def doc(seed: int = 0, writes: int = 3) -> IngestResult:
    g = torch.Generator().manual_seed(seed)
    state = MemoryState({3: torch.randn(1, 6, 4, generator=g)}, {3: torch.rand(1, 6, generator=g)}, writes)
    return IngestResult(state, [5, 6, 7], 3 * 10 + 3)


@pytest.fixture
def lib(tmp_path):
    with Library(tmp_path) as library:
        yield library


def test_save_load_round_trip(lib):
    original = doc()
    record = lib.save("/docs/a.txt", "hash-a", "model@1", "adapter-1", original)
    loaded = lib.load(record, SHAPES)
    assert loaded.tail_ids == [5, 6, 7] and loaded.tokens == 33 and loaded.state.writes == 3
    assert torch.equal(loaded.state.A[3], original.state.A[3]) and torch.equal(
        loaded.state.z[3], original.state.z[3]
    )


def test_database_is_in_wal_mode(lib):
    assert lib.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_records_are_keyed_by_content_model_and_adapter(lib):
    lib.save("/docs/a.txt", "hash-a", "model@1", "adapter-1", doc())
    assert lib.find("hash-a", "model@1", "adapter-1") is not None
    assert lib.find("hash-a", "model@2", "adapter-1") is None
    assert lib.find("hash-a", "model@1", "adapter-2") is None
    assert lib.find("hash-b", "model@1", "adapter-1") is None
    # the same content under another path is the same entry
    lib.save("/elsewhere/copy.txt", "hash-a", "model@1", "adapter-1", doc())
    assert len(lib.records()) == 1


def test_changed_file_replaces_its_old_entry(lib):
    old = lib.save("/docs/a.txt", "hash-old", "model@1", "adapter-1", doc())
    lib.save("/docs/a.txt", "hash-new", "model@1", "adapter-1", doc(1))
    assert [r.content_hash for r in lib.records()] == ["hash-new"]
    assert not (lib.states / old.state_file).exists()


def test_corrupt_state_is_rejected(lib):
    record = lib.save("/docs/a.txt", "hash-a", "model@1", "adapter-1", doc())
    path = lib.states / record.state_file
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(EdgememError, match="corrupt"):
        lib.load(record, SHAPES)


def test_state_with_wrong_shapes_is_rejected(lib):
    record = lib.save("/docs/a.txt", "hash-a", "model@1", "adapter-1", doc())
    with pytest.raises(EdgememError, match="wrong shapes"):
        lib.load(record, {"layers.3.A": (1, 6, 8), "layers.3.z": (1, 6)})


def test_state_with_nan_is_rejected(lib):
    bad = doc()
    bad.state.A[3][0, 0, 0] = float("nan")
    record = lib.save("/docs/a.txt", "hash-a", "model@1", "adapter-1", bad)
    with pytest.raises(EdgememError, match="NaN"):
        lib.load(record, SHAPES)


def test_missing_state_file_is_reported(lib):
    record = lib.save("/docs/a.txt", "hash-a", "model@1", "adapter-1", doc())
    (lib.states / record.state_file).unlink()
    with pytest.raises(EdgememError, match="missing"):
        lib.load(record, SHAPES)


def test_disk_full_on_save_changes_nothing(lib, monkeypatch):
    lib.save("/docs/a.txt", "hash-a", "model@1", "adapter-1", doc())

    def full(_fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)  # the OS layer fails; the store code runs for real
    with pytest.raises(EdgememError, match="disk full"):
        lib.save("/docs/a.txt", "hash-b", "model@1", "adapter-1", doc(1))
    assert [r.content_hash for r in lib.records()] == ["hash-a"]
    assert sorted(p.name for p in lib.states.iterdir()) == [lib.records()[0].state_file]


def test_remove_deletes_record_and_file(lib):
    record = lib.save("/docs/a.txt", "hash-a", "model@1", "adapter-1", doc())
    lib.remove(record.id)
    assert lib.records() == [] and not (lib.states / record.state_file).exists()
    with pytest.raises(EdgememError, match="no library entry"):
        lib.remove(record.id)


def test_unreadable_database_is_reported(tmp_path):
    (tmp_path / "library.sqlite3").write_bytes(b"this is not a database" * 100)
    with pytest.raises(EdgememError, match="unreadable"):
        Library(tmp_path)
