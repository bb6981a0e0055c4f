#!/usr/bin/env python3
"""llama.cpp prompt processing speed on SmolLM2's Q4_1 GGUF: 1,024 random tokens, twice.

T=2 python scripts/llama_prompt_speed.py     # T = llama.cpp threads (default 2)
"""

import os
import random
import time

from edgemem.cli_common import run_script
from edgemem.errors import EdgememError
from edgemem.methods import LlamaGenerator
from edgemem.models import resolve_source


def main() -> None:
    threads = os.environ.get("T", "2")
    if not threads.isdigit() or int(threads) < 1:
        raise EdgememError(f"T={threads!r}: llama.cpp threads must be a whole number, at least 1")
    _, gguf = resolve_source("smollm2-135m-instruct")
    generator = LlamaGenerator(gguf, 4096, threads=int(threads))
    rng = random.Random(0)
    for _trial in range(2):
        ids = [rng.randrange(100, 40000) for _ in range(1024)]
        generator.llm.reset()
        start = time.perf_counter()
        _out, computed = generator.generate(ids, 1, set())
        rate = computed / (time.perf_counter() - start)
        print(f"threads {threads}: {rate:.0f} prompt tokens/s")


if __name__ == "__main__":
    run_script(main)
