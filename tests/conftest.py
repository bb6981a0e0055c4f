import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True, scope="session")
def edgemem_home(tmp_path_factory):
    """All tests keep their library and model cache in a temporary EDGEMEM_HOME (shared per session,
    so the real model's dequantised cache is built once)."""
    home = tmp_path_factory.mktemp("edgemem-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("EDGEMEM_HOME", str(home))
    yield home
    mp.undo()
