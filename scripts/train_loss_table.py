#!/usr/bin/env python3
"""Training logs side by side: each stage's mean loss over the steps a log holds, and its
held-out evaluations, one column per log.

    python scripts/train_loss_table.py docs/train/gemma3-270m/log.jsonl docs/train/smollm2-135m/log.jsonl
    python scripts/train_loss_table.py --until 50 LOG ...   # only the steps up to 50 (runs of unequal length)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edgemem.cli_common import run_script


def records(log: Path, until: int | None = None) -> list[dict]:
    """The log's lines (steps and evaluations), only those up to step `until` when given."""
    out = [json.loads(line) for line in log.read_text().splitlines()]
    return [r for r in out if until is None or r["step"] <= until]


def stages(log: Path, until: int | None = None) -> dict[str, tuple[int, int, float]]:
    """stage -> (first step, last step, mean loss) over the log's step lines, in order (only the
    steps up to `until`, when given)."""
    seen: dict[str, list[tuple[int, float]]] = {}
    for record in records(log, until):
        if "loss" in record:
            seen.setdefault(record["stage"], []).append((record["step"], record["loss"]))
    return {
        name: (steps[0][0], steps[-1][0], sum(loss for _, loss in steps) / len(steps))
        for name, steps in seen.items()
    }


def evaluations(log: Path, until: int | None = None) -> list[str]:
    out = []
    for record in records(log, until):
        if "eval_exact" in record:
            cells = " / ".join(f"{v:.2f}" for v in record["eval_exact"].values())
            out.append(f"step {record['step']}: {cells} at {', '.join(record['eval_exact'])} segments")
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=Path, help="log.jsonl of a training run")
    parser.add_argument("--until", type=int, default=None, help="only the steps up to this one")
    args = parser.parse_intermixed_args(argv)
    logs = args.logs
    tables = [stages(log, args.until) for log in logs]
    names = list(dict.fromkeys(name for table in tables for name in table))
    print("| stage | " + " | ".join(str(log) for log in logs) + " |")
    print("|---|" + "---:|" * len(logs))
    for name in names:
        cells = [f"{t[name][2]:.2f} (steps {t[name][0]}-{t[name][1]})" if name in t else "-" for t in tables]
        print(f"| {name} | " + " | ".join(cells) + " |")
    for log in logs:
        print(f"\n{log}: held-out exact recall")
        for line in evaluations(log, args.until):
            print(f"  {line}")


if __name__ == "__main__":
    run_script(lambda: main(sys.argv[1:]))
