#!/usr/bin/env python3
"""niah answers decoded against the memory's key-free prior: is the lost first digit still in the read?

The long-stream misses write one digit first whatever the gold one (docs/RESULTS.md, "Fortieth
session"), the digit the haystack's own numbers favour. This script asks whether the read still
holds the needle's digit under that prior. Per niah item (built as `edgemem eval` builds it, the
same ingest and prompt as `ARMTMethod`) it decodes the answer greedily from

    score(t) = log p(t | question about the item's key) - lam * mean_j log p(t | question about key j)

where the keys j are `--others` random keys the context does not hold (the same template, so the
second term is what the memory and the prompt give for any key), over the tokens within a tenth of
the top token's probability (the plausibility cut of contrastive decoding). lam = 0 is the eval's
own greedy answer (the script checks it against `--check` lines when given). Per item and lam it
prints the answer and, for the first digit, the gold digit's rank among the ten digits; it also
records each other key's own greedy answer and the gold first digit's rank in it (does the read
give the needle's digit to any key?), and appends the item's line to `--out`; `--table` sums such a
file up.

    OMP_NUM_THREADS=1 python scripts/niah_key_contrast.py --length 64k -n 20 --lams 0,0.5,1 \\
        --out /tmp/contrast-64k.jsonl [--shard 0/2]
    python scripts/niah_key_contrast.py --table /tmp/contrast-64k.jsonl [--check EVAL_LINES.jsonl]

`--adapter` defaults to the shipped adapter; the weights run in float32, as the eval lines do.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from pathlib import Path

import torch

from edgemem.armt import answer_state, text_ids
from edgemem.cli_common import run_script
from edgemem.data.tasks import NIAH_PREFIX, NIAH_QUESTION, Builder, random_key
from edgemem.evaluate import parse_lengths
from edgemem.methods import ARMTMethod, build, chat_prompt
from edgemem.scoring import near_miss, score

DIGITS = "0123456789"


def contrast_decode(
    method: ARMTMethod,
    state: object,
    prompt: list[int],
    others: list[list[int]],
    lam: float,
    digit_ids: list[int],
    max_new: int = 12,
    cut: float = 0.1,
) -> tuple[str, list[float] | None]:
    """Greedy answer under score = log p(prompt) - lam * mean log p(others), and the ten digits'
    scores at the first digit the answer writes (None if it writes none)."""
    from transformers import DynamicCache

    armt = method.armt
    device = armt.write_embeddings.device
    prompts = [prompt] + (others if lam else [])
    caches = [DynamicCache(config=armt.base.config) for _ in prompts]
    first: list[float] | None = None
    out: list[int] = []
    with torch.inference_mode():
        logits = [
            armt.read_only_forward(torch.tensor([p], device=device), state, c)
            for p, c in zip(prompts, caches, strict=True)
        ]
        for _ in range(max_new):
            logp = [torch.log_softmax(x[0].float(), -1) for x in logits]
            scores = logp[0] - lam * torch.stack(logp[1:]).mean(0) if len(logp) > 1 else logp[0]
            scores = torch.where(logp[0] >= logp[0].max() + torch.log(torch.tensor(cut)), scores, -torch.inf)
            token = int(scores.argmax())
            if first is None and token in digit_ids:
                first = [float(scores[d]) for d in digit_ids]
            if token in method.stop_ids:
                break
            out.append(token)
            logits = [
                armt.read_only_forward(torch.tensor([[token]], device=device), state, c) for c in caches
            ]
    return method.tokenizer.decode(out, skip_special_tokens=True), first


def gold_rank(first: list[float] | None, gold: str) -> int | None:
    """Where the gold number's first digit ranks among the ten digits' scores (1: on top)."""
    return None if first is None else sorted(first, reverse=True).index(first[int(gold[0])]) + 1


def _ranks(ranks: list[int | None]) -> str:
    counts = Counter("none" if r is None else r for r in ranks)
    order = sorted(counts, key=lambda k: (k == "none", k if k != "none" else 0))
    return ", ".join(f"{k}: {counts[k]}" for k in order)


def table(rows: list[dict], check: dict[str, str] | None = None) -> list[str]:
    """Per lam: items answered, near misses, first digits right and the gold first digit's ranks;
    with `check` (eval lines' predictions by id) how many lam-0 answers are the eval's own."""
    lams = sorted((k for k in rows[0] if k.replace(".", "", 1).isdigit()), key=float)
    lines = [f"{len(rows)} items"]
    if check is not None:
        same = sum(r[lams[0]]["prediction"].strip() == check.get(r["id"], "").strip() for r in rows)
        lines.append(f"lam {lams[0]}: the eval's own answer on {same} of {len(rows)}")
    for lam in lams:
        got = [r[lam] for r in rows]
        right, near = sum(g["correct"] for g in got), sum(g["near"] for g in got)
        ranked = _ranks([g["rank"] for g in got])
        lines.append(f"lam {lam}: correct {right}, 5+ of 7 digits {near}, gold first digit ranked {ranked}")
    own = [
        (o, r[lams[0]]["prediction"].strip()) for r in rows for o in r.get("others", [])
    ]  # older lines: none
    if own:
        ranked = _ranks([o["rank"] for o, _ in own])
        same = sum(o["prediction"].strip() == mine for o, mine in own)
        lines.append(
            f"other keys' questions ({len(own)}): the item's own lam {lams[0]} answer on {same},"
            f" gold first digit ranked {ranked}"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adapter", default=None, help="default: the shipped adapter")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--length", default="64k")
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("--split", default="test", choices=["test", "validation"])
    ap.add_argument("--lams", default="0,0.5,1")
    ap.add_argument("--others", type=int, default=2, help="keys the context does not hold")
    ap.add_argument("--shard", default="0/1", help="i/k: this process's share of the items")
    ap.add_argument("--out", type=Path, help="JSONL, one line per item (appended)")
    ap.add_argument("--table", type=Path, help="print the summary of such a JSONL, and stop")
    ap.add_argument("--check", type=Path, help="with --table: eval lines of the same items")
    args = ap.parse_args()
    if args.table:
        rows = [json.loads(line) for line in args.table.read_text().splitlines() if line.strip()]
        check = None
        if args.check:
            lines = (json.loads(x) for x in args.check.read_text().splitlines() if x.strip())
            check = {x["id"]: x["prediction"] for x in lines}
        print("\n".join(table(rows, check)))
        return
    if args.out is None:
        ap.error("--out is needed to run items")
    (length,) = parse_lengths(args.length)
    lams = [float(x) for x in args.lams.split(",")]
    shard, shards = (int(x) for x in args.shard.split("/"))

    method = build("armt", args.model, "hf", args.adapter, torch.float32)
    assert isinstance(method, ARMTMethod)
    tok = method.tokenizer
    digit_ids = [tok(d, add_special_tokens=False).input_ids[-1] for d in DIGITS]
    items = list(Builder(tok, split=args.split).build("niah", length, args.n))
    items.sort(key=lambda it: -float(it.meta["depth"]))  # as the eval: shared prefixes run once
    for item in items[shard::shards]:
        key, gold = item.meta["key"], item.answers[0]
        rng = random.Random(f"contrast-{item.id}")
        taken = {key}
        keys = [random_key(rng, taken) for _ in range(args.others)]  # distinct, none the item's
        (done,) = method.cache.ingest_many([text_ids(item.context, tok)])
        state = answer_state(method.armt, done.state, done.tail)
        prompt = chat_prompt(tok, done.tail, item.question, item.answer_prefix)
        others = [chat_prompt(tok, done.tail, NIAH_QUESTION.format(k), NIAH_PREFIX.format(k)) for k in keys]
        row: dict = {"id": item.id, "split": args.split, "gold": gold, "depth": item.meta["depth"]}
        row["others"] = []  # each other key's own greedy answer, and the gold first digit's rank in it
        for k, other in zip(keys, others, strict=True):
            text, first = contrast_decode(method, state, other, [], 0.0, digit_ids)
            row["others"].append({"key": k, "prediction": text, "rank": gold_rank(first, gold)})
        for lam in lams:
            text, first = contrast_decode(method, state, prompt, others, lam, digit_ids)
            rank = gold_rank(first, gold)
            row[str(lam)] = {
                "prediction": text,
                "correct": score("niah", text, item.answers).correct,
                "near": near_miss(text, gold),  # it reads the digits out of the text itself
                "rank": rank,
            }
            print(f"{item.id} lam {lam}: {text.strip()!r} gold {gold} first-digit rank {rank}", flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    run_script(main)
