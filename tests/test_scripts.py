"""The scripts under scripts/ end the way the commands do (`edgemem.cli_common.run_script`): a user
mistake as one line on stderr and a non-zero exit, a reader that closes the pipe early quietly.
Each runs as a user runs it: `python scripts/NAME.py ...` in its own process."""

import os
import subprocess
import sys

import pytest
from fuzz.helpers import REPO, write_corpora


def run_as_user(args: list[str], home, close_stdout: bool = False) -> tuple[int, str]:
    """Run scripts/`args[0]` with EDGEMEM_HOME=`home`; (exit code, stderr). With `close_stdout`,
    the reader is gone before the interpreter has started: every write meets a closed pipe."""
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / args[0]), *args[1:]],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "EDGEMEM_HOME": str(home)},
    )
    if close_stdout:
        proc.stdout.close()
        stderr = proc.stderr.read().decode()
    else:
        stderr = proc.communicate(timeout=120)[1].decode()
    return proc.wait(timeout=120), stderr


@pytest.mark.parametrize(
    "args",
    [
        ["train_ablations.py", "cost"],
        ["train_loss_table.py", "docs/train/ablations-avx2-7c152bb2e60d/layers-low/log.jsonl"],
        ["niah_align_bounds.py", "--length", "1k", "-n", "1"],
    ],
)
def test_scripts_piped_into_a_closed_reader_stop_without_a_traceback(args, tmp_path):
    """`train_ablations.py cost | head -1`, `niah_align_bounds.py ... | head`: the reader is gone
    before the script writes; it exits 1 with nothing on stderr (each used to end in a
    BrokenPipeError traceback)."""
    write_corpora(tmp_path / "data")  # niah_align_bounds builds its items from the prose corpora
    assert run_as_user(args, tmp_path, close_stdout=True) == (1, "")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["niah_align_bounds.py", "--length", "1k", "-n", "1"],
            "error: corpus 'linux-doc' is not prepared: run `edgemem data prepare`",
        ),
        (["niah_align_bounds.py", "--length", "1kk"], "error: bad length '1kk': use numbers like"),
        (
            ["train_loss_table.py", "{tmp}/missing.jsonl"],
            "error: No such file or directory: {tmp}/missing.jsonl",
        ),
        (["train_loss_table.py", "{tmp}"], "error: Is a directory: {tmp}"),
        (["blend_adapters.py", "{tmp}/a.safetensors", "{tmp}/b.safetensors", "--distances"], "error: "),
        (["project_niah_sweep.py", "--results", "{tmp}/none"], "error: no results in {tmp}/none"),
        (["int8_niah.py", "{tmp}/a", "{tmp}/b"], "error: engine {tmp}/a does not exist"),
        (["armt_eval_rss.py"], "error: corpus 'linux-doc' is not prepared"),
        (["trt_plugin_probe.py", "tensorrt_llm"], "error: unknown module 'tensorrt_llm'"),
    ],
)
def test_a_user_mistake_in_a_script_is_one_line_and_a_non_zero_exit(args, line, tmp_path):
    """Corpora not prepared, a bad length bin, a log that is missing or a folder, adapters, a
    results folder or engine bundles that do not exist, a module that is not TensorRT: one line
    "error: ..." and exit 1, no traceback (all but blend_adapters used to end in one, or in
    project_niah_sweep's case in an empty table; blend_adapters' own `return 1` must still reach
    the exit code)."""
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code, stderr = run_as_user(args, tmp_path)
    assert code == 1
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert stderr.startswith(line.replace("{tmp}", str(tmp_path))), stderr


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["train_memory_cost.py", "--modes", "bptt"], "unknown mode 'bptt': use full, checkpointing"),
        (["diagonal_batching_bound.py", "0"], "rounds must be at least 1"),
    ],
)
def test_a_bad_script_argument_is_refused_before_any_work(args, line, tmp_path):
    """A measurement mode that does not exist, zero rounds: argparse's usage and error line, exit 2,
    before a model loads (`--modes bptt` used to measure full back-propagation under that name;
    zero rounds ended in a StatisticsError after the model had loaded)."""
    code, stderr = run_as_user(args, tmp_path)
    assert code == 2
    assert f"error: {line}" in stderr.strip().splitlines()[-1], stderr
    assert "Traceback" not in stderr


def test_the_train_validate_driver_stops_where_training_fails(tmp_path):
    """`scripts/train_validate.sh CONFIG NAME` on a config `edgemem train` refuses: the command's own
    line and its exit code, and nothing after it (no log copied into docs/train/, nothing staged,
    nothing read): a failed run must not go on to stage and read whatever adapter RUN held. Without
    its arguments: the usage line and exit 2."""
    env = {
        **os.environ,
        "EDGEMEM_HOME": str(tmp_path),
        "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}",  # `edgemem`
    }
    driver = str(REPO / "scripts" / "train_validate.sh")
    (tmp_path / "bad.toml").write_text('model = "smollm2-135m-instruct"\nlr = \n')
    for args, code, line in [
        ([], 2, "usage: scripts/train_validate.sh CONFIG NAME [LENGTHS]"),
        (["missing.toml", "run"], 1, "error: no config at missing.toml"),
        (["bad.toml", "run"], 1, "error: training config bad.toml is not valid TOML"),
    ]:
        proc = subprocess.run(
            ["bash", driver, *args], cwd=tmp_path, env=env, capture_output=True, timeout=120
        )
        stderr = proc.stderr.decode()
        assert proc.returncode == code, stderr
        assert len(stderr.strip().splitlines()) == 1 and stderr.startswith(line), stderr
    assert not (tmp_path / "docs").exists() and not (tmp_path / "runs" / "stage-run").exists()
