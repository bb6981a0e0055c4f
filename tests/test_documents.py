"""Reading files and folders: stable order, .gitignore, binaries skipped, bad input reported."""

import pytest

from edgemem.documents import iter_text, scan
from edgemem.errors import EdgememError


def test_folder_walk_is_sorted_respects_gitignore_and_skips_binaries(tmp_path):
    (tmp_path / "b.py").write_text("print('b')\n")
    (tmp_path / "a.md").write_text("# A\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_text("c text\n")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "out.txt").write_text("generated\n")
    (tmp_path / "secret.log").write_text("ignored\n")
    (tmp_path / ".gitignore").write_text("build/\n*.log\n")
    (tmp_path / "image.png").write_bytes(b"\x89PNG\x00\x00binary")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref\n")
    source = scan(tmp_path)
    assert [p.as_posix() for p in source.files] == [".gitignore", "a.md", "b.py", "sub/c.txt"]
    assert source.skipped_binary == 1
    text = "".join(iter_text(source))
    assert "===== sub/c.txt =====\nc text" in text
    assert text.index("a.md") < text.index("b.py") < text.index("sub/c.txt")
    assert "generated" not in text and "ignored" not in text


def test_content_hash_follows_content(tmp_path):
    f = tmp_path / "doc.txt"
    f.write_text("one\n")
    first = scan(f).content_hash
    assert scan(f).content_hash == first
    f.write_text("two\n")
    assert scan(f).content_hash != first


def test_invalid_utf8_is_decoded_with_replacement_and_flagged(tmp_path):
    f = tmp_path / "latin1.txt"
    f.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    source = scan(f)
    assert source.invalid_utf8 == ["latin1.txt"]
    assert "".join(iter_text(source)) == "caf\ufffd au lait\n"


def test_long_single_line_is_streamed_in_pieces(tmp_path):
    f = tmp_path / "long.txt"
    f.write_text("word " * 600_000)  # 3 MB, no newline
    pieces = list(iter_text(scan(f)))
    assert len(pieces) > 1 and "".join(pieces) == "word " * 600_000
    assert max(len(p) for p in pieces) < 2 * (1 << 20)


def _file(root, name, data: bytes):
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: p / "missing.txt", "no such file"),
        (lambda p: _file(p, "empty.txt", b""), "empty"),
        (lambda p: _file(p, "x.bin", b"\x00\x01\x02"), "binary"),
        (lambda p: _file(p, "d/x.bin", b"\x00").parent, "no readable text"),
    ],
    ids=["missing", "empty", "binary", "folder-without-text"],
)
def test_bad_inputs_raise_one_clear_error(tmp_path, setup, message):
    with pytest.raises(EdgememError, match=message):
        scan(setup(tmp_path))
