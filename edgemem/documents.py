"""Reading what the user points edgemem at: one text file or a folder of text and code.

`scan(path)` looks at everything once (which files, their content hash, what was skipped);
`iter_text(scan)` then streams the text in bounded pieces, never holding a whole file.
A folder is walked in a stable (sorted) order, `.gitignore` rules are respected, binary files are
skipped and counted, and each file's text is preceded by its path.

Hostile input is expected: only regular files are opened (a FIFO, socket or device is skipped, or
refused when named directly, and never blocks), symlinks inside a folder are not followed (no
loops), the walk is iterative (any depth), unreadable files and folders are counted and skipped,
and a file that changes between the scan and the ingest is caught before a changed block reaches
the model (each block's digest is kept by the scan and checked when the block is read again).
"""

from __future__ import annotations

import codecs
import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import pathspec

from edgemem.errors import EdgememError

BLOCK_BYTES = 1 << 18  # read size
# Pieces handed to the tokenizer end at a newline and hold at most this many characters (a longer
# line is cut at whitespace, or anywhere). Small pieces keep memory flat: tokenizing 256 KB at a
# time made glibc's heap grow by ~6 MB a call (freed, but not returned; measured with the tiny
# model's tokenizer), 16 KB at a time keeps it level.
MAX_PIECE_CHARS = 1 << 14
BINARY_SNIFF_BYTES = 8192
MAX_GITIGNORE_BYTES = 1 << 20  # a larger .gitignore is not read
BLOCK_DIGEST_BYTES = 8  # per block of a scanned file: what `iter_text` checks the block against
ALWAYS_SKIPPED_DIRS = {".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


class NotRegularFile(OSError):
    """The path is a FIFO, socket, device or folder where a regular file was expected."""


class DocumentChanged(EdgememError):
    """A file's bytes differ from what the scan saw: nothing of the changed part was used."""


@dataclass
class Scan:
    """What a path holds, measured without keeping any of its text."""

    root: Path
    files: list[Path]  # relative to root for a folder; [Path(name)] for a single file
    is_dir: bool
    content_hash: str
    total_bytes: int
    skipped_binary: int = 0
    skipped_unreadable: int = 0  # files and folders that could not be opened
    skipped_special: int = 0  # FIFOs, sockets, devices
    invalid_utf8: list[str] = field(default_factory=list)
    # per file: the concatenated BLOCK_DIGEST_BYTES digests of its BLOCK_BYTES blocks
    block_digests: list[bytes] = field(default_factory=list, repr=False)

    def path_of(self, rel: Path) -> Path:
        return self.root / rel if self.is_dir else self.root


def display(path: Path | str) -> str:
    """A path as printable text: undecodable bytes in a file name become U+FFFD."""
    return os.fsencode(path).decode("utf-8", "replace")


def open_regular(path: Path, follow_symlinks: bool = True) -> BinaryIO:
    """Open a regular file for reading; anything else raises NotRegularFile without blocking.

    O_NONBLOCK makes opening a FIFO return at once (a plain open waits for a writer forever).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(f"{display(path)} is not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)  # blocks come straight from the file
    except BaseException:
        os.close(fd)
        raise


def _blocks(handle: BinaryIO) -> Iterator[bytes]:
    """BLOCK_BYTES blocks (the last one shorter), whatever sizes the reads return."""
    pending = b""
    while chunk := handle.read(BLOCK_BYTES - len(pending)):
        pending += chunk
        if len(pending) == BLOCK_BYTES:
            yield pending
            pending = b""
    if pending:
        yield pending


def _block_digest(block: bytes) -> bytes:
    return hashlib.blake2b(block, digest_size=BLOCK_DIGEST_BYTES).digest()


def _is_binary(head: bytes) -> bool:
    return b"\x00" in head


@dataclass
class _Hashed:
    size: int = 0
    binary: bool = False
    invalid_utf8: bool = False
    blocks: bytes = b""


def _hash_file(path: Path, digest: hashlib._Hash, follow_symlinks: bool = True) -> _Hashed:
    """Feed a text file's bytes to `digest` and note each block's digest.

    A binary file (a NUL byte near the start) is reported as such and not hashed.
    """
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    out, blocks = _Hashed(), bytearray()
    with open_regular(path, follow_symlinks) as handle:
        for block in _blocks(handle):
            if out.size == 0 and _is_binary(block[:BINARY_SNIFF_BYTES]):
                return _Hashed(binary=True)
            digest.update(block)
            blocks += _block_digest(block)
            out.size += len(block)
            if not out.invalid_utf8:
                try:
                    decoder.decode(block)
                except UnicodeDecodeError:
                    out.invalid_utf8 = True
    if not out.invalid_utf8:
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            out.invalid_utf8 = True
    out.blocks = bytes(blocks)
    return out


def _read_gitignore(path: Path) -> pathspec.PathSpec | None:
    try:
        with open_regular(path, follow_symlinks=False) as handle:
            data = handle.read(MAX_GITIGNORE_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_GITIGNORE_BYTES:
        return None
    return pathspec.PathSpec.from_lines("gitignore", data.decode("utf-8", "replace").splitlines())


def _walk(root: Path, result: Scan) -> Iterator[Path]:
    """Regular files under root in sorted order (depth first, a folder's files before its
    subfolders), minus .gitignore'd and VCS folders. Symlinks are not followed; special files and
    unreadable folders are counted on `result`. Iterative: no recursion limit on deep trees."""
    specs: list[tuple[Path, pathspec.PathSpec]] = []

    def ignored(path: Path, is_dir: bool) -> bool:
        for base, spec in specs:
            try:
                rel = path.relative_to(base).as_posix()
            except ValueError:
                continue
            if spec.match_file(rel + "/" if is_dir else rel):
                return True
        return False

    stack = [root]
    while stack:
        here = stack.pop()
        try:
            with os.scandir(here) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError:
            result.skipped_unreadable += 1
            continue
        if any(e.name == ".gitignore" for e in entries) and (spec := _read_gitignore(here / ".gitignore")):
            specs.append((here, spec))
        subdirs = []
        for entry in entries:
            path = here / entry.name
            try:
                if entry.is_symlink():
                    continue
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in ALWAYS_SKIPPED_DIRS and not ignored(path, True):
                        subdirs.append(path)
                elif entry.is_file(follow_symlinks=False):
                    if not ignored(path, False):
                        yield path
                else:
                    result.skipped_special += 1
            except OSError:
                result.skipped_unreadable += 1
        stack.extend(reversed(subdirs))


def _too_big(root: Path, size: int, max_bytes: int) -> EdgememError:
    return EdgememError(
        f"{display(root)} holds more than {max_bytes:,} bytes of text ({size:,} found so far);"
        " raise the limit with --max-size"
    )


def scan(path: str | Path, max_bytes: int | None = None) -> Scan:
    """Look at a file or folder once: list, hash, skip binaries. Raises EdgememError for user mistakes.

    `max_bytes` caps the text taken in (the sum over a folder's files); more is an error.
    """
    root = Path(path).expanduser()
    try:
        os.stat(root)
    except FileNotFoundError as exc:
        if os.path.islink(root):
            raise EdgememError(f"{display(root)} is a broken symbolic link") from exc
        raise EdgememError(f"{display(root)}: no such file or folder") from exc
    except OSError as exc:  # ELOOP, ENAMETOOLONG, EACCES on a parent...
        raise EdgememError(f"{display(root)}: cannot open ({exc.strerror})") from exc
    digest = hashlib.sha256()
    if root.is_dir():
        result = Scan(root, [], True, "", 0)
        for file in _walk(root, result):
            rel = file.relative_to(root)
            file_digest = hashlib.sha256()
            try:
                hashed = _hash_file(file, file_digest, follow_symlinks=False)
            except NotRegularFile:  # replaced by something else since the listing
                result.skipped_special += 1
                continue
            except OSError:
                result.skipped_unreadable += 1
                continue
            if hashed.binary:
                result.skipped_binary += 1
                continue
            if hashed.size == 0:
                continue
            digest.update(os.fsencode(rel) + b"\x00" + file_digest.digest())
            result.files.append(rel)
            result.block_digests.append(hashed.blocks)
            result.total_bytes += hashed.size
            if max_bytes is not None and result.total_bytes > max_bytes:
                raise _too_big(root, result.total_bytes, max_bytes)
            if hashed.invalid_utf8:
                result.invalid_utf8.append(display(rel.as_posix()))
        if not result.files:
            raise EdgememError(f"{display(root)}: no readable text files in this folder")
        result.content_hash = digest.hexdigest()
        return result
    if max_bytes is not None and (size := root.stat().st_size) > max_bytes:
        raise _too_big(root, size, max_bytes)
    try:
        hashed = _hash_file(root, digest)
    except NotRegularFile as exc:
        raise EdgememError(f"{display(root)} is not a regular file (a pipe, socket or device)") from exc
    except PermissionError as exc:
        raise EdgememError(f"{display(root)}: permission denied") from exc
    except OSError as exc:
        raise EdgememError(f"{display(root)}: cannot read ({exc.strerror})") from exc
    if hashed.binary:
        raise EdgememError(f"{display(root)} is a binary file, not text")
    if hashed.size == 0:
        raise EdgememError(f"{display(root)} is empty")
    if max_bytes is not None and hashed.size > max_bytes:  # it grew since the stat
        raise _too_big(root, hashed.size, max_bytes)
    result = Scan(root, [Path(root.name)], False, digest.hexdigest(), hashed.size)
    result.block_digests.append(hashed.blocks)
    if hashed.invalid_utf8:
        result.invalid_utf8.append(display(root.name))
    return result


def file_pieces(path: Path, block_digests: bytes | None = None) -> Iterator[str]:
    """A file's text (invalid UTF-8 replaced) in pieces that end at a newline where possible.

    With `block_digests` (from a scan) every block is checked before any of it is decoded: a
    file that changed since the scan raises DocumentChanged, and no changed byte is yielded.
    """
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    carry = ""
    n = BLOCK_DIGEST_BYTES
    with open_regular(path) as handle:
        blocks = _blocks(handle)
        index = 0
        while True:
            block = next(blocks, b"")
            if block_digests is not None:
                expected = block_digests[index * n : (index + 1) * n]
                changed = _block_digest(block) != expected if block else bool(expected)
                if changed:
                    raise DocumentChanged(
                        f"{display(path)} changed during the ingest; run the command again to ingest"
                        " its new content"
                    )
            index += 1
            text = carry + decoder.decode(block, final=not block)
            start = 0
            while len(text) - start > MAX_PIECE_CHARS:
                end = start + MAX_PIECE_CHARS
                cut = text.rfind("\n", start, end) + 1 or text.rfind(" ", start, end) + 1 or end
                yield text[start:cut]
                start = cut
            if not block:
                if start < len(text):
                    yield text[start:]
                return
            cut = max(text.rfind("\n", start) + 1, start)
            carry = text[cut:]
            if cut > start:
                yield text[start:cut]


def iter_text(source: Scan) -> Iterator[str]:
    """Stream the text of a scanned file or folder; for a folder each file starts with its path.

    Raises DocumentChanged when a file differs from what the scan saw, EdgememError when it can
    no longer be read.
    """
    for i, rel in enumerate(source.files):
        if source.is_dir:
            yield f"\n===== {display(rel.as_posix())} =====\n"
        digests = source.block_digests[i] if i < len(source.block_digests) else None
        path = source.path_of(rel)
        try:
            yield from file_pieces(path, digests)
        except FileNotFoundError as exc:
            raise DocumentChanged(f"{display(path)} was removed during the ingest") from exc
        except OSError as exc:
            raise EdgememError(f"{display(path)}: cannot read during ingest ({exc.strerror})") from exc
