"""What every `edgemem` command shares: the consoles, common options and the user-error wrapper;
and for the scripts under scripts/, `run_script` (they end the same way).

Every user mistake ends as one line on stderr ("error: ...") and a non-zero exit code.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Annotated, TypeVar

import typer
from rich.console import Console

from edgemem.errors import EdgememError

err = Console(stderr=True, highlight=False, soft_wrap=True)


def _out() -> Console:
    """stdout console; when piped, tables keep their natural width instead of 80 columns."""
    return Console(highlight=False, width=None if sys.stdout.isatty() else 1000)


F = TypeVar("F", bound=Callable[..., object])

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="Registry name, or a path to a .gguf file or model folder.")
]
AdapterOpt = Annotated[
    str | None,
    typer.Option("--adapter", help="Memory adapter (.safetensors); default: the one shipped for the model."),
]
SegmentOpt = Annotated[
    int | None,
    typer.Option(
        "--segment-len",
        min=16,
        help="Tokens per segment (default: the adapter's, 128 for the shipped SmolLM2 one; else 512).",
    ),
]

AnswerWindowOpt = Annotated[
    int | None,
    typer.Option(
        "--answer-window",
        min=0,
        help="Leave a document's last N tokens unwritten, beside the question (0: off; default: adapter's).",
    ),
]


def user_errors(func: F) -> F:
    """Turn EdgememError into a one-line message and exit code 1; Ctrl-C into exit code 130."""

    @functools.wraps(func)
    def wrapper(*args: object, **kwargs: object) -> object:
        try:
            return func(*args, **kwargs)
        except EdgememError as exc:
            err.print(f"error: {exc}", markup=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def run_script(main: Callable[[], object]) -> None:
    """Run a script's `main` (scripts/) the way the commands end: a user mistake (an EdgememError,
    or a file that cannot be opened) as one line "error: ..." on stderr and a non-zero exit, Ctrl-C
    as exit 130, and a reader that closes the pipe early (`script | head`) quietly with exit 1, as
    other filters do. An int that `main` returns is the exit code."""
    try:
        code = main()
        sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not at interpreter exit
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except EdgememError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename is not None else ""
        print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
