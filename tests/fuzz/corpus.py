"""The fuzz corpus of hostile and odd inputs, built at test time (some members are large, or are
things git cannot hold: FIFOs, symlink loops, unreadable files).

`python tests/fuzz/corpus.py DIR` builds the same tree by hand, to try `edgemem ingest DIR` on it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DEEP_LEVELS = 1100  # deeper than Python's default recursion limit (1000)


def deep_tree(root: Path, levels: int, name: str = "d") -> Path:
    """`levels` nested folders under root, one text file at the bottom; built one level at a time
    through folder descriptors, so it works past PATH_MAX as well. Returns the top folder."""
    top = root / name
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels - 1):
            os.mkdir(name, dir_fd=fd)
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        leaf = os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(leaf, b"the bottom of a deep tree\n")
        os.close(leaf)
    finally:
        os.close(fd)
    return top


def remove_deep(top: Path, name: str = "d") -> None:
    """Delete a tree made by `deep_tree` (shutil.rmtree recurses, and fails on it): the chain is
    moved up one level at a time, so no path ever gets long."""
    current, i = top, 0
    while current.is_dir():
        child, following = current / name, None
        for entry in os.scandir(current):
            if not entry.is_dir(follow_symlinks=False):
                os.unlink(entry.path)
        if child.is_dir():
            following = top.parent / f".removing-{top.name}-{i % 2}"
            os.rename(child, following)
        os.rmdir(current)
        if following is None:
            return
        current, i = following, i + 1


# name -> bytes; the small members of the corpus
SMALL_FILES: dict[str, bytes] = {
    "empty.txt": b"",
    "one-byte.txt": b"x",
    "one-nul.bin": b"\x00",
    "one-invalid.txt": b"\xff",
    "nul-after-sniff.txt": b"a" * 9000 + b"\x00tail\n",  # a NUL past the binary sniff window: text
    "elf.bin": b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)),
    "latin1.txt": "caf\xe9 na\xefve\n".encode("latin-1"),
    "truncated-utf8.txt": "snowman \u2603".encode()[:-1],
    "overlong-utf8.txt": b"\xc0\xaf \xe0\x80\xaf \xed\xa0\x80 surrogates and overlongs\n",
    "bom.txt": b"\xef\xbb\xbfwith a byte order mark\n",
    "utf16.txt": "utf-16 text\n".encode("utf-16"),  # NULs in the head: skipped as binary
    "crlf.txt": b"windows\r\nline\r\nends\r\n",
    "control-chars.txt": bytes(range(1, 32)) + b"\n",
    "emoji.txt": "\U0001f600 \u200d\u200b zero-width and astral\n".encode(),
    os.fsdecode(b"bad-name-\xff\xfe.txt"): b"a file whose name is not UTF-8\n",
    "name with spaces and\nnewline.txt": b"odd file name\n",
}


def build(root: Path, unreadable: bool = True, deep: bool = True) -> dict[str, int]:
    """The small corpus under `root`; -> what a scan must count (binary, special, symlinks...)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, data in SMALL_FILES.items():
        (root / name).write_bytes(data)
    os.mkfifo(root / "fifo")
    (root / "loop-a").symlink_to("loop-b")
    (root / "loop-b").symlink_to("loop-a")
    (root / "parent-link").symlink_to("..")
    (root / "self-link").symlink_to(".")
    (root / "dangling").symlink_to("does-not-exist")
    (root / "etc-passwd-link").symlink_to("/etc/passwd")
    if deep:
        deep_tree(root, DEEP_LEVELS)
    if unreadable:
        (root / "locked.txt").write_bytes(b"you may not read this\n")
        (root / "locked.txt").chmod(0o000)
        (root / "locked-dir").mkdir()
        (root / "locked-dir" / "inside.txt").write_bytes(b"nor this\n")
        (root / "locked-dir").chmod(0o000)
    return {"binary": 3, "special": 1, "unreadable": 2 if unreadable else 0}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/fuzz/corpus.py DIR")
    print(build(Path(sys.argv[1])))
