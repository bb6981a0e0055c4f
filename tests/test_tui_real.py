"""The whole `edgemem chat` path on the real SmolLM2-135M-Instruct: add a folder, watch it ingest,
ask, get a streamed answer, close the app, come back to the same conversation."""

import asyncio
import sysconfig
import time
from pathlib import Path

import pytest

from edgemem.tui.app import EdgememApp
from edgemem.tui.config import Settings, save_settings

pytestmark = pytest.mark.real_model

STDLIB = Path(sysconfig.get_paths()["stdlib"])


async def until(pilot, condition, timeout, what):
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out waiting for {what}; notices: {pilot.app.notices}")
        await pilot.pause(0.05)


def sources(app):
    """The Markdown of the messages shown (a message widget has its text once it is mounted)."""
    return [m.source for m in app.query(".msg")]


def test_real_model_folder_ingest_streamed_answer_and_history_after_restart(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "scanner.py").write_text((STDLIB / "json" / "scanner.py").read_text())
    # about 4k tokens in all: more than the shipped adapter's answer window, so segments are written
    (folder / "decoder.py").write_text((STDLIB / "json" / "decoder.py").read_text())
    (folder / "NOTES.md").write_text("# Notes\n\nThe JSON scanner turns text into Python objects.\n")
    config = tmp_path / "config.toml"  # its own settings; the library and model cache are the session's
    save_settings(Settings(max_new_tokens=24), config)

    async def first_session():
        app = EdgememApp([folder], settings_file=config)
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.status_of(folder) == "ready", 300, "the ingest")
            assert app.bar_history and app.bar_history[-1] > 0
            assert app.last_progress is not None and app.last_progress.rss_bytes > 0
            assert not [text for severity, text in app.notices if severity == "error"]
            await pilot.click("#question")
            await pilot.press(*"What does the scanner do?", "enter")
            await until(pilot, lambda: not app.generating and app.last_answer, 120, "the answer")
            expected = ["What does the scanner do?", app.last_answer]
            await until(pilot, lambda: sources(app)[-2:] == expected, 30, "the messages on screen")
            return app.last_answer, app.answer_pieces

    answer, pieces = asyncio.run(first_session())
    assert answer.strip() and pieces > 1

    async def second_session():
        app = EdgememApp(settings_file=config)
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.current == str(folder.resolve()), 60, "the library")
            expected = ["What does the scanner do?", answer]
            await until(pilot, lambda: sources(app)[-2:] == expected, 60, "the saved conversation")

    asyncio.run(second_session())
