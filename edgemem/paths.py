"""Where edgemem keeps its files: a data directory (library, states), a cache directory and a
config directory (the chat app's settings).

`EDGEMEM_HOME` overrides all three (`$EDGEMEM_HOME/data`, `/cache`, `/config`), which is what the
tests use to stay out of the user's real directories.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def data_dir() -> Path:
    home = os.environ.get("EDGEMEM_HOME")
    path = Path(home) / "data" if home else Path(platformdirs.user_data_dir("edgemem"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir() -> Path:
    home = os.environ.get("EDGEMEM_HOME")
    path = Path(home) / "cache" if home else Path(platformdirs.user_cache_dir("edgemem"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def config_dir() -> Path:
    home = os.environ.get("EDGEMEM_HOME")
    path = Path(home) / "config" if home else Path(platformdirs.user_config_dir("edgemem"))
    path.mkdir(parents=True, exist_ok=True)
    return path
