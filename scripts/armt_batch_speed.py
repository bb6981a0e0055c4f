#!/usr/bin/env python3
"""Ingest throughput of the ARMT segment step at batch 1, 2, 4, 8 (items side by side), one process.

The evaluation harness steps one item at a time: [1, 144, 576] activations, matrix products too
thin to keep a CPU's vector units busy. This measures what stepping B items in lockstep buys, in
alternating rounds so every batch size sees the same machine noise.

OMP_NUM_THREADS=1 python scripts/armt_batch_speed.py [--batches 1 2 4 8] [--segments 8] [--rounds 3]
    [--dtype auto|float32|bfloat16] [--merge-lora]
"""

import argparse
import statistics
import time

import torch

from edgemem.assistant import Assistant

parser = argparse.ArgumentParser()
parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
parser.add_argument("--segments", type=int, default=8, help="segments stepped per timing")
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto")
parser.add_argument("--merge-lora", action="store_true", help="fold LoRA into the weights (ARMT.merge_lora)")
args = parser.parse_args()

dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
assistant = Assistant.open("smollm2-135m-instruct", None, dtype=dtype)
armt = assistant.armt
if args.merge_lora:
    armt.merge_lora()
S = armt.config.segment_len
generator = torch.Generator().manual_seed(0)
vocab = armt.base.config.vocab_size
print(
    f"dtype {armt.base.dtype}, segment {S} + {armt.config.num_write_tokens} write tokens, "
    f"{torch.get_num_threads()} threads, LoRA {'merged' if args.merge_lora else 'separate'}"
)
rates: dict[int, list[float]] = {b: [] for b in args.batches}
with torch.inference_mode():
    for b in args.batches:  # warm-up: oneDNN picks kernels per shape
        armt.step(torch.randint(0, vocab, (b, S), generator=generator), armt.empty_state(b))
    for r in range(args.rounds):
        order = args.batches if r % 2 == 0 else list(reversed(args.batches))
        for b in order:
            state = armt.empty_state(b)
            ids = torch.randint(0, vocab, (args.segments, b, S), generator=generator)
            start = time.perf_counter()
            for k in range(args.segments):
                state, _ = armt.step(ids[k], state)
            rates[b].append(b * S * args.segments / (time.perf_counter() - start))
base = statistics.median(rates[args.batches[0]])
print("batch  tokens/s (median)  vs batch", args.batches[0], "  rounds")
for b in args.batches:
    median = statistics.median(rates[b])
    print(f"{b:5d}  {median:17.0f}  {median / base:13.2f}x   {' '.join(f'{x:.0f}' for x in rates[b])}")
