"""SWAX engine bundles: `edgemem export --model CHECKPOINT` writes the step graphs with the whole
fixed-size state (window keys/values, mLSTM C/n/m, position) as their inputs and outputs, and
ONNX Runtime gives PyTorch's states and answers through the runtime interface and the CLI.

One bundle is exported through the CLI per module from a briefly trained tiny checkpoint (segment
16 bytes, window 8: several segments go past the window).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from edgemem.cli import app
from edgemem.documents import scan
from edgemem.export.bundle import read_manifest
from edgemem.export.swax_onnx import export_swax_bundle
from edgemem.runtime import answer, open_engine
from edgemem.store import Library
from edgemem.swax import M_EMPTY, SwaxConfig, SwaxModel, WindowSchedule
from edgemem.swax_runtime import M_EMPTY as ENGINE_M_EMPTY
from edgemem.swax_runtime import SwaxOrtEngine, SwaxTorchRuntime
from edgemem.swax_train import ByteStream, TrainConfig, new_model, train

ROOT = Path(__file__).resolve().parents[1]
SEGMENT = 16
TINY = SwaxConfig(d_model=32, n_layers=2, n_heads=2, window=8, chunk=16)
STEPS = 30
TEXT = "The backup of the Lisbon vault runs at 02:40 every night. " * 6 + "magic abcd=4417.\n"
runner = CliRunner()


def run(*args: object):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def assert_one_line_error(result, text: str) -> None:
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and text in lines[0], result.stderr


def make_checkpoint(folder: Path, config: SwaxConfig = TINY) -> Path:
    """A real SWAX checkpoint, as the trainer writes it (STEPS steps on text without newlines: answers
    end at a newline, and this one should not stop at once)."""
    stream = ByteStream([(ROOT / "README.md").read_text().replace("\n", " ")])
    cfg = TrainConfig(steps=STEPS, batch=2, length=48, warmup=1, needle_frac=0.0, log_every=5)
    train(new_model(config, 0), stream, WindowSchedule.fixed(config.window, STEPS), cfg, folder)
    return folder / "ckpt.safetensors"


@pytest.fixture(scope="module")
def swax(tmp_path_factory):
    root = tmp_path_factory.mktemp("swax-export")
    ckpt = make_checkpoint(root / "run")
    bundle = root / "bundle"
    result = run("export", "--model", ckpt, "--to", "onnx", "--out", bundle, "--segment-len", SEGMENT)
    assert result.exit_code == 0, result.output
    return {"root": root, "ckpt": ckpt, "bundle": bundle, "torch": SwaxTorchRuntime.open(ckpt, SEGMENT)}


def segments(count: int, seed: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (1, SEGMENT), generator=g) for _ in range(count)]


def test_bundle_carries_the_whole_state_in_and_out(swax):
    """The manifest and both graphs name every state tensor (position included) as input and output."""
    m = read_manifest(swax["bundle"], verify=True)
    assert m.architecture == "swax" and m.segment_len == SEGMENT and m.tokenizer_files == []
    assert m.state_shapes == {
        "layers.0.k": [1, 2, 7, 16],
        "layers.0.v": [1, 2, 7, 16],
        "layers.1.C": [1, 2, 16, 16],
        "layers.1.n": [1, 2, 16],
        "layers.1.m": [1, 2],
        "position": [1],
    }
    order = list(swax["torch"].state_shapes())  # the graphs' order: layer by layer, position last
    for graph in m.graphs.values():
        assert [n for n in graph.inputs if n.startswith("state_in.")] == [f"state_in.{n}" for n in order]
        assert [n for n in graph.outputs if n.startswith("state_out.")] == [f"state_out.{n}" for n in order]
    assert m.graphs["answer"].outputs[0] == "logits"
    assert m.model_id == swax["torch"].model_id and m.adapter_hash == swax["torch"].adapter_hash


def test_engine_empty_state_is_the_models():
    """The numpy engine's empty state (zeros, m = M_EMPTY, position 0) is the PyTorch one."""
    assert ENGINE_M_EMPTY == M_EMPTY


def test_ort_step_matches_torch_over_segments_past_the_window(swax):
    """8 segments of 16 bytes (window 8): every state tensor within 1e-4, the position exact."""
    torch_rt, ort_rt = swax["torch"], open_engine(swax["bundle"])
    a, b = torch_rt.empty_state(), ort_rt.empty_state()
    for name, tensor in a.named_tensors().items():
        assert torch.equal(b.named_tensors()[name], tensor), name
    with torch.inference_mode():
        for ids in segments(8):
            a, _ = torch_rt.step(ids, a)
            b, _ = ort_rt.step(ids, b)
    assert a.writes == b.writes == 8 and a.tokens == b.tokens == 8 * SEGMENT
    for name, tensor in a.named_tensors().items():
        torch.testing.assert_close(b.named_tensors()[name], tensor, rtol=1e-4, atol=1e-5)


def test_ort_answer_bytes_and_logits_match_torch(swax):
    """After 4 segments, a prompt longer than a segment: the last logits agree within 1e-4 and 24
    greedy bytes are identical."""
    torch_rt, engine = swax["torch"], SwaxOrtEngine(swax["bundle"])
    state = torch_rt.empty_state()
    with torch.inference_mode():
        for ids in segments(4):
            state, _ = torch_rt.step(ids, state)
        prompt = list(b"the vault opens at 02:40\nwhen does it open?")
        assert len(prompt) > SEGMENT
        _, logits = torch_rt.model.step(torch.tensor([prompt]), state, return_logits=True)
    numpy_state = {k: v.numpy() for k, v in state.named_tensors().items()}
    whole = (len(prompt) - 1) // SEGMENT * SEGMENT
    st = numpy_state
    for a in range(0, whole, SEGMENT):
        st = engine.step(prompt[a : a + SEGMENT], st)
    for byte in prompt[whole:]:
        last, st = engine.read_byte(byte, st)
    np.testing.assert_allclose(last, logits[0, -1].numpy(), rtol=1e-4, atol=1e-4)
    expected = list(torch_rt.generate_ids(state, prompt, set(), max_new_tokens=24))
    assert len(expected) == 24
    assert list(engine.generate_ids(numpy_state, prompt, set(), max_new_tokens=24)) == expected


def test_ask_engine_end_to_end_gives_the_torch_answer(swax, tmp_path):
    """`edgemem ask --engine BUNDLE` prints what `edgemem ask --model CHECKPOINT` prints."""
    doc = tmp_path / "vault.txt"
    doc.write_text(TEXT)
    common = ["--max-new-tokens", "16", "--segment-len"]
    on_torch = run("ask", doc, "magic abcd=", "--model", swax["ckpt"], *common, SEGMENT)
    assert on_torch.exit_code == 0, on_torch.output
    on_engine = run("ask", doc, "magic abcd=", "--engine", swax["bundle"], "--max-new-tokens", "16")
    assert on_engine.exit_code == 0, on_engine.output
    assert on_engine.stdout == on_torch.stdout and len(on_torch.stdout) > 1  # an answer, not just the newline


def test_states_are_shared_between_torch_and_the_engine(swax, tmp_path):
    """A document ingested with PyTorch is reused by the engine (same library key), and the answer
    from the stored state is the one the engine gives after its own ingest."""
    doc = tmp_path / "doc.txt"
    doc.write_text(TEXT * 2)
    from edgemem.assistant import Assistant

    torch_asst = Assistant(None, None, None, swax["torch"].adapter_hash, swax["torch"])
    engine_asst = Assistant.open_engine(swax["bundle"])
    with Library(tmp_path / "lib") as library:
        record, _, reused = torch_asst.ingest_scan(scan(doc), library)
        assert not reused
        record2, stored, reused = engine_asst.ingest_scan(scan(doc), library)
        assert reused and record2.id == record.id
        _, fresh, _ = engine_asst.ingest_scan(scan(doc), library, force=True)
    assert stored.tail_ids == fresh.tail_ids and stored.state.tokens == fresh.state.tokens
    got = "".join(answer(engine_asst.runtime, stored, "magic abcd=", max_new_tokens=12))
    assert got == "".join(answer(engine_asst.runtime, fresh, "magic abcd=", max_new_tokens=12))


def test_ingest_engine_reuses_what_model_ingested(swax, tmp_path):
    """Through the CLI: `ingest --model CHECKPOINT`, then `ingest --engine BUNDLE` finds it stored."""
    doc = tmp_path / "note.txt"
    doc.write_text(TEXT + "(ingested with PyTorch)\n")
    first = run("ingest", doc, "--model", swax["ckpt"], "--segment-len", SEGMENT)
    assert first.exit_code == 0 and "ingested" in first.stderr, first.output
    again = run("ingest", doc, "--engine", swax["bundle"])
    assert again.exit_code == 0 and "already in the library" in again.stderr, again.output


def test_swax_export_and_engine_user_errors_are_one_line(swax, tmp_path):
    """Quantizing, an existing folder, an adapter, or another checkpoint with the bundle: one line."""
    ckpt, bundle = swax["ckpt"], swax["bundle"]
    assert_one_line_error(run("export", "--model", ckpt, "--out", bundle), "pass --force")
    out = tmp_path / "b"
    assert_one_line_error(
        run("export", "--model", ckpt, "--out", out, "--quantize", "int8"), "ONNX bundle only"
    )
    assert_one_line_error(
        run("export", "--model", ckpt, "--out", out, "--to", "tensorrt"), "ONNX bundle only"
    )
    doc = tmp_path / "d.txt"
    doc.write_text(TEXT)
    other = make_checkpoint(
        tmp_path / "other", SwaxConfig(d_model=32, n_layers=2, n_heads=2, window=4, chunk=16)
    )
    assert_one_line_error(run("ask", doc, "q", "--engine", bundle, "--model", other), "was exported from")
    adapter = tmp_path / "adapter.safetensors"
    adapter.write_bytes(b"x")
    assert_one_line_error(run("ask", doc, "q", "--model", ckpt, "--adapter", adapter), "no memory adapter")
    assert not out.exists()


def test_gated_deltanet_model_exports_and_matches(tmp_path):
    """The Gated DeltaNet variant (its step graph runs the recurrence: no ONNX triangular solve)
    gives PyTorch's state over 3 segments and its greedy bytes."""
    torch.manual_seed(0)
    model = SwaxModel(
        SwaxConfig(d_model=16, n_layers=2, n_heads=2, window=4, chunk=8, recurrent="gdn")
    ).eval()
    with torch.no_grad():  # a gate that forgets and writes noticeably
        model.blocks[1].mixer.gates.bias.zero_()
    export_swax_bundle(model, tmp_path / "gdn", model_name="gdn", segment_len=8)
    rt, engine = SwaxTorchRuntime(model, "gdn", 8), SwaxOrtEngine(tmp_path / "gdn")
    a, b = rt.empty_state(), engine.empty_state()
    g = torch.Generator().manual_seed(5)
    with torch.inference_mode():
        for _ in range(3):
            ids = torch.randint(0, 256, (1, 8), generator=g)
            a, _ = rt.step(ids, a)
            b = engine.step(ids.numpy(), b)
    for name, tensor in a.named_tensors().items():
        np.testing.assert_allclose(b[name], tensor.numpy(), rtol=1e-4, atol=1e-5)
    prompt = list(b"abc\nq")
    expected = list(rt.generate_ids(a, prompt, set(), max_new_tokens=10))
    assert list(engine.generate_ids(b, prompt, set(), max_new_tokens=10)) == expected


def test_swax_bundle_runs_in_a_process_without_torch(swax):
    """The SWAX engine needs onnxruntime and numpy only."""
    script = f"""
import json, sys
from edgemem.swax_runtime import SwaxOrtEngine
engine = SwaxOrtEngine({str(swax["bundle"])!r})
state = engine.step(list(range(40, 40 + {SEGMENT})), engine.empty_state())
ids = list(engine.generate_ids(state, list(b"\\nmagic abcd="), set(), max_new_tokens=6))
assert "torch" not in sys.modules and "transformers" not in sys.modules, "torch was imported"
print(json.dumps(ids))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rt = swax["torch"]
    with torch.inference_mode():
        state, _ = rt.step(torch.arange(40, 40 + SEGMENT)[None], rt.empty_state())
    expected = list(rt.generate_ids(state, list(b"\nmagic abcd="), set(), max_new_tokens=6))
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == expected
