#!/usr/bin/env python3
"""Peak memory and time of one training step against the number of written segments, with full
back-propagation, per-segment recomputation (`checkpointing`) and truncation (`bptt`), and with
bf16 autocast: what the long curriculum needs before it is scheduled on a machine.

    python scripts/train_memory_cost.py [--segments 2 4 8] [--modes full checkpointing bptt4]
                                        [--autocast both|off|on] [--batch 4]

SmolLM2-135M-Instruct in float32 with the shipped recipe's adapter (LoRA r=16 on every projection,
the memory on the layer's input norm, every segment token writing), recall items of 128-token
segments from the train-split stream (run `edgemem data prepare` first). Each cell runs in its own
process (`--cell`), so that its peak RSS is its own: one warm-up step at 1 segment, then the step
that is measured. `delta` is the step's peak RSS (VmHWM, reset after the model loaded and the warm-up
ran) minus the RSS before the step. Prints one line per cell, then the per-segment slope of each mode.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import time

from edgemem.cli_common import run_script
from edgemem.errors import EdgememError


def status_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (the peak since the last reset) of this process, in MB."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    """Start VmHWM again from the current RSS (Linux >= 4.0), so that loading the model's peak
    does not hide the step's."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def cell(segments: int, mode: str, autocast: bool, batch: int) -> dict:
    import torch

    from edgemem.models import load_model
    from edgemem.train import (
        ProseTasks,
        Stage,
        TrainConfig,
        autocast_context,
        build_armt,
        cached_stream,
        forward_loss,
    )

    bptt = int(mode.removeprefix("bptt")) if mode.startswith("bptt") else 0
    stage = Stage(
        name="s",
        task="recall",
        steps=1,
        segment_len=128,
        segments=(segments,),
        batch_size=batch,
        tail=32,
        checkpointing=mode == "checkpointing",
        bptt=bptt,
    )
    config = TrainConfig(
        model="smollm2-135m-instruct",
        stages=(stage,),
        backbone="lora",
        lora_rank=16,
        norm_inputs=True,
        write_source="segment",
        autocast=autocast,
    )
    loaded = load_model("smollm2-135m-instruct", dtype=torch.float32)
    tasks = ProseTasks(loaded.tokenizer, cached_stream(loaded.tokenizer, loaded.model_id, config, "train"))
    armt = build_armt(loaded.model, config)
    armt.train()
    params = [p for p in armt.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)

    def step(n: int) -> float:
        data = tasks.batch("recall", random.Random(n), stage, 128, n)
        started = time.perf_counter()
        with autocast_context(armt, autocast):
            loss, _ = forward_loss(armt, data, stage, data.written.shape[0])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return time.perf_counter() - started

    step(1)  # warm-up: allocator, optimizer state
    reset_peak()
    base = status_mb("VmRSS")
    seconds = step(segments)
    peak = status_mb("VmHWM")
    tokens = batch * segments * (128 + armt.config.num_write_tokens)
    return {
        "segments": segments,
        "mode": mode,
        "autocast": autocast,
        "batch": batch,
        "threads": torch.get_num_threads(),
        "seconds": round(seconds, 2),
        "written_tokens_per_s": round(tokens / seconds, 1),
        "base_mb": round(base),
        "peak_mb": round(peak),
        "delta_mb": round(peak - base),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--segments", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--modes", nargs="+", default=["full", "checkpointing", "bptt4"])
    parser.add_argument("--autocast", choices=("both", "off", "on"), default="both")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--cell", nargs=3, metavar=("SEGMENTS", "MODE", "AUTOCAST"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    bad = [m for m in args.modes if not re.fullmatch(r"full|checkpointing|bptt[1-9][0-9]*", m)]
    if bad:
        parser.error(f"unknown mode {bad[0]!r}: use full, checkpointing or bptt<K> (K segments)")
    if min(args.batch, *args.segments) < 1:
        parser.error("--batch and --segments must be at least 1")
    if args.cell:
        segments, mode, autocast = args.cell
        print(json.dumps(cell(int(segments), mode, autocast == "on", args.batch)))
        return
    flags = {"both": ["off", "on"], "off": ["off"], "on": ["on"]}[args.autocast]
    rows = []
    for autocast in flags:
        for mode in args.modes:
            for segments in args.segments:
                cmd = [
                    sys.executable,
                    __file__,
                    "--batch",
                    str(args.batch),
                    "--cell",
                    str(segments),
                    mode,
                    autocast,
                ]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:  # the child's own last line: its error, or its traceback's
                    last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
                    raise EdgememError(
                        f"cell {segments} {mode} autocast {autocast}: {last.removeprefix('error: ')}"
                    )
                row = json.loads(proc.stdout.strip().splitlines()[-1])
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("per extra written segment (least squares over the segment counts):")
    for autocast in flags:
        for mode in args.modes:
            pts = [
                (r["segments"], r["delta_mb"], r["seconds"])
                for r in rows
                if r["mode"] == mode and r["autocast"] == (autocast == "on")
            ]
            if len(pts) < 2:
                continue
            xs = [p[0] for p in pts]
            mx = sum(xs) / len(xs)
            var = sum((x - mx) ** 2 for x in xs)

            def slope(ys: list[float], xs: list[int] = xs, mx: float = mx, var: float = var) -> float:
                my = sum(ys) / len(ys)
                return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var

            mb, s = slope([p[1] for p in pts]), slope([p[2] for p in pts])
            print(f"  autocast {autocast:3s} {mode:14s} {mb:7.0f} MB  {s:6.2f} s  (batch {args.batch})")


if __name__ == "__main__":
    run_script(main)
