#!/usr/bin/env python3
"""Projected wall time of a 100-item-per-bin niah sweep to 32k, per method, from the measured
seconds per item in docs/eval (100 x mean seconds per item, summed over the 1k-32k bins).
armt lines are labelled by adapter as in the results table (`armt`, `armt-untrained`).

    python scripts/project_niah_sweep.py                 # projections from docs/eval
    python scripts/project_niah_sweep.py --results DIR   # from another results folder
    python scripts/project_niah_sweep.py --floor         # and the compute floor of this CPU

Seconds are those recorded, on whatever machine ran each line; lines with a `dtype` are grouped
by it (`armt float32`, `armt bfloat16`).
"""

import argparse
import collections
from pathlib import Path

from edgemem.cli_common import run_script
from edgemem.errors import EdgememError
from edgemem.evaluate import load_records


def compute_floor() -> None:
    """The least time the armt sweep could take on this CPU: every token of every item through the
    model's non-embedding weights (2 FLOPs per weight per token, write tokens included), at the
    fp32 matmul rate torch reaches here on large square matrices (a rate no real step reaches)."""
    import time

    import torch

    from edgemem.armt import read_adapter
    from edgemem.assistant import shipped_adapter
    from edgemem.models import load_model

    model = load_model("smollm2-135m-instruct", dtype=torch.float32).model
    embedding = model.get_input_embeddings().weight.numel()
    weights = sum(p.numel() for p in model.parameters()) - embedding  # tied head: counted once
    memory, _ = read_adapter(shipped_adapter("smollm2-135m-instruct"))
    per_token = 2 * weights * (memory.segment_len + memory.num_write_tokens) / memory.segment_len
    tokens = 100 * sum(2**k * 1024 for k in range(6))  # 100 items per bin, 1k..32k
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
        torch.mm(a, b)
        best = 0.0
        for _ in range(5):
            start = time.perf_counter()
            torch.mm(a, b)
            best = max(best, 2 * 2048**3 / (time.perf_counter() - start))
        print(
            f"{torch.get_num_threads()} threads: {str(dtype)[6:]} matmul {best / 1e9:.0f} GFLOP/s; "
            f"{weights / 1e6:.0f} M non-embedding weights -> {per_token / 1e9:.2f} GFLOP per token; "
            f"{tokens / 1e6:.1f} M tokens -> at least {tokens * per_token / best / 3600:.1f} h "
            f"(needs {tokens * per_token / 3600 / 1e9:.0f} GFLOP/s for 1 h)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("docs/eval"), help="results folder (docs/eval)")
    parser.add_argument("--floor", action="store_true", help="and the compute floor of this CPU")
    args = parser.parse_args()
    records = load_records(args.results)
    if not records:
        raise EdgememError(f"no results in {args.results}")
    seconds: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    for record in records:
        if (
            record["model"] == "smollm2-135m-instruct"
            and record["task"] == "niah"
            and record["length"] <= 32768
        ):
            method = f"{record['method']} {record['dtype']}" if "dtype" in record else record["method"]
            seconds[(method, record["length"])].append(record["seconds"])
    for method in sorted({m for m, _ in seconds}):
        bins = sorted(length for m, length in seconds if m == method)
        total = sum(100 * sum(seconds[(method, n)]) / len(seconds[(method, n)]) for n in bins)
        print(f"{method:22s} bins {len(bins)} -> {total / 3600:.1f} h for 100 items/bin")
    if args.floor:
        compute_floor()


if __name__ == "__main__":
    run_script(main)
