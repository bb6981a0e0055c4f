"""Resumable ingest: a cancelled, interrupted or killed ingest continues from its last checkpoint
and ends in exactly the state an uninterrupted run reaches."""

import shutil

import pytest
import torch
from tiny_assistant import tiny_assistant

from edgemem.armt import IngestCancelled
from edgemem.documents import scan
from edgemem.store import Library

S = 16
TEXT = "".join(f"line {i}: the quick brown fox {i * 7 % 13} jumps over the lazy dog.\n" for i in range(12))


@pytest.fixture(scope="module")
def assistant():
    return tiny_assistant(segment_len=S)


@pytest.fixture
def doc(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text(TEXT)
    return scan(path)


@pytest.fixture(scope="module")
def ref(assistant, tmp_path_factory):
    """The uninterrupted run everything is compared with."""
    tmp = tmp_path_factory.mktemp("reference")
    (tmp / "notes.txt").write_text(TEXT)
    with Library(tmp / "lib") as lib:
        _, result, reused = assistant.ingest_scan(scan(tmp / "notes.txt"), lib)
    assert not reused and result.state.writes > 20
    return result


def assert_same_document(a, b):
    assert a.tokens == b.tokens and a.tail_ids == b.tail_ids and a.state.writes == b.state.writes
    for name, tensor in a.state.named_tensors().items():
        assert torch.equal(tensor, b.state.named_tensors()[name]), name  # bit-identical


class StopAfter:
    def __init__(self, segments: int) -> None:
        self.segments, self.seen = segments, []

    def progress(self, p) -> None:
        self.seen.append(p)

    def __call__(self) -> bool:
        return len(self.seen) >= self.segments


def test_cancelled_ingest_resumes_to_the_state_of_an_uninterrupted_run(assistant, ref, doc, tmp_path):
    with Library(tmp_path / "lib") as lib:
        stop = StopAfter(7)
        with pytest.raises(IngestCancelled, match="after 112 tokens"):
            assistant.ingest_scan(doc, lib, progress=stop.progress, should_stop=stop)
        (checkpoint,) = lib.checkpoints()
        assert (checkpoint.tokens, checkpoint.segments) == (7 * S, 7)
        assert lib.records() == []

        seen, notices = [], []
        record, result, reused = assistant.ingest_scan(doc, lib, progress=seen.append, notice=notices.append)
        assert not reused and "from 112 tokens" in notices[0]
        assert seen[0].start_tokens == 7 * S and seen[0].tokens == 8 * S  # it went on, not from 0
        assert len(seen) == ref.state.writes - 7
        assert_same_document(result, ref)
        assert_same_document(lib.load(record, assistant.armt.state_shapes()), ref)  # and as stored
        assert lib.checkpoints() == [] and not list(lib.states.glob("*partial*"))


def test_ctrl_c_mid_ingest_leaves_a_checkpoint_to_resume_from(assistant, ref, doc, tmp_path):

    def interrupt(p):
        if p.segments == 5:
            raise KeyboardInterrupt  # what the signal does when it lands after a segment

    with Library(tmp_path / "lib") as lib:
        with pytest.raises(KeyboardInterrupt):
            assistant.ingest_scan(doc, lib, progress=interrupt)
        assert lib.checkpoints()[0].segments == 5
        _, result, _ = assistant.ingest_scan(doc, lib)
    assert_same_document(result, ref)


def test_killed_ingest_resumes_from_its_last_periodic_checkpoint(assistant, ref, doc, tmp_path):
    root, crashed = tmp_path / "lib", tmp_path / "after-kill"

    def snapshot(p):
        if p.segments == 9:  # the files on disk at this moment are what a kill -9 would leave
            shutil.copytree(root, crashed)

    with Library(root) as lib:
        assistant.ingest_scan(doc, lib, progress=snapshot, checkpoint_every_s=0.0)
    with Library(crashed) as lib:
        (checkpoint,) = lib.checkpoints()
        assert checkpoint.segments == 8  # saved after the segment before the "kill"
        seen = []
        _, result, _ = assistant.ingest_scan(doc, lib, progress=seen.append)
    assert seen[0].start_tokens == 8 * S
    assert_same_document(result, ref)


def test_force_starts_again_and_discards_the_checkpoint(assistant, doc, tmp_path):
    with Library(tmp_path / "lib") as lib:
        stop = StopAfter(3)
        with pytest.raises(IngestCancelled):
            assistant.ingest_scan(doc, lib, progress=stop.progress, should_stop=stop)
        seen = []
        assistant.ingest_scan(doc, lib, progress=seen.append, force=True)
        assert seen[0].start_tokens == 0 and seen[0].tokens == S
        assert lib.checkpoints() == []


def test_damaged_checkpoint_is_reported_and_the_ingest_starts_over(assistant, ref, doc, tmp_path):
    with Library(tmp_path / "lib") as lib:
        stop = StopAfter(4)
        with pytest.raises(IngestCancelled):
            assistant.ingest_scan(doc, lib, progress=stop.progress, should_stop=stop)
        file = lib.states / lib.checkpoints()[0].state_file
        file.write_bytes(file.read_bytes()[:-8] + b"\xff" * 8)
        seen, notices = [], []
        _, result, _ = assistant.ingest_scan(doc, lib, progress=seen.append, notice=notices.append)
    assert "corrupt" in notices[0] and "from the beginning" in notices[0]
    assert seen[0].start_tokens == 0
    assert_same_document(result, ref)


def test_a_changed_file_does_not_resume_the_old_content(assistant, doc, tmp_path):
    with Library(tmp_path / "lib") as lib:
        stop = StopAfter(3)
        with pytest.raises(IngestCancelled):
            assistant.ingest_scan(doc, lib, progress=stop.progress, should_stop=stop)
        doc.root.write_text(TEXT.replace("fox", "cat"))
        seen = []
        assistant.ingest_scan(scan(doc.root), lib, progress=seen.append)
        assert seen[0].start_tokens == 0
        assert lib.checkpoints() == []  # the old content's progress went with it
