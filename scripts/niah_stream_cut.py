#!/usr/bin/env python3
"""Does the stream before the needle cost the long niah answers, or the haystack around it?

At 32k the shipped adapter answers 2 of 20 validation items, wherever the needle sits (a needle
2,000 tokens from the end is missed as often as one 30,000 away), while at 16k it answers 16 of 20
(docs/RESULTS.md, "Thirty-seventh session"). This probe answers each niah item of one length whose
needle lies in the context's last `--keep` tokens twice, side by side in one process, through the
evaluation's own path (`ARMTMethod`, greedy, float32, the adapter's answer window):

- `full`: the whole context, as `edgemem eval` reads it;
- `cut`: only the context's last `--keep` tokens (the same needle, the same text after it; the
  stream before it left out).

If `cut` answers where `full` does not, what the memory wrote before the needle is what loses it
(the state after hundreds of segments), not the text around the needle.

`--cap-at N` adds a third answer, `capped`: the whole context, with each memory layer's A scaled
down after every write past the N-th to the Frobenius norm it had after the N-th write of the same
stream (z is fixed from the first write on: `write_gamma` is 0 for every later key). A probe of
whether the growth of A past the lengths trained on (64 written segments) is what loses the needle,
not a feature of edgemem.

    OMP_NUM_THREADS=1 python scripts/niah_stream_cut.py --length 32k --keep 16k -n 20 --split validation

`--skip-full` answers the cut contexts only (compare with `edgemem eval` lines of the same items).
`--cut-full-z` adds `cut-fz`: the cut context with z as the whole context's first write left it
(z is set by a stream's first write, so `cut` also changes the read's normaliser; this keeps it).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import Tensor

from edgemem.armt import MemoryState, text_ids
from edgemem.cli_common import run_script
from edgemem.data.tasks import Builder
from edgemem.evaluate import MAX_NEW_TOKENS, parse_lengths
from edgemem.methods import PrefixStateCache, build
from edgemem.scoring import near_miss, score


def capped_step(step: Callable, cap_at: int) -> Callable:
    """`ARMT.step` with each layer's A scaled down, after every write past the `cap_at`-th, to the
    norm it had after the `cap_at`-th write of the stream (batch 1; a new stream starts at write 1)."""
    caps: dict[int, Tensor] = {}

    def run(input_ids: Tensor, state: MemoryState, return_logits: bool = False):
        new, logits = step(input_ids, state, return_logits)
        if new.writes == cap_at:
            caps.clear()
            caps.update({layer: a.norm() for layer, a in new.A.items()})
        elif new.writes > cap_at and caps:
            scale = {layer: (caps[layer] / a.norm()).clamp(max=1.0) for layer, a in new.A.items()}
            new = MemoryState({layer: a * scale[layer] for layer, a in new.A.items()}, new.z, new.writes)
        return new, logits

    return run


def fixed_z_step(step: Callable, z: dict[int, Tensor]) -> Callable:
    """`ARMT.step` whose states carry `z` (per layer [1, K]) in place of the z the step wrote."""

    def run(input_ids: Tensor, state: MemoryState, return_logits: bool = False):
        new, logits = step(input_ids, state, return_logits)
        return MemoryState(new.A, dict(z), new.writes), logits

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adapter", default=None, help="default: the shipped adapter")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--length", default="32k")
    ap.add_argument("--keep", default="16k", help="tokens of the context kept for the cut answer")
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("--split", default="validation", choices=["test", "validation"])
    ap.add_argument("--skip-full", action="store_true")
    ap.add_argument("--skip-cut", action="store_true")
    ap.add_argument("--cap-at", type=int, default=0, help="add the `capped` answer (see above)")
    ap.add_argument("--cut-full-z", action="store_true", help="add the `cut-fz` answer (see above)")
    args = ap.parse_args()
    (length,), (keep,) = parse_lengths(args.length), parse_lengths(args.keep)

    method = build("armt", args.model, "hf", args.adapter, torch.float32)
    tokenizer = method.tokenizer
    # (arm, whether asked, whether it reads the cut context)
    plan = [
        (arm, reads_cut)
        for arm, on, reads_cut in (
            ("full", not args.skip_full, False),
            ("cut", not args.skip_cut, True),
            ("capped", args.cap_at > 0, False),
            ("cut-fz", args.cut_full_z, True),
        )
        if on
    ]
    arms = [arm for arm, _ in plan]
    step = method.armt.step
    right = dict.fromkeys(arms, 0)
    near = dict.fromkeys(arms, 0)
    asked = 0
    for item in Builder(tokenizer, split=args.split).build("niah", length, args.n):
        ids = text_ids(item.context, tokenizer)
        cut = replace(item, context=tokenizer.decode(ids[-keep:]))  # type: ignore[attr-defined]
        if item.answers[0] not in cut.context:  # the needle is not in the kept tokens
            continue
        asked += 1
        cells = []
        for arm, reads_cut in plan:
            it = cut if reads_cut else item
            t0 = time.time()
            wrapped = step
            if arm == "capped":
                wrapped = capped_step(step, args.cap_at)
            elif arm == "cut-fz":
                with torch.inference_mode():
                    first, _ = step(
                        torch.tensor([ids[: method.armt.config.segment_len]]), method.armt.empty_state()
                    )
                wrapped = fixed_z_step(step, first.z)
            method.armt.step = wrapped  # type: ignore[method-assign]
            method.cache = PrefixStateCache(method.armt)  # no state from another arm's ingest
            pred = method.predict(it, MAX_NEW_TOKENS["niah"])
            ok = score("niah", pred.text, it.answers).correct
            right[arm] += ok
            near[arm] += not ok and near_miss(pred.text, it.answers[0])
            cells.append(
                f"{arm} {'ok ' if ok else 'bad'} {time.time() - t0:5.1f}s {pred.text.strip()[:12]!r}"
            )
        print(
            f"{item.id} depth {item.meta['depth']:.2f} gold {item.answers[0]}: " + "  ".join(cells),
            flush=True,
        )
    for arm in arms:
        print(f"{arm}: {right[arm]} of {asked} correct, {near[arm]} near misses (5+ of 7 digits in place)")


if __name__ == "__main__":
    run_script(main)
