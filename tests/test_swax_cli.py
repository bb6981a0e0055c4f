"""A SWAX checkpoint as `--model`: the document streams through the fixed-size state with the same
ingest driver and library as ARMT (stored, resumed, reused), and the answer is what the model's own
forward pass predicts."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from edgemem import cli_swax
from edgemem.armt import IngestCancelled
from edgemem.assistant import Assistant
from edgemem.cli import app
from edgemem.documents import scan
from edgemem.errors import EdgememError
from edgemem.store import Library
from edgemem.swax import SwaxConfig, SwaxState, WindowSchedule
from edgemem.swax_runtime import SwaxTorchRuntime, answer_prompt
from edgemem.swax_train import ByteStream, TrainConfig, new_model, train

ROOT = Path(__file__).resolve().parents[1]
TINY = SwaxConfig(d_model=32, n_layers=2, n_heads=2, window=8, chunk=16)
DOC = "The keys rotate every night.\n" * 3 + "magic abcd=12"


def _checkpoint(tmp_path: Path) -> Path:
    """A real (briefly trained) SWAX checkpoint, as the trainer writes it."""
    torch.set_num_threads(1)
    stream = ByteStream([(ROOT / "README.md").read_text()])
    cfg = TrainConfig(steps=3, batch=2, length=48, warmup=1, needle_frac=0.0, log_every=1)
    train(new_model(TINY, 0), stream, WindowSchedule.fixed(8, 3), cfg, tmp_path / "run")
    return tmp_path / "run" / "ckpt.safetensors"


def _assistant(ckpt: Path, segment_len: int) -> Assistant:
    runtime = SwaxTorchRuntime.open(ckpt, segment_len)
    return Assistant(None, None, None, runtime.adapter_hash, runtime)


def test_answer_is_what_the_forward_pass_predicts(tmp_path):
    """Greedy bytes from the state path (document ingested in 7-byte segments into the library,
    the tail and question as the last step, then one byte at a time) equal greedy decoding by
    re-running the whole sequence through forward."""
    asst = _assistant(_checkpoint(tmp_path), 7)
    path = tmp_path / "doc.txt"
    path.write_text(DOC)
    with Library(tmp_path / "lib") as library:
        _, doc, _ = asst.ingest_scan(scan(path), library)
    assert doc.state.writes == (len(DOC) - 1) // 7 and 1 <= len(doc.tail_ids) <= 7
    prompt, stops = answer_prompt(doc.tail_ids, "Which keys?")
    got = list(asst.runtime.generate_ids(doc.state, prompt, stops, max_new_tokens=12))
    seq, want = list((DOC + "\nWhich keys?").encode()), []
    model = asst.runtime.model
    with torch.no_grad():
        for _ in range(12):
            byte = int(model(torch.tensor([seq]))[0, -1].argmax())
            if byte == ord("\n"):
                break
            want.append(byte)
            seq.append(byte)
    assert got == want


def test_ask_stores_the_state_and_the_next_ask_reuses_it(tmp_path):
    """`ask --model CHECKPOINT` ingests into the library (one entry, keyed by the SWAX model id and
    segment length); `ingest` of the same file then finds it stored."""
    ckpt = _checkpoint(tmp_path)
    doc = tmp_path / "note.txt"
    doc.write_text("The backup runs at 02:00 every night.\n" * 20)
    result = CliRunner().invoke(
        app, ["ask", str(doc), "When?", "--model", str(ckpt), "--max-new-tokens", "8"]
    )
    assert result.exit_code == 0, result.output
    assert "SWAX byte model" in result.output
    with Library() as library:
        [record] = [r for r in library.records() if r.path == str(doc.resolve())]
    assert record.model_id.startswith("swax@") and record.adapter_hash == "swax-segment-512"
    again = CliRunner().invoke(app, ["ingest", str(doc), "--model", str(ckpt)])
    assert again.exit_code == 0 and "already in the library" in again.stderr, again.output


def test_cancelled_ingest_resumes_to_the_uninterrupted_state(tmp_path):
    """A SWAX ingest stopped after 3 segments resumes from its library checkpoint and ends in
    exactly the state of an ingest that was never stopped."""
    ckpt = _checkpoint(tmp_path)
    path = tmp_path / "long.txt"
    path.write_text(DOC * 4)
    asst = _assistant(ckpt, 16)
    calls = iter(range(100))
    with Library(tmp_path / "a") as library:
        with pytest.raises(IngestCancelled):
            asst.ingest_scan(scan(path), library, should_stop=lambda: next(calls) == 2)
        [saved] = library.checkpoints()
        assert saved.segments == 3 and saved.tokens == 48
        _, resumed, reused = asst.ingest_scan(scan(path), library)
        assert not reused and not library.checkpoints()
    with Library(tmp_path / "b") as library:
        _, straight, _ = asst.ingest_scan(scan(path), library)
    assert resumed.tail_ids == straight.tail_ids and resumed.state.tokens == straight.state.tokens
    for name, tensor in straight.state.named_tensors().items():
        assert torch.equal(resumed.state.named_tensors()[name], tensor), name


def test_stored_state_round_trips_and_a_forged_position_is_refused(tmp_path):
    """The library gives back the SwaxState it stored (position included); a stored state whose
    position is not an int64 count is one EdgememError, never a wrong state."""
    asst = _assistant(_checkpoint(tmp_path), 16)
    path = tmp_path / "doc.txt"
    path.write_text(DOC * 2)
    with Library(tmp_path / "lib") as library:
        record, doc, _ = asst.ingest_scan(scan(path), library)
        _, loaded, reused = asst.ingest_scan(scan(path), library)
        assert reused and isinstance(loaded.state, SwaxState)
        assert loaded.state.tokens == doc.state.tokens == doc.tokens - len(doc.tail_ids)
        for name, tensor in doc.state.named_tensors().items():
            assert torch.equal(loaded.state.named_tensors()[name], tensor), name
        forged = {**doc.state.named_tensors(), "position": torch.tensor([-1])}
        library.save(
            str(path.resolve()), record.content_hash, record.model_id, "forged", _Forged(forged, doc)
        )
        [bad] = [r for r in library.records() if r.adapter_hash == "forged"]
        with pytest.raises(EdgememError, match="not a valid state"):
            library.load(bad, asst.runtime.state_shapes(), SwaxState)


class _Forged:
    """An IngestResult-shaped value whose state names the given tensors (for the forged file)."""

    def __init__(self, tensors, doc):
        self.state = type("S", (), {"named_tensors": lambda self: tensors, "writes": doc.state.writes})()
        self.tail_ids, self.tokens = doc.tail_ids, doc.tokens


def test_other_files_are_not_swax_checkpoints(tmp_path):
    """A safetensors file without the SWAX metadata, or a missing path, goes to the normal loader."""
    other = tmp_path / "adapter.safetensors"
    save_file({"x": torch.zeros(1)}, str(other))
    assert not cli_swax.is_swax_checkpoint(str(other))
    assert not cli_swax.is_swax_checkpoint(str(tmp_path / "missing.safetensors"))
    assert not cli_swax.is_swax_checkpoint("smollm2-135m-instruct")


def test_a_damaged_swax_checkpoint_is_one_error_line(tmp_path):
    """A file marked as a SWAX checkpoint whose configuration or weights do not load: exit 1 and one
    `error:` line, no traceback."""
    bad = tmp_path / "ckpt.safetensors"
    save_file(
        {"model.embed.weight": torch.zeros(3, 3)}, str(bad), metadata={"swax_config": '{"d_model": 32}'}
    )
    doc = tmp_path / "doc.txt"
    doc.write_text("text\n")
    result = CliRunner().invoke(app, ["ask", str(doc), "q", "--model", str(bad)])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "not a usable SWAX checkpoint" in lines[0], result.stderr
