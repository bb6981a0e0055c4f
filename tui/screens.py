"""The app's modal screens: help, add a path (with completion), settings, confirm."""

from __future__ import annotations

import os
from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.suggester import Suggester
from textual.widgets import Button, Input, Label, Markdown, Select

from edgemem.tui.config import ENGINES, THEMES, Settings

HELP = """\
# edgemem chat

Ask questions about your documents and code, offline. Each document streams through the model in
segments into a fixed-size memory (about 5 MB), however long it is.

| key | what it does |
|---|---|
| `ctrl+o` | add a file or folder (Tab or → completes the path) |
| `enter` | in the library: chat about the document; in the question box: ask |
| `delete` | in the library: remove the document, its memory and its conversation |
| `ctrl+r` | ingest the selected document again (when its file changed, or to resume) |
| `ctrl+g` | cancel the running ingest (its progress is kept: `ctrl+r` resumes it) |
| `escape` | stop the answer being written |
| `ctrl+y` | copy the last answer to the clipboard |
| `ctrl+l` | clear the conversation about this document |
| `f2` | settings: model, engine, temperature, answer length, theme (light or dark) |
| `ctrl+p` | the command palette (themes, keys, quit) |
| `tab` | move between the library, the conversation and the question box |
| `f1` | this help |
| `ctrl+q` | quit (a running ingest is saved and resumes next time) |

Statuses in the library: **ready** (ingested with the current model), **partial** (an ingest was
cancelled or interrupted; it resumes), **changed** (the file changed since it was ingested),
**queued**, **missing** (the file is gone), **other model** (ingested with another model only).

Settings live in `config.toml` in the edgemem config directory (`$EDGEMEM_HOME/config` when set).
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box", classes="dialog"):
            yield Markdown(HELP)

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


class PathSuggester(Suggester):
    """Completes a file-system path: the first entry of the folder that starts with what is typed
    (folders get a trailing slash)."""

    def __init__(self) -> None:
        super().__init__(use_cache=False, case_sensitive=True)

    async def get_suggestion(self, value: str) -> str | None:
        if not value:
            return None
        expanded = os.path.expanduser(value)
        folder, prefix = os.path.split(expanded)
        try:
            names = sorted(os.listdir(folder or "."))
        except OSError:
            return None
        hidden = prefix.startswith(".")
        for name in names:
            if name.startswith(prefix) and name != prefix and (hidden or not name.startswith(".")):
                full = os.path.join(folder, name)
                suffix = name[len(prefix) :] + ("/" if os.path.isdir(full) else "")
                return value + suffix
        return None


class AddPathScreen(ModalScreen[str | None]):
    """Asks for a file or folder to add; returns the path, or None."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("tab", "complete", "Complete", priority=True),
    ]

    def compose(self) -> ComposeResult:
        with Vertical(id="add-box", classes="dialog"):
            yield Label("Add a file or folder (Tab completes, Enter adds, Esc cancels)")
            yield Input(placeholder="~/docs/manual.txt", suggester=PathSuggester(), id="add-path")

    def action_complete(self) -> None:
        field = self.query_one("#add-path", Input)
        field.cursor_position = len(field.value)
        field.action_cursor_right()  # at the end of the text this accepts the grey completion

    def on_input_submitted(self, event: Input.Submitted) -> None:
        value = event.value.strip()
        self.dismiss(value or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class SettingsScreen(ModalScreen[Settings | None]):
    """Edits the settings; returns the new ones (already checked), or None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save")]

    def __init__(self, settings: Settings, themes: list[str] | None = None) -> None:
        super().__init__()
        self.settings = settings
        self.themes = themes or list(THEMES)

    def compose(self) -> ComposeResult:
        s = self.settings
        with Vertical(id="settings-box", classes="dialog"):
            yield Label("Settings (ctrl+s saves, Esc cancels)", id="settings-title")
            with Grid(id="settings-grid"):
                yield Label("model")
                yield Input(s.model, id="set-model", placeholder="name or path (onnxruntime: bundle)")
                yield Label("engine")
                yield Select([(e, e) for e in ENGINES], value=s.engine, allow_blank=False, id="set-engine")
                yield Label("adapter")
                yield Input(s.adapter, id="set-adapter", placeholder="path (empty: the shipped one)")
                yield Label("answer window")
                yield Input(
                    str(s.answer_window),
                    id="set-answer-window",
                    type="integer",
                    placeholder="-1: the adapter's own, 0: off",
                )
                yield Label("temperature")
                yield Input(str(s.temperature), id="set-temperature", type="number")
                yield Label("max new tokens")
                yield Input(str(s.max_new_tokens), id="set-max-new-tokens", type="integer")
                yield Label("theme")
                themes = self.themes if s.theme in self.themes else [*self.themes, s.theme]
                yield Select([(t, t) for t in themes], value=s.theme, allow_blank=False, id="set-theme")
            with Horizontal(id="settings-buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def _read(self) -> Settings | None:
        try:
            settings = Settings(
                model=self.query_one("#set-model", Input).value.strip(),
                engine=str(self.query_one("#set-engine", Select).value),
                adapter=self.query_one("#set-adapter", Input).value.strip(),
                answer_window=int(self.query_one("#set-answer-window", Input).value or "-1"),
                temperature=float(self.query_one("#set-temperature", Input).value or "0"),
                max_new_tokens=int(self.query_one("#set-max-new-tokens", Input).value or "0"),
                theme=str(self.query_one("#set-theme", Select).value),
            )
        except ValueError as exc:
            self.app.notify(f"settings: {exc}", severity="error")
            return None
        if problems := settings.problems():
            self.app.notify(f"settings: {problems[0]}", severity="error")
            return None
        return settings

    def action_save(self) -> None:
        if (settings := self._read()) is not None:
            self.dismiss(settings)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def on_input_submitted(self) -> None:
        self.action_save()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        else:
            self.action_cancel()


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question (y / n, Enter / Esc)."""

    BINDINGS = [
        Binding("y,enter", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box", classes="dialog"):
            yield Label(self.question, markup=False)
            yield Label("y: yes   n: no")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


def short_path(path: str | Path, width: int) -> str:
    """A path shortened from the left to `width` characters, home as ~."""
    text = str(path)
    home = str(Path.home())
    if text.startswith(home + os.sep):
        text = "~" + text[len(home) :]
    return text if len(text) <= width else "…" + text[-(width - 1) :]
