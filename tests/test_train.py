"""The training recipe: a tiny model learns recall, resume is exact, DDP matches one process,
schedules give the intended shapes, adapters round-trip, configs and real-text items are right."""

import json
import os
import random
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tiny import VOCAB, tiny_llama

from edgemem.armt import ARMT, override_config, read_adapter, save_adapter
from edgemem.data.tasks import NIAH_NEEDLE, NIAH_PREFIX
from edgemem.errors import EdgememError
from edgemem.files import read_safetensors, sha256_file
from edgemem.models import cpu_model
from edgemem.train import (
    FINAL_FRACTION,
    Batch,
    ProseTasks,
    Run,
    Stage,
    TokenRecall,
    TrainConfig,
    batch_shape,
    build_armt,
    forward_loss,
    learning_rate,
    load_config,
    read_log,
    recall_accuracy,
    step_rng,
    train,
)

REPO = Path(__file__).parents[1]


def load_script(name: str):
    """A module of scripts/ (not a package), imported from its file."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def writing_armt(lora_rank: int = 0) -> ARMT:
    """A tiny ARMT with memory in layers 0-1 whose values are not zero (a fresh W_V writes zeros)."""
    from edgemem.armt import ARMTConfig

    torch.manual_seed(0)
    armt = ARMT(tiny_llama(), ARMTConfig.for_model(2, segment_len=8, d_mem=8, lora_rank=lora_rank))
    with torch.no_grad():
        for memory in armt.memories.values():
            memory.W_V.weight.normal_(0, 0.5)
    return armt


def adapter_at_step(folder: Path, step: int) -> Path:
    """A stand-in run folder for the ablation driver: an adapter file whose metadata says its run
    is at `step` (the driver reads only that, never the weights)."""
    folder.mkdir(parents=True, exist_ok=True)
    adapter = folder / "adapter.safetensors"
    save_file({"w": torch.zeros(1)}, str(adapter), metadata={"train_steps": str(step)})
    return adapter


SHIPPED_CONFIG = REPO / "configs" / "train" / "smollm2-135m.toml"
# what a run continuing from the recall adapter must share with its recipe (the adapter's shapes)
RECIPE_SHAPE = ("norm_inputs", "write_source", "lora_rank", "d_mem", "num_write_tokens", "memory_layers")


def tiny_config(steps: int = 6, backbone: str = "full", **stage: object) -> TrainConfig:
    options = dict(
        name="kv",
        task="tokens",
        steps=steps,
        segment_len=4,
        segments=(1,),
        lr=3e-3,
        warmup=10,
        batch_size=16,
        needle="end",
    )
    options.update(stage)
    return TrainConfig(
        model="tiny",
        stages=(Stage(**options),),
        backbone=backbone,
        memory_layers=(0, 1, 2, 3, 4),
        d_mem=16,
        num_write_tokens=4,
        eval_every=0,
        checkpoint_every=3,
    )


def tiny_run(config: TrainConfig, out: Path) -> Run:
    torch.manual_seed(0)
    return Run(build_armt(tiny_llama(), config), out, TokenRecall(VOCAB).batch, log=lambda _: None)


def test_tiny_model_learns_two_segment_recall(tmp_path):
    """The memory carries a value from the written segment to the answer segment: loss falls and
    held-out exact recall beats chance (1 in 10) by a wide margin, in well under a minute."""
    config = tiny_config(steps=300)
    run = tiny_run(config, tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert train(config, run) == 300
    finally:
        torch.set_num_threads(threads)
    steps, _ = read_log(tmp_path / "log.jsonl")
    first = sum(r["loss"] for r in steps[:20]) / 20
    last = sum(r["loss"] for r in steps[-20:]) / 20
    assert last < 0.5 * first
    run.armt.eval()
    accuracy = recall_accuracy(run.armt, TokenRecall(VOCAB).batch, 123, 64, 4, 1, config.stages[0])
    assert accuracy >= 0.5


def test_resumed_run_continues_bit_for_bit(tmp_path):
    """Killed after step 4 with the checkpoint of step 3: the resumed run drops the logged step 4,
    runs it again, and ends with the parameters and losses of 6 steps in one go."""
    config = tiny_config(steps=6)
    straight = tiny_run(config, tmp_path / "a")
    train(config, straight)
    run_dir = tmp_path / "b"
    assert train(config, tiny_run(config, run_dir), max_steps=3) == 3
    saved = (run_dir / "checkpoint.safetensors").read_bytes()
    assert train(config, tiny_run(config, run_dir), max_steps=1) == 4
    (run_dir / "checkpoint.safetensors").write_bytes(saved)  # the kill came before step 4's save
    resumed = tiny_run(config, run_dir)  # a fresh process: a new model, the checkpoint on disk
    assert train(config, resumed) == 6
    for (name, a), (_, b) in zip(
        straight.armt.named_parameters(), resumed.armt.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name
    logs = [read_log(p / "log.jsonl")[0] for p in (tmp_path / "a", run_dir)]
    assert [r["step"] for r in logs[1]] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in logs[0]] == [r["loss"] for r in logs[1]]


def test_data_workers_build_the_same_batches_so_the_run_is_the_same_bit_for_bit(tmp_path):
    """Batches built ahead by forked worker processes (`data_workers`, so that a GPU need not wait
    while one is built) are built in those processes and are each step's own: the parameters and
    losses equal the loop-built run's, and a resume with workers continues it too."""
    import os

    from edgemem.train import step_batches

    def pid(rng, stage, S, n):
        return os.getpid()

    built_in = set(step_batches(replace(tiny_config(steps=4), data_workers=2), pid, 0, 4))
    assert built_in and os.getpid() not in built_in
    config = tiny_config(steps=5)
    straight = tiny_run(config, tmp_path / "a")
    train(config, straight)
    workers = replace(config, data_workers=2)
    assert train(workers, tiny_run(workers, tmp_path / "b"), max_steps=3) == 3
    resumed = tiny_run(workers, tmp_path / "b")
    assert train(workers, resumed) == 5
    for (name, a), (_, b) in zip(
        straight.armt.named_parameters(), resumed.armt.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name
    logs = [read_log(p / "log.jsonl")[0] for p in (tmp_path / "a", tmp_path / "b")]
    assert [r["loss"] for r in logs[0]] == [r["loss"] for r in logs[1]]
    with pytest.raises(EdgememError, match="data_workers"):
        replace(config, data_workers=-1)


def test_micro_batches_make_the_whole_batchs_update_in_a_smaller_ones_memory(tmp_path):
    """`micro_batch` rows per forward/backward pass, gradients summed before the step: the run
    whose batch of 16 goes through in parts of 5 (the last one 1 row) is the whole-batch run, up to
    float rounding: every part's gradient counts, each weighted by the global batch."""
    config = tiny_config(steps=3)
    whole = tiny_run(config, tmp_path / "a")
    train(config, whole)
    micro = replace(config, micro_batch=5)
    parts = tiny_run(micro, tmp_path / "b")
    train(micro, parts)
    for (name, a), (_, b) in zip(whole.armt.named_parameters(), parts.armt.named_parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), name
    logs = [read_log(p / "log.jsonl")[0] for p in (tmp_path / "a", tmp_path / "b")]
    for r, q in zip(*logs, strict=True):
        assert r["loss"] == pytest.approx(q["loss"], rel=1e-4)
        assert r["segment_loss"] == pytest.approx(q["segment_loss"], rel=1e-4)
        assert r["exact"] == pytest.approx(q["exact"])
    with pytest.raises(EdgememError, match="micro_batch"):
        replace(config, micro_batch=-1)


def _kill_at_call(monkeypatch, kill_at: int | None) -> list[int]:
    """Count the micro-batch passes of `train` and raise KeyboardInterrupt (a Ctrl-C, or a kill as
    far as the disk is concerned: nothing runs after it but the unwinding) at pass `kill_at`."""
    import edgemem.train as train_module

    calls, real = [], train_module.forward_loss

    def counted(*args, **kwargs):
        calls.append(1)
        if len(calls) == kill_at:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(train_module, "forward_loss", counted)
    return calls


def test_a_step_killed_between_its_micro_batches_goes_on_after_the_last_one_bit_for_bit(
    tmp_path, monkeypatch
):
    """A step taken in micro-batches keeps the gradients of those done on disk: a run killed in
    the third of step 2's four parts resumes with the two that were done (it runs two passes of
    step 2, not four) and ends with the parameters, losses and stats of the run never killed;
    step 2's logged seconds add the killed process's parts to the resumed one's."""
    config = replace(tiny_config(steps=3), micro_batch=5, checkpoint_every=1)  # 16 rows: 5, 5, 5, 1
    straight = tiny_run(config, tmp_path / "a")
    train(config, straight)
    run_dir = tmp_path / "b"
    _kill_at_call(monkeypatch, kill_at=4 + 3)
    with pytest.raises(KeyboardInterrupt):
        train(config, tiny_run(config, run_dir))
    partial = run_dir / "partial.safetensors"
    meta, tensors = read_safetensors(partial, "partial")  # the killed process's parts: said to take 1000 s
    save_file(tensors, str(partial), metadata={**meta, "seconds": "1000.0"})
    calls = _kill_at_call(monkeypatch, kill_at=None)
    resumed = tiny_run(config, run_dir)
    assert train(config, resumed) == 3
    assert len(calls) == 2 + 4
    for (name, a), (_, b) in zip(
        straight.armt.named_parameters(), resumed.armt.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name
    logs = [read_log(p / "log.jsonl")[0] for p in (tmp_path / "a", run_dir)]
    for key in ("step", "loss", "segment_loss", "exact", "grad_norm"):
        assert [r[key] for r in logs[0]] == [r[key] for r in logs[1]], key
    assert [r.get("resumed_rows") for r in logs[1]] == [None, 10, None]
    # the resumed step's seconds count both processes' parts; the others, one process's own
    assert logs[1][1]["seconds"] > 1000 > max(logs[1][0]["seconds"], logs[1][2]["seconds"])
    assert not (run_dir / "partial.safetensors").exists()  # a taken step leaves none behind


def test_a_partial_step_of_other_parameters_or_unreadable_is_redone_whole(tmp_path, monkeypatch):
    """The parts kept on disk are used only on the parameters they were computed on: a fresh run
    killed in step 1 and started again from another init, or one whose partial file is garbage,
    runs step 1 whole and ends as that run does with no partial ever written."""
    config = replace(tiny_config(steps=1), micro_batch=5)

    def other_run(out: Path) -> Run:  # another init: the run's parameters moved a little
        run = tiny_run(config, out)
        with torch.no_grad():
            next(run.armt.parameters()).add_(0.01)
        run.log = messages.append
        return run

    messages: list[str] = []
    reference = other_run(tmp_path / "ref")
    train(config, reference)
    for case in ("other parameters", "garbage"):
        run_dir = tmp_path / case.replace(" ", "-")
        _kill_at_call(monkeypatch, kill_at=3)
        with pytest.raises(KeyboardInterrupt):
            train(config, tiny_run(config, run_dir))  # unmoved: its partial is of other parameters
        if case == "garbage":
            (run_dir / "partial.safetensors").write_bytes(b"not a safetensors file")
        calls = _kill_at_call(monkeypatch, kill_at=None)
        messages.clear()
        resumed = other_run(run_dir)
        assert train(config, resumed) == 1
        assert len(calls) == 4, case
        assert any("step 1 runs whole" in m for m in messages), case
        for (name, a), (_, b) in zip(
            reference.armt.named_parameters(), resumed.armt.named_parameters(), strict=True
        ):
            assert torch.equal(a, b), (case, name)
        assert "resumed_rows" not in read_log(run_dir / "log.jsonl")[0][0]


def test_a_step_taken_whole_removes_a_partial_left_by_micro_batches(tmp_path, monkeypatch):
    """A run resumed with the whole batch at once (`--micro-batch` dropped) has no parts to keep,
    and takes the step whole; the partial its micro-batched process left is removed with the step,
    not left on disk for a later resume to find."""
    config = replace(tiny_config(steps=1), micro_batch=5)
    _kill_at_call(monkeypatch, kill_at=2)
    with pytest.raises(KeyboardInterrupt):
        train(config, tiny_run(config, tmp_path))
    assert (tmp_path / "partial.safetensors").is_file()
    monkeypatch.undo()
    whole = replace(config, micro_batch=0)
    assert train(whole, tiny_run(whole, tmp_path)) == 1
    assert not (tmp_path / "partial.safetensors").exists()


def _cli_training_folder(root: Path) -> Path:
    """What `edgemem train CONFIG` reads, small: a model folder (the tiny Llama and its character
    tokenizer), a prose corpus with train and validation documents in EDGEMEM_HOME (`root`/home),
    and a config of one two-step recall stage at batch 2. -> the config's path."""
    from fuzz.helpers import tiny_model_folder, write_corpora

    model = tiny_model_folder(root / "model")
    write_corpora(root / "home" / "data", splits=("train", "validation"))  # 18k tokens a split
    config = root / "run.toml"
    config.write_text(
        f'model = "{model}"\nbackbone = "lora"\nlora_rank = 2\nd_mem = 8\nnum_write_tokens = 2\n'
        'checkpoint_every = 1\neval_every = 0\ncorpora = ["linux-doc"]\ncorpus_tokens = 20000\n\n'
        '[[stage]]\nname = "recall"\ntask = "recall"\nsteps = 2\nsegment_len = 32\nsegments = [2]\n'
        "lr = 1e-3\nwarmup = 1\nbatch_size = 2\n"
    )
    return config


def test_edgemem_train_takes_micro_batches_from_its_option_and_the_same_command_resumes(
    tmp_path, monkeypatch
):
    """The training command end to end (model folder, corpora, config, run folder): `--micro-batch
    1` splits each batch of 2 into two passes (a Ctrl-C in step 2's second leaves the first on
    disk, rows 1); the same command again goes on after it and ends the run; the adapter's
    config says micro_batch 1. Protects the option's wiring and the README's resume promise."""
    from typer.testing import CliRunner

    from edgemem.cli import app

    config = _cli_training_folder(tmp_path)
    monkeypatch.setenv("EDGEMEM_HOME", str(tmp_path / "home"))
    out = tmp_path / "run"
    command = ["train", str(config), "--out", str(out), "--micro-batch", "1"]
    runner = CliRunner()
    first = runner.invoke(app, [*command, "--max-steps", "1"], catch_exceptions=False)
    assert first.exit_code == 0, first.output
    assert "step 1 of 2" in first.stderr
    calls = _kill_at_call(monkeypatch, kill_at=2)  # step 2's second part
    killed = runner.invoke(app, command, catch_exceptions=False)
    assert killed.exit_code == 130 and len(calls) == 2, killed.output
    with safe_open(out / "partial.safetensors", "pt") as f:
        assert f.metadata()["rows"] == "1"
    calls = _kill_at_call(monkeypatch, kill_at=None)
    resumed = runner.invoke(app, command, catch_exceptions=False)
    assert resumed.exit_code == 0, resumed.output
    assert len(calls) == 1  # step 2's second part only
    assert "step 2 goes on after 1 of its 2 rows" in resumed.stderr
    assert "step 2 of 2" in resumed.stderr
    assert not (out / "partial.safetensors").exists()
    steps, _ = read_log(out / "log.jsonl")
    assert [r["step"] for r in steps] == [1, 2] and steps[1]["resumed_rows"] == 1
    with safe_open(out / "adapter.safetensors", "pt") as f:
        assert json.loads(f.metadata()["train_config"])["micro_batch"] == 1


def test_more_processes_than_rows_in_a_batch_is_one_clear_error(tmp_path):
    config = tiny_config(steps=1)
    run = tiny_run(config, tmp_path)
    run.world = 17  # a rank would get no row of the batch of 16 to step on
    with pytest.raises(EdgememError, match="17 processes need batches of 17 or more rows, not 16"):
        train(config, run)


def test_an_evaluation_killed_after_its_checkpoint_runs_again_on_resume(tmp_path):
    """The checkpoint of an evaluation step is written before the evaluation runs: a run killed
    during the evaluation resumes at that step with no evaluation logged for it, and evaluates it
    then (a finished run, too), instead of losing that point of the learning curve for good."""
    config = replace(tiny_config(steps=4), eval_every=2, eval_items=8)
    straight = tmp_path / "a"
    train(config, tiny_run(config, straight))
    run_dir = tmp_path / "b"
    train(config, tiny_run(config, run_dir))
    log = run_dir / "log.jsonl"
    steps, evals = read_log(log)
    assert [r["step"] for r in evals] == [2, 4]
    kept = steps + evals[:1]
    log.write_text("".join(json.dumps(r) + "\n" for r in kept))  # killed during step 4's eval
    assert train(config, tiny_run(config, run_dir)) == 4
    assert read_log(log) == (steps, read_log(straight / "log.jsonl")[1])
    assert train(config, tiny_run(config, run_dir)) == 4  # evaluated once, not at every resume
    assert [r["step"] for r in read_log(log)[1]] == [2, 4]


def test_a_chunk_end_evaluation_killed_after_its_checkpoint_runs_again_on_resume(tmp_path):
    """`--max-steps` ends a chunk with a checkpoint and an evaluation at a step that is no multiple
    of eval_every: the checkpoint records that its step is evaluated, so a chunk killed during
    that evaluation evaluates it on resume, as the run that was not killed did."""
    config = replace(tiny_config(steps=6), eval_every=2, eval_items=8)
    straight = tmp_path / "a"
    train(config, tiny_run(config, straight), max_steps=3)
    run_dir = tmp_path / "b"
    train(config, tiny_run(config, run_dir), max_steps=3)
    log = run_dir / "log.jsonl"
    steps, evals = read_log(log)
    assert [r["step"] for r in evals] == [2, 3]
    log.write_text("".join(json.dumps(r) + "\n" for r in steps + evals[:1]))  # killed in step 3's eval
    assert train(config, tiny_run(config, run_dir), max_steps=0) == 3
    assert read_log(log) == (steps, read_log(straight / "log.jsonl")[1])


def test_a_checkpoint_from_before_the_evaluation_flag_resumes_by_the_eval_cadence(tmp_path):
    """Checkpoints written before they recorded whether their step is evaluated still resume: a
    step on the eval cadence is evaluated again, any other is not."""
    config = replace(tiny_config(steps=6), eval_every=2, eval_items=8)
    run_dir = tmp_path / "run"
    train(config, tiny_run(config, run_dir), max_steps=3)
    ckpt = run_dir / "checkpoint.safetensors"
    with safe_open(ckpt, "pt") as handle:
        meta = {k: v for k, v in handle.metadata().items() if k != "evaluate"}
    save_file(load_file(ckpt), ckpt, metadata=meta)
    log = run_dir / "log.jsonl"
    steps, evals = read_log(log)
    log.write_text("".join(json.dumps(r) + "\n" for r in steps + evals[:1]))
    assert train(config, tiny_run(config, run_dir), max_steps=0) == 3
    assert [r["step"] for r in read_log(log)[1]] == [2]  # step 3 is off the cadence
    assert train(config, tiny_run(config, run_dir), max_steps=1) == 4
    assert [r["step"] for r in read_log(log)[1]] == [2, 4]


def test_eval_seed_holds_the_evaluation_items_while_the_seed_changes_the_training(tmp_path):
    """A replicate under another `seed` trains on other batches but, with `eval_seed`, is
    measured on the very items the original run was: the evaluation draws from eval_seed."""
    drawn: list[tuple] = []

    def recording(rng: random.Random, stage: Stage, S: int, n: int):
        drawn.append(rng.getstate())
        return TokenRecall(VOCAB).batch(rng, stage, S, n)

    config = replace(
        tiny_config(steps=2), seed=1, eval_seed=0, eval_every=2, eval_items=8, eval_segments=(1,)
    )
    run = tiny_run(config, tmp_path)
    train(config, replace(run, make_eval_batch=recording))
    assert drawn == [step_rng(0, 0, "eval-1").getstate()]
    trained = [r["loss"] for r in read_log(tmp_path / "log.jsonl")[0]]
    other = replace(config, seed=0)
    train(other, tiny_run(other, tmp_path / "seed0"))
    assert trained != [r["loss"] for r in read_log(tmp_path / "seed0" / "log.jsonl")[0]]


def test_a_run_folder_is_trained_by_one_process_at_a_time(tmp_path):
    """A second `edgemem train` into a folder another one is training would interleave their logs
    and checkpoints: it is refused before it touches anything, and the folder trains once free."""
    from edgemem.files import lock_exclusively

    config = tiny_config(steps=2)
    with open(tmp_path / ".lock", "a") as other:
        lock_exclusively(other, "held")
        with pytest.raises(EdgememError, match="being trained by another process"):
            train(config, tiny_run(config, tmp_path))
        assert not (tmp_path / "log.jsonl").exists()
    assert train(config, tiny_run(config, tmp_path)) == 2


def test_checkpoint_of_another_config_is_refused_but_threads_may_change(tmp_path):
    train(tiny_config(steps=3), tiny_run(tiny_config(steps=3), tmp_path))
    other = tiny_config(steps=3, lr=1e-2)
    with pytest.raises(EdgememError, match="another config"):
        train(other, tiny_run(other, tmp_path))
    cadence = replace(tiny_config(steps=3), threads=1, eval_every=2)  # how it runs, not what it learns
    assert train(cadence, tiny_run(cadence, tmp_path)) == 3


def test_two_process_gloo_matches_one_process(tmp_path):
    """torchrun with 2 processes (gloo) gives the gradients of 1 process at the same global batch."""
    worker = Path(__file__).with_name("ddp_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parent)}
    one = subprocess.run(
        [sys.executable, str(worker), str(tmp_path / "one")], env=env, capture_output=True, text=True
    )
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            "29533",
            str(worker),
            str(tmp_path / "two"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert two.returncode == 0, two.stderr[-2000:]
    a, b = (
        load_file(str(tmp_path / "one" / "grads.safetensors")),
        load_file(str(tmp_path / "two" / "grads.safetensors")),
    )
    assert a.keys() == b.keys() and len(a) > 10
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-7, msg=name)
    assert any(float(t.abs().sum()) > 0 for t in a.values())


def test_curriculum_and_stochastic_segment_length_schedules():
    """Segments are drawn from the stage's list; the short length comes with probability p_short,
    never in the stage's last 10% of steps; warm-up then cosine annealing."""
    stage = Stage(
        name="s",
        task="recall",
        steps=2000,
        segment_len=128,
        segments=(2, 4, 8),
        short_segment_len=32,
        p_short=0.75,
        warmup=100,
        lr=1e-3,
        min_lr_ratio=0.1,
    )
    config = TrainConfig(model="x", stages=(Stage(name="a", task="recall", steps=10, segment_len=64), stage))
    shapes = [batch_shape(config, 10 + i) for i in range(stage.steps)]
    cut = int(stage.steps * (1 - FINAL_FRACTION))
    early, late = shapes[:cut], shapes[cut:]
    share_short = sum(s == 32 for s, _ in early) / len(early)
    assert abs(share_short - 0.75) < 0.04
    assert all(s == 128 for s, _ in late)
    for k in (2, 4, 8):
        long_k = [n for s, n in shapes if s == 128]
        assert abs(sum(n == k for n in long_k) / len(long_k) - 1 / 3) < 0.06
    assert all(s * n in (256, 512, 1024) for s, n in shapes)  # a short segment keeps the length
    assert {s for s, _ in (batch_shape(config, i) for i in range(10))} == {64}
    assert batch_shape(config, 500) == batch_shape(config, 500)  # a pure function of the step
    assert learning_rate(stage, 0) == pytest.approx(1e-5)
    assert learning_rate(stage, 99) == pytest.approx(1e-3)
    assert learning_rate(stage, 1999) == pytest.approx(1e-4, rel=1e-3)
    assert learning_rate(stage, 1000) < learning_rate(stage, 500) < 1e-3


@pytest.fixture(scope="module")
def train_split_tasks(prose_tasks, tmp_path_factory):
    """ProseTasks with a Builder on a train split of real text and real typed Python."""
    from edgemem.data.tasks import Builder

    root = tmp_path_factory.mktemp("corpora")
    licenses = sorted(p for p in Path("/usr/share/common-licenses").glob("*") if p.is_file())
    code = sorted((REPO / "edgemem").glob("*.py"))
    for source, rows in (
        ("linux-doc", [(p.name, "prose", p.read_text(errors="replace")) for p in licenses]),
        ("sqlalchemy", [(f"edgemem/{p.name}", "code", p.read_text()) for p in code]),
    ):
        with open(root / f"{source}.jsonl", "w") as handle:
            for name, kind, text in rows:
                row = {"name": name, "kind": kind, "split": "train", "sha256": "-", "text": text}
                handle.write(json.dumps(row) + "\n")
    builder = Builder(prose_tasks.tokenizer, root, ("linux-doc",), ("sqlalchemy",), split="train")
    return ProseTasks(prose_tasks.tokenizer, prose_tasks.stream, builder)


def test_vt_docqa_and_types_items_train_on_the_evaluations_generators(train_split_tasks):
    """The other tasks of the evaluation train too: the generator's context fills the written
    segments and a tail, the answer segment asks its question, and the loss sits on its gold."""
    import re

    tok = train_split_tasks.tokenizer
    end = train_split_tasks.end_id
    S, n = 128, 4
    for kind in ("vt", "docqa", "types"):
        stage = Stage(name=kind, task=kind, steps=1, segment_len=S, segments=(n,), tail=16)
        doc, prompt, answer = train_split_tasks.task_item(kind, step_rng(0, 0, kind), stage, S, n)
        assert len(doc) > S * n
        text, said = tok.decode(doc), tok.decode(answer, skip_special_tokens=True)
        asked = tok.decode(prompt)
        if kind == "vt":
            names = said.split()
            assert len(names) == 5 and all(f"VAR {v} = " in text for v in names)
            assert asked.rstrip().endswith("they are:") and answer[-1] == end
        elif kind == "docqa":
            word = said.strip()
            assert len(re.findall(rf"\b{word}\b", text, re.I)) == 1 and answer[-1] != end
            assert "Quote the text above" in asked
        else:
            assert said.endswith("`") and answer[-1] == end
            param = re.search(r"parameter `(\w+)`", asked).group(1)
            assert re.search(rf"\b{param}\b", text)
    mix = Stage(name="m", task="mix", steps=1, segment_len=S, segments=(n,), batch_size=8)
    batch = train_split_tasks.batch("mix", step_rng(0, 0, "mix"), mix, S, n)
    assert batch.written.shape == (8, S * n)
    assert all(bool((row != -100).any()) for row in batch.targets)
    with pytest.raises(EdgememError, match="mix"):
        Stage(name="m", task="mix", steps=1, segment_len=S, mix=("recall", "lm"))


def test_a_run_starts_from_another_runs_adapter_of_the_same_memory(tmp_path):
    """`init` continues an earlier run with a later recipe: the fresh run starts from its adapter,
    a resume may find the init file moved or replaced and keeps the hash the run started from;
    an adapter of another memory is refused."""
    first = tiny_config(steps=3, backbone="lora")
    run = tiny_run(first, tmp_path / "a")
    train(first, run)
    follow = replace(tiny_config(steps=3, backbone="lora"), init=str(tmp_path / "a" / "adapter.safetensors"))
    assert build_armt(tiny_llama(), follow).adapter_hash() == run.armt.adapter_hash()
    train(follow, tiny_run(follow, tmp_path / "b"), max_steps=1)
    started_from = sha256_file(Path(follow.init))
    moved = replace(follow, init=str(tmp_path / "kept.safetensors"))  # the run's init, kept elsewhere
    Path(moved.init).write_bytes(Path(follow.init).read_bytes())
    train(moved, tiny_run(moved, tmp_path / "b"), max_steps=1)
    save_adapter(run.armt, Path(follow.init), {"replaced": "later"})  # the file changes after the start
    train(follow, tiny_run(follow, tmp_path / "b"))  # a resume keeps the hash it started with
    with safe_open(str(tmp_path / "b" / "adapter.safetensors"), framework="pt") as handle:
        assert handle.metadata()["init_sha256"] == started_from != sha256_file(Path(follow.init))
    shipped = tmp_path / "shipped.safetensors"  # a shipped adapter reads in sentence-aligned segments
    meta, tensors = read_safetensors(Path(follow.init), "adapter")
    aligned = override_config(read_adapter(Path(follow.init))[0], segment_align=3)
    save_file(tensors, str(shipped), {**meta, "config": aligned.to_json()})
    from_shipped = build_armt(tiny_llama(), replace(follow, init=str(shipped)))
    assert from_shipped.config.segment_align == 0  # training's own segments: alignment is set at shipping
    assert from_shipped.adapter_hash() == run.armt.adapter_hash()  # its tensors, not a fresh memory
    other = replace(follow, d_mem=8)
    with pytest.raises(EdgememError, match="another memory"):
        build_armt(tiny_llama(), other)


def test_a_read_gate_joins_an_ungated_init_open_and_trains(tmp_path):
    """`read_gate = true` from an ungated `init`: the init's weights load, the gate starts open
    (g = 1) and is among what trains, and the run's adapter says it is gated; a gated init into an
    ungated config is refused in one line."""
    first = tiny_config(steps=2, backbone="lora")
    train(first, tiny_run(first, tmp_path / "a"))
    init = str(tmp_path / "a" / "adapter.safetensors")
    gated = replace(tiny_config(steps=2, backbone="lora"), init=init, read_gate=True)
    armt = build_armt(tiny_llama(), gated)
    _, init_tensors = read_adapter(Path(init))
    tensors = armt.adapter_tensors()
    assert all(torch.equal(tensors[k], v) for k, v in init_tensors.items())
    gate = [k for k in tensors if ".gate_" in k]
    assert gate and all(torch.count_nonzero(tensors[k]) == 0 for k in gate)
    assert all(p.requires_grad for m in armt.memories.values() for p in (m.gate_w, m.gate_b))
    train(gated, tiny_run(gated, tmp_path / "b"))
    config, trained = read_adapter(tmp_path / "b" / "adapter.safetensors")
    assert config.read_gate and any(torch.count_nonzero(trained[k]) for k in gate)
    back = replace(tiny_config(steps=2, backbone="lora"), init=str(tmp_path / "b" / "adapter.safetensors"))
    with pytest.raises(EdgememError, match="read gate"):
        build_armt(tiny_llama(), back)
    # the gates step at their own rate: 100x it moves them ~100x as far (Adam: ~lr per step)
    fast = replace(gated, gate_lr_scale=100.0)
    train(fast, tiny_run(fast, tmp_path / "c"))
    _, quick = read_adapter(tmp_path / "c" / "adapter.safetensors")
    moved = [max(float(t[k].abs().max()) for k in gate if k.endswith("gate_w")) for t in (trained, quick)]
    assert moved[1] > 30 * moved[0] > 0
    with pytest.raises(EdgememError, match="gate_lr_scale"):
        replace(gated, gate_lr_scale=0.0)


def test_write_gates_step_at_their_own_rate(tmp_path):
    """`write_gate_lr_scale` moves each memory's W_b (beta) that much farther than the memory's
    rate does (Adam: ~lr per step) and leaves the other memory weights at the memory's rate."""
    moved = {}
    for scale in (1.0, 100.0):
        config = replace(tiny_config(steps=2, backbone="lora"), write_gate_lr_scale=scale)
        run = tiny_run(config, tmp_path / str(scale))
        start = {k: v.clone() for k, v in run.armt.adapter_tensors().items()}
        train(config, run)
        _, trained = read_adapter(tmp_path / str(scale) / "adapter.safetensors")
        moved[scale] = {
            part: max(float((trained[k] - start[k]).abs().max()) for k in trained if f".{part}." in k)
            for part in ("W_b", "W_K", "W_V")
        }
    assert moved[100.0]["W_b"] > 30 * moved[1.0]["W_b"] > 0
    for part in ("W_K", "W_V"):
        assert moved[100.0][part] < 3 * moved[1.0][part]
    with pytest.raises(EdgememError, match="write_gate_lr_scale"):
        replace(tiny_config(steps=2), write_gate_lr_scale=0.0)


def test_adapter_file_round_trips(tmp_path):
    """The run's adapter loads into a fresh model with the same hash and says how it was trained."""
    config = tiny_config(steps=3, backbone="frozen")
    run = tiny_run(config, tmp_path)
    train(config, run)
    memory_config, tensors = read_adapter(tmp_path / "adapter.safetensors")
    fresh = ARMT(tiny_llama(), memory_config)
    assert fresh.adapter_hash() != run.armt.adapter_hash()
    fresh.load_adapter_tensors(tensors)
    assert fresh.adapter_hash() == run.armt.adapter_hash()
    assert fresh.is_trained()
    from safetensors import safe_open

    with safe_open(str(tmp_path / "adapter.safetensors"), framework="pt") as handle:
        meta = handle.metadata()
    assert meta["train_steps"] == "3" and json.loads(meta["train_config"])["backbone"] == "frozen"


def test_ship_adapter_keeps_the_memory_in_float16_and_cards_only_its_own_eval_lines(tmp_path):
    """scripts/ship_adapter.py: the shipped file loads to the same memory (hash taken without a
    base model equals the loaded model's), re-shipping equal content keeps the bytes (so eval lines
    keyed by the file id stay valid), and the card counts only lines run with this file, in a row
    per split (lines from before `--split` recorded it are the test split's)."""
    from edgemem.evaluate import adapter_id

    ship = load_script("ship_adapter")
    config = tiny_config(steps=3, backbone="lora")
    run = tiny_run(config, tmp_path / "run")
    train(config, run)
    adapter, shipped = tmp_path / "run" / "adapter.safetensors", tmp_path / "adapters"
    shipped.mkdir()
    out, digest = ship.ship(adapter, tmp_path / "run", [], shipped, "ship")
    memory_config, tensors = read_adapter(out)
    assert out == shipped / "tiny.safetensors" and {t.dtype for t in tensors.values()} == {torch.float16}
    fresh = ARMT(tiny_llama(), memory_config)
    fresh.load_adapter_tensors(tensors)
    assert digest == fresh.adapter_hash()
    assert digest != run.armt.adapter_hash()  # float16 rounding makes it another memory: new state keys

    file_id = adapter_id("tiny", str(out))
    lines = [
        (1024, file_id, True, {}),
        (1024, file_id, False, {"split": "test"}),
        (1024, "0123456789abcdef", True, {}),
        (2048, file_id, True, {}),
        (1024, file_id, False, {"split": "validation"}),
    ]
    evals = tmp_path / "niah.armt.jsonl"
    evals.write_text(
        "".join(
            json.dumps({"length": n, "adapter": a, "correct": c, "seconds": 2.0, **x}) + "\n"
            for n, a, c, x in lines
        )
    )
    again, _ = ship.ship(adapter, tmp_path / "run", [evals], shipped, "ship")
    assert adapter_id("tiny", str(again)) == file_id
    card = out.with_suffix(".md").read_text()
    assert (
        "| niah.armt.jsonl | test | 1024 | 1 | 2 | 2.0 |" in card
        and "| niah.armt.jsonl | test | 2048 | 1 | 1 | 2.0 |" in card
        and "| niah.armt.jsonl | validation | 1024 | 0 | 1 | 2.0 |" in card
    )
    assert "Trained for 3 of the recipe's 3 steps" in card
    # --answer-window: the same tensors, shipped with that window in the memory config (a new hash)
    windowed = tmp_path / "windowed"
    windowed.mkdir()
    window = 4 * memory_config.segment_len
    out_w, digest_w = ship.ship(adapter, tmp_path / "run", [], windowed, "ship", answer_window=window)
    config_w, tensors_w = read_adapter(out_w)
    assert config_w.answer_window == window and memory_config.answer_window == 0
    assert all(torch.equal(tensors_w[k], t) for k, t in tensors.items()) and digest_w != digest
    assert f'answer_window": {window}' in out_w.with_suffix(".md").read_text()
    with pytest.raises(EdgememError, match="answer_window"):  # shorter than a segment: nothing written
        ship.ship(adapter, tmp_path / "run", [], tmp_path, "ship", answer_window=1)
    assert not (tmp_path / "tiny.safetensors").exists()
    # --segment-align: the same tensors, with sentence-aligned segments in the config (a new hash)
    out_a, digest_a = ship.ship(adapter, tmp_path / "run", [], windowed, "ship", segment_align=2)
    config_a, tensors_a = read_adapter(out_a)
    assert config_a.segment_align == 2 and config_a.answer_window == 0 and digest_a not in (digest, digest_w)
    assert all(torch.equal(tensors_a[k], t) for k, t in tensors.items())
    with pytest.raises(EdgememError, match="segment_align"):
        ship.ship(adapter, tmp_path / "run", [], tmp_path, "ship", segment_align=memory_config.segment_len)
    assert not (tmp_path / "tiny.safetensors").exists()


def test_blend_adapters_interpolates_every_tensor_and_refuses_other_memories(tmp_path, capsys):
    """scripts/blend_adapters.py: alpha 0 and 1 give the parents' tensors exactly and 0.5 their mean;
    the blend loads into the same model, takes the answer window asked for and records its parents;
    adapters of another memory config or model are refused in one line, with nothing written."""
    from edgemem.armt import ARMTConfig

    module = load_script("blend_adapters")
    config = ARMTConfig(memory_layers=(1,), segment_len=8, num_write_tokens=2, d_mem=8, lora_rank=2)
    files = []
    for seed in (1, 2):
        armt = ARMT(tiny_llama(), config)
        torch.manual_seed(seed)
        armt.load_adapter_tensors({k: torch.randn_like(v) for k, v in armt.adapter_tensors().items()})
        files.append(tmp_path / f"p{seed}.safetensors")
        save_adapter(armt, files[-1], {"model_id": "tiny"})
    (_, a), (_, b) = read_adapter(files[0]), read_adapter(files[1])
    for alpha, expect in ((0.0, a), (1.0, b), (0.5, {k: (a[k] + b[k]) / 2 for k in a})):
        out = tmp_path / f"blend{alpha}.safetensors"
        got_config, far = module.blend_files(files[0], files[1], alpha, out, answer_window=16)
        blend_config, tensors = read_adapter(out)
        assert got_config == blend_config == replace(config, answer_window=16)
        assert all(torch.allclose(tensors[k], expect[k], atol=1e-6) for k in a)
        if alpha in (0.0, 1.0):  # the parents themselves, bit for bit
            assert all(torch.equal(tensors[k], expect[k].float()) for k in a)
        assert set(far) == {"memory", "write_embeddings", "lora.A", "lora.B"} and min(far.values()) > 0
    each = module.distances(a, b, per_tensor=True)  # --distances: how far a run moved its init
    assert set(each) == set(a)
    for name in ("write_embeddings", next(k for k in a if k.endswith("W_b.weight"))):
        expect_d = float((b[name].float() - a[name].float()).norm() / a[name].float().norm())
        assert each[name] == pytest.approx(expect_d, rel=1e-5)
    ARMT(tiny_llama(), blend_config).load_adapter_tensors(tensors)
    meta, _ = read_safetensors(out, "adapter")
    assert meta["model_id"] == "tiny" and json.loads(meta["blend"]) == {
        "a": str(files[0]),
        "a_sha256": sha256_file(files[0]),
        "b": str(files[1]),
        "b_sha256": sha256_file(files[1]),
        "alpha": 0.5,
        "alpha_lora": 0.5,
    }
    # --alpha-lora: the LoRA factors from one point of the line, the memory from another
    module.blend_files(files[0], files[1], 0.5, out, alpha_lora=1.0)
    _, tensors = read_adapter(out)
    assert all(torch.equal(tensors[k], b[k]) for k in a if k.startswith("lora."))
    assert all(
        torch.allclose(tensors[k], (a[k] + b[k]) / 2, atol=1e-6) for k in a if not k.startswith("lora.")
    )

    other = tmp_path / "other.safetensors"
    save_adapter(ARMT(tiny_llama(), replace(config, d_mem=4)), other, {"model_id": "tiny"})
    gemma = tmp_path / "gemma.safetensors"
    save_adapter(ARMT(tiny_llama(), config), gemma, {"model_id": "gemma"})
    for second, alpha, why in (
        (other, 0.5, "different memory configs"),
        (gemma, 0.5, "different models"),
        (files[1], 1.5, "alpha must be in"),
    ):
        with pytest.raises(EdgememError, match=why):
            module.blend_files(files[0], second, alpha, tmp_path / "refused.safetensors")
    assert not (tmp_path / "refused.safetensors").exists()
    assert (
        module.main([str(files[0]), str(other), "--alpha", "0.5", "--out", str(tmp_path / "x.safetensors")])
        == 1
    )
    # --distances prints each memory and write-embedding tensor's |B - A| / |A| (no LoRA), writes
    # nothing, and refuses adapters of other shapes in one line
    capsys.readouterr()
    assert module.main([str(files[0]), str(files[1]), "--distances"]) == 0
    printed = dict(line.split() for line in capsys.readouterr().out.splitlines())
    assert set(printed) == {k for k in a if not k.startswith("lora.")}
    assert all(float(v) == pytest.approx(each[k], abs=1e-4) for k, v in printed.items())
    assert module.main([str(files[0]), str(other), "--distances"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: tensor ") and "differ" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x.safetensors").exists()


def test_ship_adapter_card_says_how_each_step_computed_from_the_log(tmp_path):
    """Every step line of the log records its precision and torch threads, and the card's hardware
    line says them from the log: a run resumed with another thread count says which steps ran how
    (it once named the config's threads and resolved `"auto"` on the shipping machine)."""
    ship = load_script("ship_adapter")
    config = tiny_config(steps=3, backbone="lora")
    threads = torch.get_num_threads()
    try:
        for n, steps in ((1, 2), (2, 1)):
            torch.set_num_threads(n)
            train(config, tiny_run(config, tmp_path / "run"), max_steps=steps)
    finally:
        torch.set_num_threads(threads)
    lines = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [(r["precision"], r["threads"], r["device"]) for r in lines if "tokens" in r] == [
        ("float32", 1, "cpu")
    ] * 2 + [("float32", 2, "cpu")]
    assert {r["cpu"] for r in lines if "tokens" in r} == {cpu_model()} and cpu_model()
    out = tmp_path / "adapters"
    out.mkdir()
    shipped, _ = ship.ship(tmp_path / "run" / "adapter.safetensors", tmp_path / "run", [], out, "ship")
    card = shipped.with_suffix(".md").read_text()
    assert (
        f"- Hardware: float32, {cpu_model()}: 1 training thread (steps 1-2), "
        f"{cpu_model()}: 2 training threads (step 3).\n" in card
    )


def test_ship_adapter_stage_row_says_where_a_stage_puts_its_needles():
    """The card's stage table names a late placement's window ("one of the last 8 segments"), not
    the bare option name, and the other placements by name, as a config sets them; a weighted first
    digit (`lead_weight`) is said beside the digits."""
    ship = load_script("ship_adapter")
    stage = dict(
        name="s",
        task="recall",
        steps=1,
        segment_len=128,
        segments=[1],
        needle="random",
        digits=7,
        keys=2,
        lr=5e-5,
    )
    late = ship.stage_rows({"stages": [{**stage, "needle_segment": "late", "late": 8}]})[2]
    anywhere = ship.stage_rows({"stages": [{**stage, "needle_segment": "any"}]})[2]
    assert "| random in one of the last 8 segments |" in late
    assert "| random in any segment |" in anywhere
    assert "| 7 | 2 |" in anywhere  # a config from before lead_weight: digits alone
    lead = ship.stage_rows({"stages": [{**stage, "needle_segment": "any", "lead_weight": 8.0}]})[2]
    assert "| 7 (first weighted x8) | 2 |" in lead
    spread = ship.stage_rows(
        {"stages": [{**stage, "needle_segment": "late", "late": 8, "distractor_segment": "any"}]}
    )
    assert "| random in one of the last 8 segments (distractors: any segment) |" in spread[2]


def test_ship_adapter_card_names_the_training_cpu_from_the_log_not_the_shipping_machine():
    """The hardware line names the CPU each step's line records; for lines that record none (runs
    before the field) it says the log does not name it, where it once named the CPU of the machine
    that ran ship_adapter, which need not be the one that trained."""
    ship = load_script("ship_adapter")
    zen5 = {"precision": "bf16 autocast", "threads": 2, "device": "cpu", "cpu": "AMD EPYC 9B45"}
    steps = [{"step": 1, **zen5}, {"step": 2, **zen5, "cpu": "AMD EPYC 7B13"}]
    assert ship.hardware_line(steps, {}) == (
        "bf16 autocast, AMD EPYC 9B45: 2 training threads (step 1), "
        "AMD EPYC 7B13: 2 training threads (step 2)"
    )
    unnamed = [{"step": 1, "precision": "float32", "threads": 2, "device": "cpu"}]
    assert ship.hardware_line(unnamed, {}) == "float32, 2 training threads; the log does not name the CPU"


def test_committed_model_card_names_the_shipped_file_and_its_evaluation_lines():
    """Each card in edgemem/adapters/ names the adapter hash and file id of the file beside it, and
    the evaluation files its `--eval` cites hold lines of that file id. Shipping is done by copying
    the staged (measured) file in and re-writing the card; a file copied after the card, or lines
    measured on another file's bytes, would leave the card describing another memory."""
    from edgemem.armt import adapter_hash

    cards = sorted((REPO / "edgemem" / "adapters").glob("*.md"))
    assert cards
    for card in cards:
        weights, text = card.with_suffix(".safetensors"), card.read_text()
        file_id = sha256_file(weights)[:16]
        assert f"`{adapter_hash(*read_adapter(weights))[:16]}`" in text, card.name
        assert f"file id in evaluation lines: `{file_id}`" in text, card.name
        command = re.search(r"Shipped \S+ by `([^`]+)`", text).group(1).split()
        evals = command[command.index("--eval") + 1 :] if "--eval" in command else []
        for name in evals:
            lines = [json.loads(line) for line in (REPO / name).read_text().splitlines() if line]
            assert any(r.get("adapter") == file_id for r in lines), (card.name, name)


def test_ship_adapter_card_names_the_gpu_a_resumed_run_moved_to():
    """A run begun on the CPU and resumed on a GPU: the card's hardware line names the GPU for its
    steps (threads say nothing there), and the CPU's threads for the others."""
    ship = load_script("ship_adapter")
    cpu = {"precision": "bf16 autocast", "threads": 2, "device": "cpu"}
    gpu = {"precision": "bf16 autocast", "threads": 16, "device": "NVIDIA H200"}
    steps = [{"step": 1, **cpu}, {"step": 2, **cpu}, {"step": 3, **gpu}, {"step": 4, **gpu}]
    assert ship.compute_line(steps, {}) == (
        "bf16 autocast, 2 training threads (steps 1-2), NVIDIA H200 (steps 3-4)"
    )
    before_device = [{"step": 1, "precision": "float32", "threads": 1}]  # lines before `device`
    assert ship.compute_line(before_device, {}) == "float32, 1 training thread"


def test_ship_adapter_card_of_a_log_resumed_across_the_logging_change_says_which_steps_are_by_config():
    """A run begun before step lines recorded precision and threads and resumed after: the logged
    steps say how they ran, the older ones what the config says, marked as such (the whole line fell
    back on the config before, hiding what the log knew)."""
    ship = load_script("ship_adapter")
    steps = [{"step": 1}, {"step": 2}, {"step": 3, "precision": "bf16 autocast", "threads": 2}]
    assert ship.compute_line(steps, {"autocast": True, "threads": 2}) == (
        "bf16 autocast by its config (steps 1-2), bf16 autocast (step 3), "
        "2 training threads by its config (steps 1-2), 2 training threads (step 3)"
    )


def test_ship_adapter_card_of_an_older_log_says_how_the_run_computed_by_its_config():
    """Logs from before the step lines recorded precision and threads: the card names the run's
    precision from its config (it said float32 for every run, also for bf16-autocast ones);
    `"auto"` is named as the rule it is, and the line says it comes from the config."""
    ship = load_script("ship_adapter")
    old = [{"step": 1, "tokens": 10, "seconds": 1.0}]
    assert ship.compute_line(old, {"autocast": True, "threads": 2}) == (
        "bf16 autocast, 2 training threads (by its config)"
    )
    default = ship.compute_line(old, {"threads": 0})  # 0: the run left torch's default
    assert default == "float32, torch's default training threads (by its config)"
    assert ship.precision({"autocast": False}) == "float32"
    assert ship.precision({}) == "float32"
    assert ship.precision({"autocast": True}) == "bf16 autocast"
    # "auto" depends on the CPU that trained, which an old log does not name: said, not resolved here
    assert ship.precision({"autocast": "auto"}) == (
        "bf16 autocast where the CPU runs bf16 natively, else float32 (`autocast = auto`)"
    )


def test_ship_adapter_card_says_which_step_of_which_stages_a_run_started_from(tmp_path):
    """A run continued from another adapter (`init`) ships with a card that says which step of
    which stages that adapter was, read from its metadata, while the file is there unchanged;
    once it is gone or changed the card says only that it started from it."""
    ship = load_script("ship_adapter")
    first = tiny_config(steps=3, backbone="lora")
    train(first, tiny_run(first, tmp_path / "a"))
    init = tmp_path / "a" / "adapter.safetensors"
    follow = replace(tiny_config(steps=2, backbone="lora"), init=str(init))
    train(follow, tiny_run(follow, tmp_path / "b"))
    out = tmp_path / "adapters"
    out.mkdir()
    stages = ", ".join(f"{s.name} {s.steps}" for s in first.stages)
    shipped, _ = ship.ship(tmp_path / "b" / "adapter.safetensors", tmp_path / "b", [], out, "ship")
    assert f"step 3 of its own run (stages and steps: {stages};" in shipped.with_suffix(".md").read_text()
    init.write_bytes(init.read_bytes() + b" ")  # another file now: its metadata is not that run's
    ship.ship(tmp_path / "b" / "adapter.safetensors", tmp_path / "b", [], out, "ship")
    card = shipped.with_suffix(".md").read_text()
    assert "of its own run" not in card and "trained by an earlier recipe." in card


def test_ship_adapter_card_of_a_blend_names_both_parents_and_whose_run_it_describes(tmp_path):
    """A blend (scripts/blend_adapters.py) ships like a trained adapter: it keeps its second
    parent's model id and training metadata, and its card says it is a blend, of which two adapters
    (each with its step and stages) at which weights, and that the training lines are B's run."""
    ship, blender = load_script("ship_adapter"), load_script("blend_adapters")
    first = tiny_config(steps=3, backbone="lora")
    train(first, tiny_run(first, tmp_path / "a"))
    a = tmp_path / "a" / "adapter.safetensors"
    follow = replace(tiny_config(steps=2, backbone="lora"), init=str(a))
    train(follow, tiny_run(follow, tmp_path / "b"))
    b, blend = tmp_path / "b" / "adapter.safetensors", tmp_path / "blend.safetensors"
    blender.blend_files(a, b, 0.75, blend, alpha_lora=1.0)
    out = tmp_path / "adapters"
    out.mkdir()
    shipped, _ = ship.ship(blend, tmp_path / "b", [], out, "ship")
    card = shipped.with_suffix(".md").read_text()
    stages = ", ".join(f"{s.name} {s.steps}" for s in first.stages)
    assert (
        "every tensor 0.25 A + 0.75 B (the LoRA factors 0 A + 1 B), where A is the adapter "
        f"`{a}` (sha256 `{sha256_file(a)[:16]}`): step 3 of its own run (stages and steps: {stages};"
    ) in card
    assert f"; B is the adapter `{b}` (sha256 `{sha256_file(b)[:16]}`): step 2 of its own run" in card
    assert "are B's run." in card and "Trained for 2 of the recipe's 2 steps" in card
    assert f"- Started from the adapter `{a}`" in card  # B's own start
    ship.ship(b, tmp_path / "b", [], out, "ship")
    assert "A blend" not in shipped.with_suffix(".md").read_text()
    # A blend with the adapter it replaces: the card says so, first from that file, then (re-shipped,
    # the file there now this one) from git history
    shipped.write_bytes(a.read_bytes())
    a_sha = sha256_file(shipped)[:16]
    blender.blend_files(shipped, b, 0.5, blend)
    ship.ship(blend, tmp_path / "b", [], out, "ship")
    before = f"A is the adapter shipped before this one at this path (sha256 `{a_sha}`)"
    assert f"{before}: step 3 of its own run" in shipped.with_suffix(".md").read_text()
    ship.ship(blend, tmp_path / "b", [], out, "ship")
    assert f"{before}, in git history with the card" in shipped.with_suffix(".md").read_text()


def test_ship_adapter_card_command_reads_back_every_eval_file():
    """The card records how the adapter shipped; run again, that command must summarise the same
    evaluation files (a repeated `--eval` would keep only the last one)."""
    import shlex

    ship = load_script("ship_adapter")
    evals = [Path("docs/eval/m/niah.armt.jsonl"), Path("docs/eval/m/vt.armt.jsonl")]
    for given, window, align in ((evals, None, None), ([], None, None), (evals, 1024, 48)):
        line = ship.command_line(Path("runs/a.safetensors"), Path("runs/r"), given, window, align)
        args = ship.parser().parse_args(shlex.split(line)[2:])
        assert (
            args.eval == given and args.adapter == Path("runs/a.safetensors") and args.run == Path("runs/r")
        )
        assert args.answer_window == window and args.segment_align == align


def test_frozen_backbone_trains_only_the_adapter(tmp_path):
    config = tiny_config(steps=2, backbone="frozen")
    run = tiny_run(config, tmp_path)
    before = {n: p.detach().clone() for n, p in run.armt.base.named_parameters() if ".memory." not in n}
    train(config, run)
    for name, p in run.armt.base.named_parameters():
        if ".memory." not in name:
            assert torch.equal(p, before[name]), name
    saved = [n for n in load_file(str(tmp_path / "checkpoint.safetensors")) if n.startswith("param.")]
    assert len(saved) == len(run.armt.adapter_tensors())  # the checkpoint holds the adapter, nothing more


def test_memory_lr_scale_multiplies_the_memorys_learning_rate_only(tmp_path):
    """memory_lr_scale: the memory's parameters and write embeddings step at that multiple of the
    schedule's learning rate, the LoRA matrices at the schedule's own (Adam's first step moves each
    parameter by about its learning rate, so the moves compare directly)."""
    moves = {}
    for scale in (1.0, 4.0):
        config = replace(tiny_config(steps=1, backbone="lora"), memory_lr_scale=scale)
        run = tiny_run(config, tmp_path / str(scale))
        before = {n: p.detach().clone() for n, p in run.armt.named_parameters() if p.requires_grad}
        train(config, run)
        after = dict(run.armt.named_parameters())
        moves[scale] = {
            group: torch.cat([(after[n] - before[n]).abs().flatten() for n in before if pick(n)]).max()
            for group, pick in (
                ("memory", lambda n: ".memory." in n or n == "write_embeddings"),
                ("lora", lambda n: n.endswith((".A", ".B")) and ".memory." not in n),
            )
        }
    torch.testing.assert_close(moves[4.0]["memory"], 4 * moves[1.0]["memory"], rtol=1e-3, atol=0)
    torch.testing.assert_close(moves[4.0]["lora"], moves[1.0]["lora"], rtol=1e-3, atol=0)
    with pytest.raises(EdgememError, match="memory_lr_scale"):
        replace(tiny_config(), memory_lr_scale=0.0)


def test_late_needles_sit_in_the_last_segments_after_the_whole_stream():
    """needle_segment "late" writes every needle into one of the last `late` segments (what a long
    item's late needles see: a memory that has taken in the whole stream first), each of them
    drawn, and refuses a window of no segments."""
    stage = tiny_config(segments=(12,), needle_segment="late", late=3, keys=2, needle="random").stages[0]
    seen = set()
    for seed in range(20):
        batch = TokenRecall(VOCAB).batch(random.Random(seed), stage, 4, 12)
        for row in batch.written:
            marks = (row == 1).nonzero().flatten().tolist()
            assert marks  # (two needles drawn into one segment may overlap)
            seen.update(at // 4 for at in marks)
    assert seen == {9, 10, 11}
    with pytest.raises(EdgememError, match="late"):
        replace(stage, late=0)
    with pytest.raises(EdgememError, match="first|last|any|late"):
        replace(stage, needle_segment="middle")


def test_distractors_spread_over_the_stream_while_the_asked_needle_stays_late():
    """distractor_segment "any" puts other keys' needles anywhere in the written stream and leaves
    the asked needle in the last `late` segments; empty (the default) places them as the asked one,
    and an unknown placement is refused."""
    stage = tiny_config(segments=(12,), needle_segment="late", late=2, keys=4, needle="random").stages[0]
    spread = replace(stage, distractor_segment="any")
    asked, others = set(), set()
    for seed in range(20):
        batch = TokenRecall(VOCAB).batch(random.Random(seed), spread, 4, 12)
        for row, answer in zip(batch.written, batch.answer, strict=True):
            for at in (row == 1).nonzero().flatten().tolist():
                if at + 1 < len(row):
                    (asked if row[at + 1] == answer[1] else others).add(at // 4)
    assert asked <= {10, 11} and asked
    assert len(others - {10, 11}) >= 6  # spread far before the asked needle's window
    for seed in range(5):  # the default: every needle late
        batch = TokenRecall(VOCAB).batch(random.Random(seed), stage, 4, 12)
        assert {at // 4 for at in (batch.written == 1).nonzero()[:, 1].tolist()} <= {10, 11}
    with pytest.raises(EdgememError, match="distractor_segment"):
        replace(stage, distractor_segment="middle")


def armt_with_written_values(config: TrainConfig) -> ARMT:
    """A tiny ARMT whose W_V is random, as a trained memory's: with W_V = 0 early writes carry no
    gradient at all."""
    armt = build_armt(tiny_llama(), config)
    torch.manual_seed(1)
    with torch.no_grad():
        for memory in armt.memories.values():
            memory.W_V.weight.normal_(0, 0.1)
    return armt


def test_gradient_checkpointing_and_truncation():
    """Recomputing segments gives the same gradients; truncated BPTT cuts the gradient of early writes."""
    config = tiny_config(steps=1, segments=(3,), needle_segment="first", needle="random")
    stage = config.stages[0]
    batch = TokenRecall(VOCAB).batch(random.Random(0), stage, 4, 3)
    grads = []
    for variant in (stage, replace(stage, checkpointing=True), replace(stage, bptt=1)):
        armt = armt_with_written_values(config)
        loss, _ = forward_loss(armt, batch, variant, 16)
        loss.backward()
        grads.append(armt.write_embeddings.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])
    assert not torch.allclose(grads[0], grads[2])


def test_write_grad_reaches_the_writes_before_the_bptt_window_and_nothing_else():
    """With write_grad the segments before the last K give their writes' projections a gradient
    (truncated BPTT alone gives them none) and nothing else: the loss, the write embeddings' and
    the LoRA's gradients are truncated BPTT's; with every segment in the window it is full BPTT."""
    config = tiny_config(steps=1, segments=(4,), needle_segment="first", needle="random", backbone="lora")
    stage = config.stages[0]
    batch = TokenRecall(VOCAB).batch(random.Random(0), stage, 4, 4)
    runs = {}
    for name, variant in {
        "full": stage,
        "cut": replace(stage, bptt=1),
        "writes": replace(stage, bptt=1, write_grad=True),
        "writes-all": replace(stage, bptt=4, write_grad=True),
    }.items():
        for write_source in ("write_tokens", "segment"):
            armt = armt_with_written_values(replace(config, write_source=write_source))
            loss, _ = forward_loss(armt, batch, variant, 16)
            loss.backward()
            grads = {n: p.grad.clone() for n, p in armt.named_parameters() if p.grad is not None}
            runs[name, write_source] = loss.detach(), grads
    for source in ("write_tokens", "segment"):
        (full, g_full), (cut, g_cut) = runs["full", source], runs["cut", source]
        (writes, g_writes), (writes_all, g_all) = runs["writes", source], runs["writes-all", source]
        torch.testing.assert_close(writes, cut)
        torch.testing.assert_close(writes_all, full)
        for name in g_full:
            torch.testing.assert_close(g_all[name], g_full[name])
            if ".memory.W_" in name and "W_Q" not in name:
                assert not torch.allclose(g_writes[name], g_cut[name]), name
            else:  # the read, the write embeddings and the LoRA see only the last segment's graph
                torch.testing.assert_close(g_writes[name], g_cut[name], msg=name)
    with pytest.raises(EdgememError, match="write_grad"):
        replace(stage, write_grad=True)
    with pytest.raises(EdgememError, match="write_grad"):
        replace(stage, task="lm", segments=(4,), bptt=1, write_grad=True)


def test_norm_inputs_and_write_source_reach_the_memory_and_its_adapter(tmp_path):
    """A config's norm_inputs builds memories that read the layer's input norm, its write_source
    memories that write every token, and the adapter a run saves says so (an adapter trained that
    way must be loaded that way)."""
    config = replace(tiny_config(steps=1, backbone="lora"), norm_inputs=True, write_source="segment")
    armt = build_armt(tiny_llama(), config)
    assert armt.config.norm_inputs and armt.config.write_source == "segment"
    layers = [armt.base.model.layers[i] for i in armt.config.memory_layers]
    assert all(layer._norm and layer.write_segment for layer in layers)
    save_adapter(armt, tmp_path / "a.safetensors")
    saved = read_adapter(tmp_path / "a.safetensors")[0]
    assert saved.norm_inputs and saved.write_source == "segment"


def test_a_configs_answer_window_is_the_adapters_and_may_be_set_on_a_resume_or_an_init(tmp_path):
    """A run trained to answer from an unwritten window (Stage.tail, p_view) says so in its adapter,
    so `ask` and `eval` answer that way without --answer-window; the window does not change what
    trains: a run resumes with it set, an init adapter of the same memory with another window loads,
    and a window shorter than the last stage's segments is refused in one line."""
    plain = tiny_config(steps=2, backbone="lora")
    run = tiny_run(plain, tmp_path / "a")
    train(plain, run, max_steps=1)
    windowed = replace(plain, answer_window=8)
    run = tiny_run(windowed, tmp_path / "a")
    assert train(windowed, run) == 2  # a resume: same training, the adapter now answers windowed
    assert read_adapter(tmp_path / "a" / "adapter.safetensors")[0].answer_window == 8
    follow = replace(plain, init=str(tmp_path / "a" / "adapter.safetensors"))
    assert build_armt(tiny_llama(), follow).config.answer_window == 0  # the config's, not the init's
    with pytest.raises(EdgememError, match="answer_window"):
        replace(plain, answer_window=3)  # segment_len 4


def test_every_committed_training_config_parses_and_runs_on_its_recipe():
    """configs/train/*.toml are what the README and RESULTS tell people to run."""
    shipped = load_config(SHIPPED_CONFIG)
    for path in sorted(SHIPPED_CONFIG.parent.glob("*.toml")):
        config = load_config(path)
        assert config.total_steps > 0, path.name
        if config.init:  # continues from the recall adapter: the same memory and LoRA shapes
            assert all(getattr(config, k) == getattr(shipped, k) for k in RECIPE_SHAPE), path.name


def test_shipped_config_parses_and_bad_configs_are_refused(tmp_path):
    config = load_config(SHIPPED_CONFIG)
    assert config.model == "smollm2-135m-instruct" and config.stages[0].task == "lm"
    assert config.backbone == "lora" and config.norm_inputs
    assert [s.segment_len for s in config.stages][-1] == 128
    assert [s.digits for s in config.stages if s.task == "recall"][:3] == [1, 3, 7]  # growing numbers
    tasks = load_config(SHIPPED_CONFIG.with_name("smollm2-135m-tasks.toml"))
    assert set(tasks.stages[0].mix) == {"recall", "vt", "docqa", "types"}
    # it continues from the recall adapter, kept outside edgemem/adapters/ where a later ship replaces it
    assert tasks.init and not (REPO / tasks.init).resolve().is_relative_to(REPO / "edgemem" / "adapters")
    assert all(getattr(tasks, k) == getattr(config, k) for k in RECIPE_SHAPE)
    # the GPU-sized next run: same memory and init, recall kept in the mix past 8 segments, every
    # stage past 8 segments recomputed in backward, and a held-out check as long as the curriculum
    long = load_config(SHIPPED_CONFIG.with_name("smollm2-135m-long.toml"))
    assert all(getattr(long, k) == getattr(config, k) for k in RECIPE_SHAPE) and long.init == tasks.init
    assert all(s.checkpointing for s in long.stages if max(s.segments) > 8)
    assert all("recall" in s.mix for s in long.stages if s.task == "mix")
    assert max(long.eval_segments) >= max(max(s.segments) for s in long.stages)
    assert {batch_shape(long, step)[1] for step in range(long.total_steps)} >= {2, 8, 32, 64}
    # in the answer window's shape: long unwritten tails, items and needles answered from view
    tasks_stages = [s for s in long.stages if s.task == "mix"]
    assert all(s.tail >= 1024 and s.p_view > 0 and s.view == "same" and s.p_tail > 0 for s in tasks_stages)
    # the recall adapter it starts from cannot copy a needle from view: an empty-memory recall stage
    # first gives the copy back, and the first task stage keeps empty-memory steps
    first = long.stages[0]
    assert first.task == "recall" and first.segments == (0,) and first.tail >= 1024
    assert 0 in tasks_stages[0].segments
    bad = tmp_path / "bad.toml"
    bad.write_text(
        'model = "x"\nspeed = 3\n[[stage]]\nname = "a"\ntask = "recall"\nsteps = 1\nsegment_len = 8\n'
    )
    with pytest.raises(EdgememError, match="unknown training option"):
        load_config(bad)
    bad.write_text('model = "x"\n[[stage]]\nname = "a"\ntask = "poetry"\nsteps = 1\nsegment_len = 8\n')
    with pytest.raises(EdgememError, match="unknown task"):
        load_config(bad)
    bad.write_text("model = [")
    with pytest.raises(EdgememError, match="not valid TOML"):
        load_config(bad)


def test_gpu_check_times_the_long_recipes_first_task_stage_not_its_view_stage(tmp_path):
    """scripts/gpu_check.sh filters smollm2-135m-long.toml's "view" stage (nothing written, cheap
    steps) out before timing 3 steps: its own awk filter, run on the config, leaves the task stages."""
    script = (REPO / "scripts" / "gpu_check.sh").read_text()
    program = re.search(r"awk '([^']*# view:[^']*)'", script).group(1)
    long = SHIPPED_CONFIG.with_name("smollm2-135m-long.toml")
    kept = subprocess.run(["awk", program, str(long)], capture_output=True, text=True, check=True).stdout
    (tmp_path / "window.toml").write_text(kept)
    names = [s.name for s in load_config(tmp_path / "window.toml").stages]
    assert names == [s.name for s in load_config(long).stages if s.name != "view"]
    assert load_config(tmp_path / "window.toml").stages[0].task == "mix"


def test_ablation_configs_share_the_learnable_recipe_and_differ_only_in_what_they_ablate(tmp_path):
    """Prefixes (one per memory placement) and the branches that start from them: every branch
    trains the same steps from its own prefix's adapter with the same memory placement; the
    segment-length branches all start from the default placement's prefix."""
    module = load_script("train_ablations")
    configs = {}
    for name, text in module.variants().items():
        (tmp_path / f"{name}.toml").write_text(text)
        configs[name] = load_config(tmp_path / f"{name}.toml")
    prefixes = {n: c for n, c in configs.items() if module.prefix_of(n) is None}
    branches = {n: c for n, c in configs.items() if module.prefix_of(n) is not None}
    assert set(prefixes) == {f"prefix-{p}" for p in ("spread", "low", "middle", "high", "all")}
    assert len(branches) == 8
    base = configs["layers-spread"]
    assert base.backbone == "lora" and base.norm_inputs and base.write_source == "segment"
    assert {c.total_steps for c in prefixes.values()} == {500}  # equal compute
    assert {c.total_steps for c in branches.values()} == {300}
    for name, config in branches.items():
        prefix = module.prefix_of(name)
        assert config.init == f"runs/ablations/{prefix}/adapter.safetensors"
        assert config.memory_layers == configs[prefix].memory_layers
        assert config.stages[0].name == "length" and len(config.stages) == 1
    assert [s.name for s in configs["prefix-low"].stages] == [
        "bootstrap-1",
        "bootstrap-3",
        "bootstrap-7",
        "position",
    ]
    assert {module.prefix_of(n) for n in branches if n.startswith("segment-")} == {"prefix-spread"}
    assert (
        configs["layers-low"].memory_layers == (0, 1, 2, 3, 4, 5)
        and len(configs["layers-all"].memory_layers) == 30
    )
    last = {name: c.stages[-1] for name, c in branches.items()}
    assert last["segment-fixed-64"].segment_len * max(last["segment-fixed-64"].segments) == 256
    assert (
        last["segment-stochastic-0.75"].short_segment_len == 64
        and last["segment-stochastic-0.75"].p_short == 0.75
    )
    # Apart from what each ablates, a branch's config is the fixed-128 branch's.
    stage = last["layers-spread"]
    assert last["segment-stochastic-0.5"] == replace(stage, short_segment_len=64, p_short=0.5)
    assert replace(configs["layers-low"], memory_layers=base.memory_layers, init=base.init) == base


def test_ablation_branch_refuses_to_start_before_its_prefix_finished(tmp_path, monkeypatch, capsys):
    module = load_script("train_ablations")
    monkeypatch.setattr(module, "OUT", tmp_path)
    with pytest.raises(SystemExit, match="prefix-low, which has not finished"):
        module.run(["layers-low"], threads=1)
    with pytest.raises(SystemExit, match="no ablation run 'layers-sideways'"):
        module.run(["layers-sideways"], threads=1)


def write_ablation_logs(root: Path) -> None:
    """A finished spread prefix, fixed 128 evaluated at steps 100 and 200, fixed 64 at step 100
    only: the log lines `train_ablations.py table` and `steps` read."""
    for name, records in {
        "prefix-spread": [{"step": 500, "eval_exact": {"1": 1.0}}],
        "layers-spread": [
            {"step": 100, "eval_exact": {"16": 0.25, "4": 0.5}},
            {"step": 200, "eval_exact": {"4": 0.75, "16": 0.5}},
        ],
        "segment-fixed-64": [{"step": 100, "eval_exact": {"8": 1.0, "32": 0.125}}],
    }.items():
        (root / name).mkdir()
        (root / name / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_ablation_table_at_a_step_compares_branches_at_equal_compute(tmp_path, capsys):
    """`table --at STEP`: each branch's evaluation at that step, not its last (branches still
    running are compared where all of them have been); a branch not there yet shows its last,
    marked as such, never passed off as the step asked for."""
    module = load_script("train_ablations")
    write_ablation_logs(tmp_path)
    module.table(tmp_path, at=100)
    rows = capsys.readouterr().out.splitlines()
    assert "| layers-spread | prefix-spread | 1.00 | 100 | 0.50 | 0.25 |" in rows
    module.table(tmp_path, at=200)
    rows = capsys.readouterr().out.splitlines()
    assert "| layers-spread | prefix-spread | 1.00 | 200 | 0.75 | 0.50 |" in rows
    assert "| segment-fixed-64 | prefix-spread | 1.00 | 100 (not at 200 yet) | 1.00 | 0.12 |" in rows
    module.table(tmp_path)
    assert "| layers-spread | prefix-spread | 1.00 | 200 | 0.75 | 0.50 |" in capsys.readouterr().out


def test_ablation_steps_table_puts_each_branchs_evaluations_side_by_side(tmp_path, capsys):
    """`steps --at 100,200`: a row per branch that has run, its 2x / 8x recall at each step, "-"
    where it has not evaluated that step; a branch with no log gets no row."""
    module = load_script("train_ablations")
    write_ablation_logs(tmp_path)
    module.steps_table(tmp_path, [100, 200])
    rows = capsys.readouterr().out.splitlines()
    assert rows[0] == "| branch (recall at 2x / 8x L) | from | step 100 | step 200 |"
    assert "| layers-spread | prefix-spread | 0.50 / 0.25 | 0.75 / 0.50 |" in rows
    assert "| segment-fixed-64 | prefix-spread | 1.00 / 0.12 | - |" in rows
    assert len(rows) == 4


def test_ablation_at_refuses_a_non_step_and_a_list_for_table_in_one_line(tmp_path, monkeypatch):
    """`--at x` and `table --at 100,200` stop with one line naming what `--at` takes."""
    module = load_script("train_ablations")
    write_ablation_logs(tmp_path)
    monkeypatch.setattr(sys, "argv", ["train_ablations.py", "steps", str(tmp_path), "--at", "x"])
    with pytest.raises(SystemExit, match=r"--at takes step numbers \(100 or 100,200,300\), not 'x'"):
        module.main()
    monkeypatch.setattr(sys, "argv", ["train_ablations.py", "table", str(tmp_path), "--at", "100,200"])
    with pytest.raises(SystemExit, match="table --at takes one step"):
        module.main()


def test_ablation_until_stops_each_branch_at_that_step_and_skips_one_already_there(tmp_path, monkeypatch):
    """`run --until STEP`: a branch gets `--max-steps` for the steps it has left to STEP (its
    adapter's train_steps says where it is), one already at STEP is not started, and a prefix
    always trains to its end (a branch needs it finished)."""
    module = load_script("train_ablations")
    monkeypatch.setattr(module, "OUT", tmp_path)
    commands: list[list[str]] = []
    monkeypatch.setattr(module, "train_one", lambda cmd, name: commands.append(cmd))

    module.write_configs()
    for name, step in (("prefix-spread", 500), ("segment-fixed-64", 40), ("layers-spread", 100)):
        adapter_at_step(tmp_path / name, step)
    module.run(["prefix-spread", "segment-fixed-64", "layers-spread", "segment-stochastic-0.5"], 1, until=100)
    tails = [cmd[cmd.index("--out") + 1 :] for cmd in commands]
    assert tails == [
        [str(tmp_path / "prefix-spread"), "--threads", "1"],
        [str(tmp_path / "segment-fixed-64"), "--threads", "1", "--max-steps", "60"],
        [str(tmp_path / "segment-stochastic-0.5"), "--threads", "1", "--max-steps", "100"],
    ]


def test_ablation_seed_replicates_a_run_on_other_batches_and_the_same_items(tmp_path, monkeypatch, capsys):
    """`run --seed N NAME`: the run again in `NAME-seedN` with only its seed changed and its
    held-out items kept (eval_seed 0): a branch from the same prefix adapter, or a prefix;
    `table` and `steps` show a replicate that has a log right under its branch."""
    module = load_script("train_ablations")
    monkeypatch.setattr(module, "OUT", tmp_path)
    commands: list[list[str]] = []
    monkeypatch.setattr(module, "train_one", lambda cmd, name: commands.append(cmd))
    paths = module.write_configs(seed=2)
    assert set(paths) == {f"{n}-seed2" for n in module.variants()}
    originals = module.write_configs()
    for name in ("layers-middle", "prefix-middle"):
        again = load_config(paths[f"{name}-seed2"])
        assert (again.seed, again.eval_seed) == (2, 0)
        assert replace(again, seed=0, eval_seed=None) == load_config(originals[name])
    assert module.prefix_of("layers-middle-seed2") == "prefix-middle"
    assert module.prefix_of("prefix-middle-seed2") is None
    with pytest.raises(SystemExit, match="prefix-middle, which has not finished"):
        module.run(["layers-middle"], threads=1, seed=2)
    with pytest.raises(SystemExit, match="no ablation run 'layers-sideways' to replicate"):
        module.run(["layers-sideways"], threads=1, seed=2)
    assert commands == []
    module.run(["prefix-middle"], threads=1, seed=2)
    assert commands[0][commands[0].index("--out") + 1] == str(tmp_path / "prefix-middle-seed2")
    with pytest.raises(SystemExit, match="layers-spread-seed2 starts from prefix-spread, which has not"):
        module.run([], threads=1, seed=2)  # no names: every replicate in order, the prefixes first
    outs = [Path(cmd[cmd.index("--out") + 1]).name for cmd in commands[1:]]
    assert outs == [f"prefix-{p}-seed2" for p in ("spread", "low", "middle", "high", "all")]
    for command in ("configs", "run"):
        for option in ("--seed", "--prefix-seed"):
            monkeypatch.setattr(sys, "argv", ["train_ablations.py", command, option, "-1"])
            with pytest.raises(SystemExit, match=f"{option} takes a seed of 1 or more"):
                module.main()

    logs = tmp_path / "logs"  # the run folders' log copies, as docs/train keeps them
    logs.mkdir()
    write_ablation_logs(logs)
    (logs / "layers-low-seed1").mkdir()  # configs only: not started, not shown
    (logs / "layers-spread-seed1").mkdir()
    record = {"step": 100, "eval_exact": {"4": 0.25, "16": 0.0}}
    (logs / "layers-spread-seed1" / "log.jsonl").write_text(json.dumps(record) + "\n")
    capsys.readouterr()  # the runs' command lines
    module.steps_table(logs, [100])
    rows = capsys.readouterr().out.splitlines()
    assert rows[2:4] == [
        "| layers-spread | prefix-spread | 0.50 / 0.25 |",
        "| layers-spread-seed1 | prefix-spread | 0.25 / 0.00 |",
    ]
    module.table(logs, at=100)
    rows = capsys.readouterr().out.splitlines()
    assert "| layers-spread-seed1 | prefix-spread | 1.00 | 100 | 0.25 | 0.00 |" in rows
    assert not any("layers-low-seed1" in row for row in rows)


def test_ablation_prefix_seed_starts_each_branch_from_its_prefixs_replicate(tmp_path, monkeypatch, capsys):
    """`run --prefix-seed P BRANCH`: the branch, on its own batches, from the adapter of
    `prefix-<placement>-seedP` (a placement measured on a second prefix), in `BRANCH-prefixP`; it
    waits for that prefix, names the command that trains it, and `steps` shows it under its branch
    with that prefix as where it came from."""
    module = load_script("train_ablations")
    monkeypatch.setattr(module, "OUT", tmp_path)
    commands: list[list[str]] = []
    monkeypatch.setattr(module, "train_one", lambda cmd, name: commands.append(cmd))
    paths = module.write_configs(prefix_seed=1)
    assert set(paths) == {f"{n}-prefix1" for n in module.variants() if module.prefix_of(n)}
    original = load_config(module.write_configs()["layers-middle"])
    moved = load_config(paths["layers-middle-prefix1"])
    assert moved.init == "runs/ablations/prefix-middle-seed1/adapter.safetensors"
    assert replace(moved, init=original.init) == original
    both = load_config(module.write_configs(seed=3, prefix_seed=1)["segment-fixed-64-prefix1-seed3"])
    assert (both.init, both.seed, both.eval_seed) == (
        "runs/ablations/prefix-spread-seed1/adapter.safetensors",
        3,
        0,
    )
    assert module.prefix_of("segment-fixed-64-prefix2-seed1") == "prefix-spread-seed2"
    assert module.split_replica("layers-middle-prefix2-seed1") == ("layers-middle", 2, 1)

    with pytest.raises(
        SystemExit,
        match=r"prefix-middle-seed1, which has not finished \(500 steps\): run --seed 1 prefix-middle first",
    ):
        module.run(["layers-middle"], threads=1, prefix_seed=1)
    with pytest.raises(
        SystemExit, match="no ablation branch 'prefix-middle' to start from a prefix replicate"
    ):
        module.run(["prefix-middle"], threads=1, prefix_seed=1)
    adapter_at_step(tmp_path / "prefix-middle-seed1", 500)
    module.run(["layers-middle"], threads=1, prefix_seed=1)
    assert [cmd[cmd.index("--out") + 1] for cmd in commands] == [str(tmp_path / "layers-middle-prefix1")]

    logs = tmp_path / "logs"
    logs.mkdir()
    for name, record in {
        "layers-middle": {"step": 100, "eval_exact": {"4": 0.5, "16": 0.25}},
        "layers-middle-prefix1": {"step": 100, "eval_exact": {"4": 0.75, "16": 0.0}},
        "layers-middle-seed1": {"step": 100, "eval_exact": {"4": 1.0, "16": 0.5}},
        "prefix-middle-seed1": {"step": 500, "eval_exact": {"1": 0.875}},
    }.items():
        (logs / name).mkdir()
        (logs / name / "log.jsonl").write_text(json.dumps(record) + "\n")
    capsys.readouterr()  # the run's command line
    module.steps_table(logs, [100])
    assert capsys.readouterr().out.splitlines()[2:] == [
        "| layers-middle | prefix-middle | 0.50 / 0.25 |",
        "| layers-middle-seed1 | prefix-middle | 1.00 / 0.50 |",
        "| layers-middle-prefix1 | prefix-middle-seed1 | 0.75 / 0.00 |",
    ]
    module.table(logs)
    assert (
        "| layers-middle-prefix1 | prefix-middle-seed1 | 0.88 | 100 | 0.75 | 0.00 |"
        in capsys.readouterr().out
    )


def ablation_driver(child_code: str) -> str:
    """Python code that loads scripts/train_ablations.py and runs `train_one` on a child process
    running `child_code` (in place of `edgemem train`), as branch "branch". SIGINT raises
    KeyboardInterrupt in it, as in a script started from a terminal, also when the suite runs in a
    background job (which starts it with SIGINT ignored, and Python then keeps it ignored)."""
    path = str(REPO / "scripts" / "train_ablations.py")
    return (
        "import importlib.util, signal, sys\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"spec = importlib.util.spec_from_file_location('t', {path!r})\n"
        "t = importlib.util.module_from_spec(spec); spec.loader.exec_module(t)\n"
        f"t.train_one([sys.executable, '-c', {child_code!r}], 'branch')\n"
    )


def test_ablation_script_stopped_by_sigterm_stops_its_training_too():
    """`kill` of the ablation script (SIGTERM) ends the training it started: left running, that
    training would go on unseen, and a resumed script would find its folder locked."""
    import signal
    import time

    sleeper = "import os, time; print(os.getpid(), flush=True); time.sleep(120)"
    driver = ablation_driver(sleeper)
    script = subprocess.Popen(
        [sys.executable, "-c", driver], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    child = int(script.stdout.readline())
    script.send_signal(signal.SIGTERM)
    assert script.wait(timeout=30) == 1
    assert "branch: edgemem train stopped (exit status -15)" in script.stderr.read()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the training child outlived the script")


def test_ablation_script_on_ctrl_c_waits_for_its_training_and_says_so_in_one_line():
    """Ctrl-C sends SIGINT to the script and its training (one process group): the script waits
    for the training to stop and prints one line, not a KeyboardInterrupt traceback."""
    import signal

    sleeper = (
        "import os, signal, sys, time; signal.signal(signal.SIGINT, lambda *_: sys.exit(130)); "
        "print(os.getpid(), flush=True); time.sleep(120)"
    )
    driver = ablation_driver(sleeper)
    script = subprocess.Popen(
        [sys.executable, "-c", driver],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal gives
    )
    int(script.stdout.readline())
    os.killpg(script.pid, signal.SIGINT)
    assert script.wait(timeout=30) == 1
    err = script.stderr.read()
    assert "Traceback" not in err
    assert err.strip() == "branch: interrupted (edgemem train exit status 130); the same command resumes it"


def test_loss_table_gives_each_stages_mean_loss_and_the_evaluations(tmp_path, capsys):
    module = load_script("train_loss_table")
    log = tmp_path / "log.jsonl"
    lines = [{"step": s, "stage": "a" if s <= 2 else "b", "loss": float(s)} for s in (1, 2, 3, 4, 5)]
    lines.insert(2, {"step": 2, "stage": "a", "eval_exact": {"1": 0.5, "4": 0.25}})
    log.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert module.stages(log) == {"a": (1, 2, 1.5), "b": (3, 5, 4.0)}
    module.main([str(log)])
    out = capsys.readouterr().out
    assert "| a | 1.50 (steps 1-2) |" in out and "| b | 4.00 (steps 3-5) |" in out
    assert "step 2: 0.50 / 0.25 at 1, 4 segments" in out
    # --until: runs of unequal length compared over the same steps
    assert module.stages(log, until=4) == {"a": (1, 2, 1.5), "b": (3, 4, 3.5)}
    module.main(["--until", "1", str(log)])
    out = capsys.readouterr().out
    assert "| a | 1.00 (steps 1-1) |" in out and "| b |" not in out and "step 2:" not in out


def test_tail_split_notes_files_of_other_corpora_builds_and_where_token_counts_differ():
    """`niah_tail_split.py` compares result files by item id; an id from another corpora build may be
    another haystack, so it says so, and counts per length the items whose token counts differ."""
    module = load_script("niah_tail_split")

    def line(i, length, tokens, corpora):
        return {"id": i, "length": length, "tokens": tokens, "corpora": corpora}

    a = {"x": line("x", 1024, 1026, "aa"), "y": line("y", 16384, 16385, "aa")}
    b = {"x": line("x", 1024, 1026, "bb"), "y": line("y", 16384, 16382, "bb")}
    assert module.corpora_note([a, a], {"x", "y"}) == []
    note = module.corpora_note([a, b], {"x", "y"})
    assert "2 corpora builds (aa, bb)" in note[0]
    assert note[1:] == [
        "  1k: token counts differ on 0 of 1 items",
        "  16k: token counts differ on 1 of 1 items",
    ]


def test_tail_split_rebuilds_the_split_its_lines_record_and_never_compares_two():
    """`edgemem eval --split validation` lines share ids with the test items but are other items:
    `niah_tail_split.py` rebuilds the split the lines record (test where they record none) and
    refuses files whose shared lines come from two splits."""
    module = load_script("niah_tail_split")
    old, val = {"x": {"id": "x"}}, {"x": {"id": "x", "split": "validation"}}
    assert module.lines_split([old, old], {"x"}) == "test"
    assert module.lines_split([val, val], {"x"}) == "validation"
    with pytest.raises(ValueError, match="more than one split"):
        module.lines_split([old, val], {"x"})


def test_tail_split_counts_per_length_the_items_only_one_file_answers():
    """RESULTS' "only right" columns: per length, the items file k answers and file 0 does not, and
    the reverse (which a fall or rise of a bin's total is made of); items both answer or both miss
    are not counted."""
    module = load_script("niah_tail_split")

    def line(length, correct):
        return {"length": length, "correct": correct}

    first = {"a": line(1024, True), "b": line(1024, False), "c": line(16384, True), "d": line(16384, True)}
    other = {"a": line(1024, True), "b": line(1024, True), "c": line(16384, False), "d": line(16384, False)}
    assert module.only_right([first, other, first], {"a", "b", "c", "d"}) == {
        1024: [(1, 0), (0, 0)],
        16384: [(0, 2), (0, 0)],
    }
    assert module.only_right([first, other], {"a", "b"}) == {1024: [(1, 0)]}


def test_align_bounds_counts_the_boundaries_another_alignment_moves():
    """`niah_align_bounds.py`: alignments 2 and 3 of 4-token segments end a segment at the same
    place where a sentence ends in its last 2 tokens, so only segments whose last end lies 3
    tokens back differ; fixed segments (0) end on multiples of 4 and here share none."""
    module = load_script("niah_align_bounds")
    ends = frozenset({9})
    ids = [1, 1, 9, 1, 1, 1, 9, 1, 1, 9, 1, 1, 1, 1, 1, 1]  # sentence ends at 2, 6, 9
    # align 3: [0,3) ends after 9 at index 2; [3,7) after index 6; [7,10) after 9; [10,14) none: 14
    # align 2: 9 at index 2 is in the last 2 of [0,4) too -> 3; the same as 3 from there on
    assert [module.segment_bounds(ids, 4, 0, a, ends) for a in (3, 2, 0)] == [
        [3, 7, 10, 14],
        [3, 7, 10, 14],
        [4, 8, 12],
    ]
    assert module.moved_bounds(ids, [3, 2, 0], 4, 0, ends) == [(4, 0), (4, 0), (3, 3)]
    later = [1, 9, 1, 1, 1, 1, 1, 1, 1, 1]  # the only end 3 tokens before the first segment's end
    assert module.moved_bounds(later, [3, 2], 4, 0, ends) == [(2, 0), (2, 2)]


def test_tail_split_says_whether_a_segment_boundary_cuts_the_needle():
    """`niah_tail_split.py` places a needle: in the tail (its number unwritten), "cut" when a written
    segment's end falls inside its tokens, else "written"; the token span is the needle sentence's
    tokens in the ingested ids (BOS first), found from the real tokenizer's offsets."""
    from edgemem.armt import text_ids
    from edgemem.models import load_tokenizer

    module = load_script("niah_tail_split")
    assert module.needle_place(10, 20, [8, 16, 24], False) == "cut"
    assert module.needle_place(16, 23, [8, 16, 24], False) == "written"  # segment 16..24 holds it
    assert module.needle_place(24, 30, [8, 16, 24], True) == "tail"
    tok = load_tokenizer("smollm2-135m-instruct")
    needle = NIAH_NEEDLE.format("red-fox", "1234567")
    context = f"Some prose before it. {needle} And after."
    ids = text_ids(context, tok)
    first, last = module.needle_token_span(context, needle, tok, len(ids))
    assert tok.decode(ids[first : last + 1]).strip() == needle
    assert needle not in tok.decode(ids[first + 1 : last + 1]) and needle not in tok.decode(ids[first:last])


def test_digit_swap_permutes_the_haystack_digits_and_keeps_the_needle_and_its_place():
    """`niah_digit_swap.py` asks whether the haystack's numbers set the digit armt writes wrong: it
    swaps two digits in the haystack only (the needle, its question and answers stay), everywhere or
    in its last characters only, and counts the numbers of a text by their first digit; a needle
    sentence found twice is refused."""
    from edgemem.data.tasks import Item

    module = load_script("niah_digit_swap")
    needle = "The magic number for x is: 3737373."
    item = Item("niah", 1024, 0, f"v3.11 and 2.6.30 {needle} x37 73", "q?", ["3737373"], needle, "It is")
    swapped = module.swap_digits(item, "37")
    assert swapped.context == f"v7.11 and 2.6.70 {needle} x73 37"
    assert (swapped.id, swapped.answers, swapped.passage) == (item.id, item.answers, item.passage)
    assert module.first_digits(item.context.replace(needle, "")) == {"3": 3, "1": 1, "2": 1, "6": 1, "7": 1}
    size = len(item.context)
    assert (
        module.swap_digits(item, "37", size - len(" x37 73")).context == f"v3.11 and 2.6.30 {needle} x73 37"
    )
    tail = module.swap_digits(item, "37", size - len(f"30 {needle} x37 73"))  # from the middle of "2.6.30"
    assert tail.context == f"v3.11 and 2.6.70 {needle} x73 37"
    head = module.swap_digits(item, "37", 0, size - len(f"30 {needle} x37 73"))  # all but that tail
    assert head.context == f"v7.11 and 2.6.30 {needle} x37 73"
    assert module.swap_digits(item, "37", 0, len("v3.1")).context == f"v7.11 and 2.6.30 {needle} x37 73"
    with pytest.raises(ValueError, match="occurs 2 times"):
        module.swap_digits(Item("niah", 1024, 0, needle * 2, "q?", ["1"], needle), "37")


def test_tail_split_counts_which_digits_wrong_answers_write_in_place_of_which():
    """The count behind RESULTS' "wrong digits collapse onto 3": per wrong answer with as many
    digits as the gold number, each differing position counts the digit written, the one it
    replaced and the position, and a wrong first digit the digit written there (and whether it is
    the only wrong one), and how many such answers have one wrong digit; right answers and answers
    of another length are not counted."""
    module = load_script("niah_tail_split")

    def line(prediction, gold, correct=False):
        return {"prediction": prediction, "gold": [gold], "correct": correct}

    lines = [
        line(" 8361131.", "8361181"),
        line(" 5540366.", "5540866"),
        line(" 4250378.", "4250378", correct=True),
        line(" 0110337.", "6105777"),
        line("no number", "1234567"),
        line(" 123.", "1234567"),
    ]
    written, replaced = module.wrong_digits(lines)
    assert written == {"3": 4, "0": 2, "1": 1}
    assert replaced == {"8": 2, "6": 1, "0": 1, "5": 1, "7": 2}
    assert module.wrong_positions(lines) == {1: 1, 3: 1, 4: 1, 5: 2, 6: 2}  # 1: the first digit
    assert module.wrong_first_digits(lines) == {"0": 1}
    biased = [*lines, line(" 3286990.", "9286990"), line(" 3540866.", "5540866")]
    assert module.wrong_first_digits(biased) == {"0": 1, "3": 2}
    assert module.only_first_wrong(lines) == 0 and module.only_first_wrong(biased) == 2
    assert module.one_wrong_digit(lines) == (2, 3) and module.one_wrong_digit(biased) == (4, 5)


def test_ablation_cost_projects_each_steps_shape_at_the_logs_median(tmp_path, capsys):
    """`train_ablations.py cost`: a prefix is 300 steps of 1 x 64 and 200 of 1 x 128, a branch 300
    of 2 x 128, at the log's medians (1, 2 and 3 s); a shape the log never ran is counted, not
    priced."""
    module = load_script("train_ablations")
    log = tmp_path / "log.jsonl"
    shapes = [
        (64, 1, 1.0),
        (64, 1, 1.2),
        (64, 1, 0.8),
        (128, 1, 2.0),
        (128, 2, 3.0),
        (128, 2, 9.0),
        (128, 2, 3.0),
    ]
    log.write_text(
        "".join(json.dumps({"segment_len": S, "segments": n, "seconds": t}) + "\n" for S, n, t in shapes)
    )
    module.cost(log)
    out = capsys.readouterr().out
    assert f"prefix-spread: 500 steps, {(300 * 1.0 + 200 * 2.0) / 3600:.1f} h\n" in out
    assert f"layers-spread: 300 steps, {300 * 3.0 / 3600:.1f} h\n" in out
    assert "segment-fixed-64: 300 steps" in out and "300 steps of shapes the log never ran" in out


def test_cli_train_errors_are_one_line(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgemem.cli",
            "train",
            str(tmp_path / "missing.toml"),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: training config {tmp_path / 'missing.toml'} does not exist"
    ]


@pytest.fixture(scope="module")
def prose_tasks():
    from edgemem.models import load_tokenizer

    tokenizer = load_tokenizer()
    text = "\n\n".join(
        p.read_text() for p in sorted(Path("/usr/share/common-licenses").glob("*")) if p.is_file()
    )
    stream = torch.tensor(tokenizer(text, add_special_tokens=False).input_ids, dtype=torch.int32)
    return ProseTasks(tokenizer, stream)


def test_recall_items_match_the_evaluation_prompt(prose_tasks):
    """A recall item writes the needle into the asked segment of real prose; the answer segment is
    the chat prompt `edgemem ask` builds (tail + question) plus the niah answer prefix; the loss
    sits on the answer digits and the end of turn only."""
    from edgemem.methods import chat_prompt

    tok = prose_tasks.tokenizer
    stage = Stage(
        name="r",
        task="recall",
        steps=1,
        segment_len=64,
        segments=(3,),
        needle="end",
        needle_segment="last",
        tail=8,
        batch_size=2,
    )
    rng = step_rng(0, 0, "t")
    doc, prompt, answer = prose_tasks.recall_item(rng, stage, 64, 3)
    written = tok.decode(doc[128:192])
    match = next(m for m in [__import__("re").search(r"magic numbers for (\S+) is: (\d{7})\.", written)] if m)
    key, value = match.groups()
    assert written.rstrip().endswith(NIAH_NEEDLE.format(key, value))
    assert 1 <= len(doc) - 192 <= 8
    assert prompt == chat_prompt(
        tok,
        doc[192:],
        f"What is the special magic number for {key} mentioned in the provided text?",
        NIAH_PREFIX.format(key),
    )
    assert tok.decode(answer, skip_special_tokens=True).strip() == f"{value}."
    batch = prose_tasks.batch("recall", step_rng(0, 1, "t"), stage, 64, 3)
    assert batch.written.shape == (2, 192)
    for row in range(2):
        scored = batch.targets[row][batch.targets[row] != -100].tolist()
        assert tok.decode(scored, skip_special_tokens=True).strip().rstrip(".").isdigit()


def test_recall_stage_digits_sets_the_needle_number_length(prose_tasks):
    """A stage's `digits` is how long the needle's number is, so a curriculum can start from
    1-digit numbers; out-of-range lengths are refused."""
    tok = prose_tasks.tokenizer
    for digits in (1, 3, 7):
        stage = Stage(name="r", task="recall", steps=1, segment_len=64, needle="end", digits=digits)
        doc, _, answer = prose_tasks.recall_item(step_rng(0, digits, "t"), stage, 64, 1)
        value = tok.decode(answer, skip_special_tokens=True).strip().rstrip(".")
        assert value.isdigit() and len(value) == digits
        assert tok.decode(doc[:64]).rstrip().endswith(f" is: {value}.")
    for bad in (0, 13):
        with pytest.raises(EdgememError, match="digits"):
            Stage(name="r", task="recall", steps=1, segment_len=8, digits=bad)


def test_p_view_puts_the_whole_item_unwritten_beside_the_question(train_split_tasks):
    """With p_view = 1 a docqa item sits whole in the unwritten tail (tail // 4..tail tokens, as an
    answer window shows a document's end), after written segments of other prose: the asked word
    is in view and nowhere in what memory gets; p_view = 0 builds the item as before (no draw)."""
    import re

    tok = train_split_tasks.tokenizer
    S, n = 64, 2
    options = dict(name="d", task="docqa", steps=1, segment_len=S, segments=(n,), tail=512)
    for seed in range(3):
        doc, prompt, answer = train_split_tasks.task_item(
            "docqa", step_rng(0, seed, "v"), Stage(**options, p_view=1.0), S, n
        )
        word = tok.decode(answer, skip_special_tokens=True).strip()
        view = tok.decode(doc[S * n :])
        assert 512 // 4 - 64 <= len(doc) - S * n <= 512 + 64
        assert len(re.findall(rf"\b{word}\b", view, re.I)) == 1
        assert view.strip()[:200] in tok.decode(prompt)
        stream = train_split_tasks.stream.tolist()
        start = stream.index(doc[0])  # the written part is a window of the prose stream
        while stream[start : start + S * n] != doc[: S * n]:
            start = stream.index(doc[0], start + 1)
    # p_view = 0: the draws of the recipe before p_view existed (tail length, then the item)
    for seed in range(5, 8):
        rng = step_rng(0, seed, "v")
        tail = rng.randint(1, 512)
        item = train_split_tasks.builder.item("docqa", S * n + tail + 64, rng.randrange(10**9), 10**9)
        doc, _, _ = train_split_tasks.task_item("docqa", step_rng(0, seed, "v"), Stage(**options), S, n)
        assert doc == tok(item.context, add_special_tokens=False).input_ids
    with pytest.raises(EdgememError, match="p_view"):
        Stage(**options, p_view=-0.1)


def test_p_view_same_writes_the_documents_first_part_and_keeps_its_evidence_in_view(train_split_tasks):
    """view = "same": a docqa item longer than the written segments, redrawn until its evidence
    paragraph sits in the unwritten tail, so memory holds the same document's first part (as an
    answer window over a long document has it) and the asked word is in view; other values of
    `view` are refused."""
    import re

    tok = train_split_tasks.tokenizer
    S, n = 64, 4
    options = dict(name="d", task="docqa", steps=1, segment_len=S, segments=(n,), tail=512, p_view=1.0)
    for seed in range(3):
        doc, prompt, answer = train_split_tasks.task_item(
            "docqa", step_rng(0, seed, "s"), Stage(**options, view="same"), S, n
        )
        word = tok.decode(answer, skip_special_tokens=True).strip()
        view, whole = tok.decode(doc[S * n :]), tok.decode(doc)
        assert 0 < len(doc) - S * n <= 512 + 64
        assert len(re.findall(rf"\b{word}\b", whole, re.I)) == 1 and re.search(rf"\b{word}\b", view, re.I)
        assert view.strip()[:200] in tok.decode(prompt)
        stream = train_split_tasks.stream.tolist()  # the written part is the item's, not a prose window
        assert all(stream[i : i + S * n] != doc[: S * n] for i in range(len(stream) - S * n))
    with pytest.raises(EdgememError, match="view"):
        Stage(**options, view="elsewhere")


def test_p_view_same_finds_its_evidence_after_a_cut_many_times_the_tail(train_split_tasks):
    """A cut of 2048 tokens beside a tail of at most 256: about one draw in sixty puts the evidence
    after the cut, and this item took 70 draws, past the 50 that used to raise; the draws scale
    with cut / tail, so long written streams (a GPU run's 64 segments) build their items."""
    import re

    tok = train_split_tasks.tokenizer
    S, n = 64, 32
    stage = Stage(
        name="d", task="docqa", steps=1, segment_len=S, segments=(n,), tail=256, p_view=1.0, view="same"
    )
    doc, _, answer = train_split_tasks.task_item("docqa", step_rng(0, 0, "long"), stage, S, n)
    word = tok.decode(answer, skip_special_tokens=True).strip()
    assert 0 < len(doc) - S * n <= 256 + 64
    assert re.search(rf"\b{word}\b", tok.decode(doc[S * n :]), re.I)


def test_zero_segments_train_with_an_empty_memory_and_the_item_in_view(train_split_tasks):
    """segments = 0 is an answer window over a document shorter than the window: nothing is written,
    a recall item's asked needle sits alone in its tail (no distractor: no memory to hold one), a
    docqa item sits whole in view, and the step trains the backbone (LoRA) while the memory, which
    has nothing to read, gets no gradient; the token task still needs a segment."""
    import re

    tok = train_split_tasks.tokenizer
    options = dict(name="e", task="mix", mix=("recall", "docqa"), steps=1, segment_len=64, tail=512, keys=2)
    stage = Stage(**options, segments=(0, 2))
    for seed in range(3):
        doc, prompt, answer = train_split_tasks.recall_item(step_rng(0, seed, "e"), stage, 64, 0)
        value = tok.decode(answer, skip_special_tokens=True).strip().rstrip(".")
        found = re.findall(r"magic numbers for \S+ is: (\d{7})\.", tok.decode(doc))
        assert found == [value] and tok.decode(doc).strip() in tok.decode(prompt)
        doc, prompt, answer = train_split_tasks.task_item("docqa", step_rng(0, seed, "e"), stage, 64, 0)
        word = tok.decode(answer, skip_special_tokens=True).strip()
        assert re.search(rf"\b{word}\b", tok.decode(doc), re.I) and tok.decode(doc).strip()[
            :200
        ] in tok.decode(prompt)
    batch = train_split_tasks.batch("mix", step_rng(0, 9, "e"), stage, 64, 0)
    assert batch.written.shape == (stage.batch_size, 0) and batch.written.dtype == torch.long
    short = Stage(**{**options, "steps": 10}, segments=(0,), short_segment_len=32, p_short=1.0)
    assert {batch_shape(TrainConfig(model="m", stages=(short,)), k)[1] for k in range(4)} == {0}
    with pytest.raises(EdgememError, match="tokens task"):
        Stage(name="t", task="tokens", steps=1, segment_len=8, segments=(0,))
    with pytest.raises(EdgememError, match="segments"):
        Stage(**options, segments=(-1,))
    config = tiny_config(steps=1, backbone="lora")
    armt = build_armt(tiny_llama(), config)
    with torch.no_grad():  # a trained LoRA and memory: every matrix passes gradient where it can
        for param in armt.adapter_parameters():
            param.normal_(0, 0.1)
    answer = torch.randint(4, VOCAB, (2, 6))
    targets = torch.full_like(answer, -100)
    targets[:, -2] = answer[:, -1]
    empty = forward_loss(armt, Batch(torch.zeros(2, 0, dtype=torch.long), answer, targets, 4), stage, 2)[0]
    empty.backward()
    assert torch.isfinite(empty) and all(m.B.grad.abs().sum() > 0 for m in armt.lora.values())
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in armt.memories.parameters())


def test_recall_p_tail_puts_the_asked_needle_next_to_the_question(prose_tasks):
    """With p_tail = 1 the asked needle sits in the unwritten tail (read by attention with the
    question, as in an evaluation item whose needle falls past the last full segment), even when
    the drawn tail was shorter than the needle, while the distractors stay in written segments;
    p_tail = 0 draws nothing extra, so older runs replay the same items; p_tail outside [0, 1] is
    refused."""
    import re

    tok = prose_tasks.tokenizer
    options = dict(name="r", task="recall", steps=1, segment_len=64, segments=(2,), keys=2, tail=4)
    stage = Stage(**options, p_tail=1.0)
    for seed in range(4):
        doc, prompt, answer = prose_tasks.recall_item(step_rng(0, seed, "t"), stage, 64, 2)
        value = tok.decode(answer, skip_special_tokens=True).strip().rstrip(".")
        tail, written = tok.decode(doc[128:]), tok.decode(doc[:128])
        assert f" is: {value}." in tail and f" is: {value}." not in written
        assert len(re.findall(r"magic numbers for \S+ is: \d{7}\.", written)) == 1  # the distractor
        assert tail.strip() in tok.decode(prompt)
    # p_tail = 0: the draws of the recipe before p_tail existed (tail length, window, then keys and
    # numbers), so the same document and the same asked number
    from edgemem.data.tasks import random_key, random_number

    for seed in range(9, 12):
        rng = step_rng(0, seed, "t")
        tail_len = rng.randint(1, 4)
        start = rng.randrange(0, len(prose_tasks.stream) - (128 + tail_len))
        taken: set[str] = set()
        keys = [random_key(rng, taken) for _ in range(2)]
        value = [random_number(rng, 7) for _ in keys][0]
        doc, prompt, answer = prose_tasks.recall_item(
            step_rng(0, seed, "t"), Stage(**options, p_tail=0.0), 64, 2
        )
        assert tok.decode(prompt).endswith(NIAH_PREFIX.format(keys[0]))
        assert tok.decode(answer, skip_special_tokens=True).strip() == f"{value}."
        assert doc[128:] == prose_tasks.stream[start + 128 : start + 128 + tail_len].tolist()
    with pytest.raises(EdgememError, match="p_tail"):
        Stage(**options, p_tail=1.5)


def test_haystack_numbers_write_digits_over_the_written_prose_and_never_over_a_needle(prose_tasks):
    """`haystack_numbers` N writes about N numbers per 1,000 written tokens over the prose of the
    written segments: the written part holds more digit tokens than without them (the same draws
    before), every needle's sentence stays whole, the tail is the same prose, and the question and
    answer do not change; a count outside [0, 100] is refused."""
    import re

    tok = prose_tasks.tokenizer
    options = dict(name="r", task="recall", steps=1, segment_len=64, segments=(8,), keys=3, tail=16)
    plain, numbered = Stage(**options), Stage(**options, haystack_numbers=40.0)

    def digit_tokens(ids):
        return sum(tok.decode([i]).strip().isdigit() for i in ids)

    added = []
    for seed in range(4):
        doc0, prompt0, answer0 = prose_tasks.recall_item(step_rng(0, seed, "t"), plain, 64, 8)
        doc, prompt, answer = prose_tasks.recall_item(step_rng(0, seed, "t"), numbered, 64, 8)
        assert len(doc) == len(doc0) and doc[512:] == doc0[512:]  # the tail untouched
        assert (prompt, answer) == (prompt0, answer0)
        needles = re.findall(r"One of the special magic numbers for \S+ is: \d{7}\.", tok.decode(doc0[:512]))
        assert len(needles) == 3 and all(n in tok.decode(doc[:512]) for n in needles)
        added.append(digit_tokens(doc[:512]) - digit_tokens(doc0[:512]))
    # 40 per 1,000 of 512 tokens: about 20 numbers of 4 digits on average, a few skipped or overlapping
    assert all(a > 20 for a in added) and sum(added) / len(added) > 40
    with pytest.raises(EdgememError, match="haystack_numbers"):
        Stage(**options, haystack_numbers=-1.0)


def test_lora_backbone_trains_lora_and_memory_only(tmp_path):
    """backbone = "lora": the LoRA matrices and the memory change, the base weights do not, and
    the adapter file carries the LoRA matrices."""
    config = replace(tiny_config(steps=3, backbone="lora"), lora_rank=4)
    run = tiny_run(config, tmp_path)
    frozen = {n: p.detach().clone() for n, p in run.armt.base.named_parameters() if not p.requires_grad}
    assert frozen and all(".lora" not in n and ".A" not in n[-2:] for n in frozen)
    train(config, run)
    for name, p in run.armt.base.named_parameters():
        if name in frozen:
            assert torch.equal(p, frozen[name]), name
    assert any(float(m.B.detach().abs().sum()) > 0 for m in run.armt.lora.values())
    memory_config, tensors = read_adapter(tmp_path / "adapter.safetensors")
    assert memory_config.lora_rank == 4 and sum(k.startswith("lora.") for k in tensors) == 2 * len(
        run.armt.lora
    )


def test_recipe_runs_on_the_gemma3_architecture(tmp_path):
    """The same recipe trains a Gemma3 model (sliding-window and global layers): a step runs,
    the loss is finite and the memory changes."""
    from tiny import tiny_gemma3

    config = tiny_config(steps=2, backbone="frozen", segments=(2,))
    run = Run(build_armt(tiny_gemma3(), config), tmp_path, TokenRecall(VOCAB).batch, log=lambda _: None)
    assert not run.armt.is_trained()
    assert train(config, run) == 2
    steps, _ = read_log(tmp_path / "log.jsonl")
    assert all(r["loss"] == r["loss"] and r["loss"] > 0 for r in steps)
    assert run.armt.is_trained()
    assert load_config(REPO / "configs" / "train" / "gemma3-270m.toml").model == "gemma3-270m"


def test_bf16_autocast_step_runs_and_device_is_resolved(tmp_path):
    """autocast = true trains under bf16 autocast (on this CPU; on CUDA where present); "auto"
    turns it on only where bf16 is native; asking for CUDA on a machine without it is one clear
    error."""
    from edgemem.models import preferred_dtype
    from edgemem.train import autocast_enabled, resolve_device

    config = replace(tiny_config(steps=2, backbone="frozen"), autocast=True)
    run = tiny_run(config, tmp_path)
    assert train(config, run) == 2
    steps, _ = read_log(tmp_path / "log.jsonl")
    assert all(0 < r["loss"] < 10 for r in steps) and run.armt.is_trained()
    assert resolve_device("cpu").type == "cpu"
    cpu = torch.device("cpu")
    native = preferred_dtype() == torch.bfloat16  # AVX512-BF16 or AMX in /proc/cpuinfo
    assert (autocast_enabled("auto", cpu), autocast_enabled(True, cpu), autocast_enabled(False, cpu)) == (
        native,
        True,
        False,
    )
    for bad in ("yes", 1):
        with pytest.raises(EdgememError, match='autocast must be true, false or "auto"'):
            replace(config, autocast=bad)
    if not torch.cuda.is_available():
        assert resolve_device("auto").type == "cpu"
        with pytest.raises(EdgememError, match="no CUDA device"):
            resolve_device("cuda")


def test_lora_read_probe_memory_off_writes_nothing_and_answers_as_with_an_empty_memory():
    """`--memory-off` (RESULTS' "its memory off (LoRA on)" row): after `silence_memory` a write
    leaves every memory's values A at zero (it wrote before), so the answer pass reads what an
    empty memory gives. The probe silences the memory before any item is written."""
    module = load_script("lora_read_probe")
    armt = writing_armt(lora_rank=4)
    ids = torch.randint(0, VOCAB, (1, 8))
    with torch.no_grad():
        written, _ = armt.step(ids, armt.empty_state())
        assert any(t.abs().sum() > 0 for k, t in written.named_tensors().items() if k.endswith(".A"))
        module.silence_memory(armt)
        silenced, _ = armt.step(ids, armt.empty_state())
        reads = armt.read_only_forward(ids, silenced)
        empty = armt.read_only_forward(ids, armt.empty_state())
    values = {k: t for k, t in silenced.named_tensors().items() if k.endswith(".A")}  # z still counts keys
    assert values and all(torch.count_nonzero(t) == 0 for t in values.values()), values.keys()
    torch.testing.assert_close(reads, empty)


def test_key_contrast_decoding_at_lam_0_is_the_evals_greedy_answer():
    """`niah_key_contrast.py` (docs/RESULTS.md, "Forty-first session"): at lam 0 its answer is the
    one `generate_ids` gives (the eval's), and against the prompt itself any lam < 1 scales every
    score alike, so the answer stays; the first-digit scores are the ten digits' at the first one."""
    from tiny_assistant import tiny_assistant

    from edgemem.armt import generate_ids, ingest, prompt_ids
    from edgemem.methods import ARMTMethod

    module = load_script("niah_key_contrast")
    assistant = tiny_assistant(segment_len=8)
    method = ARMTMethod(assistant.armt, assistant.loaded.tokenizer)
    tok = method.tokenizer
    doc = ingest(
        method.armt,
        [tok("the vault code is 4417 and the porter keeps it", add_special_tokens=False).input_ids],
    )
    prompt = (
        prompt_ids(tok, doc.tail_ids, "What is the code?") + tok(" 4", add_special_tokens=False).input_ids
    )
    other = prompt_ids(tok, doc.tail_ids, "What is the key?")
    digits = [tok(d, add_special_tokens=False).input_ids[-1] for d in "0123456789"]
    greedy = tok.decode(
        list(generate_ids(method.armt, doc.state, prompt, method.stop_ids, 9)), skip_special_tokens=True
    )
    plain, first = module.contrast_decode(method, doc.state, prompt, [other], 0.0, digits, max_new=9)
    assert plain == greedy and len(greedy) == 9
    assert module.contrast_decode(method, doc.state, prompt, [prompt], 0.5, digits, max_new=9)[0] == greedy
    assert greedy[0].isdigit()  # the tiny model writes digits here: the first-digit scores are taken
    assert first is not None and len(first) == 10 and max(first) == first[int(greedy[0])]
    # lam > 0 against another question: the first token is the argmax of the contrast, among the
    # tokens within a tenth of the top one's probability
    with torch.inference_mode():
        logp = [
            torch.log_softmax(method.armt.read_only_forward(torch.tensor([p]), doc.state)[0], -1)
            for p in (prompt, other)
        ]
    allowed = logp[0] >= logp[0].max() + torch.log(torch.tensor(0.1))
    want = int(torch.where(allowed, logp[0] - 3.0 * logp[1], -torch.inf).argmax())
    contrast, _ = module.contrast_decode(method, doc.state, prompt, [other], 3.0, digits, max_new=1)
    assert contrast == tok.decode([want])


def test_key_contrast_table_counts_answers_and_the_gold_first_digits_ranks_per_lam():
    module = load_script("niah_key_contrast")

    def got(prediction, correct, near, rank):
        return {"prediction": prediction, "correct": correct, "near": near, "rank": rank}

    rows = [
        {"id": "a", "0.0": got(" 3123.", False, True, 2), "1.0": got(" 4123.", True, True, 1)},
        {"id": "b", "0.0": got(" 5.", True, False, 1), "1.0": got(" .", False, False, None)},
    ]
    table = [
        "2 items",
        "lam 0.0: the eval's own answer on 1 of 2",
        "lam 0.0: correct 1, 5+ of 7 digits 1, gold first digit ranked 1: 1, 2: 1",
        "lam 1.0: correct 1, 5+ of 7 digits 1, gold first digit ranked 1: 1, none: 1",
    ]
    assert module.table(rows, {"a": "3123.", "b": "6."}) == table  # lines without other keys' answers
    rows[0]["others"] = [
        {"key": "k", "prediction": " 2.", "rank": 3},
        {"key": "j", "prediction": " .", "rank": None},
    ]
    rows[1]["others"] = [{"key": "i", "prediction": " 5.", "rank": 1}]
    assert module.table(rows, {"a": "3123.", "b": "6."}) == table + [
        "other keys' questions (3): the item's own lam 0.0 answer on 1,"
        " gold first digit ranked 1: 1, 3: 1, none: 1"
    ]
    assert module.gold_rank([0.0, 0.5, 0.2] + [0.1] * 7, "2431") == 2 and module.gold_rank(None, "2") is None


def test_lora_read_probe_reads_from_the_question_and_records_the_gates():
    """`--read-question-only` (docs/RESULTS.md, "Twenty-ninth session"): the answer prompt's
    tokens before "Question:" read nothing, so with the cut at the prompt's end the answer is the
    one over an empty memory, and at 0 the model's own; a gated memory's gates are recorded."""
    from tiny_assistant import tiny_assistant

    from edgemem.armt import prompt_ids

    module = load_script("lora_read_probe")
    assistant = tiny_assistant(segment_len=8, read_gate=True)
    armt, tokenizer = assistant.armt, assistant.loaded.tokenizer
    ids = tokenizer("the vault code is 4417 and the porter keeps the key", add_special_tokens=False).input_ids
    prompt = prompt_ids(tokenizer, ids, "What is the code?")
    start = module.question_start(tokenizer, prompt)
    assert 0 < start < len(prompt) and "Question:" in tokenizer.decode(prompt[start:])
    assert "Question:" not in tokenizer.decode(prompt[start + 1 :])
    x = torch.tensor([prompt])
    with torch.no_grad():
        state, _ = armt.step(torch.tensor([ids[:8]]), armt.empty_state())
        own = armt.read_only_forward(x, state)
        empty = armt.read_only_forward(x, armt.empty_state())
        with module.reads_from(armt, len(prompt)):
            none = armt.read_only_forward(x, state)
        with module.reads_from(armt, 0):
            torch.testing.assert_close(armt.read_only_forward(x, state), own)
        gates = []
        with module.gates_recorded(armt, gates):
            armt.read_only_forward(x, state)
    torch.testing.assert_close(none, empty)
    assert not torch.allclose(own, empty)
    assert len(gates) == len(armt.memories) and gates[0].shape == (len(prompt),)
    assert all("gate" not in vars(m) for m in armt.memories.values())  # the patches are undone
    assert all("_read" not in vars(m) for m in armt.base.modules())


def test_lora_read_probe_scales_the_lora_in_the_answer_pass_only():
    """The probe behind RESULTS' "the LoRA cannot be left out of the answer pass": with the
    factor 0, `read_only_forward` gives what the model gives with no LoRA at all, while the
    memory writes (`step`) are those of the full LoRA, and the scales are restored after."""
    from edgemem.armt import ARMTConfig

    module = load_script("lora_read_probe")
    torch.manual_seed(0)
    armt = ARMT(tiny_llama(), ARMTConfig.for_model(2, segment_len=8, d_mem=8, lora_rank=4))
    with torch.no_grad():
        for lora in armt.lora.values():
            lora.B.normal_(0, 0.5)
    ids = torch.randint(0, VOCAB, (1, 8))
    with torch.no_grad():
        state, _ = armt.step(ids, armt.empty_state())
        full = armt.read_only_forward(ids, state)
        with module.lora_scaled(armt, 0.0):
            without = armt.read_only_forward(ids, state)
        scales = [lora.scale for lora in armt.lora.values()]
        armt.__class__ = module.ScaledReadARMT
        armt.read_scale = 0.0
        probed_state, _ = armt.step(ids, armt.empty_state())
        probed = armt.read_only_forward(ids, state)
    assert not torch.allclose(full, without)  # the LoRA changes the answer pass
    torch.testing.assert_close(probed, without)
    for name, tensor in state.named_tensors().items():
        assert torch.equal(probed_state.named_tensors()[name], tensor), name
    assert [lora.scale for lora in armt.lora.values()] == scales


def test_niah_stream_cut_capped_step_holds_each_layer_at_its_norm_after_the_cap_write():
    """`niah_stream_cut.py --cap-at N` (docs/RESULTS.md, "Thirty-eighth session"): the states up to
    the N-th write are the plain step's; every later write is the plain step from the capped state
    with each layer's A scaled down to at most the norm it had after the N-th write of that stream,
    z as the step wrote it; a new stream records its own cap."""
    module = load_script("niah_stream_cut")
    armt = writing_armt()
    capped = module.capped_step(armt.step, 2)
    segments = [torch.randint(0, VOCAB, (1, 8)) for _ in range(6)]
    for stream in range(2):  # the second stream (other segments) sets its own cap
        held, scaled = armt.empty_state(), 0
        with torch.no_grad():
            for ids in segments[stream:]:
                plain, _ = armt.step(ids, held)  # the plain step from the same state
                held, _ = capped(ids, held)
                assert all(torch.equal(held.z[k], plain.z[k]) for k in plain.z)
                if held.writes <= 2:
                    assert all(torch.equal(held.A[k], plain.A[k]) for k in plain.A)
                    cap = {k: a.norm() for k, a in held.A.items()}
                    continue
                for k, a in held.A.items():
                    assert a.norm() <= cap[k] * (1 + 1e-5)
                    ratio = a.norm() / plain.A[k].norm()
                    torch.testing.assert_close(a, plain.A[k] * ratio)
                    scaled += bool(ratio < 0.999)
        assert scaled  # the plain step did grow A past the cap: the cap did something


def test_niah_stream_cut_fixed_z_step_carries_the_given_z_and_writes_a_with_it():
    """`niah_stream_cut.py --cut-full-z`: every state the wrapped step returns carries the given z
    (another stream's first-write z), and its A is the plain step's from that state, so the writes
    after the first read their old values against the given z."""
    module = load_script("niah_stream_cut")
    armt = writing_armt()
    other = [torch.randint(0, VOCAB, (1, 8)) for _ in range(4)]
    with torch.no_grad():
        given, _ = armt.step(other[0], armt.empty_state())
        fixed = module.fixed_z_step(armt.step, given.z)
        held = armt.empty_state()
        for ids in reversed(other):
            plain, _ = armt.step(ids, held)
            held, _ = fixed(ids, held)
            assert all(torch.equal(held.z[k], given.z[k]) for k in given.z)
            assert all(torch.equal(held.A[k], plain.A[k]) for k in plain.A)
        free, _ = armt.step(other[-1], armt.empty_state())
    assert any(not torch.equal(free.z[k], given.z[k]) for k in given.z)  # its own z would differ


def test_lead_weight_scales_the_first_digits_share_of_a_recall_items_loss(prose_tasks):
    """`lead_weight` marks the answer's first digit (not the space before it) in a recall batch,
    1 on every other target; the item's loss is then the weighted mean of its targets' losses
    (a huge weight gives the first digit's loss alone); at 1 no weights are made, so older runs
    replay bit for bit; weights of 0 or less are refused."""
    tok = prose_tasks.tokenizer
    options = dict(name="r", task="recall", steps=1, segment_len=64, segments=(2,), batch_size=2)
    assert prose_tasks.batch("recall", step_rng(0, 3, "w"), Stage(**options), 64, 2).weights is None
    batch = prose_tasks.batch("recall", step_rng(0, 3, "w"), Stage(**options, lead_weight=4.0), 64, 2)
    for row in range(2):
        scored = batch.targets[row] != -100
        heavy = (batch.weights[row] == 4.0).nonzero()[:, 0].tolist()
        assert len(heavy) == 1 and scored[heavy[0]] and not scored[: heavy[0] - 1].any()
        first = tok.decode([int(batch.targets[row, heavy[0]])])
        digits = tok.decode(batch.targets[row][scored].tolist(), skip_special_tokens=True).strip()
        assert first.isdigit() and digits.startswith(first)
        assert set(batch.weights[row][scored].tolist()) == {1.0, 4.0}
    with pytest.raises(EdgememError, match="lead_weight"):
        Stage(**options, lead_weight=0.0)

    config = tiny_config(steps=1)
    armt = build_armt(tiny_llama(), config)
    stage = Stage(name="t", task="tokens", steps=1, segment_len=4, segments=(1,))
    written = torch.randint(4, VOCAB, (2, 4))
    answer = torch.randint(4, VOCAB, (2, 6))
    targets = torch.full_like(answer, -100)
    targets[:, 2:5] = answer[:, 3:6]
    only_lead = torch.full_like(answer, -100)
    only_lead[:, 3] = targets[:, 3]
    ones = torch.ones(answer.shape)
    lead = ones.clone()
    lead[:, 3] = 1e9
    with torch.no_grad():
        plain = forward_loss(armt, Batch(written, answer, targets, 4), stage, 2)[0]
        unit = forward_loss(armt, Batch(written, answer, targets, 4, ones), stage, 2)[0]
        heavy = forward_loss(armt, Batch(written, answer, targets, 4, lead), stage, 2)[0]
        alone = forward_loss(armt, Batch(written, answer, only_lead, 4), stage, 2)[0]
        # exact recall counts right tokens whatever their weights: targets the model's own argmax
        state, _ = armt.step(written, armt.empty_state(2))
        hidden = armt.read_only_hidden(answer, state)
        argmax = torch.full_like(answer, -100)
        argmax[:, 2:5] = armt.base.get_output_embeddings()(hidden).argmax(-1)[:, 2:5]
        exact = [forward_loss(armt, Batch(written, answer, argmax, 4, w), stage, 2)[1] for w in (None, lead)]
    assert torch.allclose(unit, plain) and torch.allclose(heavy, alone, rtol=1e-5)
    assert not torch.allclose(heavy, plain)
    assert [e["exact"] for e in exact] == [1.0, 1.0]


def test_memory_state_norms_rows_are_the_norms_of_the_state_after_each_write():
    """`memory_state_norms.py` (docs/RESULTS.md, "Thirty-eighth session"): one row per full segment
    written (a partial last segment is not), each the Frobenius norms of A and z per memory layer of
    the state the ARMT step returns after that write, handed to the callback as it is made."""
    module = load_script("memory_state_norms")
    armt = writing_armt()
    S = armt.config.segment_len
    ids = [random.Random(0).randrange(4, VOCAB) for _ in range(3 * S + S // 2)]
    seen = []
    rows = module.norm_rows(armt, ids, seen.append)
    assert [r["writes"] for r in rows] == [1, 2, 3] and seen == rows
    state = armt.empty_state()
    with torch.no_grad():
        for s in range(3):
            state, _ = armt.step(torch.tensor([ids[s * S : (s + 1) * S]]), state)
            assert len(rows[s]) == 1 + 2 * len(state.A) == 1 + 2 * len(armt.memories)
            for layer, a in state.A.items():
                assert rows[s][f"A{layer}"] == pytest.approx(float(a.norm()), rel=1e-6)
                assert rows[s][f"z{layer}"] == pytest.approx(float(state.z[layer].norm()), rel=1e-6)
    first = next(iter(state.A))
    assert (
        rows[2][f"A{first}"] != rows[0][f"A{first}"]
    )  # the writes move A: the rows are not one state copied


def test_memory_read_share_parts_sum_to_the_read_the_memory_makes():
    """`memory_read_share.py` (docs/RESULTS.md, "Forty-third session") splits a read into one part
    per written row: over three delta-rule writes (the first with vbar = 0, the later ones
    correcting what was there), the groups' parts sum to `memory_read` of the final state, and a
    group's part is exactly its rows' share (the same split with only that group's rows kept)."""
    from edgemem.memory import dpfp, memory_read, memory_write

    module = load_script("memory_read_share")
    g = torch.Generator().manual_seed(0)
    A, z = torch.zeros(1, 24, 5), torch.zeros(1, 24)
    rows, labels = [], []
    for w in range(3):
        k = dpfp(torch.randn(1, 6, 4, generator=g), 3)
        v, beta = torch.randn(1, 6, 5, generator=g), torch.rand(1, 6, generator=g)
        vbar = torch.zeros_like(v) if w == 0 else memory_read(k, A, z)
        A, z = memory_write(k, v, beta, A, z, first=w == 0)
        rows.append((k[0], ((v - vbar) * beta.unsqueeze(-1))[0], beta[0]))
        labels += ["needle", "digits", "other", "other", "write", "write"]
    phi_q = dpfp(torch.randn(4, generator=g), 3)
    keys, values, _rates = module.stack_rows(rows)
    parts = module.split_read(keys, values, labels, phi_q, z[0])
    assert set(parts) == set(module.GROUPS)
    read = memory_read(phi_q.view(1, 1, -1), A, z)[0, 0]
    assert torch.allclose(sum(parts.values()), read, atol=1e-5)
    assert not torch.allclose(parts["needle"], parts["other"])
    only = [lab if lab == "needle" else "write" for lab in labels]
    assert torch.allclose(module.split_read(keys, values, only, phi_q, z[0])["needle"], parts["needle"])


def test_niah_mk_confusions_say_whose_number_an_answer_writes():
    """`niah_mk_confusions.py`: an answer is the asked key's number, a distractor's (exact, or 5+
    of 7 digits in place), or none; exact beats near and the asked key beats a distractor; an answer
    says which needle it took in the context's order; the table counts per bin, and how many
    distractor answers took the needle written first."""
    module = load_script("niah_mk_confusions")
    context = " ".join(
        ["Prose before."]
        + [
            NIAH_NEEDLE.format(k, v) + " More prose."
            for k, v in (("red-fox", "1234567"), ("blue-owl", "7654321"))
        ]
        + [NIAH_NEEDLE.format("grey-elk", "1111111")]
    )
    assert module.needles(context) == [
        ("red-fox", "1234567"),
        ("blue-owl", "7654321"),
        ("grey-elk", "1111111"),
    ]
    assert module.verdict(context, "blue-owl", " 7654321.") == ("asked", 1)
    assert module.verdict(context, "blue-owl", " 7654391.") == ("asked, near", 1)
    assert module.verdict(context, "blue-owl", " 1234567.") == ("distractor", 0)
    assert module.verdict(context, "blue-owl", " 1111111.") == ("distractor", 2)
    assert module.verdict(context, "blue-owl", " 1211111.") == ("distractor, near", 2)
    assert module.verdict(context, "blue-owl", " 9999999.") == ("none", -1)
    assert module.verdict(context, "red-fox", " 1234567.") == ("asked", 0)
    rows = [(4096, "asked", 1), (4096, "distractor", 0), (4096, "distractor, near", 2), (16384, "none", -1)]
    assert module.table(rows)[2:] == [
        "| 4k | 3 | 1 | 0 | 1 | 1 | 0 | 1 of 2 |",
        "| 16k | 1 | 0 | 0 | 0 | 0 | 1 | 0 of 0 |",
    ]
