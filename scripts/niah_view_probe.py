#!/usr/bin/env python3
"""Why an adapter under an answer window misses needles that sit in plain view.

Every adapter up to the thirtieth session answered niah 1k 0 of 20 under a 1024-token answer
window, where the base model reading the same window answers 15 (docs/RESULTS.md, "Twenty-eighth
session" to "Thirty-first session"; `--adapter` defaults to the adapter shipped now). This script
answers the first `-n` test niah items of one length through the evaluation's own path
(`ARMTMethod`, greedy, float32, the evaluation's niah budget of new tokens) three ways, and prints
the correct answers split by where the needle sat (written into memory, or in the unwritten view):

- `adapter`: as `edgemem eval --method armt --answer-window W` does;
- `memory off`: every memory read zero (W_V zeroed: nothing is written), the LoRA kept;
- `LoRA and memory off`: the base model reading the view (as the `window` baseline, on torch);
Then `-n` items built as training builds them with no written segment (`recall_item`, segments
0: the needle spliced into prose at a random token, the view 1..W tokens), with the adapter and
with its LoRA off (the memory is empty): greedy answers, and the teacher-forced answer loss that
training sees (the digits right after the answer prefix, then "." and the end of turn).

    OMP_NUM_THREADS=1 python scripts/niah_view_probe.py [--adapter FILE] [--window 1024] [-n 10]
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgemem.armt import (  # noqa: E402
    ARMT,
    generate_ids,
    read_adapter,
    stop_token_ids,
    text_ids,
    written_segments,
)
from edgemem.cli_common import run_script  # noqa: E402
from edgemem.data.tasks import PROSE, Builder  # noqa: E402
from edgemem.evaluate import MAX_NEW_TOKENS  # noqa: E402
from edgemem.methods import ARMTMethod  # noqa: E402
from edgemem.models import load_model  # noqa: E402
from edgemem.scoring import score  # noqa: E402
from edgemem.train import ProseTasks, Stage, forward_loss, prose_stream  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--adapter", type=Path, default=ROOT / "edgemem/adapters/smollm2-135m-instruct.safetensors"
    )
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("-n", type=int, default=10)
    args = ap.parse_args()

    loaded = load_model(args.model, dtype=torch.float32)
    config, tensors = read_adapter(args.adapter)
    config = replace(config, answer_window=args.window)
    armt = ARMT(loaded.model, config)
    armt.eval()
    S = config.segment_len
    tok = loaded.tokenizer
    builder = Builder(tok, split="test")
    items = [builder.item("niah", args.length, i, args.n) for i in range(args.n)]
    print(f"{args.adapter.name}: niah {args.length // 1024}k, items 0-{args.n - 1}, window {args.window}")

    new_tokens = MAX_NEW_TOKENS["niah"]

    def in_view(item) -> bool:
        ids = text_ids(item.context, tok)  # as ARMTMethod
        written = written_segments(len(ids), S, args.window) * S
        return item.answers[0] in tok.decode(ids[written:])

    where = [in_view(item) for item in items]
    print(f"needle in view on {sum(where)} of {len(items)} items")
    print("| way | correct (in memory) | correct (in view) | answers |")
    print("|---|---|---|---|")
    for way in ("adapter", "memory off", "LoRA and memory off"):
        armt.load_adapter_tensors(tensors)
        with torch.no_grad():
            if way != "adapter":
                for memory in armt.memories.values():
                    memory.W_V.weight.zero_()
            if way == "LoRA and memory off":
                for module in armt.lora.values():
                    module.B.zero_()
        method = ARMTMethod(armt, tok)
        mem = view = 0
        answers = []
        for item, seen in zip(items, where, strict=True):
            pred = method.predict(item, new_tokens)
            ok = score(item.task, pred.text, item.answers).correct
            view += ok and seen
            mem += ok and not seen
            answers.append(" ".join(pred.text.split())[:16])
        print(
            f"| {way} | {mem}/{len(items) - sum(where)} | {view}/{sum(where)} | {', '.join(answers[:4])} |",
            flush=True,
        )

    stream = prose_stream(tok, PROSE, "test", 200_000)
    tasks = ProseTasks(tok, stream)
    stage = Stage("probe", "recall", 1, S, (0,), tail=args.window, keys=1, batch_size=1)
    stops = stop_token_ids(tok)
    print("| train-shaped, empty memory | exact greedy | answer loss (teacher-forced) | answers |")
    print("|---|---|---|---|")
    for way in ("adapter", "LoRA and memory off"):
        armt.load_adapter_tensors(tensors)
        if way != "adapter":
            with torch.no_grad():
                for module in armt.lora.values():
                    module.B.zero_()
        rng = random.Random(7)
        correct, losses, answers = 0, [], []
        for _ in range(args.n):
            batch = tasks.batch("recall", rng, stage, S, 0)  # one item, as training builds it
            scored = (batch.targets[0] != -100).nonzero()[:, 0]
            prompt = batch.answer[0, : int(scored[0]) + 1].tolist()  # up to the answer prefix
            gold = tok.decode(batch.targets[0, scored], skip_special_tokens=True).strip().rstrip(".")
            ids = list(generate_ids(armt, armt.empty_state(), prompt, stops, new_tokens))
            out = tok.decode(ids, skip_special_tokens=True)
            correct += score("niah", out, [gold]).correct
            answers.append(" ".join(out.split())[:16])
            with torch.no_grad():
                losses.append(float(forward_loss(armt, batch, stage, 1)[0]))
        mean = sum(losses) / len(losses)
        print(f"| {way} | {correct}/{args.n} | {mean:.3f} | {', '.join(answers[:4])} |", flush=True)


if __name__ == "__main__":
    run_script(main)
