"""edgemem: on-device long-context assistant with an associative recurrent memory (ARMT).

Importing edgemem makes the process offline for the Hugging Face libraries: every model is read
from a file on disk, never from a hub.
"""

import os

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

__version__ = "0.1.0"
