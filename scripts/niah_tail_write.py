#!/usr/bin/env python3
"""Would writing the unwritten tail into memory before answering save the tail needles?

An armt ingest writes every full segment and keeps the last 1..S tokens (the tail) unwritten, shown
beside the question; the shipped adapter then answers 0 of 14 tail needles (`niah_tail_split.py`).
Its recall stages always wrote the needle into memory and answered from memory. This probe
answers each niah test item twice from the same ingest, side by side in one process:

- `tail unwritten` (edgemem's answers before `armt.answer_state`): the state after the full
  segments, the tail in the prompt;
- `tail written` (edgemem's answers since): one more (partial) segment step on the tail first,
  the tail still in the prompt.

It runs every item whose needle sits in the tail and the first `--written` items per length whose
needle was written (deepest first, as `edgemem eval` orders them), and prints correct answers and
near misses (5+ of 7 digits in place) for both, split by where the needle was:

    python scripts/niah_tail_write.py --lengths 1k,2k,4k,8k -n 100 --written 20

The model is `edgemem eval`'s armt: the shipped adapter (or `--adapter`), LoRA merged, the
machine's preferred dtype, `--threads` torch threads.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

from edgemem.armt import answer_state, generate_ids
from edgemem.cli_common import run_script
from edgemem.data.tasks import Builder
from edgemem.evaluate import MAX_NEW_TOKENS, parse_lengths
from edgemem.methods import ARMTMethod, build, chat_prompt
from edgemem.models import load_tokenizer
from edgemem.scoring import near_miss, score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1k,2k,4k,8k")
    parser.add_argument("-n", type=int, default=100, help="items per length (the sweep's)")
    parser.add_argument("--written", type=int, default=20, help="written-needle items per length")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--adapter", default=None)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    tokenizer = load_tokenizer(args.model)
    builder = Builder(tokenizer)
    method = build("armt", args.model, "hf", args.adapter)
    assert isinstance(method, ARMTMethod)
    armt, S = method.armt, method.armt.config.segment_len
    counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    start = time.perf_counter()
    for length in parse_lengths(args.lengths):
        items = sorted(
            builder.build("niah", length, args.n), key=lambda it: -float(it.meta.get("depth") or 0)
        )
        written = 0
        for item in items:
            ids = method._ids(item.context)
            tail_text = tokenizer.decode(ids[(len(ids) - 1) // S * S :])  # type: ignore[attr-defined]
            where = "tail" if item.answers[0] in tail_text else "written"
            if where == "written":
                if written >= args.written:
                    continue
                written += 1
            done = method.cache.ingest(ids)
            prompt = chat_prompt(tokenizer, done.tail, item.question, item.answer_prefix)
            state = answer_state(armt, done.state, done.tail)
            texts = [
                tokenizer.decode(  # type: ignore[attr-defined]
                    list(generate_ids(armt, s, prompt, method.stop_ids, MAX_NEW_TOKENS["niah"])),
                    skip_special_tokens=True,
                )
                for s in (done.state, state)
            ]
            cell = counts[f"{length // 1024}k", where]
            cell[0] += 1
            for k, text in enumerate(texts):
                cell[1 + 2 * k] += score("niah", text, item.answers).correct
                cell[2 + 2 * k] += near_miss(text, item.answers[0])
            print(f"{item.id} {where:7s} gold {item.answers[0]}: {texts[0]!r} | {texts[1]!r}", flush=True)
    print(f"{time.perf_counter() - start:.0f} s; correct / 5+ of 7 digits in place:")
    print("           items  unwritten   tail written")
    total: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for (length, where), cell in counts.items():
        total[where] = [a + b for a, b in zip(total[where], cell, strict=True)]
        print(
            f"{length:>4s} {where:7s} {cell[0]:4d}  {cell[1]:4d} / {cell[2]:3d}  {cell[3]:4d} / {cell[4]:3d}"
        )
    for where, cell in sorted(total.items()):
        print(f" all {where:7s} {cell[0]:4d}  {cell[1]:4d} / {cell[2]:3d}  {cell[3]:4d} / {cell[4]:3d}")


if __name__ == "__main__":
    run_script(main)
