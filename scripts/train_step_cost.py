#!/usr/bin/env python3
"""Cost of one training step, frozen backbone vs LoRA, side by side in one process.

    python scripts/train_step_cost.py [--steps 3] [--segments 2] [--segment-len 128]

SmolLM2-135M-Instruct in float32, batch 4, recall items from the train-split stream (run
`edgemem data prepare` first). The two variants alternate step by step so that a busy machine
slows both alike; the ratio is the figure to read.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from edgemem.cli_common import run_script
from edgemem.models import load_model
from edgemem.train import ProseTasks, Stage, TrainConfig, build_armt, cached_stream, forward_loss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--segments", type=int, default=2)
    parser.add_argument("--segment-len", type=int, default=128)
    args = parser.parse_args()
    stage = Stage(name="s", task="recall", steps=1, segment_len=args.segment_len, segments=(args.segments,))
    loaded = load_model("smollm2-135m-instruct", dtype=torch.float32)
    base_config = TrainConfig(model="smollm2-135m-instruct", stages=(stage,))
    tasks = ProseTasks(
        loaded.tokenizer, cached_stream(loaded.tokenizer, loaded.model_id, base_config, "train")
    )
    times: dict[str, list[float]] = {"frozen": [], "lora-16": []}
    for step in range(args.steps + 1):
        for name in times:
            config = TrainConfig(
                model="smollm2-135m-instruct",
                stages=(stage,),
                backbone="frozen" if name == "frozen" else "lora",
                lora_rank=16,
            )
            armt = build_armt(loaded.model, config)  # re-wraps the same base for each variant
            params = [p for p in armt.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(params, lr=1e-4)
            batch = tasks.batch("recall", random.Random(step), stage, args.segment_len, args.segments)
            started = time.perf_counter()
            loss, _ = forward_loss(armt, batch, stage, batch.written.shape[0])
            loss.backward()
            optimizer.step()
            if step:  # the first step of each variant warms up
                times[name].append(time.perf_counter() - started)
            if name != "frozen" and step == args.steps:
                print(f"trainable parameters: lora-16 {sum(p.numel() for p in params):,}")
        if step == args.steps:
            frozen_params = sum(p.numel() for p in build_armt(loaded.model, base_config).adapter_parameters())
            print(f"trainable parameters: frozen {frozen_params:,}")
    tokens = 4 * (args.segments * (args.segment_len + 16) + 90)
    print(f"threads {torch.get_num_threads()}, batch 4, {args.segments} x {args.segment_len} tokens + answer")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:8s} {median:6.2f} s/step  ~{tokens / median:5.0f} tok/s  ({len(values)} steps)")
    ratio = statistics.median(times["lora-16"]) / statistics.median(times["frozen"])
    print(f"lora-16 / frozen step time: {ratio:.2f}x")


if __name__ == "__main__":
    run_script(main)
