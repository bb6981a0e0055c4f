"""The `edgemem` command line: models, ingest, ask, library, chat, bench.

Every user mistake ends as one line on stderr ("error: ...") and a non-zero exit code.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from edgemem.cli_common import AdapterOpt, AnswerWindowOpt, ModelOpt, SegmentOpt, _out, err, user_errors
from edgemem.cli_eval import data_app, eval_app
from edgemem.cli_export import EngineOpt, OptionalModelOpt, bench_runtimes, export_cmd
from edgemem.cli_train import train_cmd
from edgemem.errors import EdgememError
from edgemem.limits import DEFAULT_MAX_SIZE, parse_duration, parse_size

app = typer.Typer(
    help="edgemem: ask questions about documents and code of any length, offline, in fixed memory.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
bench_app = typer.Typer(help="Benchmarks that print measured figures.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(data_app, name="data")
app.add_typer(eval_app, name="eval")
app.command("train")(train_cmd)
app.command("export")(export_cmd)
bench_app.command("runtimes")(bench_runtimes)

LOG_EVERY_S = 30.0  # progress line interval when stderr is not a terminal

MaxSizeOpt = Annotated[
    str,
    typer.Option(
        "--max-size",
        envvar="EDGEMEM_MAX_SIZE",
        help="Largest document or folder to take in (bytes of text; k, M, G suffixes; 0 = no limit).",
    ),
]
MaxTimeOpt = Annotated[
    str | None,
    typer.Option(
        "--max-time",
        envvar="EDGEMEM_MAX_TIME",
        help="Stop an ingest after this long (s, m, h suffixes); its progress is kept for a resume.",
    ),
]


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


@app.command()
@user_errors
def models() -> None:
    """The bundled base models and whether they are ready."""
    from edgemem.models import DEFAULT_MODEL, REGISTRY, model_status

    table = Table("model", "ready", "size", "notes")
    for spec in REGISTRY.values():
        status = model_status(spec)
        name = spec.name + (" (default)" if spec.name == DEFAULT_MODEL else "")
        if status["installed"]:
            ready = "yes" if status["cached"] else "yes (first load converts the GGUF, ~1 min)"
            table.add_row(name, ready, f"{status['size_mb']} MB", str(status["detail"]))
        else:
            table.add_row(name, "no", "-", str(status["detail"]))
    _out().print(table)


def _open(
    model: str | None,
    adapter: str | None,
    segment_len: int | None,
    engine: str | None = None,
    answer_window: int | None = None,
):
    from edgemem.assistant import Assistant
    from edgemem.cli_swax import is_swax_checkpoint, open_swax_assistant
    from edgemem.models import DEFAULT_MODEL
    from edgemem.runtime import OrtOptions, find_default_engine

    if engine in (None, "torch") and is_swax_checkpoint(model):  # a SWAX checkpoint as --model
        if answer_window is not None:
            raise EdgememError("--answer-window is for ARMT memories, not SWAX models")
        return open_swax_assistant(model, adapter, segment_len)
    if engine is None and segment_len is None and adapter is None and answer_window is None:
        found = find_default_engine(model or DEFAULT_MODEL)  # the fastest CPU backend, once exported
        if found is not None:
            err.print(f"using the exported engine {found} (--engine torch runs PyTorch)", markup=False)
            engine = str(found)
    if engine == "torch":
        engine = None
    if engine is not None:
        if segment_len is not None:
            raise EdgememError("an engine's segment length is fixed: export it again with --segment-len")
        if answer_window is not None:
            raise EdgememError("an engine's answer window is its adapter's: use --engine torch for another")
        with err.status(f"opening engine {engine}..."):
            # one command, one document: the answer graph's session replaces the segment step's
            assistant = Assistant.open_engine(engine, model, adapter, OrtOptions(one_session=True))
    else:
        with err.status(f"loading {model or DEFAULT_MODEL}..."):
            assistant = Assistant.open(
                model or DEFAULT_MODEL, adapter, segment_len, answer_window=answer_window
            )
    if not assistant.trained:
        err.print(
            f"note: the memory is untrained (no adapter for {assistant.name}): "
            "answers only see the last "
            f"{assistant.runtime.config.segment_len} tokens of a document plus what an empty memory returns."
        )
    return assistant


def _scan(path: str, max_size: str = DEFAULT_MAX_SIZE):
    """Look at the path before loading any model, so that a bad path fails at once."""
    from edgemem.documents import scan

    source = scan(path, max_bytes=parse_size(max_size))
    for name in source.invalid_utf8[:5]:
        err.print(f"warning: {name} is not valid UTF-8; decoded with replacement characters", markup=False)
    if len(source.invalid_utf8) > 5:
        err.print(f"warning: {len(source.invalid_utf8) - 5} more files are not valid UTF-8")
    if source.skipped_binary:
        err.print(f"skipped {source.skipped_binary} binary file(s)")
    if source.skipped_unreadable:
        err.print(f"skipped {source.skipped_unreadable} unreadable file(s) or folder(s)")
    if source.skipped_special:
        err.print(f"skipped {source.skipped_special} special file(s) (pipes, sockets, devices)")
    return source


def _ingest(assistant, source, force: bool = False, max_time: str | None = None):
    from edgemem.armt import IngestCancelled
    from edgemem.store import Library

    limit_s = parse_duration(max_time)
    deadline = None if limit_s is None else time.monotonic() + limit_s

    estimate = max(1, source.total_bytes // 4)
    columns = (
        TextColumn("[bold]ingest"),
        BarColumn(),
        TextColumn("{task.fields[tokens]:>10,} tokens"),
        TextColumn("{task.fields[rate]:>7,.0f} tok/s"),
        TextColumn("RSS {task.fields[rss]}"),
        TimeElapsedColumn(),
    )
    bar = Progress(*columns, console=err, transient=False, disable=not err.is_terminal)
    with Library() as library, bar:
        task = bar.add_task("ingest", total=estimate, tokens=0, rate=0.0, rss="-")

        last_line = 0.0

        def report(p) -> None:
            nonlocal last_line
            bar.update(
                task,
                completed=min(p.tokens, estimate),
                tokens=p.tokens,
                rate=p.tokens_per_s,
                rss=_mb(p.rss_bytes),
            )
            if not err.is_terminal and p.seconds - last_line >= LOG_EVERY_S:  # logs get a line instead
                last_line = p.seconds
                err.print(f"ingest: {p.tokens:,} tokens, {p.tokens_per_s:,.0f} tok/s, RSS {_mb(p.rss_bytes)}")

        def notice(message: str) -> None:
            err.print(message, markup=False)

        try:
            record, doc, reused = assistant.ingest_scan(
                source,
                library,
                progress=report,
                force=force,
                notice=notice,
                should_stop=None if deadline is None else lambda: time.monotonic() >= deadline,
            )
        except IngestCancelled as exc:
            raise EdgememError(
                f"ingest stopped at the --max-time limit ({max_time}) after {exc.tokens:,} tokens;"
                " its progress is saved: run the same command again to resume"
            ) from exc
        except KeyboardInterrupt:
            bar.stop()
            key = assistant.library_key(source.content_hash)
            saved = library.find_checkpoint(*key)
            if saved is not None:
                err.print(
                    f"interrupted: {saved.tokens:,} tokens are saved; run the same command again to resume"
                )
            raise
        bar.update(task, total=max(doc.tokens, 1), completed=doc.tokens, tokens=doc.tokens)
    return record, doc, reused


@app.command("ingest")
@user_errors
def ingest_cmd(
    path: Annotated[str, typer.Argument(help="A text file or a folder of text and code.")],
    model: OptionalModelOpt = None,
    adapter: AdapterOpt = None,
    segment_len: SegmentOpt = None,
    answer_window: AnswerWindowOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Ingest again even if the library has it.")] = False,
    max_size: MaxSizeOpt = DEFAULT_MAX_SIZE,
    max_time: MaxTimeOpt = None,
    engine: EngineOpt = None,
) -> None:
    """Stream a document or folder through memory and store its state in the library."""
    parse_duration(max_time)  # a bad value fails before the model loads
    source = _scan(path, max_size)
    assistant = _open(model, adapter, segment_len, engine, answer_window)
    record, doc, reused = _ingest(assistant, source, force, max_time)
    verb = "already in the library" if reused else "ingested"
    err.print(
        f"{record.path}: {verb}: {doc.tokens:,} tokens, {doc.state.writes} segments written, "
        f"state {_mb(record.state_bytes)} (library id {record.id})",
        markup=False,
    )


@app.command()
@user_errors
def ask(
    path: Annotated[
        str, typer.Argument(help="The document or folder to ask about (ingested first if needed).")
    ],
    question: Annotated[str, typer.Argument(help="Your question.")],
    model: OptionalModelOpt = None,
    adapter: AdapterOpt = None,
    segment_len: SegmentOpt = None,
    answer_window: AnswerWindowOpt = None,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Longest answer, in tokens.")] = 256,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 = greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0)] = 0.95,
    seed: Annotated[int | None, typer.Option(help="Random seed for sampling.")] = None,
    max_size: MaxSizeOpt = DEFAULT_MAX_SIZE,
    max_time: MaxTimeOpt = None,
    engine: EngineOpt = None,
) -> None:
    """Answer a question about a document, streaming the answer."""
    if not question.strip():
        raise EdgememError("the question is empty")
    parse_duration(max_time)
    source = _scan(path, max_size)
    assistant = _open(model, adapter, segment_len, engine, answer_window)
    _record, doc, _reused = _ingest(assistant, source, max_time=max_time)
    pieces = assistant.ask(
        doc, question, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed
    )
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")


@app.command()
@user_errors
def library(
    remove: Annotated[
        list[int] | None, typer.Option("--remove", help="Remove the entry with this id.")
    ] = None,
) -> None:
    """What has been ingested (sizes, dates); remove entries with --remove ID."""
    from edgemem.store import Library

    with Library() as lib:
        for record_id in remove or []:
            record = lib.remove(record_id)
            err.print(f"removed {record.id}: {record.path}", markup=False)
        records = lib.records()
    if not records:
        _out().print("the library is empty")
        return
    table = Table("id", "path", "tokens", "segments", "state", "model", "ingested")
    for r in records:
        when = dt.datetime.fromtimestamp(r.created_at).strftime("%Y-%m-%d %H:%M")
        table.add_row(
            str(r.id), r.path, f"{r.tokens:,}", str(r.segments), _mb(r.state_bytes), r.model_id, when
        )
    _out().print(table)


@app.command()
@user_errors
def chat(
    paths: Annotated[
        list[str] | None, typer.Argument(help="Files or folders to add to the library (and ingest).")
    ] = None,
    max_size: MaxSizeOpt = DEFAULT_MAX_SIZE,
    max_time: MaxTimeOpt = None,
) -> None:
    """Open the chat app: the library, ingest with progress, streamed answers, saved conversations.
    The app's ingests keep to --max-size and --max-time, as `edgemem ingest` does."""
    max_seconds = parse_duration(max_time)
    for path in paths or []:
        _scan(path, max_size)  # a bad path fails here, in one line, before the screen opens
    try:
        from edgemem.tui.app import run
    except ImportError as exc:
        raise EdgememError(f"the chat app needs textual ({exc}): pip install 'textual>=1.0'") from exc
    run(paths or [], max_bytes=parse_size(max_size), max_seconds=max_seconds)


@bench_app.command("ingest")
@user_errors
def bench_ingest(
    sizes: Annotated[str, typer.Option(help="Comma-separated token counts.")] = "4096,32768,131072,1048576",
    corpus: Annotated[
        str | None, typer.Option(help="Text file or folder (default: the Python standard library source).")
    ] = None,
    model: ModelOpt = "smollm2-135m-instruct",
    output: Annotated[
        str, typer.Option("--out", help="Where to write the JSON results.")
    ] = "bench-ingest.json",
) -> None:
    """Ingest tokens/s and peak RSS vs the plain base model over the same segments."""
    from edgemem.bench import run_ingest_bench

    try:
        counts = [int(s) for s in sizes.split(",") if s.strip()]
    except ValueError as exc:
        raise EdgememError(f"--sizes must be comma-separated integers, got {sizes!r}") from exc
    run_ingest_bench(counts, corpus, model, output, _out())


def main() -> None:
    app()


if __name__ == "__main__":
    main()
