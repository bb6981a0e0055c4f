"""The project's file helpers: atomic writes, advisory locks, content hashes, safetensors reads.

An atomic write goes to a temporary file next to the target, fsynced, then renamed over it: a
reader (or a process killed half-way through the write) sees the old file or the new one, never a
torn one.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """`write(tmp)` fills a temporary file next to `path`, which is fsynced and renamed over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    if hasattr(os, "fchmod"):  # mkstemp gives 0600, which would hide adapters and bundles from others
        os.fchmod(fd, 0o644)  # (Windows has no fchmod before Python 3.13, nor those modes)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file's bytes, read in 4 MiB blocks (model files are hundreds of MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def lock_exclusively(handle: IO, busy: str) -> None:
    """Take an advisory lock on the open file `handle`, held until it is closed; where another
    process (or another open of the same file) holds it, raise EdgememError(busy) at once."""
    from edgemem.errors import EdgememError

    if not try_lock(handle):
        raise EdgememError(busy)


def try_lock(handle: IO) -> bool:
    """Take an advisory lock on the open file `handle`, held until it is closed: False (and no
    lock) where another process (or another open of the same file) holds it. The OS drops the
    lock when its process dies, so a killed run leaves nothing stale. Where the platform has no
    `flock` (Windows) or the file system refuses it, nothing is locked and the answer is True."""
    try:
        import fcntl
    except ImportError:
        return True
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # a file system without locks (ENOLCK, EOPNOTSUPP): go on unguarded
        return True
    return True


def require_file(path: Path, what: str) -> None:
    """Nothing if `path` is a file; else one EdgememError naming `what` that says what is there
    instead: nothing, a folder, or something else (a folder passed for a file is a different
    mistake from a typo)."""
    from edgemem.errors import EdgememError

    if path.is_file():
        return
    if path.is_dir():
        raise EdgememError(f"{what} {path} is a folder, not a file")
    if path.exists():
        raise EdgememError(f"{what} {path} is not a regular file")
    raise EdgememError(f"{what} {path} does not exist")


def read_safetensors(path: Path, what: str) -> tuple[dict[str, str], dict]:
    """(metadata, tensors) of a safetensors file; anything unreadable is one EdgememError naming `what`."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    from edgemem.errors import EdgememError

    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = handle.metadata() or {}
        return meta, load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise EdgememError(f"{what} {path} is not a readable safetensors file: {exc}") from exc
