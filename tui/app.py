"""`edgemem chat`: the library of ingested documents on the left, the conversation on the right.

Everything slow runs in thread workers so the screen answers at once: importing torch, loading
the model, scanning a path, ingesting (with a progress bar: tokens, tokens/s, ETA, resident
memory), answering (streamed token by token into Markdown). One worker uses the model at a time;
ingests wait in a queue. Each worker opens its own `Library` connection (SQLite connections stay
in the thread that made them); the screen's thread has one too, for listings and conversations.

A cancelled ingest (ctrl+g, or quitting) stops between segments and keeps a checkpoint in the
library; ctrl+r (or adding the path again) resumes it. Every error a user can cause is a
notification, never a traceback.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import inspect
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.message import Message
from textual.widgets import DataTable, Footer, Header, Input, Markdown, ProgressBar, Static
from textual.widgets.markdown import MarkdownStream
from textual.worker import Worker, WorkerState

from edgemem.errors import EdgememError
from edgemem.limits import DEFAULT_MAX_BYTES
from edgemem.tui.config import NO_WINDOW_OVERRIDE, Settings, load_settings, save_settings
from edgemem.tui.screens import AddPathScreen, ConfirmScreen, HelpScreen, SettingsScreen, short_path

if TYPE_CHECKING:
    from edgemem.armt import Progress
    from edgemem.assistant import Assistant
    from edgemem.documents import Scan
    from edgemem.store import Checkpoint, Library, Record

OpenAssistant = Callable[[Settings], "Assistant"]
PROGRESS_EVERY_S = 0.1  # the progress bar is redrawn at most this often


def open_assistant(settings: Settings) -> Assistant:
    """The engines the app can run a model with (see `edgemem.tui.config.ENGINES`)."""
    from edgemem.assistant import Assistant

    if settings.engine == "torch":
        window = None if settings.answer_window == NO_WINDOW_OVERRIDE else settings.answer_window
        return Assistant.open(settings.model, settings.adapter or None, answer_window=window)
    if settings.engine == "onnxruntime":
        return Assistant.open_engine(settings.model)  # the model setting is the bundle's folder
    raise EdgememError(f"engine {settings.engine!r} is not available")


@dataclass
class Entry:
    """A document or folder in the library panel."""

    path: str  # resolved
    is_dir: bool = False
    records: list[Record] = field(default_factory=list)  # one per model it was ingested with
    checkpoints: list[Checkpoint] = field(default_factory=list)  # unfinished ingests
    scanned_hash: str | None = None  # the file's content when last looked at
    changed: bool = False
    missing: bool = False
    error: str = ""

    @property
    def name(self) -> str:
        return Path(self.path).name + ("/" if self.is_dir else "")


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def _eta(seconds: float) -> str:
    if seconds <= 0 or seconds != seconds or seconds > 360_000:
        return "-"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class UiCall(Message):
    """A screen update sent by a worker thread."""

    def __init__(self, callback: Callable[[], object]) -> None:
        super().__init__()
        self.callback = callback


class DocTable(DataTable):
    BINDINGS = [Binding("delete", "app.remove", "Remove")]


class EdgememApp(App[None]):
    TITLE = "edgemem chat"
    CSS = """
    #main { height: 1fr; }
    #library-panel { width: 32; border: round $primary; }
    #docs { height: 1fr; }
    #doc-info { height: auto; max-height: 5; color: $text-muted; padding: 0 1; }
    #chat-panel { width: 1fr; border: round $secondary; }
    #messages { height: 1fr; padding: 0 1; }
    .msg { margin: 0 0 1 0; padding: 0 1; border-left: outer $secondary; }
    .msg.user { border-left: outer $accent; background: $boost; }
    .empty { color: $text-muted; padding: 1; }
    #ingest-box { height: auto; display: none; padding: 0 1; }
    #ingest-box.active { display: block; }
    #ingest-bar Bar { width: 1fr; }
    ModalScreen { align: center middle; }
    .dialog { width: 72; max-width: 95%; height: auto; max-height: 90%;
              border: thick $primary; background: $surface; padding: 0 1; }
    /* seven fields are 21 rows: past 60% of the screen they scroll, and Save stays in view */
    #settings-grid { grid-size: 2; grid-columns: 16 1fr; grid-rows: 3; height: auto;
                     max-height: 60vh; overflow-y: auto; }
    #settings-grid Label { padding: 1 0 0 0; }
    #settings-buttons { height: auto; align-horizontal: right; }
    """
    BINDINGS = [
        Binding("f1", "help", "Help"),
        Binding("ctrl+o", "add_path", "Add"),
        Binding("ctrl+r", "reingest", "Ingest"),
        Binding("ctrl+g", "cancel_ingest", "Cancel"),
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+y", "copy_answer", "Copy"),
        Binding("ctrl+l", "clear_chat", "Clear"),
        Binding("f2", "settings", "Config"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(
        self,
        paths: Sequence[str | Path] = (),
        *,
        open_assistant: OpenAssistant = open_assistant,
        checkpoint_every_s: float | None = None,
        settings_file: Path | None = None,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
        max_seconds: float | None = None,
    ) -> None:
        """`max_bytes` caps the text a path may hold (None: no cap) and `max_seconds` the time of
        one ingest (None: no limit; it then stops between segments, keeps its progress and ctrl+r
        resumes it): the CLI's --max-size and --max-time."""
        super().__init__()
        self.initial_paths = [str(p) for p in paths]
        self.open_assistant = open_assistant
        self.checkpoint_every_s = checkpoint_every_s
        self.max_bytes, self.max_seconds = max_bytes, max_seconds
        self.settings_file = settings_file
        self.settings, self._settings_warnings = load_settings(settings_file)
        self.assistant: Assistant | None = None
        self.model_status = "loading"  # "loading" | "ready" | "failed"
        self.library: Library | None = None  # this thread's connection
        self.entries: dict[str, Entry] = {}
        self.current: str | None = None
        self.queue: deque[str] = deque()
        self.ingesting: str | None = None
        self.generating = False
        self.last_answer = ""
        self.answer_pieces = 0  # how many streamed pieces the last answer arrived in
        self.last_progress: Progress | None = None
        self.bar_history: deque[float] = deque(maxlen=1000)  # what the bar showed during the last ingest
        self.notices: list[tuple[str, str]] = []  # (severity, message) of every notification shown
        self._cancel_ingest = threading.Event()
        self._stop_answer = threading.Event()
        self._stream: MarkdownStream | None = None
        self._estimate = 1
        self._peak_rss = 0
        self._quitting = False

    # ----- layout -----

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="library-panel"):
                yield DocTable(id="docs", cursor_type="row")
                yield Static("", id="doc-info", markup=False)
            with Vertical(id="chat-panel"):
                yield VerticalScroll(id="messages")
                with Vertical(id="ingest-box"):
                    yield Static("", id="ingest-label", markup=False)
                    yield ProgressBar(id="ingest-bar", show_eta=False)
                    yield Static("", id="ingest-stats", markup=False)
                yield Input(placeholder="Ask about the selected document (Enter)", id="question")
        yield Footer(compact=True, show_command_palette=False)  # ctrl+p still opens the palette

    def on_mount(self) -> None:
        if self.settings.theme in self.available_themes:
            self.theme = self.settings.theme
        else:
            self.notify(
                f"settings: unknown theme {self.settings.theme!r}; using {self.theme}", severity="warning"
            )
            self.settings = replace(self.settings, theme=self.theme)
        self.theme_changed_signal.subscribe(self, self._theme_changed)
        table = self.query_one(DocTable)
        table.add_column("document", width=17, key="name")
        table.add_column("status", width=9, key="status")
        self.query_one("#library-panel").border_title = "Library"
        self.query_one("#chat-panel").border_title = "Chat"
        for warning in self._settings_warnings:
            self.notify(warning, severity="warning")
        self.sub_title = f"loading {self.settings.model}…"
        self._show_empty_chat("Loading the library…")
        self.query_one("#question", Input).focus()
        self._start()

    def notify(self, message: str, *, severity: str = "information", **kwargs: Any) -> None:  # type: ignore[override]
        self.notices.append((severity, message))
        super().notify(message, severity=severity, markup=False, **kwargs)  # type: ignore[arg-type]

    def _ui(self, callback: Callable[..., object], *args: object, **kwargs: object) -> None:
        """Run `callback(*args, **kwargs)` in the screen's thread, from a worker. It is posted as a
        message and never waited for, so a worker cannot block on a screen that is closing."""
        if not self._quitting:
            self.post_message(UiCall(functools.partial(callback, *args, **kwargs)))

    async def on_ui_call(self, message: UiCall) -> None:
        try:
            result = message.callback()
            if inspect.isawaitable(result):
                await result
        except Exception as exc:  # a bug in a screen update: say so rather than crash
            if not self._quitting:
                self.notify(f"internal error: {exc!r}", severity="error")

    # ----- start: imports, library, model -----

    @work(thread=True, exit_on_error=False, group="start")
    def _start(self) -> None:
        try:
            import edgemem.assistant  # noqa: F401  (torch and the store: seconds, not on the screen's time)
        except Exception as exc:  # a broken installation is a message too
            self._ui(self.notify, f"cannot start: {exc}", severity="error")
            return
        self._ui(self._library_ready)
        self._load_model()  # even without a library: a model problem is worth its own message

    def _load_model(self) -> None:
        try:
            assistant = self.open_assistant(self.settings)
        except EdgememError as exc:
            self._ui(self._model_failed, str(exc))
            return
        except Exception as exc:
            self._ui(self._model_failed, f"cannot load model {self.settings.model}: {exc}")
            return
        self._ui(self._model_ready, assistant)

    def _library_ready(self) -> None:
        from edgemem.store import Library

        try:
            self.library = Library()
        except EdgememError as exc:
            self.notify(str(exc), severity="error")
            return
        self._refresh_entries()
        for path in self.initial_paths:
            self.add_path(path)
        if self.current is None and self.entries:
            newest = max(self.entries.values(), key=self._entry_time)
            self._select(newest.path)
        elif not self.entries:
            self._show_empty_chat("The library is empty: press ctrl+o to add a file or folder.")
        self._check_files(list(self.entries))

    def _model_ready(self, assistant: Assistant) -> None:
        self.assistant = assistant
        self.model_status = "ready"
        self.sub_title = assistant.name
        if not assistant.trained:
            self.notify(
                f"the memory is untrained (no adapter for {assistant.name}): answers only see the "
                f"last {assistant.runtime.config.segment_len} tokens of a document",
                severity="warning",
                timeout=8,
            )
        self._redraw_table()
        if self.current:
            self._select(self.current)
        self._pump()

    def _model_failed(self, message: str) -> None:
        self.model_status = "failed"
        self.sub_title = "no model (f2: settings)"
        self.notify(message, severity="error", timeout=10)

    # ----- the library panel -----

    def _model_key(self) -> tuple[str, str] | None:
        a = self.assistant
        return (a.runtime.model_id, a.adapter_hash) if a is not None else None

    def _current_record(self, entry: Entry) -> Record | None:
        """The entry's stored state for the loaded model (the newest of any before it loads)."""
        key = self._model_key()
        if key is None:
            return max(entry.records, key=lambda r: r.created_at, default=None)
        matches = [r for r in entry.records if (r.model_id, r.adapter_hash) == key]
        return max(matches, key=lambda r: r.created_at, default=None)

    def _content_hash(self, entry: Entry) -> str | None:
        """Which conversation the entry shows: its stored content's, else what its file holds now."""
        record = self._current_record(entry) or max(entry.records, key=lambda r: r.created_at, default=None)
        return record.content_hash if record is not None else entry.scanned_hash

    @staticmethod
    def _entry_time(entry: Entry) -> float:
        return max([r.created_at for r in entry.records] + [c.updated_at for c in entry.checkpoints] + [0.0])

    def status(self, entry: Entry) -> str:
        """The word shown for an entry in the library panel."""
        if entry.path == self.ingesting:
            p = self.last_progress
            return f"{min(99, int(100 * p.tokens / self._estimate))}%" if p else "starting"
        if entry.path in self.queue:
            return "queued"
        if entry.error:
            return "error"
        if entry.missing:
            return "missing"
        if entry.changed:
            return "changed"
        if self._current_record(entry) is not None:
            return "ready"
        key = self._model_key()
        if any(key is None or (c.model_id, c.adapter_hash) == key for c in entry.checkpoints):
            return "partial"
        return "other model" if entry.records else "new"

    def status_of(self, path: str | Path) -> str | None:
        """The status shown for a path (None when it is not in the library panel)."""
        entry = self.entries.get(str(Path(path).expanduser().resolve()))
        return self.status(entry) if entry is not None else None

    def _refresh_entries(self) -> None:
        """Re-read records and checkpoints from the library (keeps flags of entries already shown)."""
        if self.library is None:
            return
        records, checkpoints = self.library.records(), self.library.checkpoints()
        for entry in self.entries.values():
            entry.records, entry.checkpoints = [], []
        for record in records:
            entry = self.entries.setdefault(record.path, Entry(record.path, Path(record.path).is_dir()))
            entry.records.append(record)
        for checkpoint in checkpoints:
            entry = self.entries.setdefault(
                checkpoint.path, Entry(checkpoint.path, Path(checkpoint.path).is_dir())
            )
            entry.checkpoints.append(checkpoint)
        self._redraw_table()

    def _redraw_table(self) -> None:
        table = self.query_one(DocTable)
        keep = self.current
        table.clear()
        for entry in sorted(self.entries.values(), key=lambda e: e.name.lower()):
            table.add_row(entry.name, self.status(entry), key=entry.path)
        if keep in self.entries:
            table.move_cursor(row=table.get_row_index(keep))
        self._show_info()
        self.refresh_bindings()

    def _update_status(self, path: str) -> None:
        if path in self.entries:
            table = self.query_one(DocTable)
            table.update_cell(path, "status", self.status(self.entries[path]))

    def _show_info(self) -> None:
        info = self.query_one("#doc-info", Static)
        entry = self.entries.get(self.current or "")
        if entry is None:
            info.update("")
            return
        lines = [short_path(entry.path, 28)]
        record = self._current_record(entry)
        if record is not None:
            when = dt.datetime.fromtimestamp(record.created_at).strftime("%Y-%m-%d %H:%M")
            lines.append(f"{record.tokens:,} tokens, state {_mb(record.state_bytes)}")
            lines.append(f"{record.model_id.split('@')[0]}, {when}")
        elif entry.checkpoints:
            lines.append(f"partial: {max(c.tokens for c in entry.checkpoints):,} tokens saved")
        if entry.error:
            lines.append(entry.error)
        info.update("\n".join(lines))

    @on(DataTable.RowHighlighted, "#docs")
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        """The cursor moved: show the document under it. The message is handled after whatever was
        already queued, so it may come from before a redraw of the table (each redraw posts one for
        its first row, and each move of the cursor one): neither its row key nor its row index is
        trusted, only the row under the cursor now. (An index is not enough: a highlight of the
        only row, 0, posted when the library opened, named another document once the table was
        redrawn with the new one in row 0, and took the conversation away from it.)"""
        table = event.data_table
        if not table.is_valid_row_index(table.cursor_row):  # an empty table
            return
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        if key is None or key == self.current or key not in self.entries:  # shown already, or gone
            return
        with contextlib.suppress(NoMatches):  # a highlight arriving while the app closes: nothing to show
            self._select(key)

    @on(DataTable.RowSelected, "#docs")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        self.query_one("#question", Input).focus()

    def _select(self, path: str) -> None:
        self.current = path
        entry = self.entries[path]
        table = self.query_one(DocTable)
        if table.row_count and table.get_row_index(path) != table.cursor_row:
            table.move_cursor(row=table.get_row_index(path))
        self.query_one("#chat-panel").border_title = f"Chat: {entry.name}"
        self._show_info()
        self._show_history()
        self.refresh_bindings()

    @work(thread=True, exit_on_error=False, group="scan")
    def _check_files(self, paths: list[str]) -> None:
        """Mark entries whose file changed or disappeared since they were ingested."""
        from edgemem.documents import scan

        for path in paths:
            if self._quitting:
                return
            if not Path(path).exists():
                self._ui(self._file_checked, path, None, True)
                continue
            try:
                content_hash = scan(path, max_bytes=self.max_bytes).content_hash
            except EdgememError:
                continue
            self._ui(self._file_checked, path, content_hash, False)

    def _file_checked(self, path: str, content_hash: str | None, missing: bool) -> None:
        entry = self.entries.get(path)
        if entry is None:
            return
        entry.missing = missing
        if content_hash is not None:
            entry.scanned_hash = content_hash
            known = {r.content_hash for r in entry.records} | {c.content_hash for c in entry.checkpoints}
            entry.changed = bool(known) and content_hash not in known
        self._update_status(path)
        if path == self.current:
            self._show_info()

    # ----- adding, re-ingesting, removing -----

    def add_path(self, path: str) -> None:
        """Scan a file or folder (in a worker) and queue it for ingest unless it is up to date."""
        self._scan_path(path)

    @work(thread=True, exit_on_error=False, group="scan")
    def _scan_path(self, path: str) -> None:
        from edgemem.documents import scan

        try:
            source = scan(path, max_bytes=self.max_bytes)
        except EdgememError as exc:
            self._ui(self.notify, str(exc), severity="error")
            return
        except Exception as exc:
            self._ui(self.notify, f"{path}: cannot read ({exc})", severity="error")
            return
        self._ui(self._path_scanned, source)

    def _path_scanned(self, source: Scan) -> None:
        path = str(source.root.resolve())
        for name in source.invalid_utf8[:3]:
            self.notify(f"{name} is not valid UTF-8; decoded with replacement characters", severity="warning")
        skipped = source.skipped_binary + source.skipped_unreadable + source.skipped_special
        if skipped:
            self.notify(
                f"{source.root.name}: skipped {skipped} binary, unreadable or special file(s)"
                " (pipes, sockets, devices)",
                severity="warning",
            )
        entry = self.entries.setdefault(path, Entry(path, source.is_dir))
        entry.scanned_hash, entry.missing, entry.error = source.content_hash, False, ""
        known = {r.content_hash for r in entry.records} | {c.content_hash for c in entry.checkpoints}
        entry.changed = bool(known) and source.content_hash not in known
        record = self._current_record(entry)
        up_to_date = record is not None and record.content_hash == source.content_hash
        if not up_to_date and path != self.ingesting and path not in self.queue:
            self.queue.append(path)
        elif up_to_date:
            self.notify(f"{entry.name} is up to date ({record.tokens:,} tokens)")  # type: ignore[union-attr]
        self._redraw_table()
        self._select(path)
        self._pump()

    def _pump(self) -> None:
        """Start the next queued ingest when the model is free."""
        if self.assistant is None or self.ingesting or self.generating or not self.queue:
            return
        path = self.queue.popleft()
        self.ingesting, self.last_progress, self._peak_rss = path, None, 0
        self.bar_history.clear()
        self._cancel_ingest.clear()
        entry = self.entries[path]
        self.query_one("#ingest-box").add_class("active")
        self.query_one("#ingest-label", Static).update(f"ingesting {entry.name} (ctrl+g cancels)")
        self.query_one("#ingest-stats", Static).update("reading…")
        self.query_one("#ingest-bar", ProgressBar).update(total=None, progress=0)
        self._update_status(path)
        self.refresh_bindings()
        self._ingest(self.assistant, path)

    @work(thread=True, exit_on_error=False, group="model")
    def _ingest(self, assistant: Assistant, path: str) -> None:
        from edgemem.armt import IngestCancelled
        from edgemem.documents import scan
        from edgemem.store import Library

        started, last_shown = time.perf_counter(), 0.0

        def progress(p: Progress) -> None:
            nonlocal last_shown
            if time.perf_counter() - last_shown >= PROGRESS_EVERY_S:
                last_shown = time.perf_counter()
                self._ui(self._show_progress, p)

        def notice(message: str) -> None:
            self._ui(self.notify, message)

        deadline = None if self.max_seconds is None else time.monotonic() + self.max_seconds

        def should_stop() -> bool:
            return self._cancel_ingest.is_set() or (deadline is not None and time.monotonic() >= deadline)

        try:
            source = scan(path, max_bytes=self.max_bytes)
            self._ui(self._ingest_started, max(1, source.total_bytes // 4))
            extra = {} if self.checkpoint_every_s is None else {"checkpoint_every_s": self.checkpoint_every_s}
            with Library() as library:
                record, doc, reused = assistant.ingest_scan(
                    source,
                    library,
                    progress=progress,
                    should_stop=should_stop,
                    notice=notice,
                    **extra,
                )
        except IngestCancelled as exc:
            message = f"{Path(path).name}: {exc}"
            if not self._cancel_ingest.is_set():  # the time limit, not the user
                how = "saved: ctrl+r resumes" if exc.saved else "nothing was saved"
                message = (
                    f"{Path(path).name}: stopped at the time limit ({self.max_seconds:g} s) after "
                    f"{exc.tokens:,} tokens ({how})"
                )
            self._ui(self._ingest_finished, path, message, "warning")
        except EdgememError as exc:
            self._ui(self._ingest_finished, path, str(exc), "error")
        except Exception as exc:
            self._ui(self._ingest_finished, path, f"ingest of {path} failed: {exc}", "error")
        else:
            seconds = time.perf_counter() - started
            verb = "already in the library" if reused else f"ingested in {seconds:,.1f} s"
            message = f"{Path(path).name}: {verb}: {doc.tokens:,} tokens, state {_mb(record.state_bytes)}"
            self._ui(self._ingest_finished, path, message, "information")

    def _ingest_started(self, estimate: int) -> None:
        self._estimate = estimate
        self.query_one("#ingest-bar", ProgressBar).update(total=estimate, progress=0)

    def _show_progress(self, p: Progress) -> None:
        if self.ingesting is None:
            return
        self.last_progress = p
        self._peak_rss = max(self._peak_rss, p.rss_bytes)
        if p.tokens >= self._estimate:  # the estimate (4 bytes a token) was low
            self._estimate = int(p.tokens * 1.1) + 1
        rate = p.tokens_per_s
        eta = _eta((self._estimate - p.tokens) / rate) if rate > 0 else "-"
        bar = self.query_one("#ingest-bar", ProgressBar)
        bar.update(total=self._estimate, progress=p.tokens)
        self.bar_history.append(bar.progress)
        resumed = f" (resumed at {p.start_tokens:,})" if p.start_tokens else ""
        self.query_one("#ingest-stats", Static).update(
            f"{p.tokens:,} / ~{self._estimate:,} tokens{resumed}\n"
            f"{rate:,.0f} tok/s  ETA {eta}  RSS {_mb(p.rss_bytes)} (peak {_mb(self._peak_rss)})"
        )
        self._update_status(self.ingesting)

    def _ingest_finished(self, path: str, message: str, severity: str) -> None:
        self.ingesting = None
        self.query_one("#ingest-box").remove_class("active")
        entry = self.entries.get(path)
        if entry is not None:
            entry.error = message if severity == "error" else ""
            if severity == "information":
                entry.changed = False
        self.notify(message, severity=severity)  # type: ignore[arg-type]
        self._refresh_entries()
        if path == self.current:
            self._select(path)
        self._pump()

    def action_add_path(self) -> None:
        def added(path: str | None) -> None:
            if path:
                self.add_path(path)

        self.push_screen(AddPathScreen(), added)

    def action_reingest(self) -> None:
        if self.current is None:
            self.notify("select a document first", severity="warning")
        elif self.current == self.ingesting or self.current in self.queue:
            self.notify(f"{Path(self.current).name} is already being ingested", severity="warning")
        else:
            self.add_path(self.current)

    def action_cancel_ingest(self) -> None:
        if self.ingesting is None:
            self.notify("no ingest is running", severity="warning")
            return
        self._cancel_ingest.set()
        self.query_one("#ingest-label", Static).update("cancelling after this segment…")

    def action_remove(self) -> None:
        entry = self.entries.get(self.current or "")
        if entry is None:
            return
        if entry.path == self.ingesting:
            self.notify("cancel the ingest first (ctrl+g)", severity="warning")
            return

        def confirmed(yes: bool | None) -> None:
            if yes:
                self._remove(entry)

        self.push_screen(ConfirmScreen(f"Remove {entry.name}, its memory and its conversation?"), confirmed)

    def _remove(self, entry: Entry) -> None:
        if self.library is not None:
            try:
                for record in entry.records:
                    self.library.remove(record.id)
                for c in entry.checkpoints:
                    self.library.drop_checkpoint(c.content_hash, c.model_id, c.adapter_hash)
            except EdgememError as exc:
                self.notify(str(exc), severity="error")
        if entry.path in self.queue:
            self.queue.remove(entry.path)
        del self.entries[entry.path]
        self.current = None
        self.notify(f"removed {entry.name}")
        self._refresh_entries()
        if self.entries:
            self._select(max(self.entries.values(), key=self._entry_time).path)
        else:
            self.query_one("#chat-panel").border_title = "Chat"
            self._show_empty_chat("The library is empty: press ctrl+o to add a file or folder.")

    # ----- the conversation -----

    def _show_empty_chat(self, text: str) -> None:
        messages = self.query_one("#messages", VerticalScroll)
        messages.remove_children()
        messages.mount(Static(text, classes="empty", markup=False))

    def _message(self, role: str, content: str) -> Markdown:
        widget = Markdown(content, classes=f"msg {role}")
        widget.border_title = "you" if role == "user" else "edgemem"
        return widget

    def _show_history(self) -> None:
        entry = self.entries.get(self.current or "")
        content_hash = self._content_hash(entry) if entry else None
        history = self.library.history(content_hash) if self.library and content_hash else []
        messages = self.query_one("#messages", VerticalScroll)
        messages.remove_children()
        if not history:
            hint = "Ask a question below." if entry and self._current_record(entry) else ""
            messages.mount(Static(f"No conversation yet. {hint}".strip(), classes="empty", markup=False))
        messages.mount_all(self._message(m.role, m.content) for m in history)
        answers = [m.content for m in history if m.role == "assistant"]
        self.last_answer = answers[-1] if answers else ""
        messages.scroll_end(animate=False)

    @on(Input.Submitted, "#question")
    def _question_submitted(self, event: Input.Submitted) -> None:
        question = event.value.strip()
        if not question:
            return
        entry = self.entries.get(self.current or "")
        if entry is None:
            self.notify("add a document first (ctrl+o)", severity="warning")
            return
        if self.assistant is None:
            text = (
                "the model is still loading" if self.model_status == "loading" else "no model is loaded (f2)"
            )
            self.notify(text, severity="warning")
            return
        if self.generating or self.ingesting:
            busy = (
                "an answer is being written (escape stops it)" if self.generating else "an ingest is running"
            )
            self.notify(f"wait: {busy}", severity="warning")
            return
        record = self._current_record(entry)
        if record is None:
            self.notify(f"{entry.name} is not ingested yet (ctrl+r ingests it)", severity="warning")
            return
        event.input.value = ""
        self._ask(record, question)

    def _ask(self, record: Record, question: str) -> None:
        assert self.library is not None and self.assistant is not None
        self.library.add_message(record.content_hash, "user", question)
        messages = self.query_one("#messages", VerticalScroll)
        for empty in messages.query(".empty"):
            empty.remove()
        answer = self._message("assistant", "")
        messages.mount(self._message("user", question), answer)
        messages.scroll_end(animate=False)
        self._stream = Markdown.get_stream(answer)
        self.generating, self.answer_pieces = True, 0
        self._stop_answer.clear()
        self.refresh_bindings()
        self._answer(self.assistant, record, question, self.settings)

    @work(thread=True, exit_on_error=False, group="model")
    def _answer(self, assistant: Assistant, record: Record, question: str, settings: Settings) -> None:
        from edgemem.store import Library

        text, stopped = "", False
        try:
            with Library() as library:
                doc = library.load(record, assistant.runtime.state_shapes())
            pieces = assistant.ask(
                doc, question, max_new_tokens=settings.max_new_tokens, temperature=settings.temperature
            )
            for piece in pieces:
                if self._stop_answer.is_set():
                    stopped = True
                    break
                text += piece
                self._ui(self._answer_piece, piece)
            pieces.close()
        except EdgememError as exc:
            self._ui(self._answer_finished, record.content_hash, text, False, str(exc))
        except Exception as exc:
            self._ui(self._answer_finished, record.content_hash, text, False, f"answering failed: {exc}")
        else:
            self._ui(self._answer_finished, record.content_hash, text, stopped, "")

    async def _answer_piece(self, piece: str) -> None:
        if self._stream is not None:
            self.answer_pieces += 1
            await self._stream.write(piece)
            self.query_one("#messages", VerticalScroll).scroll_end(animate=False)

    async def _answer_finished(self, content_hash: str, text: str, stopped: bool, error: str) -> None:
        if self._stream is not None:
            await self._stream.stop()
            answer = self._stream.markdown_widget
            self._stream = None
            if stopped:
                text += " *(stopped)*"
            if error:
                text += f"\n\n*(error: {error})*"
            elif not text.strip():
                text = "*(no answer)*"
            await answer.update(text)
        self.generating = False
        if error:
            self.notify(error, severity="error")
        if self.library is not None and not error:
            self.library.add_message(content_hash, "assistant", text)
            self.last_answer = text
        self.query_one("#messages", VerticalScroll).scroll_end(animate=False)
        self.refresh_bindings()
        self._pump()

    def action_stop(self) -> None:
        if self.generating:
            self._stop_answer.set()

    def action_copy_answer(self) -> None:
        if not self.last_answer:
            self.notify("no answer to copy yet", severity="warning")
            return
        self.copy_to_clipboard(self.last_answer)
        self.notify("copied the last answer")

    def action_clear_chat(self) -> None:
        entry = self.entries.get(self.current or "")
        content_hash = self._content_hash(entry) if entry else None
        if content_hash is None or self.library is None or self.generating:
            return

        def confirmed(yes: bool | None) -> None:
            if yes and self.library is not None:
                self.library.clear_history(content_hash)
                self._show_history()
                self.notify("conversation cleared")

        self.push_screen(ConfirmScreen("Clear the conversation about this document?"), confirmed)

    # ----- settings, help, theme, quit -----

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_settings(self) -> None:
        self.push_screen(SettingsScreen(self.settings, sorted(self.available_themes)), self._apply_settings)

    def _apply_settings(self, settings: Settings | None) -> None:
        if settings is None:
            return
        reload = (settings.model, settings.engine) != (self.settings.model, self.settings.engine)
        if reload and (self.ingesting or self.generating):
            self.notify("finish or cancel the running work before changing the model", severity="warning")
            settings = replace(settings, model=self.settings.model, engine=self.settings.engine)
            reload = False
        self.settings = settings
        self.theme = settings.theme
        try:
            save_settings(settings, self.settings_file)
        except OSError as exc:
            self.notify(f"cannot save the settings: {exc.strerror}", severity="error")
        else:
            self.notify("settings saved")
        if reload:
            self.assistant, self.model_status = None, "loading"
            self.sub_title = f"loading {settings.model}…"
            self._redraw_table()
            self._reload_model()

    @work(thread=True, exit_on_error=False, group="model")
    def _reload_model(self) -> None:
        self._load_model()

    def _theme_changed(self, theme: object) -> None:
        """A theme picked in the command palette (ctrl+p) is kept, like one picked in the settings."""
        name = getattr(theme, "name", None)
        if isinstance(name, str) and name != self.settings.theme:
            self.settings = replace(self.settings, theme=name)
            with contextlib.suppress(OSError):
                save_settings(self.settings, self.settings_file)

    async def action_quit(self) -> None:
        """Quit; a running ingest stops at the end of its segment and keeps its progress."""
        self._cancel_ingest.set()
        self._stop_answer.set()
        self._quitting = True
        self.exit()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A worker that failed in a way its own handlers did not foresee is still only a message."""
        if event.state == WorkerState.ERROR and not self._quitting:
            self.notify(f"internal error in {event.worker.name}: {event.worker.error!r}", severity="error")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Show in the footer only what can be done now."""
        if action == "cancel_ingest":
            return self.ingesting is not None
        if action == "stop":
            return self.generating
        if action == "copy_answer":
            return bool(self.last_answer)
        if action in ("reingest", "clear_chat", "remove"):
            return self.current is not None
        return True

    def on_unmount(self) -> None:
        self._quitting = True
        self._cancel_ingest.set()
        self._stop_answer.set()
        if self.library is not None:
            self.library.close()


def run(
    paths: Sequence[str] = (), max_bytes: int | None = DEFAULT_MAX_BYTES, max_seconds: float | None = None
) -> None:
    """`edgemem chat [PATHS...] [--max-size SIZE] [--max-time DURATION]`."""
    # Torch's OpenMP threads spin while they wait for work by default, which starves the screen's
    # thread on a small CPU (seen on 2 cores: a tiny model's ingest ran many times slower beside the
    # screen). Passive waiting lets them sleep instead; it must be set before torch is imported,
    # which the app does in a worker, after this.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    EdgememApp(paths, max_bytes=max_bytes, max_seconds=max_seconds).run()
