"""Reading what the user points edgemem at: one text file or a folder of text and code.

`scan(path)` looks at everything once (which files, their content hash, what was skipped);
`iter_text(scan)` then streams the text in bounded pieces, never holding a whole file.
A folder is walked in a stable (sorted) order, `.gitignore` rules are respected, binary files are
skipped and counted, and each file's text is preceded by its path.
"""

from __future__ import annotations

import codecs
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from edgemem.errors import EdgememError

BLOCK_BYTES = 1 << 18  # read size
MAX_PIECE_CHARS = 1 << 20  # a line longer than this is cut at whitespace (or anywhere)
BINARY_SNIFF_BYTES = 8192
ALWAYS_SKIPPED_DIRS = {".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


@dataclass
class Scan:
    """What a path holds, measured without keeping any of its text."""

    root: Path
    files: list[Path]  # relative to root for a folder; [Path(name)] for a single file
    is_dir: bool
    content_hash: str
    total_bytes: int
    skipped_binary: int = 0
    skipped_unreadable: int = 0
    invalid_utf8: list[str] = field(default_factory=list)

    def path_of(self, rel: Path) -> Path:
        return self.root / rel if self.is_dir else self.root


def _is_binary(head: bytes) -> bool:
    return b"\x00" in head


def _hash_file(path: Path, digest: hashlib._Hash) -> tuple[int, bool, bool]:
    """Feed a text file's bytes to `digest`. -> (size, is_binary, has_invalid_utf8).

    A binary file (a NUL byte near the start) is reported as such and not hashed.
    """
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    size, invalid = 0, False
    with open(path, "rb") as handle:
        first = True
        while block := handle.read(BLOCK_BYTES):
            if first and _is_binary(block[:BINARY_SNIFF_BYTES]):
                return 0, True, False
            first = False
            digest.update(block)
            size += len(block)
            if not invalid:
                try:
                    decoder.decode(block)
                except UnicodeDecodeError:
                    invalid = True
        if not invalid:
            try:
                decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                invalid = True
    return size, False, invalid


def _walk(root: Path) -> Iterator[Path]:
    """Files under root in sorted order, minus .gitignore'd and VCS folders; symlinks are not followed."""
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

    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        gitignore = here / ".gitignore"
        if gitignore.is_file():
            try:
                lines = gitignore.read_text(errors="replace").splitlines()
                specs.append((here, pathspec.PathSpec.from_lines("gitignore", lines)))
            except OSError:
                pass
        dirnames[:] = sorted(
            d for d in dirnames if d not in ALWAYS_SKIPPED_DIRS and not ignored(here / d, True)
        )
        for name in sorted(filenames):
            path = here / name
            if path.is_symlink() or not path.is_file() or ignored(path, False):
                continue
            yield path


def scan(path: str | Path) -> Scan:
    """Look at a file or folder once: list, hash, skip binaries. Raises EdgememError for user mistakes."""
    root = Path(path).expanduser()
    if not root.exists():
        raise EdgememError(f"{root}: no such file or folder")
    digest = hashlib.sha256()
    if root.is_dir():
        result = Scan(root, [], True, "", 0)
        for file in _walk(root):
            rel = file.relative_to(root)
            file_digest = hashlib.sha256()
            try:
                size, binary, invalid = _hash_file(file, file_digest)
            except OSError:
                result.skipped_unreadable += 1
                continue
            if binary:
                result.skipped_binary += 1
                continue
            if size == 0:
                continue
            digest.update(rel.as_posix().encode() + b"\x00" + file_digest.digest())
            result.files.append(rel)
            result.total_bytes += size
            if invalid:
                result.invalid_utf8.append(rel.as_posix())
        if not result.files:
            raise EdgememError(f"{root}: no readable text files in this folder")
        result.content_hash = digest.hexdigest()
        return result
    try:
        size, binary, invalid = _hash_file(root, digest)
    except PermissionError as exc:
        raise EdgememError(f"{root}: permission denied") from exc
    except OSError as exc:
        raise EdgememError(f"{root}: cannot read ({exc.strerror})") from exc
    if binary:
        raise EdgememError(f"{root} is a binary file, not text")
    if size == 0:
        raise EdgememError(f"{root} is empty")
    result = Scan(root, [Path(root.name)], False, digest.hexdigest(), size)
    if invalid:
        result.invalid_utf8.append(root.name)
    return result


def file_pieces(path: Path) -> Iterator[str]:
    """A file's text (invalid UTF-8 replaced) in pieces that end at a newline where possible."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    carry = ""
    with open(path, "rb") as handle:
        while True:
            block = handle.read(BLOCK_BYTES)
            text = carry + decoder.decode(block, final=not block)
            if not block:
                if text:
                    yield text
                return
            cut = text.rfind("\n") + 1
            if cut == 0 and len(text) > MAX_PIECE_CHARS:
                cut = text.rfind(" ") + 1 or len(text)
            carry = text[cut:]
            if cut:
                yield text[:cut]


def iter_text(source: Scan) -> Iterator[str]:
    """Stream the text of a scanned file or folder; for a folder each file starts with its path."""
    for rel in source.files:
        if source.is_dir:
            yield f"\n===== {rel.as_posix()} =====\n"
        try:
            yield from file_pieces(source.path_of(rel))
        except OSError as exc:
            raise EdgememError(f"{source.path_of(rel)}: cannot read during ingest ({exc.strerror})") from exc
