"""Corpora: documents from real package layouts, fixed splits, idempotent preparation."""

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest

from edgemem.data import corpora
from edgemem.errors import EdgememError


def _deb(path: Path, files: dict[str, bytes]) -> Path:
    """A real Debian package file (ar archive with data.tar.xz) holding `files`."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    members = [(b"debian-binary", b"2.0\n"), (b"data.tar.xz", data.getvalue())]
    out = bytearray(b"!<arch>\n")
    for name, body in members:
        out += name.ljust(16) + b"0".ljust(12) + b"0".ljust(6) + b"0".ljust(6) + b"100644".ljust(8)
        out += str(len(body)).encode().ljust(10) + b"`\n" + body + (b"\n" if len(body) % 2 else b"")
    path.write_bytes(bytes(out))
    return path


INFO = (
    "This is bash.info.\n"
    "\x1f\nFile: bash.info,  Node: Top,  Next: Introduction,  Up: (dir)\n\nBash manual\n"
    "\x1f\nFile: bash.info,  Node: Introduction,  Next: Definitions,  Up: Top\n\n"
    "1 Introduction\nAbout bash.\n"
    "\x1f\nFile: bash.info,  Node: What is Bash?,  Up: Introduction\n\n1.1 What is Bash?\nA shell.\n"
    "\x1f\nFile: bash.info,  Node: Definitions,  Prev: Introduction,  Up: Top\n\n2 Definitions\nTerms.\n"
    "\x1f\nTag Table:\nNode: Top\x7f100\n\x1f\nEnd Tag Table\n"
)


def test_info_manual_is_cut_into_chapters_with_their_subnodes():
    docs = list(corpora.info_chapters("bash", INFO))
    assert [d.name for d in docs] == ["bash/Introduction", "bash/Definitions"]
    assert "A shell." in docs[0].text and "About bash." in docs[0].text
    assert "Tag Table" not in "".join(d.text for d in docs)


def test_linux_docs_are_joined_per_subsystem_and_translations_skipped(tmp_path):
    base = tmp_path / "usr/share/doc/linux-doc-6.1/Documentation"
    for rel, text in {
        "networking/a.rst.gz": "Alpha",
        "networking/sub/b.rst.gz": "Beta",
        "mm/c.rst.gz": "Gamma",
        "translations/zh_CN/d.rst.gz": "Delta",
    }.items():
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_bytes(gzip.compress(text.encode()))
    docs = {d.name: d.text for d in corpora.linux_docs(tmp_path)}
    assert set(docs) == {"networking", "mm"}
    assert docs["networking"].index("Alpha") < docs["networking"].index("Beta")
    assert "===== networking/sub/b.rst =====" in docs["networking"]


def test_hash_split_is_stable_and_roughly_80_10_10():
    names = [f"doc{i}" for i in range(3000)]
    splits = [corpora.hash_split("src", n) for n in names]
    assert splits == [corpora.hash_split("src", n) for n in names]
    share = {s: splits.count(s) / len(splits) for s in corpora.SPLITS}
    assert 0.76 < share["train"] < 0.84 and 0.07 < share["test"] < 0.13


def test_committed_split_lists_never_put_a_document_in_two_splits():
    lists = sorted(corpora.SPLITS_DIR.glob("*.tsv"))
    assert {p.stem for p in lists} == set(corpora.SOURCES)
    for path in lists:
        recorded = corpora.committed_splits(path.stem)  # raises on a name in two splits
        assert recorded and set(recorded.values()) <= {"validation", "test"}


def test_committed_split_wins_over_the_hash_rule():
    recorded = {"x": "test"}
    assert corpora.split_of("src", "x", recorded) == "test"
    assert corpora.split_of("src", "y", recorded) == corpora.hash_split("src", "y")


def test_prepare_builds_a_corpus_from_package_files_once(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    autoconf = INFO.replace("bash", "autoconf")
    _deb(raw / "bash-doc_1_all.deb", {"usr/share/info/bash.info.gz": gzip.compress(INFO.encode())})
    _deb(
        raw / "autoconf-doc_1_all.deb", {"usr/share/info/autoconf.info.gz": gzip.compress(autoconf.encode())}
    )
    lines: list[str] = []
    meta = corpora.prepare(["gnu-manuals"], root=tmp_path, log=lines.append)[0]
    assert meta["documents"] == 4
    rows = list(corpora.load("gnu-manuals", root=tmp_path))
    assert {r["name"] for r in rows} == {
        "bash/Introduction",
        "bash/Definitions",
        "autoconf/Introduction",
        "autoconf/Definitions",
    }
    recorded = corpora.committed_splits("gnu-manuals")
    assert all(r["split"] == corpora.split_of("gnu-manuals", r["name"], recorded) for r in rows)
    before = (tmp_path / "gnu-manuals.jsonl").stat().st_mtime_ns
    corpora.prepare(["gnu-manuals"], root=tmp_path, log=lines.append)
    assert "up to date" in lines[-1]
    assert (tmp_path / "gnu-manuals.jsonl").stat().st_mtime_ns == before
    assert json.loads((tmp_path / "gnu-manuals.meta.json").read_text())["splits"]


def test_corpora_version_id_changes_with_the_package_files_and_only_with_them(tmp_path):
    """Evaluation lines record it: items cut from another package version are other text."""
    raw = tmp_path / "raw"
    raw.mkdir()
    _deb(raw / "bash-doc_1_all.deb", {"usr/share/info/bash.info.gz": gzip.compress(INFO.encode())})
    _deb(raw / "autoconf-doc_1_all.deb", {"usr/share/info/autoconf.info.gz": gzip.compress(INFO.encode())})
    missing = corpora.version_id(["gnu-manuals"], root=tmp_path)
    corpora.prepare(["gnu-manuals"], root=tmp_path, log=lambda s: None)
    first = corpora.version_id(["gnu-manuals"], root=tmp_path)
    assert first != missing and len(first) == 12
    corpora.prepare(["gnu-manuals"], root=tmp_path, log=lambda s: None)  # same inputs: same id
    assert corpora.version_id(["gnu-manuals"], root=tmp_path) == first
    (raw / "bash-doc_1_all.deb").unlink()
    newer = INFO.replace("About bash.", "About bash, version 2.")
    _deb(raw / "bash-doc_2_all.deb", {"usr/share/info/bash.info.gz": gzip.compress(newer.encode())})
    corpora.prepare(["gnu-manuals"], root=tmp_path, log=lambda s: None)
    assert corpora.version_id(["gnu-manuals"], root=tmp_path) != first


def test_unknown_or_unprepared_corpus_is_a_clear_error(tmp_path):
    with pytest.raises(EdgememError, match="unknown corpus"):
        corpora.prepare(["wikipedia"], root=tmp_path)
    with pytest.raises(EdgememError, match="edgemem data prepare"):
        list(corpora.load("pandas", root=tmp_path))


def test_a_file_that_is_not_a_deb_is_refused(tmp_path):
    bad = tmp_path / "x.deb"
    bad.write_bytes(b"not an archive")
    with pytest.raises(EdgememError, match="not a Debian package"):
        corpora._extract_deb(bad, tmp_path / "out")
