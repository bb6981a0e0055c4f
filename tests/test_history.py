"""Per-document chat history in the library database: kept in order, survives a re-ingest, follows a
changed file to its new entry, and goes with the last entry of its document."""

import pytest
import torch

from edgemem.armt import IngestResult, MemoryState
from edgemem.store import Library


def doc() -> IngestResult:
    return IngestResult(MemoryState({3: torch.zeros(1, 6, 4)}, {3: torch.zeros(1, 6)}, 1), [5], 11)


@pytest.fixture
def lib(tmp_path):
    with Library(tmp_path) as library:
        yield library


def test_history_is_kept_in_order_per_document_and_across_reopening(lib, tmp_path):
    lib.save("/docs/a.txt", "hash-a", "model@1", "adapter-1", doc())
    lib.add_message("hash-a", "user", "What is the code?")
    lib.add_message("hash-a", "assistant", "It is **4417**.")
    lib.add_message("hash-b", "user", "another document")
    lib.close()
    with Library(tmp_path) as again:
        assert [(m.role, m.content) for m in again.history("hash-a")] == [
            ("user", "What is the code?"),
            ("assistant", "It is **4417**."),
        ]
        assert again.clear_history("hash-a") == 2 and again.history("hash-a") == []
        assert len(again.history("hash-b")) == 1


def test_history_rejects_unknown_roles(lib):
    with pytest.raises(ValueError):
        lib.add_message("hash-a", "system", "nope")


def test_history_survives_a_reingest_with_another_model(lib):
    first = lib.save("/docs/a.txt", "hash-a", "model@1", "adapter-1", doc())
    lib.add_message("hash-a", "user", "hello")
    lib.save("/docs/a.txt", "hash-a", "model@2", "adapter-1", doc())
    lib.remove(first.id)  # one entry of the same content is still there
    assert [m.content for m in lib.history("hash-a")] == ["hello"]


def test_history_follows_a_changed_file_to_its_new_entry(lib):
    lib.save("/docs/a.txt", "hash-old", "model@1", "adapter-1", doc())
    lib.add_message("hash-old", "user", "before the edit")
    lib.save("/docs/a.txt", "hash-new", "model@1", "adapter-1", doc())
    assert [m.content for m in lib.history("hash-new")] == ["before the edit"]
    assert lib.history("hash-old") == []


def test_history_goes_with_the_last_entry_of_its_document(lib):
    record = lib.save("/docs/a.txt", "hash-a", "model@1", "adapter-1", doc())
    lib.add_message("hash-a", "user", "hello")
    lib.remove(record.id)
    assert lib.history("hash-a") == []
