#!/usr/bin/env python3
"""Projected wall time of a 100-item-per-bin niah sweep to 32k, per method, from the measured
seconds per item in docs/eval (100 x mean seconds per item, summed over the 1k-32k bins).
armt lines are labelled by adapter as in the results table (`armt`, `armt-untrained`)."""

import collections
from pathlib import Path

from edgemem.evaluate import load_records

seconds: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
for record in load_records(Path("docs/eval")):
    if record["model"] == "smollm2-135m-instruct" and record["task"] == "niah" and record["length"] <= 32768:
        seconds[(record["method"], record["length"])].append(record["seconds"])
for method in sorted({m for m, _ in seconds}):
    bins = sorted(length for m, length in seconds if m == method)
    total = sum(100 * sum(seconds[(method, n)]) / len(seconds[(method, n)]) for n in bins)
    print(f"{method:15s} bins {len(bins)} -> {total / 3600:.1f} h for 100 items/bin")
