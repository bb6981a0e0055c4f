"""What the reliability and fuzz tests share: a tiny model folder the CLI can load, small corpora,
running code without root's permission override, and checking that a library is consistent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def tiny_model_folder(path: Path) -> Path:
    """The tiny random Llama and its character tokenizer saved as a Hugging Face folder."""
    from tiny import tiny_llama
    from tiny_assistant import tiny_tokenizer

    if not (path / "config.json").is_file():
        tiny_llama().save_pretrained(path)
        tiny_tokenizer().save_pretrained(path)
    return path


def write_corpora(data: Path, splits: tuple[str, ...] = ("test",)) -> None:
    """The three prose corpora the niah task reads, small, in `data`/corpora: three made-up
    documents a split, each 60 sentences (~6k characters: the character tokenizer's tokens)."""
    corpora = data / "corpora"
    corpora.mkdir(parents=True, exist_ok=True)
    for n, source in enumerate(("linux-doc", "python-doc", "gnu-manuals")):
        with open(corpora / f"{source}.jsonl", "w") as handle:
            for split in splits:
                for d in range(3):
                    text = "".join(
                        f"The river {n}{d} flows past mill number {i} before it reaches the sea. "
                        f"Nobody counts the boats on it.\n\n"
                        for i in range(60)
                    )
                    row = {"name": f"doc{d}", "kind": "prose", "text": text, "split": split, "sha256": "-"}
                    handle.write(json.dumps(row) + "\n")


def run_unprivileged(code: str, timeout: float = 120) -> dict:
    """Run Python `code` (which prints one JSON object last) where file permissions apply: as root,
    without the capabilities that bypass them (setpriv); otherwise as is."""
    prefix = []
    if os.geteuid() == 0:
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
    done = subprocess.run(
        [*prefix, sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_library_consistent(root: Path, shapes: dict[str, tuple[int, ...]] | None = None) -> None:
    """PRAGMA integrity_check passes and every entry's and checkpoint's state file is there, with
    its recorded sha256 (and loads as a valid state of these shapes)."""
    from edgemem.store import Library

    with Library(root) as lib:
        problems = lib.verify(shapes)
    assert problems == [], problems


def assert_same_state(a, b) -> None:
    assert (a.tokens, a.tail_ids, a.state.writes) == (b.tokens, b.tail_ids, b.state.writes)
    for name, tensor in a.state.named_tensors().items():
        assert torch.equal(tensor, b.state.named_tensors()[name]), name  # bit-identical
