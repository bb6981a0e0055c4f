#!/usr/bin/env python3
"""Whose number a `niah-mk` answer writes: the asked key's needle, a distractor's, or neither.

A niah-mk item holds four needles of one sentence ("One of the special magic numbers for KEY is:
NUMBER."): the asked key's and three with other keys at random depths. This script rebuilds the
items behind a result file (from the prepared corpora, as `edgemem eval` does; validation items
for lines of `--split validation`), finds the four needles in each context, and per length bin
counts the answers that write the asked number, a distractor's (exactly, or 5+ of its 7 digits in
place), or none of them, and of the answers that take a distractor's, how many take the needle
written first in the context (the one furthest from the question):

    python scripts/niah_mk_confusions.py docs/eval-niah-mk/shipped/smollm2-135m-instruct/niah-mk.armt.jsonl

An answer that holds no key's number says the read found none; one that holds a distractor's says
it found a needle and not by its key.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

from edgemem.cli_common import run_script
from edgemem.data.tasks import NIAH_NEEDLE, Builder
from edgemem.evaluate import parse_lengths
from edgemem.models import load_tokenizer
from edgemem.scoring import near_miss

NEEDLE = re.compile(re.escape(NIAH_NEEDLE).replace(r"\{\}", r"(.+?)", 1).replace(r"\{\}", r"(\d+)", 1))
VERDICTS = ("asked", "asked, near", "distractor", "distractor, near", "none")


def needles(context: str) -> list[tuple[str, str]]:
    """The (key, number) of every needle in `context`, in the order they are written."""
    return [(m.group(1), m.group(2)) for m in NEEDLE.finditer(context)]


def verdict(context: str, key: str, prediction: str) -> tuple[str, int]:
    """Whose number `prediction` writes ("asked", "distractor", each exact or ", near": 5+ of its
    digits in place; else "none"), and that needle's place in the context's order of needles (0:
    written first; -1 for "none"). An exact match wins over a near one, the asked key's over a
    distractor's, an earlier needle over a later one."""
    found = needles(context)
    digits = "".join(ch for ch in prediction if ch.isdigit())
    for exact in (True, False):
        for asked in (True, False):
            for at, (k, number) in enumerate(found):
                if (k == key) != asked:
                    continue
                if digits[: len(number)] == number if exact else near_miss(prediction, number):
                    return ("asked" if asked else "distractor") + ("" if exact else ", near"), at
    return "none", -1


def table(rows: list[tuple[int, str, int]]) -> list[str]:
    """Rows of (length, verdict, needle order) as a table: per length, each verdict's count and
    how many of the answers that take a distractor's number take the needle written first."""
    by_length: dict[int, Counter] = defaultdict(Counter)
    first: Counter = Counter()
    for length, name, order in rows:
        by_length[length][name] += 1
        first[length] += order == 0 and name.startswith("distractor")
    lines = [
        "| length | n | " + " | ".join(VERDICTS) + " | distractor answers from the needle written first |",
        "|---" * (len(VERDICTS) + 3) + "|",
    ]
    for length in sorted(by_length):
        counts = by_length[length]
        cells = " | ".join(str(counts[v]) for v in VERDICTS)
        taken = counts["distractor"] + counts["distractor, near"]
        lines.append(f"| {length // 1024}k | {sum(counts.values())} | {cells} | {first[length]} of {taken} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="a niah-mk result file (JSONL of `edgemem eval`)")
    ap.add_argument("--lengths", default=None, help="only these bins, e.g. 4k,16k")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    args = ap.parse_args()
    lines = [json.loads(line) for line in args.results.read_text().splitlines() if line.strip()]
    lines = [r for r in lines if r["task"] == "niah-mk"]
    if args.lengths:
        keep = set(parse_lengths(args.lengths))
        lines = [r for r in lines if r["length"] in keep]
    if not lines:
        raise SystemExit(f"{args.results}: no niah-mk lines")
    splits = {r.get("split", "test") for r in lines}
    if len(splits) > 1:
        raise SystemExit(f"{args.results}: lines of more than one split ({', '.join(sorted(splits))})")
    builder = Builder(load_tokenizer(args.model), split=splits.pop())
    rows = []
    for r in sorted(lines, key=lambda r: (r["length"], r["id"])):
        index = int(r["id"].rsplit("-", 1)[1])
        item = builder.item("niah-mk", r["length"], index, index + 1)
        found = needles(item.context)
        name, order = verdict(item.context, item.meta["key"], r["prediction"])
        rows.append((r["length"], name, order))
        asked = next(at for at, (k, _) in enumerate(found) if k == item.meta["key"])
        where = f" from needle {order + 1} of {len(found)}" if order >= 0 else ""
        print(f"{r['id']}: {name}{where} (asked: needle {asked + 1}) pred={r['prediction'].strip()!r}")
    print("\n".join(table(rows)))


if __name__ == "__main__":
    run_script(main)
