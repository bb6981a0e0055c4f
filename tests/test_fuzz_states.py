"""Fuzzing what edgemem reads back from disk: library state files, adapter files, GGUF headers.

Every damaged, truncated or forged file must end in an EdgememError (one line for the user) or
load as exactly what was saved; never another exception, a hang, a huge allocation, or a read or
delete outside the library's states folder. Forged files get a matching sha256 in the database, so
the parser behind the checksum is what is exercised."""

import json
import struct

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from safetensors.torch import save

from edgemem.armt import ARMTConfig, IngestResult, MemoryState, read_adapter
from edgemem.errors import EdgememError
from edgemem.models import load_model
from edgemem.store import Library, _sha256

SHAPES = {"layers.3.A": (1, 6, 4), "layers.3.z": (1, 6)}
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def good_doc() -> IngestResult:
    g = torch.Generator().manual_seed(0)
    state = MemoryState({3: torch.randn(1, 6, 4, generator=g)}, {3: torch.rand(1, 6, generator=g)}, 3)
    return IngestResult(state, [5, 6, 7], 51)


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    with Library(tmp_path_factory.mktemp("lib")) as lib:
        record = lib.save("/docs/a.txt", "hash-a", "model@1", "adapter-1", good_doc())
        yield lib, record, (lib.states / record.state_file).read_bytes()


def load_forged(lib, record, data: bytes):
    """Put `data` in the record's file with a matching sha256, then load it."""
    (lib.states / record.state_file).write_bytes(data)
    with lib.db:
        lib.db.execute("UPDATE documents SET state_sha256 = ? WHERE id = ?", (_sha256(data), record.id))
    return lib.load(lib.get(record.id), SHAPES)


def assert_valid_or_refused(lib, record, data: bytes) -> None:
    """A forged file with a matching checksum is refused in one line, or is a valid state."""
    try:
        result = load_forged(lib, record, data)
    except EdgememError as exc:
        assert "\n" not in str(exc)
        return
    shapes = {k: tuple(v.shape) for k, v in result.state.named_tensors().items()}
    assert shapes == SHAPES and result.state.writes >= 0 and result.tokens >= len(result.tail_ids)
    assert all(bool(torch.isfinite(t).all()) for t in result.state.named_tensors().values())
    assert all(isinstance(i, int) for i in result.tail_ids)


@FUZZ
@given(cut=st.integers(min_value=0, max_value=10_000))
def test_truncated_state_files_are_refused(library, cut):
    lib, record, data = library
    assert_valid_or_refused(lib, record, data[: cut % len(data)])


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1, max_size=8))
def test_state_files_with_flipped_bytes_are_refused_or_valid(library, flips):
    lib, record, data = library
    forged = bytearray(data)
    for position, mask in flips:
        forged[position % len(forged)] ^= mask
    assume(bytes(forged) != data)  # two flips of one byte can cancel
    (lib.states / record.state_file).write_bytes(bytes(forged))  # damaged on disk: the checksum says so
    with pytest.raises(EdgememError, match="corrupt"):
        lib.load(record, SHAPES)
    assert_valid_or_refused(lib, record, bytes(forged))  # forged, checksum and all


def _with_header(data: bytes, edit) -> bytes:
    """The file with its JSON header changed by `edit(header)` (tensor data kept as is)."""
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    edit(header)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data[8 + size :]


FORGERIES = {
    "header-longer-than-file": lambda d: struct.pack("<Q", 2**62) + d[8:],
    "header-not-json": lambda d: struct.pack("<Q", 4) + b"{{{{" + d[12:],
    "header-a-list": lambda d: struct.pack("<Q", 2) + b"[]" + d[10:],
    "offsets-past-the-end": lambda d: _with_header(
        d, lambda h: h["layers.3.A"].update(data_offsets=[0, 10**12])
    ),
    "offsets-overlap": lambda d: _with_header(d, lambda h: h["layers.3.z"].update(data_offsets=[0, 24])),
    "shape-lies": lambda d: _with_header(d, lambda h: h["layers.3.A"].update(shape=[1, 6, 400000000])),
    "wrong-shape": lambda d: _with_header(d, lambda h: h["layers.3.z"].update(shape=[2, 3])),
    "dtype-f16": lambda d: _with_header(d, lambda h: h["layers.3.z"].update(dtype="F16", shape=[1, 12])),
    "tail-as-float": lambda d: _with_header(d, lambda h: h["tail_ids"].update(dtype="F64")),
    "missing-tensor": lambda d: _with_header(d, lambda h: h.pop("layers.3.z")),
    "no-metadata": lambda d: _with_header(d, lambda h: h.pop("__metadata__")),
    "metadata-not-strings": lambda d: _with_header(d, lambda h: h["__metadata__"].update(writes=3)),
    "other-format": lambda d: _with_header(d, lambda h: h["__metadata__"].update(format="x/1")),
    "other-model": lambda d: _with_header(d, lambda h: h["__metadata__"].update(model_id="evil@0")),
    "negative-writes": lambda d: _with_header(d, lambda h: h["__metadata__"].update(writes="-1")),
    "tokens-not-a-number": lambda d: _with_header(d, lambda h: h["__metadata__"].update(tokens="1e9")),
    "empty-file": lambda d: b"",
}


@pytest.mark.parametrize("forgery", FORGERIES)
def test_forged_state_files_are_refused_in_one_line(library, forgery):
    lib, record, data = library
    with pytest.raises(EdgememError) as caught:
        load_forged(lib, record, FORGERIES[forgery](data))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("what", "value"), [("nan", float("nan")), ("inf", float("inf"))], ids=["nan", "inf"]
)
def test_states_with_nan_or_inf_are_refused(library, what, value):
    lib, record, _ = library
    doc = good_doc()
    doc.state.z[3][0, 2] = value
    tensors = {**doc.state.named_tensors(), "tail_ids": torch.tensor(doc.tail_ids)}
    meta = {"format": "edgemem-state/1", "model_id": "model@1", "adapter_hash": "adapter-1"}
    meta |= {"content_hash": "hash-a", "writes": "3", "tokens": "51"}
    with pytest.raises(EdgememError, match="NaN or infinite"):
        load_forged(lib, record, save(tensors, metadata=meta))


def test_a_huge_state_file_is_refused_without_reading_it(library):
    lib, record, data = library
    path = lib.states / record.state_file
    with open(path, "wb") as handle:
        handle.truncate(8 << 30)  # 8 GB, sparse: reading it whole would exhaust memory
    try:
        with pytest.raises(EdgememError, match="far larger"):
            lib.load(record, SHAPES)
    finally:
        path.write_bytes(data)


@pytest.mark.parametrize("name", ["../../victim.txt", "/etc/passwd", "states/../x.safetensors", ""])
def test_a_forged_row_cannot_read_or_delete_outside_the_states_folder(tmp_path, name):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    with Library(tmp_path / "lib") as lib:
        record = lib.save("/docs/a.txt", "hash-a", "model@1", "adapter-1", good_doc())
        with lib.db:
            lib.db.execute("UPDATE documents SET state_file = ? WHERE id = ?", (name, record.id))
        with pytest.raises(EdgememError, match="invalid file name"):
            lib.load(lib.get(record.id), SHAPES)
        assert any("invalid file name" in p for p in lib.verify())
        lib.remove(record.id)
    assert victim.read_text() == "keep me\n"


# ----- adapters -----


def adapter_bytes(config: dict | None = None, tensors: dict | None = None) -> bytes:
    tensors = tensors or {"write_embeddings": torch.zeros(3, 32)}
    config = config or json.loads(ARMTConfig.for_model(5, segment_len=16).to_json())
    return save(tensors, metadata={"format": "edgemem-adapter/1", "config": json.dumps(config)})


@pytest.mark.parametrize(
    "config",
    [
        {"segment_len": 0},
        {"segment_len": -16},
        {"segment_len": True},
        {"num_write_tokens": 0},
        {"d_mem": 10**9},
        {"nu": 0},
        {"memory_layers": []},
        {"memory_layers": ["2"]},
        {"memory_layers": [2, 2]},
        {"memory_layers": 7},
        {"surprise": 1},
    ],
    ids=repr,
)
def test_adapters_with_unusable_configs_are_refused(tmp_path, config):
    """A segment length of 0 would make the ingest loop forever; the rest cannot build a memory."""
    good = json.loads(ARMTConfig.for_model(5, segment_len=16).to_json())
    path = tmp_path / "adapter.safetensors"
    path.write_bytes(adapter_bytes({**good, **config}))
    with pytest.raises(EdgememError, match="invalid memory config"):
        read_adapter(path)


def test_adapters_with_non_finite_tensors_are_refused(tmp_path):
    path = tmp_path / "adapter.safetensors"
    path.write_bytes(adapter_bytes(tensors={"write_embeddings": torch.full((3, 32), float("nan"))}))
    with pytest.raises(EdgememError, match="not finite"):
        read_adapter(path)


@FUZZ
@given(
    cut=st.integers(0, 5000), flips=st.lists(st.tuples(st.integers(0, 5000), st.integers(1, 255)), max_size=4)
)
def test_damaged_adapter_files_are_refused_or_read(tmp_path, cut, flips):
    data = bytearray(adapter_bytes())
    for position, mask in flips:
        data[position % len(data)] ^= mask
    path = tmp_path / "adapter.safetensors"
    path.write_bytes(bytes(data[: cut % (len(data) + 1)]))
    try:
        config, tensors = read_adapter(path)
    except EdgememError as exc:
        assert "\n" not in str(exc)
    else:
        assert config.segment_len >= 1 and all(bool(torch.isfinite(t).all()) for t in tensors.values())


# ----- GGUF -----


def tiny_gguf(path) -> bytes:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def _gguf_forgeries(data: bytes) -> dict[str, bytes]:
    name = data.find(b"token_embd.weight") + len("token_embd.weight")
    (ndims,) = struct.unpack("<I", data[name : name + 4])
    dims, offset = name + 4, name + 4 + 8 * ndims + 4
    key = data.find(b"general.architecture")

    def patch(at: int, value: bytes) -> bytes:
        return data[:at] + value + data[at + len(value) :]

    return {
        "wrong-magic": b"GGML" + data[4:],
        "zip": b"PK\x03\x04" + data[4:],
        "version-99": patch(4, struct.pack("<I", 99)),
        "tensor-count-lies": patch(8, struct.pack("<Q", 2**60)),
        "key-count-lies": patch(16, struct.pack("<Q", 2**60)),
        "string-length-lies": patch(key - 8, struct.pack("<Q", 2**62)),
        "tensor-dims-lie": patch(dims, struct.pack("<Q", 2**40)),
        "tensor-offset-past-the-end": patch(offset, struct.pack("<Q", 10**9)),
        "truncated-data": data[:-40],
        "header-only": data[:24],
        "four-bytes": data[:4],
    }


@pytest.mark.parametrize(
    "forgery",
    [
        "wrong-magic",
        "zip",
        "version-99",
        "tensor-count-lies",
        "key-count-lies",
        "string-length-lies",
        "tensor-dims-lie",
        "tensor-offset-past-the-end",
        "truncated-data",
        "header-only",
        "four-bytes",
    ],
)
def test_forged_gguf_files_are_refused_in_one_line(tmp_path, forgery):
    data = tiny_gguf(tmp_path / "good.gguf")
    path = tmp_path / f"{forgery}.gguf"
    path.write_bytes(_gguf_forgeries(data)[forgery])
    with pytest.raises(EdgememError) as caught:
        load_model(str(path))
    message = str(caught.value)
    assert "\n" not in message and ("GGUF" in message or "gguf" in message), message
