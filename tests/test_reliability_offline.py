"""The offline guarantee: edgemem's commands run with the network blocked, and make no attempt
to use it. Each CLI run happens in a child process whose sockets are guarded (any internet
connection or host name lookup fails and is logged) and, where the kernel lets us make one, inside
a fresh network namespace (`unshare -rn`: no interface but loopback)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fuzz.helpers import REPO, tiny_model_folder

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
    # One process runs the commands in turn (the CLI's own entry point each time): a Python start
    # with torch costs 10-30 s on a busy machine.
    code = (
        "import sys\nfrom edgemem.cli import app\n"
        f"for args in {commands!r}:\n"
        "    try:\n        app(args)\n"
        "    except SystemExit as exc:\n"
        "        if exc.code:\n            sys.exit(f'{args[0]} exited {exc.code}')\n"
    )
    done, attempts = guarded(tmp_path, ["-c", code], home=home)
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
