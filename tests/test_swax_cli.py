"""`edgemem ask --model CKPT.safetensors` with a SWAX checkpoint: the document streams through the
fixed-size state and the answer is what the model's own forward pass predicts."""

from pathlib import Path

import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from edgemem import cli_swax
from edgemem.cli import app
from edgemem.swax import SwaxConfig, WindowSchedule
from edgemem.swax_train import ByteStream, TrainConfig, new_model, train

ROOT = Path(__file__).resolve().parents[1]
TINY = SwaxConfig(d_model=32, n_layers=2, n_heads=2, window=8, chunk=16)


def _checkpoint(tmp_path: Path) -> Path:
    """A real (briefly trained) SWAX checkpoint, as the trainer writes it."""
    torch.set_num_threads(1)
    stream = ByteStream([(ROOT / "README.md").read_text()])
    cfg = TrainConfig(steps=3, batch=2, length=48, warmup=1, needle_frac=0.0, log_every=1)
    train(new_model(TINY, 0), stream, WindowSchedule.fixed(8, 3), cfg, tmp_path / "run")
    return tmp_path / "run" / "ckpt.safetensors"


def test_answer_streams_what_the_forward_pass_predicts(tmp_path, monkeypatch):
    """Greedy bytes from the state path (document in 7-byte segments, then the question, then one
    byte at a time) equal greedy decoding by re-running the whole sequence through forward."""
    monkeypatch.setattr(cli_swax, "SEGMENT", 7)
    model = cli_swax.load_swax(_checkpoint(tmp_path))
    doc = "The keys rotate every night.\nmagic abcd=12"
    got = list(
        cli_swax.answer_bytes(model, [doc[:10].encode(), doc[10:].encode()], "Which keys?", max_new=12)
    )
    seq = list((doc + "\nWhich keys?").encode())
    want = []
    with torch.no_grad():
        for _ in range(12):
            byte = int(model(torch.tensor([seq]))[0, -1].argmax())
            if byte == ord("\n"):
                break
            want.append(byte)
            seq.append(byte)
    assert got == want


def test_ask_with_a_swax_checkpoint_as_model(tmp_path):
    """The CLI recognises the checkpoint, reads the document and prints an answer line (exit 0)."""
    ckpt = _checkpoint(tmp_path)
    doc = tmp_path / "note.txt"
    doc.write_text("The backup runs at 02:00 every night.\n" * 20)
    result = CliRunner().invoke(
        app, ["ask", str(doc), "When?", "--model", str(ckpt), "--max-new-tokens", "8"]
    )
    assert result.exit_code == 0, result.output
    assert "SWAX byte model" in result.output


def test_other_files_are_not_swax_checkpoints(tmp_path):
    """A safetensors file without the SWAX metadata, or a missing path, goes to the normal loader."""
    other = tmp_path / "adapter.safetensors"
    save_file({"x": torch.zeros(1)}, str(other))
    assert not cli_swax.is_swax_checkpoint(str(other))
    assert not cli_swax.is_swax_checkpoint(str(tmp_path / "missing.safetensors"))
    assert not cli_swax.is_swax_checkpoint("smollm2-135m-instruct")
