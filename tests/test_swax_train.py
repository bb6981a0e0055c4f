"""SWAX training: a tiny model learns from real text on a CPU in seconds, a resumed run ends where an
uninterrupted one does, niah items put the needle and the answer where they say."""

from pathlib import Path

import torch

from edgemem.swax import SwaxConfig, WindowSchedule
from edgemem.swax_train import (
    ByteStream,
    TrainConfig,
    bits_per_byte,
    cosine_lr,
    load_checkpoint,
    make_batch,
    new_model,
    niah_overhead,
    niah_sequence,
    read_jsonl,
    train,
)

ROOT = Path(__file__).resolve().parents[1]
TINY = SwaxConfig(d_model=32, n_layers=2, n_heads=2, window=8, chunk=16)


def _real_text() -> ByteStream:
    """Real prose: the project's own documentation."""
    return ByteStream([(ROOT / "README.md").read_text(), (ROOT / "docs" / "ARCHITECTURE.md").read_text()])


def test_tiny_model_loss_falls_on_real_text():
    """60 steps on real text bring a tiny SWAX model's held-out bits per byte well below its start."""
    torch.set_num_threads(1)
    stream = _real_text()
    gen = torch.Generator().manual_seed(123)
    held = [stream.window(65, gen) for _ in range(16)]
    model = new_model(TINY, 0)
    before = bits_per_byte(model, held, 8)
    cfg = TrainConfig(steps=60, batch=8, length=64, lr=1e-2, warmup=5, needle_frac=0.0, log_every=10)
    records = train(model, stream, WindowSchedule(4, 16, 0.5, cfg.steps), cfg)
    after = bits_per_byte(model, held, 16)
    assert before > 7.5  # ~8 bits: uniform over bytes
    assert after < before - 2.0
    assert records[-1]["step"] == 60


def test_resumed_training_equals_uninterrupted(tmp_path):
    """Stopped at step 4 and started again, a run ends with the same weights, window draws and log
    steps as one that never stopped (data RNG, optimizer state and step come back from the file)."""
    torch.set_num_threads(1)
    stream = _real_text()
    cfg = TrainConfig(
        steps=8, batch=2, length=48, warmup=2, checkpoint_every=100, log_every=1, needle_frac=0.5
    )
    sched = WindowSchedule(4, 16, 0.5, cfg.steps)
    whole = new_model(TINY, 1)
    train(whole, stream, sched, cfg, tmp_path / "a")
    parts = new_model(TINY, 1)
    train(parts, stream, sched, cfg, tmp_path / "b", stop_at=4)
    resumed = new_model(TINY, 7)  # other initial weights: everything must come from the checkpoint
    train(resumed, stream, sched, cfg, tmp_path / "b")
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    log_a, log_b = read_jsonl(tmp_path / "a" / "log.jsonl"), read_jsonl(tmp_path / "b" / "log.jsonl")
    assert [(r["step"], r["window"], r["loss"]) for r in log_a] == [
        (r["step"], r["window"], r["loss"]) for r in log_b
    ]
    step, _, meta = load_checkpoint(tmp_path / "b" / "ckpt.safetensors", new_model(TINY, 2))
    assert step == 8 and SwaxConfig.from_json(meta["swax_config"]) == TINY


def test_niah_sequence_places_needle_and_answer():
    """The needle sits at the asked depth of the haystack and the sequence ends with query + digits."""
    hay = bytes(range(97, 97 + 26)) * 4
    seq, at, ans = niah_sequence(hay, "abcd", "4821", 0.25)
    assert at == 26 and seq[at:].startswith(b" magic abcd=4821. ")
    assert seq.endswith(b"\nmagic abcd=4821") and seq[ans:] == b"4821"
    assert len(seq) == len(hay) + niah_overhead()


def test_batches_mark_answer_digits_only():
    """In a training batch the answer mask covers exactly the 4 answer digits of niah rows."""
    gen = torch.Generator().manual_seed(0)
    b = make_batch(_real_text(), 16, 64, 0.5, gen)
    assert b.inputs.shape == b.targets.shape == (16, 64)
    assert torch.equal(b.inputs[:, 1:], b.targets[:, :-1])
    counts = b.answer_mask.sum(1).tolist()
    assert set(counts) <= {0, 4} and 0 < counts.count(4) < 16
    for row in range(16):
        if counts[row]:
            assert bytes(b.targets[row, -4:].tolist()).isdigit()


def test_cosine_lr_warms_up_then_decays_to_floor():
    """Warm-up reaches the peak, the end is floor * peak."""
    assert cosine_lr(0, 100, 1.0, 10) == 0.1
    assert cosine_lr(9, 100, 1.0, 10) == 1.0
    assert abs(cosine_lr(100, 100, 1.0, 10) - 0.1) < 1e-12
