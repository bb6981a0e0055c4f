"""Where edgemem keeps its files: one data directory (library, states) and one cache directory.

`EDGEMEM_HOME` overrides both (data in `$EDGEMEM_HOME/data`, cache in `$EDGEMEM_HOME/cache`),
which is what the tests use to stay out of the user's real directories.
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
