"""The file helpers every writer shares: atomic writes and content hashes."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest

from edgemem.files import atomic_write, atomic_write_text, sha256_file


def test_atomic_write_replaces_the_file_and_leaves_it_readable_like_a_plain_write(tmp_path: Path) -> None:
    target = tmp_path / "results.jsonl"
    target.write_text("old\n")
    atomic_write_text(target, "new\n")
    assert target.read_text() == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # not mkstemp's owner-only 0600
    assert [p.name for p in tmp_path.iterdir()] == ["results.jsonl"]


def test_a_failed_atomic_write_keeps_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "adapter.safetensors"
    target.write_bytes(b"old bytes")

    def half_written(tmp: str) -> None:
        Path(tmp).write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, half_written)
    assert target.read_bytes() == b"old bytes"
    assert [p.name for p in tmp_path.iterdir()] == ["adapter.safetensors"]


def test_sha256_file_hashes_the_bytes_across_read_blocks(tmp_path: Path) -> None:
    data = bytes(range(256)) * (1 << 15)  # 8 MiB: two full 4 MiB blocks
    path = tmp_path / "blob"
    path.write_bytes(data + b"tail")
    assert sha256_file(path) == hashlib.sha256(data + b"tail").hexdigest()
