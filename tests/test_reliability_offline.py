"""The offline guarantee: edgemem's commands run with the network blocked, and make no attempt
to use it. Each CLI run happens in a child process whose sockets are guarded (any internet
connection or host name lookup fails and is logged) and, where the kernel lets us make one, inside
a fresh network namespace (`unshare -rn`: no interface but loopback).

The whole flow is covered, on the tiny model: `models`, `ingest`, `ask`, `library`; `export` (an
ONNX bundle), `ask --engine` on it and `eval` (niah, 1k tokens, one item, on a small corpus written
to the test's data directory); and the chat app, headless (Textual's pilot), adding a document,
ingesting it and answering, with both of its engines (PyTorch, and ONNX Runtime on the bundle)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fuzz.helpers import REPO, tiny_model_folder, write_corpora

GUARD = """
import os
from pathlib import Path
from edgemem.offline import block_network
block_network(log=Path(os.environ["EDGEMEM_NETWORK_LOG"]))
"""


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0


UNSHARE = _can_unshare()


def guarded(
    tmp_path: Path, args: list[str], unshare: bool = UNSHARE, timeout: float = 600, home: Path | None = None
):
    """Run `python args...` with the socket guard loaded at start-up (sitecustomize), in a network
    namespace when possible. -> (completed process, attempts logged)."""
    site = tmp_path / "guard-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(GUARD)
    log = tmp_path / "network.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]),
        "EDGEMEM_NETWORK_LOG": str(log),
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    if home is not None:
        env["EDGEMEM_HOME"] = str(home)
    prefix = ["unshare", "-rn"] if unshare else []
    done = subprocess.run(
        [*prefix, sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout
    )
    attempts = log.read_text().splitlines() if log.exists() else []
    return done, attempts


def cli_commands(commands: list[list[str]]) -> str:
    """Python code that runs `edgemem ARGS...` for each list of ARGS in turn, in one process (the
    CLI's own entry point each time: a Python start with torch costs 10-30 s on a busy machine),
    stopping at the first that fails."""
    return (
        "import sys\nfrom edgemem.cli import app\n"
        f"for args in {commands!r}:\n"
        "    try:\n        app(args)\n"
        "    except SystemExit as exc:\n"
        "        if exc.code:\n            sys.exit(f'{args[0]} exited {exc.code}')\n"
    )


def test_the_guard_catches_a_connection_attempt(tmp_path):
    """The check can fail: a program that does reach for the network is caught and logged."""
    code = (
        "import urllib.request\n"
        "try:\n    urllib.request.urlopen('http://example.com', timeout=5)\nexcept OSError:\n    pass"
    )
    done, attempts = guarded(tmp_path, ["-c", code], unshare=False)
    assert done.returncode == 0, done.stderr
    assert attempts and "example.com" in attempts[0]


def test_cli_models_ingest_ask_library_make_no_network_attempt(tmp_path):
    model = tiny_model_folder(tmp_path / "model")
    doc = tmp_path / "doc.txt"
    doc.write_text("The access code for the Lisbon vault is 4417.\n" * 20)
    home = tmp_path / "home"
    commands = [
        ["models"],
        ["ingest", str(doc), "--model", str(model), "--segment-len", "64"],
        [
            "ask",
            str(doc),
            "What is the code?",
            "--model",
            str(model),
            "--segment-len",
            "64",
            "--max-new-tokens",
            "4",
        ],
        ["library"],
    ]
    done, attempts = guarded(tmp_path, ["-c", cli_commands(commands)], home=home)
    assert done.returncode == 0, done.stderr[-2000:]
    assert attempts == []
    assert "doc.txt" in done.stdout and "smollm2-135m-instruct" in done.stdout  # library, models


def test_importing_edgemem_switches_the_hub_clients_offline_even_against_the_users_setting(tmp_path):
    code = (
        "import huggingface_hub.constants as before\n"
        "assert not before.HF_HUB_OFFLINE\n"
        "import edgemem, os\n"
        "import huggingface_hub.constants as c\n"
        "from huggingface_hub.constants import is_offline_mode\n"
        "print(c.HF_HUB_OFFLINE, is_offline_mode(), os.environ['HF_HUB_OFFLINE'], os.environ['DO_NOT_TRACK'])"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "1", "1"]


@pytest.mark.skipif(not UNSHARE, reason="no user network namespaces here (unshare -rn)")
def test_the_namespace_really_has_no_network(tmp_path):
    code = "import socket\ns = socket.socket()\ns.settimeout(3)\nprint(s.connect_ex(('1.1.1.1', 443)))"
    done = subprocess.run(["unshare", "-rn", sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() != "0"  # ENETUNREACH, not a connection


@pytest.mark.real_model
@pytest.mark.reliability  # a second real-model load in a child process: only with -m reliability
def test_real_model_ask_makes_no_network_attempt(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("The access code for the Lisbon vault is 4417.\n")
    cli = ["-c", "from edgemem.cli import main; main()"]
    done, attempts = guarded(tmp_path, [*cli, "ask", str(doc), "What is the code?", "--max-new-tokens", "8"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert attempts == []


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """`export`, `ask --engine` and `eval` run in one guarded process (one Python start with torch:
    10-30 s on a busy machine). -> (process, attempts, paths)."""
    tmp = tmp_path_factory.mktemp("offline-export")
    model = tiny_model_folder(tmp / "model")
    home, bundle, results = tmp / "home", tmp / "bundle", tmp / "results"
    write_corpora(home / "data")
    doc = tmp / "doc.txt"
    doc.write_text("The access code for the Lisbon vault is 4417.\n" * 20)
    commands = [
        ["export", "--model", str(model), "--out", str(bundle)],
        ["ask", str(doc), "What is the code?", "--engine", str(bundle), "--max-new-tokens", "4"],
        ["eval", "--task", "niah", "--method", "armt", "--lengths", "1k", "-n", "1"]
        + ["--model", str(model), "--results", str(results)],
    ]
    done, attempts = guarded(tmp, ["-c", cli_commands(commands)], home=home)
    return done, attempts, {"model": model, "bundle": bundle, "results": results, "home": home}


def test_cli_export_ask_engine_and_eval_make_no_network_attempt(exported):
    done, attempts, paths = exported
    assert done.returncode == 0, done.stderr[-3000:]
    assert attempts == []
    assert (paths["bundle"] / "manifest.json").is_file() and "wrote" in done.stderr  # export
    (result,) = [json.loads(line) for line in (paths["results"] / "model" / "niah.armt.jsonl").open()]
    assert result["task"] == "niah" and result["length"] == 1024  # eval ran its item
    assert "1 items run" in done.stderr


CHAT_FLOW = """
import asyncio, sys, time
from pathlib import Path
from edgemem.store import Library
from edgemem.tui.app import EdgememApp
from edgemem.tui.config import Settings, save_settings


async def until(app, pilot, condition, what):
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > 300:
            sys.exit(f"timed out waiting for {what}; notices: {app.notices}")
        await pilot.pause(0.05)


async def session(doc):
    app = EdgememApp([doc])  # the app's own engine choice: the settings' model and engine
    async with app.run_test() as pilot:
        await until(app, pilot, lambda: app.model_status != "loading", "the model")
        await until(app, pilot, lambda: app.status_of(doc) in ("ready", "error"), "the ingest")
        await pilot.click("#question")
        await pilot.press(*"What is the code?", "enter")
        await until(app, pilot, lambda: len(app.query(".msg")) == 2 and not app.generating, "the answer")
    problems = [text for severity, text in app.notices if severity == "error"]
    if problems or app.model_status != "ready":
        sys.exit(f"{doc}: {app.model_status}, {problems}")


# One library for both sessions: the second opens with the first one's document and conversation
# in it, and must still show and answer only its own document.
for doc, model, engine in zip(*[iter(sys.argv[1:])] * 3):
    save_settings(Settings(model=model, engine=engine, max_new_tokens=4))
    asyncio.run(session(doc))
with Library() as lib:
    print(sorted((Path(r.path).name, len(lib.history(r.content_hash))) for r in lib.records()))
"""


def test_chat_app_ingests_and_answers_with_both_engines_without_a_network_attempt(exported, tmp_path):
    """The chat app as a user runs it (model and engine from its settings file), headless: add a
    document, ingest it, ask, save the conversation; with PyTorch, then ONNX Runtime on the bundle,
    both in one library (the second session finds the first one's document and conversation)."""
    _done, _attempts, paths = exported
    torch_doc, ort_doc = tmp_path / "torch.txt", tmp_path / "ort.txt"
    torch_doc.write_text("The access code for the Lisbon vault is 4417.\n" * 20)
    ort_doc.write_text("The porter of the Porto vault keeps the key.\n" * 20)
    args = [str(torch_doc), str(paths["model"]), "torch", str(ort_doc), str(paths["bundle"]), "onnxruntime"]
    done, attempts = guarded(tmp_path, ["-c", CHAT_FLOW, *args], home=tmp_path / "home")
    assert done.returncode == 0, done.stderr[-3000:]
    assert attempts == []
    saved = done.stdout.strip().splitlines()[-1]  # each document: its own question and answer, no more
    assert saved == "[('ort.txt', 2), ('torch.txt', 2)]", saved
