#!/usr/bin/env python3
"""The accuracy effect of int8: the same niah items through a float32 and an int8 engine bundle.

OMP_WAIT_POLICY=PASSIVE nice -n 5 python scripts/int8_niah.py FP32_BUNDLE INT8_BUNDLE [n] [length]

Items come from the evaluation's niah builder (test split, `edgemem data prepare` first), each
ingested through the engine's segment step and answered greedily through its answer graph, with
the prompt every method of the harness uses. Prints one JSON line: accuracy of each engine, how
many answers are identical, and the relative difference of the final memory states.
"""

import argparse
import json
import sys
import time

import numpy as np

from edgemem.armt import ingest, sentence_end_ids, stop_token_ids, text_ids
from edgemem.cli_common import run_script
from edgemem.data.tasks import Builder
from edgemem.methods import chat_prompt
from edgemem.runtime import open_engine
from edgemem.scoring import score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fp32_bundle", help="engine bundle exported in float32")
    parser.add_argument("int8_bundle", help="the same export quantized to int8")
    parser.add_argument("n", type=int, nargs="?", default=20, help="niah items (default 20)")
    parser.add_argument("length", type=int, nargs="?", default=2048, help="tokens per item (default 2048)")
    args = parser.parse_args()
    if args.n < 1 or args.length < 1:
        parser.error("n and length must be at least 1")
    fp32_path, int8_path, n, length = args.fp32_bundle, args.int8_bundle, args.n, args.length
    engines = {"fp32": open_engine(fp32_path), "int8": open_engine(int8_path)}
    tokenizer = engines["fp32"].tokenizer
    stop = stop_token_ids(tokenizer)
    ends = sentence_end_ids(tokenizer)  # an aligned adapter's segments end after them
    items = list(Builder(tokenizer).build("niah", length, n))
    answers: dict[str, list[str]] = {name: [] for name in engines}
    correct = dict.fromkeys(engines, 0)
    state_diff: list[float] = []
    start = time.perf_counter()
    for item in items:
        ids = text_ids(item.context, tokenizer)
        states = {}
        for name, runtime in engines.items():
            doc = ingest(runtime, [ids], ends=ends)
            prompt = chat_prompt(tokenizer, doc.tail_ids, item.question, item.answer_prefix)
            out = list(runtime.generate_ids(doc.state, prompt, stop, max_new_tokens=24))
            text = tokenizer.decode(out, skip_special_tokens=True)
            answers[name].append(text)
            correct[name] += score("niah", text, item.answers).correct
            states[name] = np.concatenate([t.numpy().ravel() for t in doc.state.named_tensors().values()])
        if np.linalg.norm(states["fp32"]) > 0:
            state_diff.append(
                float(np.linalg.norm(states["int8"] - states["fp32"]) / np.linalg.norm(states["fp32"]))
            )
    same = sum(a == b for a, b in zip(answers["fp32"], answers["int8"], strict=True))
    print(
        json.dumps(
            {
                "command": "python scripts/int8_niah.py " + " ".join(sys.argv[1:]),
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "task": "niah",
                "length": length,
                "n": n,
                "accuracy": {name: round(correct[name] / n, 3) for name in engines},
                "identical_answers": same,
                "state_relative_difference_max": round(max(state_diff), 4) if state_diff else None,
                "seconds": round(time.perf_counter() - start, 1),
            }
        )
    )


if __name__ == "__main__":
    run_script(main)
