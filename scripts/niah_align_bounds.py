#!/usr/bin/env python3
"""How far another segment alignment moves armt's segment boundaries on the niah items of a bin.

`edgemem eval --segment-align N` reads an adapter with another alignment (`ARMTConfig.segment_align`:
each segment ends after the last sentence end among its last N tokens). Where a sentence ends in
the last 32 tokens, alignments 32 and 48 end the segment at the same place, so two readings can
share most boundaries; this script says how many. Per item (rebuilt as `edgemem eval` builds it):
the written segments under each alignment and how many of its boundaries the first alignment's
reading does not have.

    python scripts/niah_align_bounds.py --length 64k -n 20 --split validation --aligns 48,32,0
"""

from __future__ import annotations

import argparse
import sys

from edgemem.armt import segment_bounds, sentence_end_ids, text_ids
from edgemem.cli_common import run_script
from edgemem.data.tasks import Builder
from edgemem.evaluate import parse_lengths
from edgemem.models import load_tokenizer


def moved_bounds(
    ids: list[int], aligns: list[int], segment_len: int, window: int, ends: frozenset[int]
) -> list[tuple[int, int]]:
    """Per alignment in `aligns`: (segments written, boundaries the first alignment's reading lacks)."""
    bounds = [segment_bounds(ids, segment_len, window, a, ends) for a in aligns]
    first = set(bounds[0])
    return [(len(b), len(set(b) - first)) for b in bounds]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", default="64k", help="one length bin, e.g. 64k")
    parser.add_argument("-n", type=int, default=20, help="items of the bin (its first n, as the eval)")
    parser.add_argument("--split", default="test", choices=("test", "validation"))
    parser.add_argument("--aligns", default="48,32,0", help="alignments, the first the reference")
    parser.add_argument("--segment-len", type=int, default=128, help="tokens per segment (the adapter's)")
    parser.add_argument(
        "--answer-window", type=int, default=1024, help="tokens left unwritten (the adapter's)"
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args(argv)
    (length,) = parse_lengths(args.length)
    aligns = [int(a) for a in args.aligns.split(",")]
    tokenizer = load_tokenizer(args.model)
    ends = sentence_end_ids(tokenizer)
    print(
        "| item | "
        + " | ".join(f"align {a}: segments, boundaries not in align {aligns[0]}" for a in aligns)
        + " |"
    )
    print("|---|" + "---:|" * len(aligns))
    totals = [(0, 0)] * len(aligns)
    for item in Builder(tokenizer, split=args.split).build("niah", length, args.n):
        ids = text_ids(item.context, tokenizer)
        row = moved_bounds(ids, aligns, args.segment_len, args.answer_window, ends)
        totals = [(n + m, k + j) for (n, k), (m, j) in zip(totals, row, strict=True)]
        print(f"| {item.id} | " + " | ".join(f"{n}, {k}" for n, k in row) + " |")
    print("| all | " + " | ".join(f"{n}, {k}" for n, k in totals) + " |")


if __name__ == "__main__":
    run_script(lambda: main(sys.argv[1:]))
