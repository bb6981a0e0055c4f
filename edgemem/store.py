"""The library: which documents were ingested, and their memory states on disk.

SQLite (WAL) holds one record per (content hash, model id, adapter hash); the state itself is a
safetensors file beside the database, written to a temporary file, fsynced and renamed, so a crash
never leaves a half-written state under a real name. Every load checks the file's sha256, its
metadata (model, adapter) and its tensor shapes before the state is used.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from edgemem.armt import IngestResult, MemoryState
from edgemem.errors import EdgememError
from edgemem.paths import data_dir

STATE_FORMAT = "edgemem-state/1"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    model_id TEXT NOT NULL,
    adapter_hash TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    segments INTEGER NOT NULL,
    state_file TEXT NOT NULL,
    state_sha256 TEXT NOT NULL,
    state_bytes INTEGER NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE (content_hash, model_id, adapter_hash)
);
CREATE INDEX IF NOT EXISTS documents_path ON documents (path);
"""


@dataclass(frozen=True)
class Record:
    id: int
    path: str
    content_hash: str
    model_id: str
    adapter_hash: str
    tokens: int
    segments: int
    state_file: str
    state_sha256: str
    state_bytes: int
    created_at: float


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Library:
    """The SQLite library under the edgemem data directory (or `root`)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root else data_dir()
        self.states = self.root / "states"
        self.states.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(self.root / "library.sqlite3", timeout=30)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise EdgememError(
                f"library database {self.root / 'library.sqlite3'} is unreadable: {exc}"
            ) from exc

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Library:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- records -----

    def _rows(self, where: str = "", args: tuple = ()) -> list[Record]:
        cursor = self.db.execute(f"SELECT * FROM documents {where} ORDER BY created_at", args)
        return [Record(*row) for row in cursor.fetchall()]

    def records(self) -> list[Record]:
        return self._rows()

    def get(self, record_id: int) -> Record | None:
        rows = self._rows("WHERE id = ?", (record_id,))
        return rows[0] if rows else None

    def find(self, content_hash: str, model_id: str, adapter_hash: str) -> Record | None:
        rows = self._rows(
            "WHERE content_hash = ? AND model_id = ? AND adapter_hash = ?",
            (content_hash, model_id, adapter_hash),
        )
        return rows[0] if rows else None

    def remove(self, record_id: int) -> Record:
        record = self.get(record_id)
        if record is None:
            raise EdgememError(f"no library entry with id {record_id}")
        with self.db:
            self.db.execute("DELETE FROM documents WHERE id = ?", (record_id,))
        with contextlib.suppress(FileNotFoundError):
            (self.states / record.state_file).unlink()
        return record

    # ----- states -----

    def save(
        self, path: str, content_hash: str, model_id: str, adapter_hash: str, doc: IngestResult
    ) -> Record:
        """Store a document's state. Older entries for the same path, model and adapter (a changed
        file) are replaced once the new one is safely on disk."""
        tensors = {k: v.detach().cpu().contiguous() for k, v in doc.state.named_tensors().items()}
        tensors["tail_ids"] = torch.tensor(doc.tail_ids, dtype=torch.long)
        meta = {
            "format": STATE_FORMAT,
            "model_id": model_id,
            "adapter_hash": adapter_hash,
            "content_hash": content_hash,
            "writes": str(doc.state.writes),
            "tokens": str(doc.tokens),
        }
        data = save(tensors, metadata=meta)
        key = _sha256(f"{content_hash}|{model_id}|{adapter_hash}".encode())[:24]
        name = f"{key}.safetensors"
        final = self.states / name
        tmp = self.states / f".{name}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            if exc.errno == errno.ENOSPC:
                raise EdgememError(
                    f"disk full while saving the state of {path}; the library was not changed"
                ) from exc
            raise EdgememError(f"cannot save the state of {path}: {exc.strerror}") from exc
        stale = [
            r
            for r in self._rows(
                "WHERE path = ? AND model_id = ? AND adapter_hash = ?", (path, model_id, adapter_hash)
            )
            if r.content_hash != content_hash
        ]
        with self.db:
            self.db.execute(
                "INSERT OR REPLACE INTO documents (path, content_hash, model_id, adapter_hash, tokens,"
                " segments, state_file, state_sha256, state_bytes, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    path,
                    content_hash,
                    model_id,
                    adapter_hash,
                    doc.tokens,
                    doc.state.writes,
                    name,
                    _sha256(data),
                    len(data),
                    time.time(),
                ),
            )
        for record in stale:
            self.remove(record.id)
        record = self.find(content_hash, model_id, adapter_hash)
        assert record is not None
        return record

    def load(self, record: Record, expected_shapes: dict[str, tuple[int, ...]]) -> IngestResult:
        """Read and verify a stored state; any mismatch is an EdgememError, never a silent bad state."""
        file = self.states / record.state_file
        problem = f"stored state for {record.path} (library id {record.id})"
        try:
            data = file.read_bytes()
        except FileNotFoundError as exc:
            raise EdgememError(f"{problem} is missing; remove the entry and ingest again") from exc
        if _sha256(data) != record.state_sha256:
            raise EdgememError(f"{problem} is corrupt (checksum mismatch); remove the entry and ingest again")
        try:
            with safe_open(str(file), framework="pt") as handle:
                meta = handle.metadata() or {}
                tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
        except (SafetensorError, OSError, ValueError) as exc:
            raise EdgememError(f"{problem} is unreadable: {exc}") from exc
        return _verify_state(problem, meta, tensors, record, expected_shapes)


def _verify_state(
    problem: str,
    meta: dict[str, str],
    tensors: dict[str, torch.Tensor],
    record: Record,
    expected_shapes: dict[str, tuple[int, ...]],
) -> IngestResult:
    if meta.get("format") != STATE_FORMAT:
        raise EdgememError(f"{problem} is not an edgemem state file")
    if meta.get("model_id") != record.model_id or meta.get("adapter_hash") != record.adapter_hash:
        raise EdgememError(f"{problem} was made by another model or adapter ({meta.get('model_id')})")
    shapes = {k: tuple(v.shape) for k, v in tensors.items() if k != "tail_ids"}
    if shapes != expected_shapes:
        raise EdgememError(f"{problem} has the wrong shapes for this model: {json.dumps(shapes)[:120]}")
    tail = tensors.get("tail_ids")
    if tail is None or tail.dim() != 1 or tail.dtype != torch.long:
        raise EdgememError(f"{problem} has no valid tail tokens")
    if not all(bool(torch.isfinite(v).all()) for k, v in tensors.items() if k != "tail_ids"):
        raise EdgememError(f"{problem} contains NaN or infinite values")
    try:
        writes, tokens = int(meta["writes"]), int(meta["tokens"])
    except (KeyError, ValueError) as exc:
        raise EdgememError(f"{problem} has invalid metadata") from exc
    state = MemoryState.from_named_tensors({k: v for k, v in tensors.items() if k != "tail_ids"}, writes)
    return IngestResult(state, tail.tolist(), tokens)
