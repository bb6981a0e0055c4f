#!/usr/bin/env python3
"""Does the haystack's own text set the digit armt writes wrong? niah with two haystack digits swapped.

At 64k the misses of the recall-longer-more2 adapter write the needle's first digit as `3`
(15 of 16 misses), whatever the gold digit. This script rebuilds niah test items (as `edgemem
eval` does), swaps two digits in the haystack (everywhere, in its last `--last` characters or in
all but them) but never in the needle's own sentence, and evaluates `armt` on them with
`edgemem.evaluate.run`, into a results folder of their own. Digits are single tokens in SmolLM2's
tokenizer, so every item keeps its token count, segments and needle position (checked per item
before anything runs). If the haystack's text sets the wrong digit, it moves with the swap (`3`
-> `7` under `--swap 37`); if it stays, the bias is the adapter's.

    python scripts/niah_digit_swap.py --counts --length 64k            # the haystacks' first digits
    python scripts/niah_digit_swap.py --adapter A --length 64k -n 20 --swap 37 --results R
    python scripts/niah_digit_swap.py ... --last 20000 --results R2       # the haystack's end only
    python scripts/niah_digit_swap.py ... --but-last 20000 --results R3   # all but its end
    python scripts/niah_tail_split.py CONTROL.jsonl R/smollm2-135m-instruct/niah.armt.jsonl

Two processes of the same command share the items (`edgemem eval`'s per-item claims), one thread
each (`OMP_NUM_THREADS=1`). Lines record the corpora build with a `+swapAB` suffix
(`+swapAB-lastN`, `+swapAB-butlastN`).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

from edgemem.cli_common import run_script
from edgemem.data.tasks import Builder, Item
from edgemem.errors import EdgememError
from edgemem.evaluate import parse_lengths, run
from edgemem.models import load_tokenizer

NUMBER = re.compile(r"(?<![0-9])[0-9]+")


def first_digits(text: str) -> Counter[str]:
    """How many numbers (maximal digit runs) of `text` start with each digit."""
    return Counter(m.group()[0] for m in NUMBER.finditer(text))


def swap_digits(item: Item, pair: str, start: int = 0, end: int | None = None) -> Item:
    """`item` with the two digits of `pair` swapped in its context's characters [start, end) (end
    None: to the end) but never in the needle's own sentence (`item.passage`, which must occur
    once): the same question, answers and needle."""
    count = item.context.count(item.passage)
    if count != 1:
        raise ValueError(f"{item.id}: the needle's sentence occurs {count} times")
    table = str.maketrans({pair[0]: pair[1], pair[1]: pair[0]})
    end = len(item.context) if end is None else end

    def swapped(lo: int, hi: int) -> str:  # the context's [lo, hi), swapped where inside [start, end)
        a, b = min(max(start, lo), hi), max(min(end, hi), lo)
        if a >= b:
            return item.context[lo:hi]
        return item.context[lo:a] + item.context[a:b].translate(table) + item.context[b:hi]

    needle = item.context.index(item.passage)
    after = needle + len(item.passage)
    context = swapped(0, needle) + item.passage + swapped(after, len(item.context))
    return Item(**{**item.__dict__, "context": context})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", default="64k", help="one length bin, e.g. 64k")
    parser.add_argument("-n", type=int, default=20, help="items in the bin")
    parser.add_argument("--swap", default="37", help="the two digits to swap, e.g. 37")
    parser.add_argument("--adapter", help="ARMT memory adapter (.safetensors)")
    parser.add_argument("--results", default="docs/digit-swap", help="results folder")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--counts", action="store_true", help="print the haystacks' first digits and stop")
    parser.add_argument("--tail-chars", type=int, default=20_000, help="--counts: the tail's characters")
    span = parser.add_mutually_exclusive_group()
    span.add_argument("--last", type=int, metavar="N", help="swap in the context's last N characters only")
    span.add_argument(
        "--but-last", type=int, metavar="N", help="swap everywhere but in the last N characters"
    )
    args = parser.parse_args()
    if not re.fullmatch(r"[0-9]{2}", args.swap) or args.swap[0] == args.swap[1]:
        parser.error("--swap takes two different digits, e.g. 37")
    try:
        lengths = parse_lengths(args.length)
    except EdgememError as e:
        parser.error(str(e))
    if len(lengths) != 1:
        parser.error("--length takes one length bin, e.g. 64k")
    [length] = lengths
    tokenizer = load_tokenizer(args.model)
    builder = Builder(tokenizer)
    if args.counts:
        item = builder.item("niah", length, 0, args.n)  # a bin's items share one haystack (needle aside)
        for where, text in (
            ("whole", item.context),
            (f"last {args.tail_chars:,} chars", item.context[-args.tail_chars :]),
        ):
            counts = first_digits(text.replace(item.passage, ""))
            total = sum(counts.values())
            shares = " ".join(f"{d}:{counts[d] / max(1, total):.2f}" for d in "0123456789")
            print(f"{length // 1024}k {where}: {total} numbers, first digit {shares}")
        return

    swapped = []
    for item in builder.build("niah", length, args.n):
        size = len(item.context)
        start = 0 if args.last is None else max(0, size - args.last)
        end = size if args.but_last is None else max(0, size - args.but_last)
        other = swap_digits(item, args.swap, start, end)
        if builder.count(other.context) + builder.count(other.question) != item.tokens:  # as the item counted
            raise SystemExit(f"{item.id}: swapping {args.swap} changes the token count")
        swapped.append(other)
    where = "" if args.last is None else f"-last{args.last}"
    where += "" if args.but_last is None else f"-butlast{args.but_last}"
    corpora = f"{builder.corpora_id('niah')}+swap{args.swap}{where}"
    results = Path(args.results)
    report = run(
        "niah",
        [length],
        "armt",
        args.n,
        args.model,
        adapter=args.adapter,
        results=results,
        items=lambda _: swapped,
        corpora=corpora,
    )
    print(
        f"{report.ran} run ({report.correct} correct), {report.skipped} done before, {report.elsewhere} aside"
    )


if __name__ == "__main__":
    run_script(main)
