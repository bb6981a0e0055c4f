#!/usr/bin/env python3
import collections
import glob
import json

# projected wall time of a 100-item-per-bin niah sweep to 32k, from the measured seconds per item
secs = collections.defaultdict(list)
for path in glob.glob("docs/eval/smollm2-135m-instruct/niah.*.jsonl"):
    for line in open(path):
        r = json.loads(line)
        if r["length"] <= 32768:
            secs[(r["method"], r["length"])].append(r["seconds"])
for method in sorted({m for m, _ in secs}):
    bins = sorted(l for m, l in secs if m == method)
    total = sum(100 * sum(secs[(method, l)]) / len(secs[(method, l)]) for l in bins)
    print(f"{method:10s} bins {len(bins)} -> {total / 3600:.1f} h for 100 items/bin")
