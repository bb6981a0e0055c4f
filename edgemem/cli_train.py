"""`edgemem train CONFIG --out RUN`: the memory training recipe (`--plot` draws a run's curves).

Registered on the main app in edgemem/cli.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from edgemem.cli_common import err, user_errors


@user_errors
def train_cmd(
    config: Annotated[
        Path | None, typer.Argument(help="Training config (TOML), e.g. configs/train/smollm2-135m.toml.")
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="Run folder: checkpoint, adapter, log, curves.")] = Path(
        "runs/train"
    ),
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", min=1, help="Stop after this many more steps.")
    ] = None,
    plot: Annotated[bool, typer.Option("--plot", help="Only draw RUN/curves.png from the log.")] = False,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="Torch threads (overrides the config).")
    ] = None,
    micro_batch: Annotated[
        int | None,
        typer.Option(
            "--micro-batch",
            min=1,
            help="Rows per forward/backward pass, gradients summed to the same update (overrides the "
            "config): fewer rows, less memory.",
        ),
    ] = None,
) -> None:
    """Train the memory adapter; the same command again resumes from the last checkpoint.

    Under `torchrun --nproc_per_node N -m edgemem.cli train ...` the processes share each batch (DDP).
    """
    from edgemem.errors import EdgememError
    from edgemem.train import load_config, run_config
    from edgemem.train import plot as draw

    if plot:
        err.print(f"wrote {draw(out)}", markup=False)
        return
    if config is None:
        raise EdgememError("usage: edgemem train CONFIG --out RUN_FOLDER (or --plot --out RUN_FOLDER)")
    cfg = load_config(config)
    if threads is not None:
        cfg = replace(cfg, threads=threads)
    if micro_batch is not None:
        cfg = replace(cfg, micro_batch=micro_batch)
    step = run_config(cfg, out, max_steps, log=lambda line: err.print(line, markup=False))
    err.print(f"step {step} of {cfg.total_steps}; adapter: {out / 'adapter.safetensors'}", markup=False)
    draw(out)
