#!/usr/bin/env python3
"""How a memory state grows along one long stream: each memory layer's |A| and |z| after each write.

Writes every full segment of one niah item's context (the evaluation's builder, `--split`,
`--length`, item `--index`) through the adapter, one step per segment (float32, no answer),
and prints the Frobenius norms of A and z per layer at the writes given by `--at`; `--out` keeps
every write's norms as JSON. docs/RESULTS.md, "Thirty-eighth session", read one 32k validation
stream this way: z is fixed from the first write on (`write_gamma` is 0 for every later key once
the first segment's 128 keys are summed into z), while A keeps growing past the 64 written
segments the adapters trained on.

    OMP_NUM_THREADS=1 python scripts/memory_state_norms.py --length 32k --split validation
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch

from edgemem.armt import ARMT, text_ids
from edgemem.cli_common import run_script
from edgemem.data.tasks import Builder
from edgemem.evaluate import parse_lengths
from edgemem.files import atomic_write_text
from edgemem.methods import build


def norm_rows(
    armt: ARMT, ids: list[int], on_row: Callable[[dict[str, float]], None] | None = None
) -> list[dict[str, float]]:
    """Write every full segment of `ids` (one step each, batch 1, no gradient) from an empty state:
    one row per write, {"writes": n, "A<layer>": |A|, "z<layer>": |z|} (Frobenius norms), each
    also handed to `on_row` as soon as it is made."""
    S = armt.config.segment_len
    state, rows = armt.empty_state(), []
    with torch.no_grad():
        for s in range(len(ids) // S):
            state, _ = armt.step(torch.tensor([ids[s * S : (s + 1) * S]]), state)
            row: dict[str, float] = {"writes": state.writes}
            row.update({f"A{layer}": float(a.norm()) for layer, a in state.A.items()})
            row.update({f"z{layer}": float(z.norm()) for layer, z in state.z.items()})
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adapter", default=None, help="default: the shipped adapter")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--length", default="32k")
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--split", default="validation", choices=["test", "validation"])
    ap.add_argument("--at", default="1,2,4,8,16,32,64,128,192,255", help="writes to print")
    ap.add_argument("--out", type=Path, default=None, help="every write's norms, as JSON")
    args = ap.parse_args()
    (length,) = parse_lengths(args.length)
    show = {int(x) for x in args.at.split(",")}

    method = build("armt", args.model, "hf", args.adapter, torch.float32)
    armt, tokenizer = method.armt, method.tokenizer
    item = Builder(tokenizer, split=args.split).item("niah", length, args.index, args.index + 1)
    ids = text_ids(item.context, tokenizer)
    print(f"{item.id} ({args.split}): {len(ids)} tokens, {len(ids) // armt.config.segment_len} segments")

    def report(row: dict[str, float]) -> None:
        if row["writes"] in show:
            cells = " ".join(f"{k} {v:.4g}" for k, v in row.items() if k != "writes")
            print(f"write {row['writes']:4d}: {cells}", flush=True)

    rows = norm_rows(armt, ids, report)
    if args.out:
        atomic_write_text(args.out, json.dumps(rows))


if __name__ == "__main__":
    run_script(main)
