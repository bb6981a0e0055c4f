"""edgemem: on-device long-context assistant with an associative recurrent memory (ARMT).

Importing edgemem makes the process offline for the Hugging Face libraries: every model is read
from a file on disk, never from a hub (see edgemem/offline.py).
"""

import os

from edgemem.offline import apply_offline_env

apply_offline_env()
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

__version__ = "0.1.0"
