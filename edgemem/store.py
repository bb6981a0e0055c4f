"""The library: which documents were ingested, and their memory states on disk.

SQLite (WAL) holds one record per (content hash, model id, adapter hash); the state itself is a
safetensors file beside the database, written to a temporary file, fsynced and renamed, so a crash
never leaves a half-written state under a real name. Every load checks the file's sha256, its
metadata (model, adapter) and its tensor shapes before the state is used.

Several processes may share a library (an ingest in one terminal, an `ask` or the chat app in
another). Every change takes SQLite's write lock first (`BEGIN IMMEDIATE`) and writes its state
file inside it; each state file gets a name that is never used again, and a file is deleted only
after the transaction that stopped referring to it has committed. So a reader never sees a row
whose file is half-written, a writer never deletes a file another process refers to, and a file
left by a process killed before its commit (an orphan) is recognised and swept by the next writer.

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
import re
import secrets
import sqlite3
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from edgemem.armt import IngestResult, MemoryState
from edgemem.errors import EdgememError
from edgemem.paths import data_dir

STATE_FORMAT = "edgemem-state/1"
# What a state file may be called: `<key>[.partial-<segments>][.<token>].safetensors`. A name read
# from the database is checked against it before any file is opened or deleted, so a forged row
# can never point outside the states folder.
STATE_FILE_RE = re.compile(r"[0-9a-f]{24}(\.partial-\d{1,12})?(\.[0-9a-f]{8})?\.safetensors")
STATE_SLACK_BYTES = 16 << 20  # a state file may exceed its tensors by this much (header, tail ids)

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


def _text(path: str) -> str:
    """A path as storable text: undecodable bytes in a file name become U+FFFD."""
    return os.fsencode(path).decode("utf-8", "replace")


class Library:
    """The SQLite library under the edgemem data directory (or `root`)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root else data_dir()
        self.states = self.root / "states"
        self.states.mkdir(parents=True, exist_ok=True)
        self._lock_depth = 0
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

    @contextlib.contextmanager
    def _locked(self) -> Iterator[list[str]]:
        """A write transaction holding SQLite's write lock (other writers wait, readers go on).

        Yields a list to which the body adds state files it stopped referring to: they are
        deleted after the commit, with any orphan a killed process left (every write sweeps:
        a save, a checkpoint, a removal). Re-entrant.
        """
        if self._lock_depth:
            self._lock_depth += 1
            try:
                yield self._unlink_after
            finally:
                self._lock_depth -= 1
            return
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise EdgememError(f"the library is busy (another edgemem process holds it): {exc}") from exc
        self._lock_depth, self._unlink_after = 1, []
        try:
            yield self._unlink_after
            self._sweep(self._unlink_after)
            self.db.commit()
        except BaseException:
            self.db.rollback()
            raise
        finally:
            self._lock_depth = 0
        for name in self._unlink_after:
            with contextlib.suppress(OSError):
                (self.states / name).unlink()

    def _referenced(self) -> set[str]:
        rows = self.db.execute("SELECT state_file FROM documents UNION SELECT state_file FROM checkpoints")
        return {row[0] for row in rows}

    def _sweep(self, unlink: list[str]) -> None:
        """Inside the lock: files no row refers to can only be left by a killed process."""
        referenced = self._referenced() | set(unlink)
        for file in self.states.iterdir():
            if file.name not in referenced and (
                STATE_FILE_RE.fullmatch(file.name) or file.name.endswith(".tmp")
            ):
                unlink.append(file.name)

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
        with self._locked() as unlink:
            record = self.get(record_id)
            if record is None:
                raise EdgememError(f"no library entry with id {record_id}")
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
            if STATE_FILE_RE.fullmatch(record.state_file):
                unlink.append(record.state_file)
        return record

    # ----- states -----

    def save(
        self, path: str, content_hash: str, model_id: str, adapter_hash: str, doc: IngestResult
    ) -> Record:
        """Store a document's state. Older entries for the same path, model and adapter (a changed
        file) are replaced once the new one is safely on disk."""
        path = _text(path)
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
        name = f"{_file_key(content_hash, model_id, adapter_hash)}.{secrets.token_hex(4)}.safetensors"
        with self._locked() as unlink:
            self._write_atomic(name, data, path)
            stale = [
                r
                for r in self._rows(
                    "WHERE path = ? AND model_id = ? AND adapter_hash = ?", (path, model_id, adapter_hash)
                )
                if r.content_hash != content_hash
            ]
            replaced = self.find(content_hash, model_id, adapter_hash)
            if replaced is not None:
                unlink.append(replaced.state_file)
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
        """Write a state file under `name`: temporary file, fsync, rename (inside the write lock)."""
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

    def load(
        self, record: Record, expected_shapes: dict[str, tuple[int, ...]], state_type: type = MemoryState
    ) -> IngestResult:
        """Read and verify a stored state; any mismatch is an EdgememError, never a silent bad state.
        `state_type` (MemoryState, or SwaxState) builds the state from its named tensors."""
        problem = f"stored state for {record.path} (library id {record.id})"
        return self._read_state(
            record.state_file, record.state_sha256, problem, record, expected_shapes, state_type
        )

    # ----- checkpoints of unfinished ingests -----

    def save_checkpoint(
        self, path: str, content_hash: str, model_id: str, adapter_hash: str, state: MemoryState, tokens: int
    ) -> Checkpoint:
        """Keep the state of an unfinished ingest (after `tokens` ids, whole segments only).

        Each checkpoint gets a new file; the row moves to it in one transaction and the old file
        is deleted after, so a crash at any point leaves the previous checkpoint or the new one.
        """
        path = _text(path)
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
        name = f"{key}.partial-{state.writes}.{secrets.token_hex(4)}.safetensors"
        with self._locked() as unlink:
            self._write_atomic(name, data, path)
            previous = self.find_checkpoint(content_hash, model_id, adapter_hash)
            if previous is not None:
                unlink.append(previous.state_file)
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
        self,
        checkpoint: Checkpoint,
        expected_shapes: dict[str, tuple[int, ...]],
        state_type: type = MemoryState,
    ) -> MemoryState:
        """The verified state of an unfinished ingest (an EdgememError if it is damaged)."""
        problem = f"saved progress of the ingest of {checkpoint.path}"
        result = self._read_state(
            checkpoint.state_file, checkpoint.state_sha256, problem, checkpoint, expected_shapes, state_type
        )
        if result.tokens != checkpoint.tokens or result.state.writes != checkpoint.segments:
            raise EdgememError(f"{problem} does not match its library entry")
        return result.state

    def drop_checkpoint(self, content_hash: str, model_id: str, adapter_hash: str) -> None:
        with self._locked() as unlink:
            checkpoint = self.find_checkpoint(content_hash, model_id, adapter_hash)
            if checkpoint is None:
                return
            self.db.execute(
                "DELETE FROM checkpoints WHERE content_hash = ? AND model_id = ? AND adapter_hash = ?",
                (content_hash, model_id, adapter_hash),
            )
            if STATE_FILE_RE.fullmatch(checkpoint.state_file):
                unlink.append(checkpoint.state_file)

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
        state_type: type = MemoryState,
    ) -> IngestResult:
        if not STATE_FILE_RE.fullmatch(state_file):
            raise EdgememError(f"{problem} has an invalid file name in the library database")
        file = self.states / state_file
        limit = 4 * sum(_numel(shape) for shape in expected_shapes.values()) + STATE_SLACK_BYTES
        try:
            with open(file, "rb") as handle:
                data = handle.read(limit + 1)
        except FileNotFoundError as exc:
            raise EdgememError(f"{problem} is missing; remove the entry and ingest again") from exc
        except OSError as exc:
            raise EdgememError(f"{problem} cannot be read ({exc.strerror})") from exc
        if len(data) > limit:
            raise EdgememError(f"{problem} is far larger than a state of this model; ingest again")
        if _sha256(data) != sha256:
            raise EdgememError(f"{problem} is corrupt (checksum mismatch); remove the entry and ingest again")
        # Parsed from the bytes that were checked (never by opening the file a second time).
        try:
            meta = _safetensors_metadata(data)
            tensors = load(data)
        except (SafetensorError, ValueError, struct.error, UnicodeDecodeError) as exc:
            raise EdgememError(f"{problem} is unreadable: {str(exc)[:120]}") from exc
        return _verify_state(problem, meta, tensors, owner, expected_shapes, state_type)

    # ----- checking the whole library -----

    def verify(self, expected_shapes: dict[str, tuple[int, ...]] | None = None) -> list[str]:
        """Every problem in the library, as lines (empty: consistent). Reads only.

        SQLite's integrity check; every entry's and checkpoint's state file present, named as
        the store names them, with the recorded sha256 (and, given `expected_shapes`, loading as a
        valid state); state files no row refers to (what a killed process can leave; the next
        write sweeps them) are not problems.
        """
        problems = [
            f"sqlite: {row[0]}" for row in self.db.execute("PRAGMA integrity_check") if row[0] != "ok"
        ]
        owners: list[Record | Checkpoint] = [*self.records(), *self.checkpoints()]
        for owner in owners:
            what = f"{type(owner).__name__.lower()} {owner.path} ({owner.state_file})"
            try:
                if expected_shapes is not None:
                    result = self._read_state(
                        owner.state_file, owner.state_sha256, what, owner, expected_shapes
                    )
                    if result.tokens != owner.tokens or result.state.writes != owner.segments:
                        problems.append(f"{what}: metadata does not match its row")
                elif not STATE_FILE_RE.fullmatch(owner.state_file):
                    problems.append(f"{what}: invalid file name")
                elif _sha256((self.states / owner.state_file).read_bytes()) != owner.state_sha256:
                    problems.append(f"{what}: checksum mismatch")
            except (EdgememError, OSError) as exc:
                problems.append(f"{what}: {exc}")
        return problems

    def orphans(self) -> list[str]:
        """State and temporary files no row refers to (left by a killed process)."""
        referenced = self._referenced()
        return sorted(f.name for f in self.states.iterdir() if f.name not in referenced)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _safetensors_metadata(data: bytes) -> dict[str, str]:
    """The `__metadata__` of a safetensors file held in memory (ValueError if malformed)."""
    (size,) = struct.unpack("<Q", data[:8])
    if size > len(data) - 8:
        raise ValueError("header longer than the file")
    header = json.loads(data[8 : 8 + size])
    meta = header.get("__metadata__", {}) if isinstance(header, dict) else None
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("invalid metadata")
    return meta


def _file_key(content_hash: str, model_id: str, adapter_hash: str) -> str:
    return _sha256(f"{content_hash}|{model_id}|{adapter_hash}".encode())[:24]


def _verify_state(
    problem: str,
    meta: dict[str, str],
    tensors: dict[str, torch.Tensor],
    record: Record | Checkpoint,
    expected_shapes: dict[str, tuple[int, ...]],
    state_type: type = MemoryState,
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
    if writes < 0 or tokens < 0 or tokens < len(tail):
        raise EdgememError(f"{problem} has invalid metadata")
    try:
        state = state_type.from_named_tensors({k: v for k, v in tensors.items() if k != "tail_ids"}, writes)
    except ValueError as exc:
        raise EdgememError(f"{problem} is not a valid state: {exc}") from exc
    return IngestResult(state, tail.tolist(), tokens)
