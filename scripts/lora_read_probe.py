#!/usr/bin/env python3
"""Does an adapter answer docqa again with its LoRA off in the answer pass only?

The needle adapter shipped until the thirty-sixth session (LoRA on every projection plus the
memory, trained on needles only; `git show 13a97e1:edgemem/adapters/smollm2-135m-instruct.safetensors`,
pass it with `--adapter` to repeat the figures; without `--adapter` the probe reads the adapter
shipped now) answers docqa with numbers, even with the whole document in its context
(docs/RESULTS.md, "Eighteenth session"). If the LoRA's change to the model, not the memory, is
what loses copying a word from context, then writing with the LoRA and answering without it (or
with it scaled by `--scale`) would give docqa back. Every memory write (the document's segments
and its tail) keeps the full LoRA; only the answer segment and the generated tokens run with the
LoRA scaled:

    python scripts/lora_read_probe.py --scale 0 --task docqa --length 1k -n 20 --out docqa.jsonl

`--answer-window N` answers with that window instead of the adapter's own (`ARMTConfig`); with
`--memory-off` too, it asks whether the memory read is what keeps the answer in view from being
copied. `--memory-off` zeroes every memory's W_V, so nothing is written and every read is zero: with
`--segment-len 1024` at 1k the whole document is the tail beside the question, so `--scale 1
--memory-off` asks whether the LoRA alone loses the copy, and `--scale 0 --memory-off` is the base
model with the document in its context. `--read-question-only` keeps the memory but reads it only
from the question on: the answer prompt's tokens before "Question:" (the document's tail in view)
get no memory read, the question, the answer prefix and each generated token do. It asks whether
the read at the tokens in view is what takes their copy away while the needles in memory stay.
With an adapter whose memories have a read gate (`ARMTConfig.read_gate`) each line also has the
mean gate over the answer prompt's tokens in view, from its question on, and at its last token.

One JSON line per item (id, correct, the answer's first 80 characters, gold) is appended to
`--out`; the last line printed is the count. Test items as `edgemem eval` builds them, the
machine's preferred dtype, LoRA not merged (so it can be scaled).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Iterator

import torch

from edgemem.armt import ARMT, MemoryLayer
from edgemem.assistant import Assistant
from edgemem.cli_common import run_script
from edgemem.data.tasks import Builder
from edgemem.evaluate import MAX_NEW_TOKENS, parse_lengths
from edgemem.methods import ARMTMethod
from edgemem.scoring import score


@contextlib.contextmanager
def lora_scaled(armt: ARMT, factor: float) -> Iterator[None]:
    """Every LoRA update of `armt` multiplied by `factor` inside the block."""
    saved = [module.scale for module in armt.lora.values()]
    for module in armt.lora.values():
        module.scale *= factor
    try:
        yield
    finally:
        for module, scale in zip(armt.lora.values(), saved, strict=True):
            module.scale = scale


def silence_memory(armt: ARMT) -> None:
    """Zero every memory's W_V: nothing is ever written, so every read is zero (the model is its
    base plus the LoRA)."""
    with torch.no_grad():
        for memory in armt.memories.values():
            memory.W_V.weight.zero_()


def question_start(tokenizer: object, ids: list[int]) -> int:
    """Position of the token that begins the question's "Question:" in an answer prompt (0 if none)."""
    for i in range(len(ids) - 1, -1, -1):
        if "Question:" in tokenizer.decode(ids[i:]):  # type: ignore[attr-defined]
            return i
    return 0


@contextlib.contextmanager
def reads_from(armt: ARMT, cut: int) -> Iterator[None]:
    """Inside the block every memory read adds nothing at positions before `cut` of the call."""
    layers = [m for m in armt.base.modules() if isinstance(m, MemoryLayer)]

    def masked(layer: MemoryLayer):  # type: ignore[no-untyped-def]
        read = MemoryLayer._read.__get__(layer)

        def _read(h, A, z):  # type: ignore[no-untyped-def]
            out = read(h, A, z)
            out[:, :cut] = 0
            return out

        return _read

    for layer in layers:
        layer._read = masked(layer)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for layer in layers:
            del layer._read


@contextlib.contextmanager
def gates_recorded(armt: ARMT, into: list[torch.Tensor]) -> Iterator[None]:
    """Inside the block every gated memory read appends its gate ([T] of the call's one row) to `into`."""
    gated = [m for m in armt.memories.values() if m.gated]
    for memory in gated:
        gate = type(memory).gate.__get__(memory)

        def recorded(h, gate=gate):  # type: ignore[no-untyped-def]
            g = gate(h)
            into.append(g[0, :, 0].detach())
            return g

        memory.gate = recorded  # type: ignore[method-assign]
    try:
        yield
    finally:
        for memory in gated:
            del memory.gate


class ScaledReadARMT(ARMT):
    """`ARMT` whose answer pass (`read_only_forward`) runs with the LoRA scaled; writes do not.
    With `read_question_only` the answer prompt's tokens before its question (the document's tail
    in view) read nothing from memory; the question, the answer prefix and the answer do.
    `gate_stats`: the mean read gate of the last answer prompt (gated memories only)."""

    read_scale = 1.0
    read_question_only = False
    tokenizer: object = None
    gate_stats: dict[str, float | None] = {}

    def read_only_forward(self, input_ids, state, cache=None):  # type: ignore[no-untyped-def]
        prompt = input_ids.shape[1] > 1  # the answer prompt, not a generated token
        ask = prompt and self.tokenizer is not None  # the tokenizer finds the question
        q = question_start(self.tokenizer, input_ids[0].tolist()) if ask else 0
        gates: list[torch.Tensor] = []
        cut = q if self.read_question_only else 0
        with lora_scaled(self, self.read_scale), reads_from(self, cut), gates_recorded(self, gates):
            logits = super().read_only_forward(input_ids, state, cache)
        if prompt:
            self.gate_stats = {}
        if prompt and gates:  # an empty memory reads nothing and records no gate
            g = torch.stack(gates)  # [layers, T]
            self.gate_stats = {
                "gate_view": round(float(g[:, :q].mean()), 4) if q else None,
                "gate_question": round(float(g[:, q:].mean()), 4),
                "gate_last": round(float(g[:, -1].mean()), 4),
            }
        return logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.0, help="LoRA factor in the answer pass")
    parser.add_argument("--task", default="docqa")
    parser.add_argument("--length", default="1k")
    parser.add_argument("-n", type=int, default=20)
    parser.add_argument("--out", required=True)
    parser.add_argument("--segment-len", type=int, default=None, help="the adapter's, if not given")
    parser.add_argument("--memory-off", action="store_true", help="zero every W_V: reads are zero")
    parser.add_argument("--adapter", default=None, help="the shipped adapter, if not given")
    parser.add_argument("--answer-window", type=int, default=None, help="the adapter's, if not given")
    parser.add_argument(
        "--read-question-only", action="store_true", help="no memory read at the tail in view"
    )
    args = parser.parse_args()
    (length,) = parse_lengths(args.length)

    assistant = Assistant.open(
        adapter=args.adapter, segment_len=args.segment_len, answer_window=args.answer_window
    )
    armt = assistant.armt
    if args.memory_off:
        silence_memory(armt)
    armt.__class__ = ScaledReadARMT  # same module, same state: only the answer pass changes
    armt.read_scale = args.scale
    armt.read_question_only = args.read_question_only
    armt.tokenizer = assistant.loaded.tokenizer
    method = ARMTMethod(armt, assistant.loaded.tokenizer)
    builder = Builder(assistant.loaded.tokenizer)
    correct = 0
    with open(args.out, "a", encoding="utf-8") as out:
        for item in builder.build(args.task, length, args.n):
            start = time.perf_counter()
            pred = method.predict(item, MAX_NEW_TOKENS[args.task])
            ok = score(args.task, pred.text, item.answers).correct
            correct += ok
            line = {
                "id": item.id,
                "scale_read": args.scale,
                "memory_off": args.memory_off,
                "read_question_only": args.read_question_only,
                "segment_len": armt.config.segment_len,
                "answer_window": armt.config.answer_window,
                "correct": ok,
                "pred": pred.text[:80],
                "gold": item.answers[:3],
                "s": round(time.perf_counter() - start, 1),
                **armt.gate_stats,
            }
            out.write(json.dumps(line) + "\n")
            print(line, flush=True)
    memory = ", memory off" if args.memory_off else ", no read at the tail" if args.read_question_only else ""
    print(
        f"{args.task} {args.length} LoRA x {args.scale} in the answer pass{memory}, "
        f"{armt.config.segment_len}-token segments: {correct}/{args.n}"
    )


if __name__ == "__main__":
    run_script(main)
