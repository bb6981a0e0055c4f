"""`edgemem chat` through Textual's pilot, headless, on the tiny random model (fast).

The app gets the tiny `Assistant` through its `open_assistant` parameter (the only thing swapped:
the library, the ingest, the workers and the screens are the real ones), and each test has its own
EDGEMEM_HOME, so its own library database and settings file.
"""

import asyncio
import os
import time

import pytest
from textual.widgets import Button, Footer, Input, Select
from tiny_assistant import paced_assistant, tiny_assistant

from edgemem.errors import EdgememError
from edgemem.store import Library
from edgemem.tui.app import EdgememApp
from edgemem.tui.config import Settings, load_settings, save_settings
from edgemem.tui.screens import AddPathScreen, HelpScreen, SettingsScreen

TEXT = "".join(f"Note {i}: the vault code for room {i} is {1000 + 37 * i}.\n" for i in range(40))


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh EDGEMEM_HOME per test: its own library and config file."""
    monkeypatch.setenv("EDGEMEM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="module")
def assistant():
    return tiny_assistant(segment_len=16)


@pytest.fixture(scope="module")
def paced():
    """For tests that watch an ingest while it runs: at least 10 ms a segment, on any machine."""
    return paced_assistant(segment_len=16)


@pytest.fixture
def doc(tmp_path):
    path = tmp_path / "vault.txt"
    path.write_text(TEXT)
    return path


def make_app(assistant, *paths, **kwargs):
    return EdgememApp(list(paths), open_assistant=lambda settings: assistant, **kwargs)


async def until(pilot, condition, timeout=30.0, what="condition"):
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out waiting for {what}; notices: {pilot.app.notices}")
        await pilot.pause(0.02)


def run(coro):
    return asyncio.run(coro)


def sources(app):
    """The Markdown of the messages shown (a message widget has its text once it is mounted)."""
    return [m.source for m in app.query(".msg")]


def errors(app):
    return [text for severity, text in app.notices if severity == "error"]


async def add_path(pilot, path, complete_from=None):
    """ctrl+o, then the path (typed from `complete_from` on, after Tab completes it), then enter."""
    await pilot.press("ctrl+o")
    await until(pilot, lambda: isinstance(pilot.app.screen, AddPathScreen), what="the add dialog")
    field = pilot.app.screen.query_one(Input)
    if complete_from is None:
        field.value = str(path)
    else:
        field.value = str(path)[:complete_from]
        await until(pilot, lambda: field._suggestion == str(path), what="the completion")
        await pilot.press("tab")
        assert field.value == str(path)
    await pilot.press("enter")


async def ask(pilot, question):
    """Type a question and wait for its answer (each key press waits up to 1 s for the app to idle,
    so a short answer may be finished by the time `enter` returns)."""
    app = pilot.app
    before = len(app.query(".msg"))
    await pilot.click("#question")
    await pilot.press(*question, "enter")
    await until(pilot, lambda: len(app.query(".msg")) == before + 2 and not app.generating, what="the answer")


def test_add_a_file_watch_it_ingest_ask_and_find_the_history_after_restart(paced, home, doc):
    save_settings(Settings(max_new_tokens=16))

    async def first_session():
        app = make_app(paced)
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.model_status == "ready", what="the model")
            await add_path(pilot, doc, complete_from=len(str(doc)) - 6)  # ".../vau" + Tab
            await until(pilot, lambda: app.status_of(doc) == "ready", timeout=120, what="the ingest")
            bars = list(app.bar_history)
            assert len(bars) >= 3 and bars == sorted(bars) and bars[0] < bars[-1], bars  # it moved on
            assert not app.query_one("#ingest-box").has_class("active")  # and went away at the end
            assert any("ingested" in text for _, text in app.notices)
            await ask(pilot, "Which code?")
            assert app.last_answer.strip()
            await until(pilot, lambda: sources(app) == ["Which code?", app.last_answer], what="the messages")
            return app.last_answer, app.answer_pieces

    answer, pieces = run(first_session())
    assert pieces > 1  # streamed piece by piece, not delivered at once

    async def second_session():
        app = make_app(paced)
        async with app.run_test() as pilot:
            await until(pilot, lambda: sources(app) == ["Which code?", answer], what="the saved conversation")
            assert app.status_of(doc) == "ready"

    run(second_session())


@pytest.mark.parametrize("name", ["atlas.txt", "zebra.txt"])  # listed above the other document, and below
def test_a_conversation_shows_and_answers_only_its_own_document_when_another_shares_the_library(
    assistant, home, doc, tmp_path, name
):
    """Two sessions, one library: the second opens with a new document while the first one's
    document and conversation are already there. The new document is selected, shows no messages,
    and its question and answer are its own; the other conversation is untouched, and moving the
    cursor switches between the two. (The library lists every document; the chat panel shows the
    selected one's conversation only.) Once, a highlight of the old document queued when the
    library opened moved the selection back to it after the new one took its row."""
    save_settings(Settings(max_new_tokens=4))
    new = tmp_path / name
    new.write_text("The porter of the Porto vault keeps the key.\n" * 20)

    async def first_session():
        app = make_app(assistant, doc)
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.status_of(doc) == "ready", what="the first ingest")
            await ask(pilot, "Which code?")
            return app.last_answer

    first_answer = run(first_session())

    async def second_session():
        app = make_app(assistant, new)
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.status_of(new) == "ready", what="the second ingest")
            await pilot.pause(0.2)  # the highlights queued by the redraws are handled by now
            assert app.current == str(new.resolve())
            assert app.query_one("#chat-panel").border_title == f"Chat: {name}"
            assert sources(app) == []
            await ask(pilot, "Who keeps it?")
            assert app.current == str(new.resolve())
            await until(
                pilot, lambda: sources(app) == ["Who keeps it?", app.last_answer], what="the messages"
            )
            answer = app.last_answer

            app.query_one("#docs").focus()
            await pilot.press("up" if name > doc.name else "down")  # the user moves to the other one
            await until(pilot, lambda: app.current == str(doc.resolve()), what="the other document")
            await until(pilot, lambda: sources(app) == ["Which code?", first_answer], what="its conversation")
            await pilot.press("down" if name > doc.name else "up")
            await until(pilot, lambda: sources(app) == ["Who keeps it?", answer], what="back")
            assert errors(app) == []
            return answer

    second_answer = run(second_session())
    with Library() as lib:
        history = {r.path: [m.content for m in lib.history(r.content_hash)] for r in lib.records()}
    assert history == {
        str(doc.resolve()): ["Which code?", first_answer],
        str(new.resolve()): ["Who keeps it?", second_answer],
    }


def test_cancel_an_ingest_then_resume_it_from_where_it_stopped(paced, home, tmp_path):
    big = tmp_path / "big.txt"
    big.write_text(TEXT * 4)  # ~7k tokens: long enough to cancel in the middle

    async def session():
        app = make_app(paced, big)
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.last_progress is not None, what="progress")
            await pilot.press("ctrl+g")
            await until(pilot, lambda: app.ingesting is None, what="the cancel")
            assert app.status_of(big) == "partial", app.notices
            assert any("cancelled" in text for _, text in app.notices)
            with Library() as lib:
                (checkpoint,) = lib.checkpoints()
            assert 0 < checkpoint.tokens < 7_000

            await pilot.press("ctrl+r")
            await until(pilot, lambda: app.ingesting is not None and app.last_progress is not None)
            assert app.last_progress.start_tokens == checkpoint.tokens  # resumed, not restarted
            assert any(f"from {checkpoint.tokens:,} tokens" in text for _, text in app.notices)
            await until(pilot, lambda: app.ingesting is None, timeout=120, what="the resumed ingest")
            assert app.status_of(big) == "ready" and errors(app) == []
            with Library() as lib:
                assert lib.checkpoints() == [] and lib.records()[0].tokens > checkpoint.tokens

    run(session())


def test_quitting_mid_ingest_keeps_the_progress_for_next_time(paced, home, tmp_path):
    big = tmp_path / "big.txt"
    big.write_text(TEXT * 4)

    async def quit_early():
        app = make_app(paced, big)
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.last_progress is not None, what="progress")
            await pilot.press("ctrl+q")

    run(quit_early())
    deadline = time.monotonic() + 10  # the worker stops at the end of its segment
    while time.monotonic() < deadline:
        with Library() as lib:
            if lib.checkpoints():
                break
        time.sleep(0.05)

    async def come_back():
        app = make_app(paced)
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.status_of(big) == "partial", what="the partial entry")

    run(come_back())


def test_copy_stop_and_clear_the_conversation(assistant, home, doc):
    save_settings(Settings(max_new_tokens=4000))

    async def session():
        app = make_app(assistant, doc)
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.status_of(doc) == "ready", what="ingest")
            await pilot.click("#question")
            await pilot.press(*"Tell me everything", "enter")
            await until(pilot, lambda: app.answer_pieces >= 3, what="the answer to stream")
            await pilot.press("escape")
            await until(pilot, lambda: not app.generating, what="the stop")
            assert app.last_answer.endswith("*(stopped)*") and app.answer_pieces < 4000

            await pilot.press("ctrl+y")
            assert app.clipboard == app.last_answer

            await pilot.press("ctrl+l")
            await until(pilot, lambda: app.screen.id is None or "Confirm" in type(app.screen).__name__)
            await pilot.press("y")
            await until(pilot, lambda: len(app.query(".msg")) == 0, what="the cleared conversation")
            with Library() as lib:
                assert lib.history(lib.records()[0].content_hash) == []

    run(session())


def test_remove_a_document_from_the_library(assistant, home, doc, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text(TEXT[:300])

    async def session():
        app = make_app(assistant, doc, other)
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.status_of(doc) == app.status_of(other) == "ready", what="ingest")
            app.query_one("#docs").focus()  # tab would do the same; the library's delete key applies
            await pilot.pause()
            removed = app.current
            await pilot.press("delete")
            await pilot.press("y")
            await until(pilot, lambda: app.status_of(removed) is None, what="the removal")
            kept = str(other.resolve()) if removed == str(doc.resolve()) else str(doc.resolve())
            assert app.current == kept  # the other document is selected now
            with Library() as lib:
                assert [r.path for r in lib.records()] == [kept]

    run(session())


def test_a_changed_file_is_flagged_and_ingested_again(assistant, home, doc):
    async def ingest_once():
        app = make_app(assistant, doc)
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.status_of(doc) == "ready", what="ingest")

    run(ingest_once())
    doc.write_text(TEXT.replace("vault", "safe"))

    async def come_back():
        app = make_app(assistant)
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.status_of(doc) == "changed", what="the changed flag")
            await pilot.press("ctrl+r")
            await until(pilot, lambda: app.status_of(doc) == "ready", what="the new ingest")
            with Library() as lib:
                assert len(lib.records()) == 1  # the new content replaced the old entry

    run(come_back())


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("blob.bin", b"\x7fELF\x00\x00\x01\x02", "binary file"),
        ("nothing-here.txt", None, "no such file"),
        ("empty.txt", b"", "is empty"),
        ("unreadable.txt", b"secret", "cannot read" if os.geteuid() == 0 else "permission denied"),
    ],
)
def test_bad_paths_are_notifications_not_crashes(assistant, home, tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    if name == "unreadable.txt":
        if os.geteuid() == 0:  # root reads any file: use one the kernel refuses to read
            path = "/proc/self/mem"
        else:
            path.chmod(0)

    async def session():
        app = make_app(assistant)
        async with app.run_test() as pilot:
            await add_path(pilot, path)
            await until(pilot, lambda: errors(app), what="the error notification")
            assert message in errors(app)[0] and app.is_running
            assert app.entries == {}

    run(session())


def test_pipes_and_sockets_in_a_folder_are_counted_in_the_skipped_notice(assistant, home, tmp_path):
    """A FIFO and a socket in a folder are skipped without blocking, and the notice says so (it
    counted only binary and unreadable files before)."""
    import socket

    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "notes.txt").write_text(TEXT[:200])
    os.mkfifo(folder / "pipe")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(folder / "sock"))

        async def session():
            app = make_app(assistant)
            async with app.run_test() as pilot:
                await add_path(pilot, folder)
                await until(pilot, lambda: app.status_of(folder) == "ready", what="the ingest")
                warnings = [text for severity, text in app.notices if severity == "warning"]
                assert any("skipped 2 binary, unreadable or special file(s)" in w for w in warnings), warnings

        run(session())


def test_corrupt_state_is_a_notification_when_asking(assistant, home, doc):
    async def session():
        app = make_app(assistant, doc)
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.status_of(doc) == "ready", what="ingest")
            with Library() as lib:
                state = lib.states / lib.records()[0].state_file
            state.write_bytes(state.read_bytes()[:-8] + b"\x00" * 8)
            await ask(pilot, "Still there?")
            assert "corrupt" in errors(app)[0] and app.is_running

    run(session())


def test_missing_model_is_a_notification(home, doc):
    save_settings(Settings(model="gpt-17"))

    async def session():
        app = EdgememApp([doc])  # the real engine: the model name is checked for real
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.model_status == "failed", what="the model failure")
            assert "unknown model" in errors(app)[0] and app.is_running
            await ask_without_model(pilot)

    async def ask_without_model(pilot):
        await pilot.click("#question")
        await pilot.press(*"hello", "enter")
        assert any("no model" in text for _, text in pilot.app.notices)

    run(session())


def test_settings_screen_saves_to_the_config_file_and_fits_80x24(assistant, home):
    async def session():
        app = make_app(assistant)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("f2")
            await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
            save = app.screen.query_one("#save", Button)
            assert save.region.bottom <= 24 and save.region.height > 0  # reachable on a small terminal
            grid = app.screen.query_one("#settings-grid")
            theme = app.screen.query_one("#set-theme", Select)
            theme.focus()  # the last field scrolls into view
            await until(pilot, lambda: grid.region.contains_region(theme.region), 3.0, "theme in view")
            app.screen.query_one("#set-temperature", Input).value = "0.7"
            app.screen.query_one("#set-max-new-tokens", Input).value = "64"
            app.screen.query_one("#set-adapter", Input).value = " runs/a/adapter.safetensors "
            app.screen.query_one("#set-answer-window", Input).value = "1024"
            await pilot.press("ctrl+s")
            await until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
            return app.settings

    settings = run(session())
    assert (settings.temperature, settings.max_new_tokens) == (0.7, 64)
    assert (settings.adapter, settings.answer_window) == ("runs/a/adapter.safetensors", 1024)
    assert load_settings() == (settings, [])
    assert (home / "config" / "config.toml").is_file()


def test_the_settings_adapter_reaches_the_model_load_as_one_clear_error(tmp_path):
    from edgemem.tui.app import open_assistant

    missing = tmp_path / "trained" / "adapter.safetensors"
    with pytest.raises(EdgememError, match="adapter") as info:
        open_assistant(Settings(adapter=str(missing)))  # read before the model loads: no wait
    assert "\n" not in str(info.value)


@pytest.mark.real_model
def test_the_settings_answer_window_reaches_the_model_load():
    from edgemem.tui.app import open_assistant

    with pytest.raises(EdgememError, match=r"answer_window 64 is neither 0 nor .* segment_len \(128\)"):
        open_assistant(Settings(answer_window=64))  # the real model: its adapter's segments are 128


def test_a_bad_settings_file_is_reported_and_defaults_used(assistant, home):
    (home / "config").mkdir(parents=True)
    (home / "config" / "config.toml").write_text('engine = "onnx"\ntemperature = "hot"\n')

    async def session():
        app = make_app(assistant)
        async with app.run_test():
            return app.settings, [text for severity, text in app.notices if severity == "warning"]

    settings, warnings = run(session())
    assert settings == Settings()
    assert any("engine 'onnx' is not available" in w for w in warnings)
    assert any("temperature" in w for w in warnings)


def test_help_footer_and_both_themes_at_80x24(assistant, home, doc):
    save_settings(Settings(max_new_tokens=8))

    async def session():
        app = make_app(assistant, doc)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.status_of(doc) == "ready", what="ingest")
            await ask(pilot, "Hello?")  # so that "copy" is offered too
            await pilot.click("#docs")  # the library's own key (delete) joins the footer
            keys = list(app.query_one(Footer).query("FooterKey"))
            assert {"f1", "ctrl+o", "ctrl+r", "ctrl+y", "ctrl+l", "f2", "ctrl+q", "delete"} <= {
                k.key for k in keys
            }
            assert max(k.region.right for k in keys) <= 80  # the whole footer fits in 80 columns
            assert app.query_one("#question").region.bottom <= 23  # and everything else in 24 rows
            await pilot.press("f1")
            await until(pilot, lambda: isinstance(app.screen, HelpScreen))
            await pilot.press("escape")
            await pilot.press("f2")
            await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
            app.screen.query_one("#set-theme", Select).value = "textual-light"
            await pilot.press("ctrl+s")
            await until(pilot, lambda: app.theme == "textual-light")
            assert load_settings()[0].theme == "textual-light"

    run(session())
