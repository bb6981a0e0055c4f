"""ONNX engine bundles: `edgemem export` on a tiny model, ONNX Runtime against PyTorch, the
manifest checks, int8, and `edgemem ask --engine` end to end.

One bundle is exported through the CLI per module (about a minute on 2 cores) from a tiny random
Llama saved as a model folder, with a memory adapter that carries information (non-zero W_V), and
every test here uses it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny import tiny_llama
from tiny_assistant import tiny_assistant
from typer.testing import CliRunner

from edgemem.armt import ingest, save_adapter, tokenize_stream
from edgemem.assistant import Assistant
from edgemem.cli import app
from edgemem.documents import iter_text, scan
from edgemem.errors import EdgememError
from edgemem.export.bundle import MANIFEST, check_fits, read_manifest
from edgemem.export.quantize import quantize_bundle
from edgemem.files import sha256_file
from edgemem.runtime import OrtEngine, OrtOptions, TorchRuntime, open_engine
from edgemem.store import Library

runner = CliRunner()
SEGMENT = 16
TEXT = "The access code for the Lisbon vault is 4417. " * 12 + "Ask the porter for the key.\n"


def run(*args: str):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def assert_one_line_error(result, text: str) -> None:
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and text in lines[0], result.stderr


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny model folder, its adapter file, and the bundle `edgemem export` makes of them."""
    root = tmp_path_factory.mktemp("export")
    reference = tiny_assistant(segment_len=SEGMENT)
    folder = root / "tiny-llama"
    tiny_llama(0).save_pretrained(folder)  # the same weights, without the memory wrappers
    reference.loaded.tokenizer.save_pretrained(folder)
    adapter = root / "adapter.safetensors"
    save_adapter(reference.armt, adapter)
    bundle = root / "bundle"
    result = run("export", "--model", folder, "--adapter", adapter, "--out", bundle)
    assert result.exit_code == 0, result.output
    return {"root": root, "folder": folder, "adapter": adapter, "bundle": bundle}


@pytest.fixture(scope="module")
def torch_assistant(tiny):
    return Assistant.open(str(tiny["folder"]), tiny["adapter"], dtype=torch.float32)


def random_segments(count: int, seed: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 96, (1, SEGMENT), generator=g) for _ in range(count)]


def test_export_writes_a_complete_bundle(tiny):
    manifest = read_manifest(tiny["bundle"], verify=True)  # sizes and sha256 of both graphs
    assert manifest.opset == 18 and manifest.segment_len == SEGMENT and manifest.num_write_tokens == 3
    assert manifest.trained and manifest.quantization is None
    assert manifest.model_name == "tiny-llama" and manifest.adapter_file_sha256
    assert set(manifest.state_shapes) == {"layers.2.A", "layers.2.z"}
    assert manifest.state_shapes["layers.2.A"] == [1, 48, 32]
    assert "tokenizer/tokenizer.json" in manifest.tokenizer_files
    assert {"torch", "onnx", "onnxruntime", "transformers"} <= set(manifest.versions)
    assert not [p for p in tiny["bundle"].parent.iterdir() if ".building-" in p.name]  # no leftovers


def test_export_refuses_an_existing_folder_without_force(tiny):
    result = run("export", "--model", tiny["folder"], "--adapter", tiny["adapter"], "--out", tiny["bundle"])
    assert_one_line_error(result, "pass --force")


def test_ort_state_after_8_segments_matches_torch(tiny, torch_assistant):
    torch_rt, ort_rt = torch_assistant.runtime, open_engine(tiny["bundle"])
    assert ort_rt.adapter_hash == torch_rt.adapter_hash and ort_rt.model_id == torch_rt.model_id
    a, b = torch_rt.empty_state(), ort_rt.empty_state()
    with torch.inference_mode():
        for ids in random_segments(8):
            a, _ = torch_rt.step(ids, a)
            b, _ = ort_rt.step(ids, b)
    assert b.writes == a.writes == 8
    for name, tensor in a.named_tensors().items():
        other = b.named_tensors()[name]
        assert tensor.abs().max() > 0
        torch.testing.assert_close(other, tensor, rtol=1e-4, atol=1e-6 * float(tensor.abs().max()))


def test_ort_answer_logits_and_greedy_ids_match_torch(tiny, torch_assistant):
    torch_rt = torch_assistant.runtime
    engine = OrtEngine(tiny["bundle"])
    state = torch_rt.empty_state()
    with torch.inference_mode():
        for ids in random_segments(4):
            state, _ = torch_rt.step(ids, state)
        prompt = list(range(5, 40))
        reference = torch_assistant.armt.read_only_forward(torch.tensor([prompt]), state)[0].numpy()
    numpy_state = {k: v.numpy() for k, v in state.named_tensors().items()}
    logits, past = engine.forward(prompt, engine.empty_past(), numpy_state)
    np.testing.assert_allclose(logits, reference, rtol=1e-4, atol=1e-4)
    assert past[0].shape[2] == len(prompt)  # the prefill's cache
    expected = list(torch_rt.generate_ids(state, prompt, set(), max_new_tokens=24))
    assert list(engine.generate_ids(numpy_state, prompt, set(), max_new_tokens=24)) == expected


def test_bundle_runs_in_a_process_without_torch(tiny, torch_assistant):
    script = f"""
import json, sys
from edgemem.runtime import OrtEngine
engine = OrtEngine({str(tiny["bundle"])!r})
state = engine.empty_state()
for seed in range(3):
    state = engine.step([(seed * 7 + i) % 90 + 3 for i in range({SEGMENT})], state)
from tokenizers import Tokenizer
tok = Tokenizer.from_file({str(tiny["bundle"] / "tokenizer" / "tokenizer.json")!r})
prompt = tok.encode("Question: what is the code?").ids
ids = list(engine.generate_ids(state, prompt, set(), max_new_tokens=8))
assert "torch" not in sys.modules and "transformers" not in sys.modules, "torch was imported"
print(json.dumps({{"ids": ids, "prompt": prompt}}))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    rt = torch_assistant.runtime
    state = rt.empty_state()
    with torch.inference_mode():
        for seed in range(3):
            ids = torch.tensor([[(seed * 7 + i) % 90 + 3 for i in range(SEGMENT)]])
            state, _ = rt.step(ids, state)
    assert out["prompt"] == torch_assistant.loaded.tokenizer("Question: what is the code?").input_ids
    assert out["ids"] == list(rt.generate_ids(state, out["prompt"], set(), max_new_tokens=8))


def test_ask_engine_end_to_end_gives_the_torch_answer(tiny, torch_assistant, tmp_path):
    doc = tmp_path / "vault.txt"
    doc.write_text(TEXT + "(engine copy)\n")
    question = "What is the code?"
    on_engine = run("ask", doc, question, "--engine", tiny["bundle"], "--max-new-tokens", "12")
    assert on_engine.exit_code == 0, on_engine.output
    tokens = tokenize_stream(iter_text(scan(doc)), torch_assistant.loaded.tokenizer)
    reference = ingest(torch_assistant.armt, tokens)  # PyTorch, outside the library
    expected = "".join(torch_assistant.ask(reference, question, max_new_tokens=12))
    assert expected.strip() and on_engine.stdout.strip() == expected.strip()


def test_an_answer_window_travels_into_the_bundle_and_the_engine_answers_as_torch(tiny, tmp_path):
    """An adapter with an answer window exports with it (the manifest's memory config): the engine
    leaves the same last tokens unwritten, in view, and gives the PyTorch answer."""
    window = 3 * SEGMENT
    adapter = tmp_path / "windowed.safetensors"
    save_adapter(tiny_assistant(segment_len=SEGMENT, answer_window=window).armt, adapter)
    bundle = tmp_path / "bundle"
    result = run("export", "--model", tiny["folder"], "--adapter", adapter, "--out", bundle)
    assert result.exit_code == 0, result.output
    assert Assistant.open_engine(bundle).runtime.config.answer_window == window
    doc = tmp_path / "vault.txt"
    doc.write_text(TEXT * 2)
    question = "What is the code?"
    on_engine = run("ask", doc, question, "--engine", bundle, "--max-new-tokens", "12")
    assert on_engine.exit_code == 0, on_engine.output
    reference_assistant = Assistant.open(str(tiny["folder"]), adapter, dtype=torch.float32)
    tokens = tokenize_stream(iter_text(scan(doc)), reference_assistant.loaded.tokenizer)
    reference = ingest(reference_assistant.armt, tokens)
    assert window - SEGMENT < len(reference.tail_ids) <= window and reference.state.writes > 0
    expected = "".join(reference_assistant.ask(reference, question, max_new_tokens=12))
    assert expected.strip() and on_engine.stdout.strip() == expected.strip()


def test_export_answer_window_overrides_the_adapters_and_says_so(tiny, tmp_path):
    """`edgemem export --answer-window N` bundles the adapter with that window (as `ask
    --answer-window` answers with it) and reports it; without the flag the adapter's own window
    (here none) is kept. A window shorter than a segment, or one asked of a quantized copy (which
    keeps its source's), is refused in one line."""
    window = 3 * SEGMENT
    bundle = tmp_path / "bundle"
    args = ("export", "--model", tiny["folder"], "--adapter", tiny["adapter"], "--out", bundle)
    result = run(*args, "--answer-window", window)
    assert result.exit_code == 0, result.output
    assert f"answer window {window} tokens" in result.output
    assert Assistant.open_engine(bundle).runtime.config.answer_window == window
    assert Assistant.open_engine(tiny["bundle"]).runtime.config.answer_window == 0
    short = run(*args[:-1], tmp_path / "short", "--answer-window", SEGMENT - 1)
    assert_one_line_error(short, f"answer_window {SEGMENT - 1} is neither 0 nor")
    quantized = run(
        "export",
        "--from",
        tiny["bundle"],
        "--quantize",
        "int8",
        "--out",
        tmp_path / "q",
        "--answer-window",
        window,
    )
    assert_one_line_error(quantized, "keeps that bundle's answer window")
    assert not (tmp_path / "short").exists()


def test_a_read_gate_travels_into_the_bundle_and_the_engine_answers_as_torch(tiny, tmp_path):
    """An adapter with a read gate (trained-looking: g varies by token) exports with it: the
    manifest says so, and the engine's answer logits are PyTorch's, which the gate changes."""
    gated = tiny_assistant(segment_len=SEGMENT, read_gate=True)
    with torch.no_grad():  # a memory loud enough that its gate shows in the logits
        for memory in gated.armt.memories.values():
            memory.W_V.weight.mul_(100)
    adapter = tmp_path / "gated.safetensors"
    save_adapter(gated.armt, adapter)
    bundle = tmp_path / "bundle"
    result = run("export", "--model", tiny["folder"], "--adapter", adapter, "--out", bundle)
    assert result.exit_code == 0, result.output
    assert Assistant.open_engine(bundle).runtime.config.read_gate
    reference = Assistant.open(str(tiny["folder"]), adapter, dtype=torch.float32)
    state = reference.runtime.empty_state()
    prompt = list(range(5, 40))
    with torch.inference_mode():
        for ids in random_segments(4):
            state, _ = reference.runtime.step(ids, state)
        expected = reference.armt.read_only_forward(torch.tensor([prompt]), state)[0].numpy()
        for memory in reference.armt.memories.values():  # the gate open (g = 1) everywhere
            memory.gate_w.zero_()
        ungated = reference.armt.read_only_forward(torch.tensor([prompt]), state)[0].numpy()
    engine = OrtEngine(bundle)
    numpy_state = {k: v.numpy() for k, v in state.named_tensors().items()}
    logits, _ = engine.forward(prompt, engine.empty_past(), numpy_state)
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)
    # the gate is in the graph: it moves the logits 10x further than the engine strays from PyTorch
    assert np.abs(ungated - expected).max() > 1e-3


def test_states_are_shared_between_torch_and_the_fp32_engine(tiny, torch_assistant, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(TEXT * 2)
    with Library(tmp_path / "lib") as library:
        record, ingested, reused = torch_assistant.ingest_scan(scan(doc), library)
        assert not reused
        on_engine = Assistant.open_engine(tiny["bundle"])
        record2, loaded, reused = on_engine.ingest_scan(scan(doc), library)
        assert reused and record2.id == record.id
        question = "What is the code?"
        expected = "".join(torch_assistant.ask(ingested, question, max_new_tokens=10))
        assert "".join(on_engine.ask(loaded, question, max_new_tokens=10)) == expected


def test_ort_ingest_resumes_to_the_uninterrupted_state(tiny):
    rt = open_engine(tiny["bundle"])
    chunks = [list(range(3, 90))] * 2
    full = ingest(rt, chunks)
    first = ingest(rt, [chunks[0][: 3 * SEGMENT + 1]])  # 3 whole segments, then a checkpoint
    resumed = ingest(rt, chunks, first.state, start_tokens=3 * SEGMENT)
    assert resumed.tail_ids == full.tail_ids
    for name, tensor in full.state.named_tensors().items():
        assert torch.equal(resumed.state.named_tensors()[name], tensor)


def test_engine_refuses_another_model_or_adapter(tiny, tmp_path):
    with pytest.raises(EdgememError, match="exported from tiny-llama, not smollm2"):
        open_engine(tiny["bundle"], model="smollm2-135m-instruct")
    other = tiny_assistant(segment_len=SEGMENT, seed=5)
    save_adapter(other.armt, tmp_path / "other.safetensors")
    with pytest.raises(EdgememError, match="another adapter"):
        open_engine(tiny["bundle"], adapter=tmp_path / "other.safetensors")
    doc = tmp_path / "d.txt"
    doc.write_text(TEXT)
    result = run("ask", doc, "q?", "--engine", tiny["bundle"], "--adapter", tmp_path / "other.safetensors")
    assert_one_line_error(result, "export it again with this adapter")


def test_engine_refuses_a_state_of_another_shape(tiny):
    manifest = read_manifest(tiny["bundle"])
    with pytest.raises(EdgememError, match="another shape"):
        check_fits(manifest, tiny["bundle"], state_shapes={"layers.2.A": (1, 48, 64), "layers.2.z": (1, 48)})
    engine = OrtEngine(tiny["bundle"])
    with pytest.raises(EdgememError, match="other tensors"):
        engine.step([3] * SEGMENT, {"layers.7.A": np.zeros((1, 48, 32), np.float32)})


def edited_copy(tiny, tmp_path, edit) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(tiny["bundle"], copy)
    data = json.loads((copy / MANIFEST).read_text())
    edit(data)
    (copy / MANIFEST).write_text(json.dumps(data))
    return copy


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["graphs"]["segment_step"].update(file="../../etc/passwd"), "points outside the bundle"),
        (lambda d: d["graphs"]["answer"].update(file="/etc/passwd"), "not a relative path"),
        (lambda d: d["tokenizer_files"].append("../secret.json"), "points outside the bundle"),
        (lambda d: d["graphs"]["answer"].update(size=12), "wrong size"),
        (lambda d: d.update(format="edgemem-bundle/0"), "format"),
        (lambda d: d.pop("state_shapes"), "invalid manifest"),
        (lambda d: d["graphs"].pop("answer"), "no answer graph"),
    ],
)
def test_manifest_validation_refuses_bad_bundles(tiny, tmp_path, edit, message):
    with pytest.raises(EdgememError, match=message):
        read_manifest(edited_copy(tiny, tmp_path, edit))


def test_engine_with_a_damaged_memory_config_is_refused_in_one_line(tiny, tmp_path):
    copy = edited_copy(tiny, tmp_path, lambda d: d.update(armt_config='{"segment_len": "long"}'))
    with pytest.raises(EdgememError, match="invalid memory config"):
        open_engine(copy)


def test_graph_that_disagrees_with_its_manifest_is_refused(tiny, tmp_path):
    def wrong_memory(data):
        data["state_shapes"]["layers.2.A"] = [1, 48, 64]

    engine = OrtEngine(edited_copy(tiny, tmp_path, wrong_memory))
    with pytest.raises(EdgememError, match="expects other shapes than its manifest"):
        engine.step([3] * SEGMENT, engine.empty_state())


def test_ort_steps_a_tail_of_1_to_s_tokens_as_torch_does(tiny, torch_assistant):
    """The step graph takes 1..S tokens: an answer writes the document's tail (`answer_state`)."""
    torch_rt, ort_rt = torch_assistant.runtime, open_engine(tiny["bundle"])
    assert ort_rt.engine.partial_segments()
    g = torch.Generator().manual_seed(5)
    for n in (1, 5, SEGMENT - 1):
        ids = torch.randint(0, 96, (1, n), generator=g)
        with torch.inference_mode():
            a, _ = torch_rt.step(ids, torch_rt.step(random_segments(1)[0], torch_rt.empty_state())[0])
            b, _ = ort_rt.step(ids, ort_rt.step(random_segments(1)[0], ort_rt.empty_state())[0])
        for name, tensor in a.named_tensors().items():
            torch.testing.assert_close(b.named_tensors()[name], tensor, rtol=1e-4, atol=1e-6)
    with pytest.raises(EdgememError, match=f"steps segments of 1..{SEGMENT} tokens, not {SEGMENT + 1}"):
        ort_rt.engine.step([3] * (SEGMENT + 1), ort_rt.engine.empty_state())


def test_a_bundle_exported_for_whole_segments_only_refuses_a_tail_in_one_line(tiny, tmp_path):
    """Bundles exported before answers wrote the tail declare input_ids [1, S]: they still ingest,
    and an answer over a document with a tail says to export again."""
    import onnx

    copy = tmp_path / "old"
    shutil.copytree(tiny["bundle"], copy)
    step = copy / "segment_step.onnx"
    graph = onnx.load(str(step), load_external_data=False)
    graph.graph.input[0].type.tensor_type.shape.dim[1].dim_value = SEGMENT  # as the old export wrote it
    onnx.save(graph, str(step))
    data = json.loads((copy / MANIFEST).read_text())
    data["graphs"]["segment_step"]["size"] = step.stat().st_size
    data["graphs"]["segment_step"]["sha256"] = sha256_file(step)
    (copy / MANIFEST).write_text(json.dumps(data))
    engine = OrtEngine(copy)
    assert not engine.partial_segments()
    state = engine.step([3] * SEGMENT, engine.empty_state())  # whole segments: as before
    with pytest.raises(EdgememError, match=r"predates answers that write the tail\); export it again"):
        engine.step([3] * 5, state)
    doc = tmp_path / "d.txt"
    doc.write_text(TEXT)
    assert_one_line_error(run("ask", doc, "q?", "--engine", copy), "export it again")


def test_ask_engine_user_errors_are_one_line(tiny, tmp_path):
    doc = tmp_path / "d.txt"
    doc.write_text(TEXT)
    assert_one_line_error(run("ask", doc, "q?", "--engine", tmp_path / "nope"), "does not exist")
    assert_one_line_error(run("ask", doc, "q?", "--engine", tmp_path), "not an edgemem engine bundle")
    result = run("ask", doc, "q?", "--engine", tiny["bundle"], "--segment-len", "32")
    assert_one_line_error(result, "segment length is fixed")
    result = run("ask", doc, "q?", "--engine", tiny["bundle"], "--answer-window", "32")
    assert_one_line_error(result, "answer window is its adapter's")
    assert_one_line_error(run("export", "--out", tmp_path / "x", "--to", "tflite"), "unknown target")


def test_int8_bundle_loads_runs_and_keys_its_states_apart(tiny, tmp_path):
    manifest = quantize_bundle(tiny["bundle"], tmp_path / "int8")
    assert manifest.quantization == "int8"
    assert manifest.graphs["segment_step"].size < read_manifest(tiny["bundle"]).graphs["segment_step"].size
    fp32, int8 = open_engine(tiny["bundle"]), open_engine(tmp_path / "int8")
    assert int8.model_id == fp32.model_id + "+int8" and int8.backend == "onnxruntime-int8"
    a, b = fp32.empty_state(), int8.empty_state()
    for ids in random_segments(4):
        a, _ = fp32.step(ids, a)
        b, _ = int8.step(ids, b)
    for name, tensor in a.named_tensors().items():
        other = b.named_tensors()[name]
        assert torch.isfinite(other).all()
        assert float((other - tensor).norm() / tensor.norm()) < 0.2  # close, not equal
    assert len(list(int8.generate_ids(b, list(range(5, 30)), set(), max_new_tokens=5))) == 5


def test_session_options_follow_the_settings():
    so = OrtOptions(threads=1, spinning=False).session_options()
    assert so.intra_op_num_threads == 1
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert OrtOptions().session_options().intra_op_num_threads >= 1
    with pytest.raises(EdgememError, match="unknown optimization level"):
        OrtOptions(optimization="max").session_options()


def test_gemma3_sliding_window_engine_matches_torch(tmp_path):
    """Gemma-3 interleaves sliding-window layers (window 8 here): the engine's segment step and its
    answer past the window must still match PyTorch, with what the training recipe adds (the
    memory reading the layer's input norm, LoRA on every projection, every token of a segment
    writing; the tiny Llama tests cover the plain memory)."""
    trained_like = {"norm_inputs": True, "lora_rank": 4, "write_source": "segment"}
    from tiny import tiny_gemma3

    from edgemem.armt import ARMT, ARMTConfig
    from edgemem.export.onnx import export_bundle
    from edgemem.models import LoadedModel

    base = tiny_gemma3()
    armt = ARMT(
        base, ARMTConfig.for_model(6, segment_len=SEGMENT, num_write_tokens=3, d_mem=8, **trained_like)
    )
    with torch.no_grad():
        for mem in armt.memories.values():
            mem.W_V.weight.normal_(0, 0.1, generator=torch.Generator().manual_seed(2))
        for lora in armt.lora.values():
            lora.B.normal_(0, 0.05, generator=torch.Generator().manual_seed(3))
    tok = tiny_assistant().loaded.tokenizer
    export_bundle(armt, tok, tmp_path / "g", model_name="tiny-gemma3", model_id="tiny-gemma3@0")
    torch_rt = TorchRuntime(LoadedModel("tiny-gemma3", "tiny-gemma3@0", base, tok, torch.float32), armt)
    ort_rt = open_engine(tmp_path / "g")
    a, b = torch_rt.empty_state(), ort_rt.empty_state()
    with torch.inference_mode():
        for ids in random_segments(3):
            a, _ = torch_rt.step(ids, a)
            b, _ = ort_rt.step(ids, b)
        prompt = list(range(3, 23))  # longer than the window
        assert list(ort_rt.generate_ids(b, prompt, set(), max_new_tokens=12)) == list(
            torch_rt.generate_ids(a, prompt, set(), max_new_tokens=12)
        )
    for name, tensor in a.named_tensors().items():
        assert float((b.named_tensors()[name] - tensor).norm() / tensor.norm()) < 1e-4
    assert ort_rt.config == armt.config  # the engine reports the whole config, LoRA and write source included


def test_importing_the_runtime_loads_neither_torch_nor_onnxruntime():
    code = "import sys, edgemem.runtime; print('onnxruntime' in sys.modules, 'torch' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
    )
    assert proc.stdout.split() == ["False", "False"], proc.stderr


@pytest.fixture(scope="module")
def trt_bundle(tiny, tmp_path_factory):
    """A copy of the tiny bundle with TensorRT plans of both graphs (for this GPU, or for SM89 with
    TensorRT-RTX where there is none)."""
    from edgemem.export.tensorrt import build_engines, tensorrt_module

    if tensorrt_module() is None:
        pytest.skip("no TensorRT module (pip install tensorrt-rtx-cu13)")
    copy = tmp_path_factory.mktemp("trt") / "bundle"
    shutil.copytree(tiny["bundle"], copy)
    build_engines(copy)
    return copy


needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="running a TensorRT plan needs an NVIDIA GPU and a CUDA build of PyTorch; none here "
    "(scripts/gpu_check.sh runs these on a GPU machine)",
)


def test_tensorrt_engines_build_from_the_bundle_without_a_gpu(trt_bundle, tmp_path):
    """The build path, up to the GPU boundary: TensorRT(-RTX) parses both graphs, builds a plan for
    each (for a named compute capability when there is no GPU) and the manifest lists them."""
    manifest = read_manifest(trt_bundle)
    assert manifest.tensorrt == {
        "segment_step": "tensorrt/segment_step.plan",
        "answer": "tensorrt/answer.plan",
    }
    assert all((trt_bundle / p).stat().st_size > 100_000 for p in manifest.tensorrt.values())
    assert manifest.tensorrt_target == (None if torch.cuda.is_available() else "SM89")
    copy = tmp_path / "trt"
    shutil.copytree(trt_bundle, copy)
    (copy / manifest.tensorrt["answer"]).unlink()
    with pytest.raises(EdgememError, match="TensorRT engine tensorrt/answer.plan of answer is missing"):
        read_manifest(copy)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the plans run here")
def test_ask_engine_on_a_tensorrt_bundle_without_a_gpu_is_one_line(trt_bundle, tmp_path):
    """--engine picks TensorRT for a bundle with plans; with no GPU that is one clear line, exit 1."""
    doc = tmp_path / "doc.txt"
    doc.write_text(TEXT)
    result = run("ask", "--engine", trt_bundle, doc, "What is the code?")
    assert_one_line_error(result, "holds TensorRT plans, which run only on an NVIDIA GPU")


def test_a_tensorrt_bundle_still_runs_its_onnx_graphs_on_onnxruntime(trt_bundle, tiny):
    """The plans sit beside the ONNX graphs: asking for ONNX Runtime runs them, as before."""
    runtime = open_engine(trt_bundle, backend="onnxruntime")
    reference = open_engine(tiny["bundle"])
    assert runtime.backend == "onnxruntime"
    ids = random_segments(2)
    a, b = runtime.empty_state(), reference.empty_state()
    for segment in ids:
        a, _ = runtime.step(segment, a)
        b, _ = reference.step(segment, b)
    for name, tensor in b.named_tensors().items():
        assert torch.equal(a.named_tensors()[name], tensor), name


@needs_gpu
def test_tensorrt_engine_matches_onnxruntime(trt_bundle):
    """On a GPU: the TensorRT plans against ONNX Runtime on the same bundle: the state after 8
    segments (TensorRT may use TF32 for float32 matmuls, hence 1e-2), the answer logits and greedy
    ids."""
    from edgemem.runtime import TrtEngine

    trt_runtime = open_engine(trt_bundle)
    assert trt_runtime.backend == "tensorrt" and isinstance(trt_runtime.engine, TrtEngine)
    ort_engine = OrtEngine(trt_bundle)
    a, b = trt_runtime.engine.empty_state(), ort_engine.empty_state()
    for segment in random_segments(8):
        a = trt_runtime.engine.step(segment.numpy(), a)
        b = ort_engine.step(segment.numpy(), b)
    for name in b:
        assert np.linalg.norm(a[name] - b[name]) <= 1e-2 * np.linalg.norm(b[name]) + 1e-5, name
    prompt = [5, 6, 7, 8, 9]
    logits_trt, _ = trt_runtime.engine.forward(prompt, trt_runtime.engine.empty_past(), b)
    logits_ort, _ = ort_engine.forward(prompt, ort_engine.empty_past(), b)
    np.testing.assert_allclose(logits_trt, logits_ort, rtol=1e-2, atol=1e-2)
    expected = list(ort_engine.generate_ids(b, prompt, set(), max_new_tokens=8))
    assert list(trt_runtime.engine.generate_ids(b, prompt, set(), max_new_tokens=8)) == expected


@needs_gpu
def test_ask_engine_on_a_tensorrt_bundle_gives_the_onnxruntime_answer(
    trt_bundle, tiny, tmp_path, monkeypatch
):
    """On a GPU: `ask --engine` on the TensorRT bundle streams the answer ONNX Runtime gives (each
    in its own library, so neither reuses the other's stored state)."""
    doc = tmp_path / "doc.txt"
    doc.write_text(TEXT)
    answers = []
    for home, bundle in (("trt", trt_bundle), ("ort", tiny["bundle"])):
        monkeypatch.setenv("EDGEMEM_HOME", str(tmp_path / home))
        result = run("ask", "--engine", bundle, doc, "What is the code?", "--max-new-tokens", "8")
        assert result.exit_code == 0, result.output
        answers.append(result.stdout.strip())
    assert answers[0] and answers[0] == answers[1]


def _cuda_provider() -> bool:
    import onnxruntime as ort

    return torch.cuda.is_available() and "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.mark.skipif(
    not _cuda_provider(),
    reason="the CUDA execution provider needs onnxruntime-gpu (pip install 'edgemem[gpu]') and an NVIDIA "
    "GPU; none here (scripts/gpu_check.sh runs this on a GPU machine)",
)
def test_cuda_provider_matches_the_cpu_provider(tiny):
    """On a GPU: OrtOptions(device='cuda') runs the graphs on the CUDA provider (not a silent CPU
    fallback) and gives the CPU provider's state after 8 segments (1e-2: TF32 may be on) and its
    greedy ids."""
    cpu, gpu = OrtEngine(tiny["bundle"]), OrtEngine(tiny["bundle"], OrtOptions(device="cuda"))
    assert gpu.session("segment_step").get_providers()[0] == "CUDAExecutionProvider"
    a, b = gpu.empty_state(), cpu.empty_state()
    for segment in random_segments(8):
        a, b = gpu.step(segment.numpy(), a), cpu.step(segment.numpy(), b)
    for name in b:
        assert np.linalg.norm(a[name] - b[name]) <= 1e-2 * np.linalg.norm(b[name]) + 1e-5, name
    prompt = [5, 6, 7, 8, 9]
    expected = list(cpu.generate_ids(b, prompt, set(), max_new_tokens=8))
    assert list(gpu.generate_ids(b, prompt, set(), max_new_tokens=8)) == expected


def test_export_to_tensorrt_without_tensorrt_is_one_line(tmp_path, monkeypatch):
    import edgemem.export.tensorrt as trt_export

    monkeypatch.setattr(trt_export, "tensorrt_module", lambda: None)
    result = run("export", "--to", "tensorrt", "--out", tmp_path / "e")
    assert_one_line_error(result, "TensorRT is not installed")


def test_chat_app_opens_an_engine_bundle_from_its_settings(tiny):
    from edgemem.tui.app import open_assistant
    from edgemem.tui.config import Settings

    assistant = open_assistant(Settings(model=str(tiny["bundle"]), engine="onnxruntime"))
    assert assistant.runtime.backend == "onnxruntime" and assistant.loaded is None
    assert assistant.name == "tiny-llama" and assistant.trained


def test_bench_runtimes_user_errors_are_one_line(tmp_path):
    assert_one_line_error(run("bench", "runtimes", "--backends", "ort"), "needs --engine")
    assert_one_line_error(run("bench", "runtimes", "--backends", "tflite"), "unknown backend")


def test_bench_runtimes_reports_the_median_of_its_rounds():
    from edgemem.export.bench import _median

    runs = [
        {"backend": "ort-fp32", "round": i, "ingest_tokens_per_s": v, "first_token_s": 1.0 + i,
         "decode_tokens_per_s": None, "peak_rss_mb": 100.0 * (i + 1)}
        for i, v in enumerate([90.0, 30.0, 100.0])
    ]  # fmt: skip
    out = _median("ort-fp32", runs)
    assert out["ingest_tokens_per_s"] == 90.0 and out["first_token_s"] == 2.0
    assert out["decode_tokens_per_s"] is None and out["peak_rss_mb"] == 300.0 and out["rounds"] == 3


@pytest.fixture
def default_engine(tiny):
    """The tiny bundle posing as SmolLM2's exported engine in the default place (removed after)."""
    from edgemem.assistant import shipped_adapter
    from edgemem.models import REGISTRY
    from edgemem.runtime import default_engine_dir

    try:
        gguf = REGISTRY["smollm2-135m-instruct"].locate()
    except EdgememError as exc:
        pytest.skip(str(exc))
    root = default_engine_dir("smollm2-135m-instruct")
    shutil.copytree(tiny["bundle"], root)
    data = json.loads((root / MANIFEST).read_text())
    data.update(
        model_name="smollm2-135m-instruct",
        model_id=f"smollm2-135m-instruct@{sha256_file(gguf)[:16]}",
        adapter_file_sha256=sha256_file(shipped)
        if (shipped := shipped_adapter("smollm2-135m-instruct"))
        else None,
    )
    (root / MANIFEST).write_text(json.dumps(data))
    yield root
    shutil.rmtree(root)


def test_an_exported_engine_is_the_default_backend(default_engine, tmp_path):
    from edgemem.runtime import find_default_engine

    assert find_default_engine("smollm2-135m-instruct") == default_engine
    doc = tmp_path / "doc.txt"
    doc.write_text(TEXT)
    result = run("ask", doc, "What is the code?", "--max-new-tokens", "4")
    assert result.exit_code == 0, result.output
    assert f"using the exported engine {default_engine}" in result.stderr


def test_an_engine_from_another_adapter_or_model_file_is_not_the_default(default_engine, tmp_path):
    from edgemem.runtime import find_default_engine

    save_adapter(tiny_assistant(segment_len=SEGMENT).armt, tmp_path / "a.safetensors")
    assert find_default_engine("smollm2-135m-instruct", tmp_path / "a.safetensors") is None
    data = json.loads((default_engine / MANIFEST).read_text())
    (default_engine / MANIFEST).write_text(json.dumps({**data, "model_id": "smollm2-135m-instruct@0"}))
    assert find_default_engine("smollm2-135m-instruct") is None
    assert find_default_engine("gemma3-270m") is None


@pytest.mark.real_model
@pytest.mark.skipif(
    not os.environ.get("EDGEMEM_TEST_SMOL_ENGINE"),
    reason="set EDGEMEM_TEST_SMOL_ENGINE to a SmolLM2 bundle (`edgemem export`: ~5 CPU-minutes)",
)
def test_real_smollm2_engine_matches_torch():
    """The exported SmolLM2 bundle against PyTorch on real text: the state after 3 segments and
    the greedy answer."""
    from edgemem.armt import prompt_ids, stop_token_ids

    engine = open_engine(os.environ["EDGEMEM_TEST_SMOL_ENGINE"])
    assistant = Assistant.open("smollm2-135m-instruct", dtype=torch.float32)
    rt = assistant.runtime
    assert engine.model_id == rt.model_id and engine.adapter_hash == rt.adapter_hash
    text = Path(json.__file__).read_text()  # the json package's source
    ids = [i for chunk in tokenize_stream([text * 2], rt.tokenizer) for i in chunk][: 3 * 512 + 100]
    a, b = ingest(rt, [ids]), ingest(engine, [ids])
    for name, tensor in a.state.named_tensors().items():  # A stays 0 while the memory is untrained
        difference = float((b.state.named_tensors()[name] - tensor).norm())
        assert difference <= 1e-4 * float(tensor.norm()) + 1e-6, (name, difference, float(tensor.norm()))
    prompt = prompt_ids(rt.tokenizer, a.tail_ids, "What does this module do?")
    stop = stop_token_ids(rt.tokenizer)
    expected = list(rt.generate_ids(a.state, prompt, stop, max_new_tokens=16))
    assert list(engine.generate_ids(b.state, prompt, stop, max_new_tokens=16)) == expected


def test_one_session_mode_keeps_only_the_graph_in_use_open(tiny):
    engine = OrtEngine(tiny["bundle"], OrtOptions(one_session=True))
    state = engine.step([3] * SEGMENT, engine.empty_state())
    assert list(engine._sessions) == ["segment_step"]
    reference = OrtEngine(tiny["bundle"])
    assert list(engine.generate_ids(state, [5, 6, 7], set(), max_new_tokens=4)) == list(
        reference.generate_ids(state, [5, 6, 7], set(), max_new_tokens=4)
    )
    assert list(engine._sessions) == ["answer"]


def test_engine_decode_loop_stops_bounds_and_samples_reproducibly():
    """The numpy engines' answer loop: greedy follows the logits and stops at a stop id (not
    yielded), never passes max_new_tokens, sampling with a seed repeats itself, and a tiny top_p
    keeps only the most likely token."""
    from edgemem.runtime import decode

    table = np.eye(6, dtype=np.float32) * 5  # after token t the most likely next token is t
    chain = {0: 1, 1: 2, 2: 3, 3: 4, 4: 5, 5: 0}

    def advance(token: int) -> np.ndarray:
        return table[chain[token]]

    assert list(decode(table[1], advance, {4}, 10, 0.0, 0.95, None)) == [1, 2, 3]
    assert list(decode(table[0], advance, set(), 3, 0.0, 0.95, None)) == [0, 1, 2]
    sampled = [list(decode(table[0], advance, set(), 20, 2.0, 1.0, seed)) for seed in (7, 7, 8)]
    assert sampled[0] == sampled[1] and sampled[0] != sampled[2]
    assert list(decode(table[2], advance, set(), 4, 2.0, 1e-6, 5)) == [2, 3, 4, 5]
