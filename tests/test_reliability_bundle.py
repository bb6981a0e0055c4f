"""Engine bundles from elsewhere (edgemem.export.bundle): a manifest can name no file outside its
bundle (not by `..`, an absolute path or a symbolic link), and any damaged or forged manifest is
one EdgememError line, never another exception. Uses a synthetic bundle: `read_manifest` checks the
manifest and the files it lists without opening the graphs."""

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from edgemem.errors import EdgememError
from edgemem.export.bundle import MANIFEST, GraphSpec, Manifest, read_manifest


def good_manifest() -> dict:
    graphs = {
        "segment_step": GraphSpec("segment_step.onnx", ["input_ids"], ["state"], size=4),
        "answer": GraphSpec("answer.onnx", ["input_ids"], ["logits"], size=4),
    }
    manifest = Manifest(
        model_name="tiny",
        model_id="tiny@0",
        architecture="llama",
        adapter_hash="a" * 64,
        adapter_file_sha256=None,
        trained=False,
        segment_len=16,
        num_write_tokens=3,
        memory_layers=[2],
        d_mem=8,
        nu=3,
        state_shapes={"layers.2.A": [1, 48, 32], "layers.2.z": [1, 48]},
        kv={"layers": 5, "kv_heads": 2, "head_dim": 8},
        vocab_size=96,
        graphs=graphs,
        tokenizer_files=["tokenizer/tokenizer.json"],
        opset=17,
    )
    return json.loads(manifest.to_json())


def make_bundle(root: Path, manifest: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in ("segment_step.onnx", "answer.onnx"):
        (root / name).write_bytes(b"onnx")
    (root / "tokenizer").mkdir(exist_ok=True)
    (root / "tokenizer" / "tokenizer.json").write_text("{}")
    (root / MANIFEST).write_text(json.dumps(manifest or good_manifest()))
    return root


def test_the_synthetic_bundle_is_accepted(tmp_path):
    assert read_manifest(make_bundle(tmp_path / "b")).model_id == "tiny@0"


def test_a_symlink_inside_the_bundle_to_a_file_outside_is_refused(tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text('{"token": "x"}')
    bundle = make_bundle(tmp_path / "b")
    (bundle / "tokenizer" / "tokenizer.json").unlink()
    (bundle / "tokenizer" / "tokenizer.json").symlink_to(secret)
    with pytest.raises(EdgememError, match="points outside the bundle"):
        read_manifest(bundle)


def test_a_graph_symlinked_out_of_the_bundle_is_refused(tmp_path):
    bundle = make_bundle(tmp_path / "b")
    (bundle / "answer.onnx").unlink()
    (bundle / "answer.onnx").symlink_to("/etc/passwd")
    with pytest.raises(EdgememError, match="points outside the bundle"):
        read_manifest(bundle)


@pytest.mark.parametrize("plan", ["../plan.engine", "/tmp/plan.engine", "tensorrt/../../plan.engine"])
def test_tensorrt_plans_outside_the_bundle_are_refused(tmp_path, plan):
    (tmp_path / "plan.engine").write_bytes(b"plan")
    manifest = good_manifest()
    manifest["tensorrt"] = {"answer": plan}
    with pytest.raises(EdgememError, match="outside the bundle|not a relative path"):
        read_manifest(make_bundle(tmp_path / "b", manifest))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
FIELDS = [
    *good_manifest(),
    "graphs.segment_step",
    "graphs.answer",
    "graphs.answer.file",
    "graphs.answer.size",
]


def _replace(manifest: dict, field: str, value: object) -> dict:
    target, *path = field.split(".")
    if not path:
        manifest[target] = value
        return manifest
    node = manifest[target]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return manifest


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), value=JSON)
@example(field="graphs.answer.file", value="\x00")  # found by this test: a NUL byte made resolve() raise
def test_any_forged_manifest_field_is_one_line_error_or_accepted(tmp_path_factory, field, value):
    bundle = make_bundle(tmp_path_factory.mktemp("b"), _replace(good_manifest(), field, value))
    try:
        read_manifest(bundle)
    except EdgememError as exc:
        assert "\n" not in str(exc)


def _wrong_values(good: object) -> list[object]:
    """JSON values of another type than `good` (a null field that may be null gets no null or
    string), and for a list or a map one whose element is null."""
    values = [v for v in (None, True, 7, 1.5, "x", [], {}) if type(v) is not type(good)]
    if good is None:  # optional strings: null and a string are both valid
        values = [v for v in values if not isinstance(v, str)]
    if isinstance(good, list):
        values.append([None])
    if isinstance(good, dict):
        values.append({"k": None})
    return values


WRONG_TYPED = [
    (name, value)
    for name, good in good_manifest().items()
    if name != "format"  # checked first, by value: another format is its own error
    for value in _wrong_values(good)
]


@pytest.mark.parametrize(("field", "value"), WRONG_TYPED, ids=[f"{f}={v!r}" for f, v in WRONG_TYPED])
def test_every_wrong_typed_manifest_field_is_a_one_line_error_naming_it(tmp_path, field, value):
    """`tokenizer_files: null`, `tensorrt: null`, `graphs: {"k": null}` ... escaped `read_manifest`
    as TypeError/AttributeError before every field's JSON type was checked."""
    manifest = good_manifest()
    manifest[field] = value
    with pytest.raises(EdgememError, match=f"invalid manifest \\({field} should be") as caught:
        read_manifest(make_bundle(tmp_path / "b", manifest))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "text", ["", "{", "[]", "null", '"x"', "\x00\x00", '{"format": "edgemem-bundle/1"}'], ids=repr
)
def test_a_damaged_manifest_file_is_one_line_error(tmp_path, text):
    bundle = make_bundle(tmp_path / "b")
    (bundle / MANIFEST).write_text(text)
    with pytest.raises(EdgememError):
        read_manifest(bundle)
