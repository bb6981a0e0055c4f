#!/usr/bin/env python3
"""Where armt's niah answers fail: the needle written into memory, or left in the unwritten tail.

An armt ingest writes every full segment and keeps the last 1..S tokens (the tail) unwritten; the
answer segment shows the tail beside the question. This script rebuilds the items behind the
given result files (from the prepared corpora, as `edgemem eval` does; validation items for lines
of `--split validation`), tokenizes each context as `ARMTMethod` does, and says whether the gold
number is in the tail, or else whether one written segment holds the needle whole ("written") or
a segment boundary cuts it ("cut"). It then counts, over the items every file holds, the correct answers and
the near misses (5+ of 7 digits in place) per file, split by where the needle was, how often each
file agrees with the first, per length the items only a file or only the first answers, and which
digits a file's wrong 7-digit answers write in place of which, at which positions, which digit
a wrong first digit is written as, in how many it is the only wrong digit, and how many wrong
answers have one wrong digit:

    python scripts/niah_tail_split.py docs/eval-sweep/smollm2-135m-instruct/niah.armt.jsonl
    python scripts/niah_tail_split.py SHIPPED.jsonl PROBE.jsonl CONTROL.jsonl   # same items side by side
    python scripts/niah_tail_split.py A.jsonl B.jsonl --lengths 16k   # one bin's items only

S is 128 (the shipped adapter's segment length; `--segment-len` for another). With
`--answer-window W` the tail is what an adapter with that answer window leaves unwritten (its last
W-S+1..W tokens), so "written" is the needles in memory of lines evaluated under the window;
`--segment-align N` places the boundaries as an adapter with that alignment does
(`ARMTConfig.segment_align`).
"""

from __future__ import annotations

import argparse
import bisect
import json
from collections import Counter, defaultdict
from pathlib import Path

from edgemem.armt import segment_bounds, sentence_end_ids, text_ids
from edgemem.cli_common import run_script
from edgemem.data.tasks import NIAH_NEEDLE, Builder
from edgemem.evaluate import parse_lengths
from edgemem.models import load_tokenizer
from edgemem.scoring import near_miss


def needle_place(first: int, last: int, bounds: list[int], in_tail: bool) -> str:
    """Where a needle's tokens first..last (ids of the ingested context) sat: "tail" when its number
    is in the unwritten tail, "cut" when a segment boundary (`bounds`: where each written segment
    ends) falls inside it, else "written" (one segment holds it whole)."""
    if in_tail:
        return "tail"
    return "cut" if bisect.bisect_right(bounds, first) != bisect.bisect_right(bounds, last) else "written"


def needle_token_span(context: str, needle: str, tokenizer: object, n_ids: int) -> tuple[int, int]:
    """The first and last token of the context's `n_ids` ingested ids (a BOS, where the model uses
    one, before the text's own) that hold any of the needle sentence's characters."""
    start = context.index(needle)
    offsets = tokenizer(context, return_offsets_mapping=True, add_special_tokens=False)["offset_mapping"]  # type: ignore[operator]
    bos = n_ids - len(offsets)
    span = [j for j, (a, b) in enumerate(offsets) if a < start + len(needle) and b > start]
    return bos + span[0], bos + span[-1]


def corpora_note(runs: list[dict[str, dict]], shared: set[str]) -> list[str]:
    """Lines to print when the shared items' lines come from more than one corpora build: an id
    fixes the needle and its depth, the haystack around it comes from the build. Per length, how
    many shared items have other token counts in some file (then surely another haystack)."""
    builds = {str(run[i].get("corpora")) for run in runs for i in shared}
    if len(builds) < 2:
        return []
    lines = [
        f"note: the files' items come from {len(builds)} corpora builds ({', '.join(sorted(builds))}):"
        " one id may be another haystack in each; where the needle sat is judged on this machine's corpora"
    ]
    for length in sorted({runs[0][i]["length"] for i in shared}):
        ids = [i for i in shared if runs[0][i]["length"] == length]
        other = sum(len({run[i]["tokens"] for run in runs}) > 1 for i in ids)
        lines.append(f"  {length // 1024}k: token counts differ on {other} of {len(ids)} items")
    return lines


def lines_split(runs: list[dict[str, dict]], shared: set[str]) -> str:
    """The split the shared items' lines were drawn from (lines that record none: `test`); one id
    is another item in each split, so lines of two splits are not compared (ValueError)."""
    splits = {run[i].get("split", "test") for run in runs for i in shared} or {"test"}
    if len(splits) > 1:
        raise ValueError(f"the files' lines come from more than one split ({', '.join(sorted(splits))})")
    return splits.pop()


def _blurred(records: list[dict]) -> list[tuple[str, str]]:
    """(digits of the answer, gold number) of the wrong answers with as many digits as the gold."""
    pairs = []
    for r in records:
        gold = r["gold"][0]
        digits = "".join(ch for ch in r["prediction"] if ch.isdigit())
        if not r["correct"] and len(digits) == len(gold):
            pairs.append((digits, gold))
    return pairs


def wrong_digits(records: list[dict]) -> tuple[Counter, Counter]:
    """(digits written, gold digits they replaced) over the wrong answers whose digits are as many
    as the gold number's: where a blurred recall goes. Other wrong answers are not counted."""
    written: Counter = Counter()
    replaced: Counter = Counter()
    for digits, gold in _blurred(records):
        for got, want in zip(digits, gold, strict=True):
            if got != want:
                written[got] += 1
                replaced[want] += 1
    return written, replaced


def wrong_positions(records: list[dict]) -> Counter:
    """How often each position (1 = the number's first digit) is wrong, over the same answers as
    `wrong_digits`: which part of a blurred number the memory loses."""
    return Counter(
        position
        for digits, gold in _blurred(records)
        for position, (got, want) in enumerate(zip(digits, gold, strict=True), start=1)
        if got != want
    )


def wrong_first_digits(records: list[dict]) -> Counter:
    """The first digit written, over the same answers as `wrong_digits` whose first digit is wrong:
    whether a lost first digit is replaced by one digit every time (a bias, not a blur)."""
    return Counter(digits[0] for digits, gold in _blurred(records) if digits[0] != gold[0])


def only_first_wrong(records: list[dict]) -> int:
    """Wrong answers (of the gold's length) whose first digit is their only wrong one: the needles
    memory kept but for the digit it brings back with nothing of the number before it."""
    return sum(digits[0] != gold[0] and digits[1:] == gold[1:] for digits, gold in _blurred(records))


def one_wrong_digit(records: list[dict]) -> tuple[int, int]:
    """(wrong answers of the gold's length with exactly one wrong digit, all wrong answers of the
    gold's length): how many misses the memory kept but for one digit."""
    blurred = _blurred(records)
    return sum(sum(g != w for g, w in zip(d, gold, strict=True)) == 1 for d, gold in blurred), len(blurred)


def only_right(runs: list[dict[str, dict]], shared: set[str]) -> dict[int, list[tuple[int, int]]]:
    """Per length, for each file after the first: (items it answers and the first does not, items the
    first answers and it does not), over `shared`."""
    out: dict[int, list[tuple[int, int]]] = {}
    for length in sorted({runs[0][i]["length"] for i in shared}):
        ids = [i for i in shared if runs[0][i]["length"] == length]
        out[length] = [
            (
                sum(run[i]["correct"] and not runs[0][i]["correct"] for i in ids),
                sum(runs[0][i]["correct"] and not run[i]["correct"] for i in ids),
            )
            for run in runs[1:]
        ]
    return out


def most_common(counts: Counter) -> str:
    return ", ".join(f"{d} x{n}" for d, n in counts.most_common())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="niah.armt.jsonl result files")
    parser.add_argument("--segment-len", type=int, default=128)
    parser.add_argument("--answer-window", type=int, default=0, help="the lines' answer window (0: none)")
    parser.add_argument("--segment-align", type=int, default=0, help="the lines' segment alignment (0: none)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--lengths", type=parse_lengths, help="only these bins' items, e.g. 16k or 8k,16k")
    args = parser.parse_args()

    runs = [{r["id"]: r for r in map(json.loads, f.read_text().splitlines())} for f in args.files]
    shared = set(runs[0]).intersection(*runs[1:])
    if args.lengths:
        shared = {i for i in shared if runs[0][i]["length"] in args.lengths}
    for line in corpora_note(runs, shared):
        print(line)
    try:
        split = lines_split(runs, shared)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    tokenizer = load_tokenizer(args.model)
    builder = Builder(tokenizer, split=split)
    S = args.segment_len
    ends = sentence_end_ids(tokenizer) if args.segment_align else frozenset()
    where: dict[str, str] = {}
    for length in sorted({runs[0][i]["length"] for i in shared}):
        wanted = {i for i in shared if runs[0][i]["length"] == length}
        n = 1 + max(int(i.rsplit("-", 1)[1]) for i in wanted)
        for item in builder.build("niah", length, n):
            if item.id in wanted:
                ids = text_ids(item.context, tokenizer)
                bounds = segment_bounds(ids, S, args.answer_window, args.segment_align, ends)
                tail = tokenizer.decode(ids[bounds[-1] if bounds else 0 :])  # type: ignore[attr-defined]
                needle = NIAH_NEEDLE.format(item.meta["key"], item.answers[0])
                first, last = needle_token_span(item.context, needle, tokenizer, len(ids))
                where[item.id] = needle_place(first, last, bounds, item.answers[0] in tail)

    counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0] * (1 + 2 * len(runs)))
    for i in shared:
        length = runs[0][i]["length"]
        for key in ((f"{length // 1024}k", where[i]), ("all", where[i])):
            cell = counts[key]
            cell[0] += 1
            for k, run in enumerate(runs):
                cell[1 + 2 * k] += run[i]["correct"]
                cell[2 + 2 * k] += near_miss(run[i]["prediction"], run[i]["gold"][0])
    print(f"{len(shared)} items in every file; per file: correct / 5+ of 7 digits in place")
    for k, f in enumerate(args.files):
        print(f"  [{k}] {f}")
    for k, run in enumerate(runs[1:], start=1):
        verdict = sum(run[i]["correct"] == runs[0][i]["correct"] for i in shared)
        text = sum(run[i]["prediction"] == runs[0][i]["prediction"] for i in shared)
        print(f"  [{k}] against [0]: the same verdict on {verdict}, the same text on {text}")
    for length, pairs in only_right(runs, shared).items():
        cells = "  ".join(f"[{k}] {mine} / [0] {theirs}" for k, (mine, theirs) in enumerate(pairs, start=1))
        print(f"{length // 1024:3d}k only right: {cells}")
    for key in sorted(counts, key=lambda k: (k[0] == "all", int(k[0][:-1]) if k[0] != "all" else 0, k[1])):
        cell = counts[key]
        cells = "  ".join(f"[{k}] {cell[1 + 2 * k]:3d} / {cell[2 + 2 * k]:3d}" for k in range(len(runs)))
        print(f"{key[0]:>4s} {key[1]:7s} of {cell[0]:3d}:  {cells}")
    for k, run in enumerate(runs):
        records = [run[i] for i in shared]
        written, replaced = wrong_digits(records)
        print(f"  [{k}] {sum(written.values())} wrong digits written: {most_common(written)}")
        print(f"       in place of: {most_common(replaced)}")
        positions = wrong_positions(records)
        print(f"       at positions: {', '.join(f'{p} x{positions[p]}' for p in sorted(positions))}")
        one, blurred = one_wrong_digit(records)
        print(f"       one wrong digit in {one} of the {blurred} wrong answers of the gold's length")
        firsts, alone = most_common(wrong_first_digits(records)), only_first_wrong(records)
        print(f"       first digit, where wrong, written as: {firsts} (the only wrong digit in {alone})")


if __name__ == "__main__":
    run_script(main)
