#!/usr/bin/env python3
"""Ingest throughput of the ARMT segment step: LoRA separate vs merged into the weights
(`ARMT.merge_lora`), at batch 1, 2, 4, 8 (items side by side), in one process.

The evaluation harness used to step one item at a time through the training-time LoRA wrappers:
three matrix products per projection with a float32 round trip, on [1, 144, 576] activations.
This measures what merging and batching buy, in alternating rounds so that every variant sees the
same machine noise.

OMP_NUM_THREADS=1 python scripts/armt_batch_speed.py [--batches 1 2 4 8] [--segments 8] [--rounds 3]
    [--dtype auto|float32|bfloat16]
"""

import argparse
import copy
import statistics
import time

import torch

from edgemem.assistant import Assistant
from edgemem.cli_common import run_script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--segments", type=int, default=8, help="segments stepped per timing")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto")
    args = parser.parse_args()
    if min(args.rounds, args.segments, *args.batches) < 1:
        parser.error("--batches, --segments and --rounds must be at least 1")
    dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
    separate = Assistant.open("smollm2-135m-instruct", None, dtype=dtype).armt
    merged = copy.deepcopy(separate)  # its own base weights: merging changes them
    merged.merge_lora()
    variants = {"separate": separate, "merged": merged}
    S = separate.config.segment_len
    vocab = separate.base.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    print(
        f"dtype {separate.base.dtype}, segment {S} + {separate.config.num_write_tokens} write tokens, "
        f"{torch.get_num_threads()} threads, shipped adapter"
    )
    cells = [(name, b) for name in variants for b in args.batches]
    rates: dict[tuple[str, int], list[float]] = {cell: [] for cell in cells}
    with torch.inference_mode():
        for name, b in cells:  # warm-up: oneDNN picks kernels per shape
            armt = variants[name]
            armt.step(torch.randint(0, vocab, (b, S), generator=generator), armt.empty_state(b))
        for r in range(args.rounds):
            for name, b in cells if r % 2 == 0 else list(reversed(cells)):
                armt = variants[name]
                state = armt.empty_state(b)
                ids = torch.randint(0, vocab, (args.segments, b, S), generator=generator)
                start = time.perf_counter()
                for k in range(args.segments):
                    state, _ = armt.step(ids[k], state)
                rates[(name, b)].append(b * S * args.segments / (time.perf_counter() - start))
    base = statistics.median(rates[("separate", args.batches[0])])
    print(f"LoRA      batch  tokens/s (median)  vs separate, batch {args.batches[0]}   rounds")
    for name, b in cells:
        median = statistics.median(rates[(name, b)])
        runs = " ".join(f"{x:.0f}" for x in rates[(name, b)])
        print(f"{name:8s}  {b:5d}  {median:17.0f}  {median / base:24.2f}x   {runs}")


if __name__ == "__main__":
    run_script(main)
