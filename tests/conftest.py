import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# Triton reads TRITON_INTERPRET when it first decorates a kernel, and torch or transformers may
# import triton long before tests/test_kernels.py does: without a GPU, interpret from the start.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True, scope="session")
def edgemem_home(tmp_path_factory):
    """All tests keep their library and model cache in a temporary EDGEMEM_HOME (shared per session,
    so the real model's dequantised cache is built once)."""
    home = tmp_path_factory.mktemp("edgemem-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("EDGEMEM_HOME", str(home))
    yield home
    mp.undo()
