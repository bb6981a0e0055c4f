"""The library: which documents were ingested, and their memory states on disk.

SQLite (WAL) holds one record per (content hash, model id, adapter hash); the state itself is a
safetensors file beside the database, written to a temporary file, fsynced and renamed, so a crash
never leaves a half-written state under a real name. Every load checks the file's sha256, its
metadata (model, adapter) and its tensor shapes before the state is used.

Two more tables live in the same database: `checkpoints`, the state of an unfinished ingest (same
key, same file format, replaced as the ingest goes on and dropped once the document is saved), and
`chat_messages`, each document's conversation, keyed by the content hash so that it survives a
re-ingest with another model and follows a changed file to its new entry.
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
CREATE TABLE IF NOT EXISTS checkpoints (
    content_hash TEXT NOT NULL,
    model_id TEXT NOT NULL,
    adapter_hash TEXT NOT NULL,
    path TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    segments INTEGER NOT NULL,
    state_file TEXT NOT NULL,
    state_sha256 TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (content_hash, model_id, adapter_hash)
);
CREATE TABLE IF NOT EXISTS chat_messages (
    id INTEGER PRIMARY KEY,
    content_hash TEXT NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    content TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS chat_messages_doc ON chat_messages (content_hash, id);
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


@dataclass(frozen=True)
class Checkpoint:
    """An unfinished ingest: its state after `segments` whole segments (`tokens` ids)."""

    content_hash: str
    model_id: str
    adapter_hash: str
    path: str
    tokens: int
    segments: int
    state_file: str
    state_sha256: str
    updated_at: float


@dataclass(frozen=True)
class ChatMessage:
    id: int
    content_hash: str
    role: str  # "user" or "assistant"
    content: str
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

    def remove(self, record_id: int, keep_history: str | None = None) -> Record:
        """Delete an entry and its state file. Its conversation goes with the last entry of its
        content, unless `keep_history` names the content hash it moves to (a changed file)."""
        record = self.get(record_id)
        if record is None:
            raise EdgememError(f"no library entry with id {record_id}")
        with self.db:
            self.db.execute("DELETE FROM documents WHERE id = ?", (record_id,))
            if keep_history is None:
                self.db.execute(
                    "DELETE FROM chat_messages WHERE content_hash = ? AND NOT EXISTS"
                    " (SELECT 1 FROM documents WHERE content_hash = ?)",
                    (record.content_hash, record.content_hash),
                )
            elif keep_history != record.content_hash:
                self.db.execute(
                    "UPDATE chat_messages SET content_hash = ? WHERE content_hash = ?",
                    (keep_history, record.content_hash),
                )
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
        name = f"{_file_key(content_hash, model_id, adapter_hash)}.safetensors"
        self._write_atomic(name, data, path)
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
            self.remove(record.id, keep_history=content_hash)
        self.drop_checkpoint(content_hash, model_id, adapter_hash)
        self._drop_stale_checkpoints(path, content_hash, model_id, adapter_hash)
        record = self.find(content_hash, model_id, adapter_hash)
        assert record is not None
        return record

    def _write_atomic(self, name: str, data: bytes, path: str) -> None:
        """Write a state file under `name`: temporary file, fsync, rename."""
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

    def load(self, record: Record, expected_shapes: dict[str, tuple[int, ...]]) -> IngestResult:
        """Read and verify a stored state; any mismatch is an EdgememError, never a silent bad state."""
        problem = f"stored state for {record.path} (library id {record.id})"
        return self._read_state(record.state_file, record.state_sha256, problem, record, expected_shapes)

    # ----- checkpoints of unfinished ingests -----

    def save_checkpoint(
        self, path: str, content_hash: str, model_id: str, adapter_hash: str, state: MemoryState, tokens: int
    ) -> Checkpoint:
        """Keep the state of an unfinished ingest (after `tokens` ids, whole segments only).

        Each checkpoint gets a new file; the row moves to it in one transaction and the old file
        is deleted after, so a crash at any point leaves the previous checkpoint or the new one.
        """
        doc = IngestResult(state, [], tokens)
        tensors = {k: v.detach().cpu().contiguous() for k, v in state.named_tensors().items()}
        tensors["tail_ids"] = torch.zeros(0, dtype=torch.long)
        meta = {
            "format": STATE_FORMAT,
            "kind": "checkpoint",
            "model_id": model_id,
            "adapter_hash": adapter_hash,
            "content_hash": content_hash,
            "writes": str(doc.state.writes),
            "tokens": str(tokens),
        }
        data = save(tensors, metadata=meta)
        key = _file_key(content_hash, model_id, adapter_hash)
        name = f"{key}.partial-{state.writes}.safetensors"
        self._write_atomic(name, data, path)
        with self.db:
            self.db.execute(
                "INSERT OR REPLACE INTO checkpoints (content_hash, model_id, adapter_hash, path, tokens,"
                " segments, state_file, state_sha256, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    content_hash,
                    model_id,
                    adapter_hash,
                    path,
                    tokens,
                    state.writes,
                    name,
                    _sha256(data),
                    time.time(),
                ),
            )
        for stray in self.states.glob(f"{key}.partial-*.safetensors"):  # the old one, and any a crash left
            if stray.name != name:
                with contextlib.suppress(FileNotFoundError):
                    stray.unlink()
        self._drop_stale_checkpoints(path, content_hash, model_id, adapter_hash)
        checkpoint = self.find_checkpoint(content_hash, model_id, adapter_hash)
        assert checkpoint is not None
        return checkpoint

    def checkpoints(self) -> list[Checkpoint]:
        cursor = self.db.execute("SELECT * FROM checkpoints ORDER BY updated_at")
        return [Checkpoint(*row) for row in cursor.fetchall()]

    def find_checkpoint(self, content_hash: str, model_id: str, adapter_hash: str) -> Checkpoint | None:
        row = self.db.execute(
            "SELECT * FROM checkpoints WHERE content_hash = ? AND model_id = ? AND adapter_hash = ?",
            (content_hash, model_id, adapter_hash),
        ).fetchone()
        return Checkpoint(*row) if row else None

    def load_checkpoint(
        self, checkpoint: Checkpoint, expected_shapes: dict[str, tuple[int, ...]]
    ) -> MemoryState:
        """The verified state of an unfinished ingest (an EdgememError if it is damaged)."""
        problem = f"saved progress of the ingest of {checkpoint.path}"
        result = self._read_state(
            checkpoint.state_file, checkpoint.state_sha256, problem, checkpoint, expected_shapes
        )
        if result.tokens != checkpoint.tokens or result.state.writes != checkpoint.segments:
            raise EdgememError(f"{problem} does not match its library entry")
        return result.state

    def drop_checkpoint(self, content_hash: str, model_id: str, adapter_hash: str) -> None:
        checkpoint = self.find_checkpoint(content_hash, model_id, adapter_hash)
        if checkpoint is None:
            return
        with self.db:
            self.db.execute(
                "DELETE FROM checkpoints WHERE content_hash = ? AND model_id = ? AND adapter_hash = ?",
                (content_hash, model_id, adapter_hash),
            )
        with contextlib.suppress(FileNotFoundError):
            (self.states / checkpoint.state_file).unlink()

    def _drop_stale_checkpoints(self, path: str, content_hash: str, model_id: str, adapter_hash: str) -> None:
        """A changed file's unfinished ingest of its old content can never be resumed: drop it."""
        for other in self.checkpoints():
            same_source = (other.path, other.model_id, other.adapter_hash) == (path, model_id, adapter_hash)
            if same_source and other.content_hash != content_hash:
                self.drop_checkpoint(other.content_hash, model_id, adapter_hash)

    # ----- conversations -----

    def add_message(self, content_hash: str, role: str, content: str) -> ChatMessage:
        if role not in ("user", "assistant"):
            raise ValueError(f"role must be 'user' or 'assistant', not {role!r}")
        with self.db:
            cursor = self.db.execute(
                "INSERT INTO chat_messages (content_hash, role, content, created_at) VALUES (?, ?, ?, ?)",
                (content_hash, role, content, time.time()),
            )
        row = self.db.execute("SELECT * FROM chat_messages WHERE id = ?", (cursor.lastrowid,)).fetchone()
        return ChatMessage(*row)

    def history(self, content_hash: str) -> list[ChatMessage]:
        cursor = self.db.execute(
            "SELECT * FROM chat_messages WHERE content_hash = ? ORDER BY id", (content_hash,)
        )
        return [ChatMessage(*row) for row in cursor.fetchall()]

    def clear_history(self, content_hash: str) -> int:
        with self.db:
            cursor = self.db.execute("DELETE FROM chat_messages WHERE content_hash = ?", (content_hash,))
        return cursor.rowcount

    # ----- reading state files -----

    def _read_state(
        self,
        state_file: str,
        sha256: str,
        problem: str,
        owner: Record | Checkpoint,
        expected_shapes: dict[str, tuple[int, ...]],
    ) -> IngestResult:
        file = self.states / state_file
        try:
            data = file.read_bytes()
        except FileNotFoundError as exc:
            raise EdgememError(f"{problem} is missing; remove the entry and ingest again") from exc
        if _sha256(data) != sha256:
            raise EdgememError(f"{problem} is corrupt (checksum mismatch); remove the entry and ingest again")
        try:
            with safe_open(str(file), framework="pt") as handle:
                meta = handle.metadata() or {}
                tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
        except (SafetensorError, OSError, ValueError) as exc:
            raise EdgememError(f"{problem} is unreadable: {exc}") from exc
        return _verify_state(problem, meta, tensors, owner, expected_shapes)


def _file_key(content_hash: str, model_id: str, adapter_hash: str) -> str:
    return _sha256(f"{content_hash}|{model_id}|{adapter_hash}".encode())[:24]


def _verify_state(
    problem: str,
    meta: dict[str, str],
    tensors: dict[str, torch.Tensor],
    record: Record | Checkpoint,
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
