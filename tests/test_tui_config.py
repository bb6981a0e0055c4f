"""The chat app's settings file: round trip, and bad values reported and replaced, never fatal."""

import subprocess
import sys

from edgemem.models import DEFAULT_MODEL
from edgemem.tui import config
from edgemem.tui.config import Settings, load_settings, save_settings


def test_defaults_name_the_default_model_without_importing_torch():
    assert config.DEFAULT_MODEL == DEFAULT_MODEL
    # the app's first screen must not wait for torch: its modules import neither torch nor transformers
    code = (
        "import sys, edgemem.tui.app; sys.exit(int('torch' in sys.modules or 'transformers' in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_settings_round_trip_through_toml(tmp_path):
    path = tmp_path / "config.toml"
    settings = Settings(model='~/models/my "own".gguf', temperature=0.25, max_new_tokens=99, theme="nord")
    save_settings(settings, path)
    assert load_settings(path) == (settings, [])


def test_missing_file_means_defaults(tmp_path):
    assert load_settings(tmp_path / "none.toml") == (Settings(), [])


def test_bad_values_are_reported_one_line_each_and_replaced_by_defaults(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(
        'model = "gemma3-270m"\nengine = "onnx"\ntemperature = -1\nmax_new_tokens = "many"\ncolour = 1\n'
    )
    settings, warnings = load_settings(path)
    assert settings == Settings(model="gemma3-270m")  # the good value is kept
    assert len(warnings) == 4 and all("\n" not in w for w in warnings)
    assert any("engine 'onnx' is not available" in w for w in warnings)


def test_unparsable_file_is_a_warning(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("model = [unclosed\n")
    settings, (warning,) = load_settings(path)
    assert settings == Settings() and "unreadable" in warning


def test_adapter_and_answer_window_round_trip_and_default_to_the_adapters_own(tmp_path):
    path = tmp_path / "config.toml"
    assert (Settings().adapter, Settings().answer_window) == ("", config.NO_WINDOW_OVERRIDE)
    settings = Settings(adapter="~/runs/view/adapter.safetensors", answer_window=1024)
    save_settings(settings, path)
    assert load_settings(path) == (settings, [])


def test_a_bad_answer_window_is_reported_and_replaced(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('adapter = "a.safetensors"\nanswer_window = -5\n')
    settings, (warning,) = load_settings(path)
    assert settings == Settings(adapter="a.safetensors") and "answer_window" in warning


def test_an_adapter_with_an_engine_bundle_is_reported_and_dropped(tmp_path):
    # each value is good alone; together they are not: a bundle carries its own adapter and window
    path = tmp_path / "config.toml"
    path.write_text(
        'engine = "onnxruntime"\nmodel = "bundle"\nadapter = "a.safetensors"\nanswer_window = 0\n'
    )
    settings, (warning,) = load_settings(path)
    assert settings == Settings(engine="onnxruntime", model="bundle")
    assert "bundle's own" in warning and "\n" not in warning
