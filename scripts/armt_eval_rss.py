#!/usr/bin/env python3
"""RSS of the eval harness's armt method over one 16k niah item (prefix state cache held).

python scripts/armt_eval_rss.py
MALLOC_MMAP_THRESHOLD_=131072 python scripts/armt_eval_rss.py   # fixed glibc mmap threshold
"""

import resource

import psutil

from edgemem import methods
from edgemem.armt import text_ids
from edgemem.cli_common import run_script
from edgemem.data.tasks import Builder
from edgemem.models import load_tokenizer


def mb() -> str:
    """This process's resident set now and its peak so far."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return f"rss {psutil.Process().memory_info().rss / 2**20:.0f} MB, peak {peak:.0f} MB"


def main() -> None:
    item = Builder(load_tokenizer()).item("niah", 16384, 0, 1)
    print("item built:", mb())
    method = methods.build("armt", "smollm2-135m-instruct", "hf")
    print("model loaded:", mb())
    ids = text_ids(item.context, method.tokenizer)
    method.cache.ingest(ids)
    print(f"16k ingested, {len(method.cache._states)} states cached:", mb())


if __name__ == "__main__":
    run_script(main)
