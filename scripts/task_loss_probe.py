#!/usr/bin/env python3
"""Answer loss per task of an adapter, beside the same model with its LoRA off and with the memory
off too (the base model reading the tail and the question), on validation-split items.

    OMP_NUM_THREADS=1 python scripts/task_loss_probe.py [--adapter FILE] [--segments 2] [--items 4]

It asks whether training on one task (recall) cost the others: a loss above the base model's means
the adapter makes the model worse at a task than no memory at all.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgemem.armt import ARMT, read_adapter  # noqa: E402
from edgemem.cli_common import run_script  # noqa: E402
from edgemem.data.tasks import PROSE, Builder  # noqa: E402
from edgemem.models import load_model  # noqa: E402
from edgemem.train import ProseTasks, Stage, forward_loss, prose_stream, step_rng  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--adapter", type=Path, default=ROOT / "edgemem/adapters/smollm2-135m-instruct.safetensors"
    )
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--segments", type=int, default=2)
    ap.add_argument("--items", type=int, default=4)
    ap.add_argument("--tasks", default="recall,vt,docqa,types")
    args = ap.parse_args()

    loaded = load_model(args.model, dtype=torch.float32)
    config, tensors = read_adapter(args.adapter)
    armt = ARMT(loaded.model, config)
    armt.eval()
    S = config.segment_len
    stream = prose_stream(loaded.tokenizer, PROSE, "validation", 200_000)  # recall's haystacks
    tasks = ProseTasks(loaded.tokenizer, stream, Builder(loaded.tokenizer, split="validation"))
    print(f"{args.items} items per task, {args.segments} written segments of {S} tokens")
    print("| task | adapter | LoRA off | LoRA and memory off |")
    print("|---|---|---|---|")
    for kind in args.tasks.split(","):
        stage = Stage(kind, kind, 1, S, (args.segments,), tail=32, keys=1, batch_size=args.items)
        batch = tasks.batch(kind, step_rng(5, 0, kind), stage, S, args.segments)
        losses = []
        armt.load_adapter_tensors(tensors)
        for switch_off in ("nothing", "lora", "memory"):
            with torch.no_grad():
                if switch_off == "lora":
                    for module in armt.lora.values():
                        module.B.zero_()
                if switch_off == "memory":
                    for memory in armt.memories.values():
                        memory.W_V.weight.zero_()  # nothing is written: every read is zero
                losses.append(float(forward_loss(armt, batch, stage, args.items)[0]))
        print(f"| {kind} | " + " | ".join(f"{v:.2f}" for v in losses) + " |", flush=True)


if __name__ == "__main__":
    run_script(main)
