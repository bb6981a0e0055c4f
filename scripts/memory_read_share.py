#!/usr/bin/env python3
"""Whose writes a niah answer needs: the memory read split by written token, and the answer
again without each group's writes.

    OMP_NUM_THREADS=1 python scripts/memory_read_share.py --length 64k --index 1 [--split test]
        [--adapter FILE] [--segment-align N]

Runs one niah item as `edgemem eval` does (the shipped adapter unless --adapter, float32, its own
segments and answer window) and keeps, for every row each memory layer writes, its key phi(k) and
its written value beta (v - vbar). A is the sum of those rows' k^T beta (v - vbar), so the read
(phi(q) A) / (phi(q) . z) splits exactly into one part per row (`split_read`). The rows fall in
four groups: the needle sentence's tokens, the haystack's digit tokens, its other tokens, and the
write tokens. Prints one JSON line: per memory layer each group's share of the read at the
prompt's last position (its part projected on the whole read, over the read's squared norm; the
shares sum to 1), how far the parts' sum is from the read the model made (a check of the split),
and each group's mean write rate on its own key, beta ||k||^2 / (k . z) (the fraction of an old
value a write replaces); then the answer and the gold first digit's probability (softmax over the
ten digit tokens, where the answer's first digit is written) from the final
state as it is (`full`) and with one group's rows taken out of A in every layer, z kept
(`without_needle`, `without_digits`, ...).

Memory: the rows are kept in float16, about 2 KB per written token and layer (a 64k item: 0.8 GB).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict

import torch
from torch import Tensor

from edgemem import memory as memory_module
from edgemem import methods as methods_module
from edgemem.armt import MemoryLayer, MemoryState
from edgemem.cli_common import run_script
from edgemem.data.tasks import Builder
from edgemem.evaluate import parse_lengths
from edgemem.methods import build

GROUPS = ("needle", "digits", "other", "write")


def stack_rows(rows: list[tuple[Tensor, Tensor, Tensor]]) -> tuple[Tensor, Tensor, Tensor]:
    """One layer's writes, each (phi(k) [M, K], beta (v - vbar) [M, D], write rate [M]), as three
    tensors over all their rows in order, in the dtype they were kept in: keys [N, K], values
    [N, D], rates [N]."""
    return (
        torch.cat([k for k, _e, _r in rows]),
        torch.cat([e for _k, e, _r in rows]),
        torch.cat([r for _k, _e, r in rows]),
    )


def split_read(
    keys: Tensor, values: Tensor, labels: list[str], phi_q: Tensor, z: Tensor
) -> dict[str, Tensor]:
    """The read (phi(q) A) / (phi(q) . z + eps) split by written row: A is the sum over the writes'
    rows of k^T beta (v - vbar), so row i's part is (phi(q) . k_i) / (phi(q) . z + eps) beta_i
    (v_i - vbar_i). keys [N, K] and values [N, D] (`stack_rows`); labels: one group per row;
    phi_q [K], z [K] -> {group: its summed part [D]}."""
    qz = float(phi_q @ z) + memory_module.EPS
    contrib = ((keys.float() @ phi_q) / qz).unsqueeze(-1) * values.float()
    kinds = torch.tensor([GROUPS.index(lab) for lab in labels])
    return {g: contrib[kinds == i].sum(0) for i, g in enumerate(GROUPS) if (kinds == i).any()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adapter", default=None, help="default: the shipped adapter")
    ap.add_argument("--length", default="8k")
    ap.add_argument("--index", type=int, default=10)
    ap.add_argument("-n", type=int, default=20, help="items in the bin (the eval's -n: sets the depths)")
    ap.add_argument("--split", default="test", choices=["test", "validation"])
    ap.add_argument("--segment-align", type=int, default=None, help="default: the adapter's (eval's flag)")
    args = ap.parse_args()
    (length,) = parse_lengths(args.length)
    method = build(
        "armt", "smollm2-135m-instruct", "hf", args.adapter, torch.float32, segment_align=args.segment_align
    )
    armt, tok = method.armt, method.tokenizer
    item = Builder(tok, split=args.split).item("niah", length, args.index, args.n)
    needle_digits = item.answers[0]
    digit_ids = {i for i in range(len(tok)) if re.fullmatch(r"\s?\d+", tok.decode([i]))}

    def segment_labels(ids: list[int], m: int) -> list[str]:
        """needle (the needle sentence's tokens), digits, other; the rows past the ids: write."""
        out = ["digits" if i in digit_ids else "other" for i in ids] + ["write"] * (m - len(ids))
        pieces = [tok.decode([i]) for i in ids]
        text = "".join(pieces)
        hit = text.find(needle_digits)
        if hit >= 0:
            start = text.rfind("One of the special", 0, hit)
            start, end, pos = (hit if start < 0 else start), hit + len(needle_digits), 0
            for j, piece in enumerate(pieces):
                if pos + len(piece) > start and pos < end:
                    out[j] = "needle"
                pos += len(piece)
        return out

    layers = {id(m.memory): m.index for m in armt.base.modules() if isinstance(m, MemoryLayer)}
    order = sorted(layers.values())
    # per layer, per write: (phi(k) [M, K] f16, beta (v - vbar) [M, D] f16, write rate [M])
    rows: dict[int, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = defaultdict(list)
    segments: list[list[int]] = []  # the ids of each step, in order (every step writes every layer)
    reads: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    Memory = memory_module.AssociativeMemory
    real_step, real_write, real_read = armt.step, Memory.write, Memory.read

    def step(input_ids, state, *a, **k):
        segments.append(input_ids[0].tolist())
        return real_step(input_ids, state, *a, **k)

    def write(self, m, A, z, first):
        m = m.float()  # as AssociativeMemory.write: the same k, v, beta
        k = memory_module.dpfp(self.W_K(m), self.nu)
        v = self.W_V(m)
        beta = torch.sigmoid(self.W_b(m)).squeeze(-1)
        vbar = torch.zeros_like(v) if first else memory_module.memory_read(k, A, z)
        new_A, new_z = memory_module.memory_write(k, v, beta, A, z, first)
        rate = beta[0] * (k[0] * k[0]).sum(-1) / ((k[0] * new_z[0]).sum(-1) + memory_module.EPS)
        rows[layers[id(self)]].append((k[0].half(), ((v - vbar) * beta.unsqueeze(-1))[0].half(), rate))
        return new_A, new_z

    def read(self, h, A, z):
        out = real_read(self, h, A, z)
        if h.shape[1] > 1:  # a segment or the prompt; the prompt's is the last one before decoding
            phi_q = memory_module.dpfp(self.W_Q(h.float()), self.nu)[0, -1]
            reads[layers[id(self)]] = (phi_q, out[0, -1], z[0])
        return out

    answered: list[tuple[MemoryState, list[int]]] = []
    real_generate = methods_module.generate_ids

    def generate(model, state, prompt, *a, **k):
        answered.append((state, list(prompt)))
        return real_generate(model, state, prompt, *a, **k)

    armt.step, Memory.write, Memory.read = step, write, read
    methods_module.generate_ids = generate
    try:
        pred = method.predict(item, 12)
    finally:
        armt.step, Memory.write, Memory.read = real_step, real_write, real_read
        methods_module.generate_ids = real_generate
    labels: list[str] = []  # one per written row, the same for every layer
    for ids, (k, _e, _r) in zip(segments, rows[order[0]], strict=True):
        labels.extend(segment_labels(ids, k.shape[0]))

    out = {"item": item.id, "depth": item.meta.get("depth"), "gold": needle_digits, "prediction": pred.text}
    out["writes"] = len(segments)
    out["counts"] = {g: labels.count(g) for g in GROUPS}
    kinds = torch.tensor([GROUPS.index(lab) for lab in labels])
    stacked = {layer: stack_rows(rows.pop(layer)) for layer in order}  # float16, one copy at a time
    for layer in order:
        phi_q, actual, z = reads[layer]
        keys, values, rates = stacked[layer]
        parts = split_read(keys, values, labels, phi_q, z)
        total = sum(parts.values())
        norm2 = float(total @ total)
        out[f"layer{layer}"] = {
            "share": {g: round(float(part @ total) / norm2, 3) for g, part in parts.items()},
            "split_error": round(float((total - actual).norm() / actual.norm()), 4),
            "read_norm": round(float(actual.norm()), 2),
            "rate": {g: round(float(rates[kinds == GROUPS.index(g)].mean()), 4) for g in parts},
        }
    # the answer again from the state without one group's writes (A less their rows' k^T beta
    # (v - vbar), z kept): which writes the first digit depends on
    state, prompt = answered[-1]
    first = list(real_generate(armt, state, prompt, method.stop_ids, 1))
    if first and not tok.decode(first).strip():  # the answer opens with a space token: the digit is next
        prompt = prompt + first
    ten = [tok.convert_tokens_to_ids(d) for d in "0123456789"]
    gold = int(needle_digits[0])
    for drop in (None, *GROUPS):
        A = dict(state.A)
        if drop is not None:
            mask = kinds == GROUPS.index(drop)
            for layer in order:
                keys, values, _rates = stacked[layer]
                A[layer] = state.A[layer] - (keys[mask].float().T @ values[mask].float()).unsqueeze(0)
        variant = MemoryState(A, state.z, state.writes)
        with torch.no_grad():
            hidden = armt.read_only_hidden(torch.tensor([prompt]), variant)[:, -1]
            probs = armt.base.lm_head(hidden)[0, ten].softmax(-1)  # over the ten digits
        text = tok.decode(list(real_generate(armt, variant, prompt, method.stop_ids, 9)))
        out[f"without_{drop}" if drop else "full"] = {
            "answer": text.strip(),
            "gold_first_digit_p": round(float(probs[gold]), 3),
            "top_first_digit": int(probs.argmax()),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    run_script(main)
