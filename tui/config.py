"""The chat app's settings: a small TOML file in the user config directory.

    model = "smollm2-135m-instruct"   # registry name, or a path to a .gguf file or model folder
    engine = "torch"                  # how the model runs; see ENGINES (onnxruntime: model = a bundle)
    adapter = ""                      # a trained adapter (.safetensors); "": the model's shipped one
    answer_window = -1                # tokens an answer reads in view; -1: the adapter's own, 0: off
    temperature = 0.0                 # 0 = greedy
    max_new_tokens = 256
    theme = "textual-dark"            # "textual-light", or any Textual theme

Read with `tomllib`; written by hand (flat keys only), to a temporary file then renamed. A bad value
is reported and replaced by its default, never fatal. This module imports nothing heavy: the app
reads it before torch is loaded.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from edgemem.paths import config_dir

DEFAULT_MODEL = "smollm2-135m-instruct"  # edgemem.models.DEFAULT_MODEL, without importing torch
# Engines the app can run a model with: "torch" is PyTorch eager through edgemem.assistant;
# "onnxruntime" runs an engine bundle made by `edgemem export`, whose folder is then the `model`.
ENGINES: tuple[str, ...] = ("torch", "onnxruntime")
NO_WINDOW_OVERRIDE = -1  # answer_window: the adapter's own (TOML has no null)
THEMES = ("textual-dark", "textual-light")  # offered first; any theme Textual knows is accepted


@dataclass(frozen=True)
class Settings:
    model: str = DEFAULT_MODEL
    engine: str = "torch"
    # The memory (torch engine only; a bundle holds its own): `edgemem ask --adapter / --answer-window`.
    adapter: str = ""  # "": the model's shipped adapter
    answer_window: int = NO_WINDOW_OVERRIDE
    temperature: float = 0.0
    max_new_tokens: int = 256
    theme: str = "textual-dark"

    def problems(self) -> list[str]:
        """What is wrong with these values, one line each (empty when all is well)."""
        out = []
        if not self.model.strip():
            out.append("model is empty")
        if self.engine not in ENGINES:
            out.append(f"engine {self.engine!r} is not available (available: {', '.join(ENGINES)})")
        if self.answer_window < NO_WINDOW_OVERRIDE:  # the rest is Assistant.open's to check
            out.append(
                f"answer_window must be -1 (the adapter's own), 0 (off) or tokens, not {self.answer_window}"
            )
        if self.engine != "torch" and (self.adapter or self.answer_window != NO_WINDOW_OVERRIDE):
            out.append(f"adapter and answer_window are the bundle's own with engine {self.engine!r}")
        if not 0.0 <= self.temperature <= 5.0:
            out.append(f"temperature must be between 0 and 5, not {self.temperature}")
        if not 1 <= self.max_new_tokens <= 8192:
            out.append(f"max_new_tokens must be between 1 and 8192, not {self.max_new_tokens}")
        if not self.theme.strip():
            out.append("theme is empty")
        return out


def settings_path() -> Path:
    return config_dir() / "config.toml"


def load_settings(path: Path | None = None) -> tuple[Settings, list[str]]:
    """The saved settings, and a line for each problem found (bad values fall back to defaults)."""
    path = path or settings_path()
    if not path.is_file():
        return Settings(), []
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return Settings(), [f"settings file {path} is unreadable ({exc}); using the defaults"]
    defaults, values, warnings = Settings(), {}, []
    for f in fields(Settings):
        if f.name not in data:
            continue
        value, default = data[f.name], getattr(defaults, f.name)
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not type(default):
            warnings.append(f"settings: {f.name} should be a {type(default).__name__}; using {default!r}")
            continue
        values[f.name] = value
    unknown = sorted(set(data) - {f.name for f in fields(Settings)})
    if unknown:
        warnings.append(f"settings: unknown keys ignored: {', '.join(unknown)}")
    settings = Settings(**values)
    for problem in settings.problems():
        warnings.append(f"settings: {problem}; using the default")
    fixed = {
        f.name: getattr(settings, f.name)
        for f in fields(Settings)
        if not Settings(**{f.name: getattr(settings, f.name)}).problems()
    }
    settings = Settings(**fixed)
    if settings.problems():  # values good alone, not together: an adapter with an engine bundle
        settings = replace(settings, adapter=defaults.adapter, answer_window=defaults.answer_window)
    return settings, warnings


def save_settings(settings: Settings, path: Path | None = None) -> Path:
    """Write the settings as TOML (temporary file, then rename)."""
    path = path or settings_path()
    lines = ["# edgemem chat settings", ""]
    for name, value in asdict(settings).items():
        lines.append(f"{name} = {json.dumps(value)}")  # JSON strings and numbers are valid TOML
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
