"""Does the needle reach the write tokens? A linear probe on a checkpoint's memory layers.

    python scripts/train_write_probe.py RUN/checkpoint.safetensors [--items 384] [--digit 3]

Builds `bootstrap`-stage recall items (the needle at the end of one written segment) from the
validation split, runs the written segment through the checkpoint's ARMT and, at every memory
layer, fits a ridge classifier for one digit of the needle's number on (a) the layer's outputs at
the write tokens (what the memory writes from) and (b) the layer's output at that digit's own
position (what the segment knows). Prints held-out accuracy of each; chance is ~0.1. If (b) is
high and (a) at chance, the write path is what does not carry the needle.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from edgemem import train as T
from edgemem.cli_common import run_script
from edgemem.data.tasks import NIAH_NEEDLE
from edgemem.files import read_safetensors
from edgemem.models import load_model


def ridge_accuracy(x: torch.Tensor, y: torch.Tensor, train: int, alpha: float) -> float:
    """Fit one-hot ridge regression on the first `train` rows, return accuracy on the rest."""
    x = (x - x[:train].mean(0)) / (x[:train].std(0) + 1e-6)
    x = torch.cat([x, torch.ones(len(x), 1)], 1).double()
    onehot = torch.nn.functional.one_hot(y, 10).double()
    a, b = x[:train], onehot[:train]
    w = torch.linalg.solve(a.T @ a + alpha * torch.eye(a.shape[1], dtype=a.dtype), a.T @ b)
    return float(((x[train:] @ w).argmax(1) == y[train:]).double().mean())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--items", type=int, default=384)
    parser.add_argument("--digit", type=int, default=3, help="which digit of the 7 to decode (0-6)")
    parser.add_argument("--alpha", type=float, default=1000.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--write-text",
        default="",
        help="replace the write embeddings by the input embeddings of this text's tokens (cycled)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    meta, _ = read_safetensors(args.checkpoint, "checkpoint")
    config = T.TrainConfig.from_dict(json.loads(meta["config"]))
    loaded = load_model(config.model, dtype=torch.float32)
    armt = T.build_armt(loaded.model, config).eval()
    at, _ = T.load_checkpoint(args.checkpoint, armt, torch.optim.AdamW(list(T._trainable(armt).values())))
    if args.write_text:
        ids = loaded.tokenizer(args.write_text, add_special_tokens=False).input_ids
        with torch.no_grad():
            table = armt.base.get_input_embeddings().weight
            for j in range(armt.config.num_write_tokens):
                armt.write_embeddings[j] = table[ids[j % len(ids)]]
    stage = next(s for s in config.stages if s.task == "recall")
    S = stage.segment_len
    tasks = T.ProseTasks(
        loaded.tokenizer, T.cached_stream(loaded.tokenizer, loaded.model_id, config, "validation")
    )
    layers = armt.config.memory_layers
    M = armt.config.num_write_tokens
    captured: dict[int, torch.Tensor] = {}
    hooks = [
        armt.base.model.layers[i].register_forward_hook(lambda _m, _i, out, i=i: captured.__setitem__(i, out))
        for i in layers
    ]
    suffix_len = len(
        tasks._ids(NIAH_NEEDLE.format("k", "0000000").split("0000000")[1])
    )  # "." after the digits
    writes = {i: [] for i in layers}
    owns = {i: [] for i in layers}
    digits = []
    rng = T.step_rng(config.seed, 10**9, "write-probe")
    with torch.no_grad():
        for _ in range(args.items):
            doc, _prompt, answer = tasks.recall_item(rng, stage, S, 1)
            value = loaded.tokenizer.decode(answer).strip().split(".")[0]
            if len(value) != 7 or not value.isdigit():
                raise SystemExit(f"unexpected answer {value!r}: the probe assumes one token per digit")
            ids = torch.tensor([doc[:S]])
            armt.step(ids, armt.empty_state())
            position = S - suffix_len - 7 + args.digit  # the needle ends the segment (stage needle = "end")
            if loaded.tokenizer.decode([doc[position]]).strip() != value[args.digit]:
                raise SystemExit(
                    "the digit is not where the probe expects it (needle not at the segment end?)"
                )
            for i in layers:
                out = captured[i][0]
                writes[i].append(out[-M:].flatten())
                owns[i].append(out[position])
            digits.append(int(value[args.digit]))
    for h in hooks:
        h.remove()
    y = torch.tensor(digits)
    train = int(0.75 * len(y))
    note = f"; write embeddings from {args.write_text!r}" if args.write_text else ""
    print(
        f"checkpoint step {at}{note}; {len(y)} items ({train} fit, {len(y) - train} held out); "
        f"digit {args.digit}"
    )
    for i in layers:
        w = torch.stack(writes[i])
        a = ridge_accuracy(w, y, train, args.alpha)
        per_token = [ridge_accuracy(t, y, train, args.alpha) for t in w.view(len(y), M, -1).unbind(1)]
        b = ridge_accuracy(torch.stack(owns[i]), y, train, args.alpha)
        print(
            f"layer {i:2d}: write tokens {a:.2f} (best single write token {max(per_token):.2f})   "
            f"the digit's own position {b:.2f}"
        )


if __name__ == "__main__":
    run_script(main)
