"""Property-based tests of the file readers and the tokenizer path: for any bytes in any files,
`scan` + `iter_text` either refuse in one line (empty, binary) or hand on exactly the file's text
(invalid UTF-8 replaced), in bounded pieces, whatever the block boundaries; the token stream is cut
into whole segments and a tail without losing or adding a token."""

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_assistant import tiny_assistant, tiny_tokenizer

from edgemem import documents
from edgemem.armt import iter_segments, tokenize_stream
from edgemem.documents import ALWAYS_SKIPPED_DIRS, display, iter_text, scan
from edgemem.errors import EdgememError

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Bytes that stress the decoder: multi-byte starts, continuations, NUL, newlines, spaces, ASCII.
ODD_BYTES = st.binary(max_size=300) | st.lists(
    st.sampled_from(
        [b"\x00", b"\n", b" ", b"a", b"\xc3", b"\xa9", b"\xe2\x98\x83", b"\xf0\x9f", b"\xff", b"\r"]
    ),
    max_size=200,
).map(b"".join)


class Blocks:
    """Small read blocks and pieces, so that every boundary case shows up in short inputs."""

    def __init__(self, block: int, piece: int) -> None:
        self.values = {"BLOCK_BYTES": block, "MAX_PIECE_CHARS": piece}

    def __enter__(self):
        self.saved = {k: getattr(documents, k) for k in self.values}
        for k, v in self.values.items():
            setattr(documents, k, v)

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            setattr(documents, k, v)


@FUZZ
@given(data=ODD_BYTES, block=st.integers(1, 64), piece=st.integers(1, 64))
def test_any_file_is_refused_or_read_back_exactly(data, block, piece):
    with tempfile.TemporaryDirectory() as tmp, Blocks(block, piece):
        path = Path(tmp) / "f.txt"
        path.write_bytes(data)
        sniff = data[: min(block, documents.BINARY_SNIFF_BYTES)]
        if not data or b"\x00" in sniff:
            with pytest.raises(EdgememError, match="empty" if not data else "binary"):
                scan(path)
            return
        source = scan(path)
        pieces = list(iter_text(source))
        assert "".join(pieces) == data.decode("utf-8", "replace")
        assert all(len(p) <= piece + block + 4 for p in pieces)  # bounded, whatever the input
        assert (source.invalid_utf8 == ["f.txt"]) == (data.decode("utf-8", "replace").encode() != data)


NAMES = st.text(
    alphabet=st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=12,
).filter(lambda n: n not in (".", "..", ".gitignore") and len(n.encode()) < 200)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=st.dictionaries(st.lists(NAMES, min_size=1, max_size=3).map(tuple), ODD_BYTES, max_size=8))
def test_any_folder_scans_stably_and_reads_each_text_file(tree):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        written = {}
        for parts, data in tree.items():
            path = root.joinpath(*parts)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            except (FileExistsError, NotADirectoryError, IsADirectoryError):
                continue  # a name used both as a file and as a folder
            written[Path(*parts)] = data
        written = {p: d for p, d in written.items() if (root / p).is_file() and (root / p).read_bytes() == d}
        # files inside .git, .hg, __pycache__, ... are never read (hypothesis found `.hg/0`)
        written = {p: d for p, d in written.items() if not set(p.parts[:-1]) & ALWAYS_SKIPPED_DIRS}
        try:
            source = scan(root)
        except EdgememError as exc:
            assert "no readable text files" in str(exc)
            assert all(not d or b"\x00" in d[:8192] for d in written.values())
            return
        assert scan(root).content_hash == source.content_hash  # stable
        text = "".join(iter_text(source))
        for rel in source.files:
            assert (
                f"===== {display(rel.as_posix())} =====\n" + written[rel].decode("utf-8", "replace") in text
            )
        expected = {p for p, d in written.items() if d and b"\x00" not in d[:8192]}
        assert set(source.files) == expected


@FUZZ
@given(text=st.text(max_size=400), cut=st.integers(1, 50), S=st.integers(1, 40))
def test_the_token_stream_is_cut_into_segments_without_losing_a_token(text, cut, S):
    tokenizer = tiny_tokenizer()
    chunks = [text[i : i + cut] for i in range(0, len(text), cut)]
    ids = [i for chunk in tokenize_stream(chunks, tokenizer) for i in chunk]
    tail: list[int] = []
    segments = list(iter_segments(tokenize_stream(chunks, tokenizer), S, tail))
    assert all(len(s) == S for s in segments)
    assert [i for s in segments for i in s] + tail == ids
    assert 1 <= len(tail) <= S if ids else tail == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(min_size=1, max_size=200).filter(lambda d: b"\x00" not in d))
def test_any_text_file_ingests_with_the_tiny_model(tmp_path_factory, data):
    assistant = _assistant()
    root = tmp_path_factory.mktemp("ingest")
    (root / "f.txt").write_bytes(data)
    from edgemem.store import Library

    with Library(root / "lib") as lib:
        record, result, _ = assistant.ingest_scan(scan(root / "f.txt"), lib)
        assert result.tokens == record.tokens >= 1 and 1 <= len(result.tail_ids) <= 16
        assert lib.load(record, assistant.armt.state_shapes()).tail_ids == result.tail_ids


_CACHE: dict = {}


def _assistant():
    if "a" not in _CACHE:
        _CACHE["a"] = tiny_assistant(segment_len=16)
    return _CACHE["a"]


def test_display_names_are_always_encodable():
    name = os.fsdecode(b"caf\xe9-\xff.txt")
    with pytest.raises(UnicodeEncodeError):
        name.encode()
    assert display(name).encode() == "caf\ufffd-\ufffd.txt".encode()
