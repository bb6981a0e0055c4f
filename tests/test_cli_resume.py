"""`edgemem ingest` interrupted with Ctrl-C (a real SIGINT to a real process) keeps its progress,
and the same command run again resumes from it; `edgemem chat` refuses a bad path in one line."""

import _thread
import os
import signal
import subprocess
import sys
import threading
import time

from tiny import tiny_llama
from tiny_assistant import tiny_tokenizer
from typer.testing import CliRunner

from edgemem.cli import app
from edgemem.store import Library


def ingest_process(home, model, doc):
    env = {**os.environ, "EDGEMEM_HOME": str(home), "OMP_WAIT_POLICY": "PASSIVE"}
    command = [
        sys.executable,
        "-c",
        # Ctrl-C raises KeyboardInterrupt even when this suite runs as a background job (`cmd &` in
        # a script), whose children inherit SIGINT ignored and so would never see the signal
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from edgemem.cli import main; main()",
        "ingest",
        str(doc),
        "--model",
        str(model),
        "--segment-len",
        "16",
    ]
    return subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)


def test_ctrl_c_during_cli_ingest_then_the_same_command_resumes(tmp_path, monkeypatch):
    model = tmp_path / "tiny-model"
    tiny_llama().save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    doc = tmp_path / "long.txt"
    doc.write_text(
        "".join(f"line {i}: nothing to see here, keep going.\n" for i in range(4000))
    )  # ~170k tokens
    home = tmp_path / "home"

    first = ingest_process(home, model, doc)
    database = home / "data" / "library.sqlite3"
    deadline = time.monotonic() + 60
    while not database.exists() and time.monotonic() < deadline:  # opened just before the ingest starts
        time.sleep(0.1)
    time.sleep(1.5)
    first.send_signal(signal.SIGINT)
    _, stderr = first.communicate(timeout=60)
    assert first.returncode == 130, stderr
    assert "interrupted:" in stderr and "run the same command again to resume" in stderr
    with Library(home / "data") as lib:
        (checkpoint,) = lib.checkpoints()
    assert checkpoint.tokens > 0 and checkpoint.tokens % 16 == 0

    # The same command again, in this process this time, interrupted the same way after 2 s.
    monkeypatch.setenv("EDGEMEM_HOME", str(home))
    timer = threading.Timer(2.0, _thread.interrupt_main)  # does nothing while SIGINT is ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer.start()
    try:
        result = CliRunner().invoke(app, ["ingest", str(doc), "--model", str(model), "--segment-len", "16"])
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert result.exit_code == 130, result.output
    assert f"resuming the ingest of {doc} from {checkpoint.tokens:,} tokens" in result.stderr
    with Library(home / "data") as lib:
        assert lib.checkpoints()[0].tokens > checkpoint.tokens  # it went on from there


def test_chat_with_a_missing_path_is_one_line_error(tmp_path):
    result = CliRunner().invoke(app, ["chat", str(tmp_path / "nope")], catch_exceptions=False)
    assert result.exit_code == 1
    assert result.stderr.strip().startswith("error:") and "no such file" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
