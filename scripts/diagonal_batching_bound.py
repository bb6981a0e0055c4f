#!/usr/bin/env python3
"""Upper bound on what diagonal batching can gain for ARMT ingest on this CPU.

Diagonal batching runs layer l of segment t+1 together with layer l+1 of segment t: at best it
turns the per-layer work of several segments into fewer, larger kernel calls (a grouped GEMM over
the layers' weights). Running the plain decoder on G independent segments in one batch does the
same arithmetic in kernels exactly as large as the best diagonal schedule with G segments in
flight, without the schedule's own overhead; so if batch G is no faster per token than batch 1,
diagonal batching cannot pay on this machine either.

OMP_WAIT_POLICY=PASSIVE nice -n 5 python scripts/diagonal_batching_bound.py [rounds]

Prints one JSON line: tokens/s of the SmolLM2 decoder stack (no LM head, float32, 512-token
segments) at batch 1, 2 and 4, measured in alternating order over `rounds` rounds (median).
"""

import argparse
import json
import os
import statistics
import time

import torch

from edgemem.cli_common import run_script
from edgemem.models import load_model

S = 512


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rounds", type=int, nargs="?", default=3, help="alternating rounds (default 3)")
    rounds = parser.parse_args().rounds
    if rounds < 1:
        parser.error("rounds must be at least 1")
    loaded = load_model("smollm2-135m-instruct", torch.float32)
    decoder = loaded.model.model
    g = torch.Generator().manual_seed(0)
    rates: dict[int, list[float]] = {1: [], 2: [], 4: []}
    with torch.inference_mode():
        decoder(input_ids=torch.randint(100, 40000, (1, S), generator=g), use_cache=False)  # warm-up
        for r in range(rounds):
            for batch in [1, 2, 4] if r % 2 == 0 else [4, 2, 1]:
                ids = torch.randint(100, 40000, (batch, S), generator=g)
                segments = 4 // batch  # the same 4 segments of work at every batch size
                start = time.perf_counter()
                for _ in range(segments):
                    decoder(input_ids=ids, use_cache=False)
                rates[batch].append(4 * S / (time.perf_counter() - start))
    print(
        json.dumps(
            {
                "command": "python scripts/diagonal_batching_bound.py " + str(rounds),
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "threads": torch.get_num_threads(),
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "tokens_per_s_median": {b: round(statistics.median(v), 1) for b, v in rates.items()},
                "tokens_per_s_all": {b: [round(x, 1) for x in v] for b, v in rates.items()},
            }
        )
    )


if __name__ == "__main__":
    run_script(main)
