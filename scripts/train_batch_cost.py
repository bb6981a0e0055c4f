#!/usr/bin/env python3
"""What building one training batch costs on the CPU, per number of written segments: the work
`data_workers` takes off a GPU's training loop.

    python scripts/train_batch_cost.py CONFIG [--segments 0,8,16,32,64] [--batches 3] [--batch-size 16]

Builds the batches of the config's first stage as its run would (`ProseTasks.batch` on the run's
`train_tasks`, the step's seeded draws) and prints the median seconds per batch and per
item for each segment count, one process, one thread.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from edgemem.cli_common import run_script
from edgemem.models import load_model
from edgemem.train import load_config, step_rng, train_tasks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config", type=Path)
    parser.add_argument("--segments", default="0,8,16,32,64")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = load_config(args.config)
    stage = replace(config.stages[0], batch_size=args.batch_size)
    loaded = load_model(config.model, dtype=torch.float32)  # its id keys the run's stream cache
    tasks = train_tasks(loaded.tokenizer, loaded.model_id, config)
    print(f"{args.config.name}: stage {stage.name}, task {stage.task}, batch {args.batch_size}")
    for n in (int(x) for x in args.segments.split(",")):
        times = []
        for k in range(args.batches):
            started = time.perf_counter()
            tasks.batch(stage.task, step_rng(config.seed, k, "batch-cost"), stage, stage.segment_len, n)
            times.append(time.perf_counter() - started)
        median = statistics.median(times)
        print(f"segments {n:3d}: {median:6.2f} s per batch, {median / args.batch_size:5.3f} s per item")


if __name__ == "__main__":
    run_script(main)
