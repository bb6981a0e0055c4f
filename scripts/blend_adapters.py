#!/usr/bin/env python3
"""Blend two adapters of one lineage: every tensor (1 - alpha) * A + alpha * B, written as a new adapter.

    mkdir -p runs/smollm2-135m && git show 13a97e1:edgemem/adapters/smollm2-135m-instruct.safetensors \\
        > runs/smollm2-135m/recall-longer-step24.f16.safetensors
    python scripts/blend_adapters.py runs/smollm2-135m/recall-longer-step24.f16.safetensors \\
        runs/smollm2-135m-view-long-cpu2/adapter.safetensors --alpha 0.75 --answer-window 1024 \\
        --out runs/blend/a075.safetensors

Weight interpolation between a model and its fine-tuned descendant (WiSE-FT, model soups) often
keeps some of what each endpoint does well. The adapter shipped since 2026-12-05 is the blend
above: A the needle adapter shipped before it (needles recalled at 16k-32k, docqa lost), B a
descendant trained for the answer window (docqa at `window`, fewer needles past 8k); see
docs/RESULTS.md, "Thirty-sixth session".

The LoRA factors are blended one by one, so the blended update B_alpha A_alpha is not exactly the
blend of the two updates: it differs by alpha (1 - alpha) (B1 - B0)(A1 - A0), small when the
factors are close (the script prints each group's distance relative to A). The two adapters must
have the same memory config (answer window aside; `--answer-window` sets the blend's) and the same
tensor names and shapes. The blend keeps B's model id and training metadata, so
`scripts/ship_adapter.py` can ship it with a card that says it is a blend. `--alpha-lora` gives
the LoRA factors their own alpha (the memory and the write embeddings keep `--alpha`): the
backbone's update and the memory can come from different points of the line. The blend records
both parents' sha256 and both alphas in its metadata.

`python scripts/blend_adapters.py A B --distances` writes nothing and prints |B - A| / |A| for each
memory and write-embedding tensor: how far a run moved its `init` (docs/RESULTS.md, "Forty-fourth
session").
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgemem.armt import ADAPTER_FORMAT, ARMTConfig, answer_window_problem, read_adapter  # noqa: E402
from edgemem.cli_common import run_script  # noqa: E402
from edgemem.errors import EdgememError  # noqa: E402
from edgemem.files import atomic_write_bytes, read_safetensors, sha256_file  # noqa: E402

Tensors = dict[str, torch.Tensor]
# B's metadata that the blend keeps: its model and its last run (scripts/ship_adapter.py's card says
# that those training lines are B's and what the blend is)
TRAINING_METADATA = ("model_id", "train_config", "train_steps", "init_sha256")


def same_tensors(a: Tensors, b: Tensors) -> None:
    """Refuse (one line) two adapters whose tensor names or shapes differ."""
    if a.keys() != b.keys():
        missing = sorted(a.keys() ^ b.keys())[:3]
        raise EdgememError(f"the adapters have different tensors ({missing})")
    for name, x in a.items():
        if x.shape != b[name].shape:
            raise EdgememError(f"tensor {name}: shapes {tuple(x.shape)} and {tuple(b[name].shape)} differ")


def blend(a: Tensors, b: Tensors, alpha: float, alpha_lora: float | None = None) -> Tensors:
    """(1 - alpha) * a + alpha * b per tensor, in float32 (`torch.lerp`: alpha 0 gives a, 1 gives b
    exactly); the LoRA factors (`lora.*`) with `alpha_lora` instead where it is given."""
    alpha_lora = alpha if alpha_lora is None else alpha_lora
    for value in (alpha, alpha_lora):
        if not 0.0 <= value <= 1.0:
            raise EdgememError(f"alpha must be in [0, 1], got {value}")
    same_tensors(a, b)
    out = {}
    for name, x in a.items():
        y = b[name]
        t = alpha_lora if name.startswith("lora.") else alpha
        out[name] = torch.lerp(x.float(), y.float(), t)
    return out


def same_memory(a: ARMTConfig, b: ARMTConfig) -> bool:
    """Whether two memory configs differ at most in their answer window (a read-time setting)."""
    return replace(a, answer_window=0) == replace(b, answer_window=0)


def distances(a: Tensors, b: Tensors, per_tensor: bool = False) -> dict[str, float]:
    """|B - A| / |A| per group (memory, write_embeddings, lora.A, lora.B), or with `per_tensor` per
    tensor name: how far apart the parents are (or how far a run moved its `init`)."""
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for name, x in a.items():
        if per_tensor:
            group = name
        else:
            group = name.split(".")[0] + (f".{name.rsplit('.', 1)[1]}" if name.startswith("lora.") else "")
        sums[group][0] += float((b[name].float() - x.float()).pow(2).sum())
        sums[group][1] += float(x.float().pow(2).sum())
    return {g: (d / n) ** 0.5 if n else float("inf") for g, (d, n) in sums.items()}


def blend_files(
    a: Path,
    b: Path,
    alpha: float,
    out: Path,
    answer_window: int | None = None,
    alpha_lora: float | None = None,
) -> tuple[ARMTConfig, dict[str, float]]:
    """Write the blend of adapter files `a` and `b` to `out`: (its memory config, `distances`)."""
    config_a, tensors_a = read_adapter(a)
    config_b, tensors_b = read_adapter(b)
    if not same_memory(config_a, config_b):
        raise EdgememError(f"the adapters have different memory configs ({config_a} and {config_b})")
    meta_a, _ = read_safetensors(a, "adapter")
    meta_b, _ = read_safetensors(b, "adapter")
    if meta_a.get("model_id") != meta_b.get("model_id"):
        raise EdgememError(
            f"the adapters are for different models ({meta_a.get('model_id')}, {meta_b.get('model_id')})"
        )
    config = config_b if answer_window is None else replace(config_b, answer_window=answer_window)
    if problem := answer_window_problem(config.answer_window, config.segment_len):
        raise EdgememError(problem)
    tensors = blend(tensors_a, tensors_b, alpha, alpha_lora)
    metadata = {
        **{k: meta_b[k] for k in TRAINING_METADATA if k in meta_b},
        "format": ADAPTER_FORMAT,
        "config": config.to_json(),
        "blend": json.dumps(
            {
                "a": str(a),
                "a_sha256": sha256_file(a),
                "b": str(b),
                "b_sha256": sha256_file(b),
                "alpha": alpha,
                "alpha_lora": alpha if alpha_lora is None else alpha_lora,
            }
        ),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, save(tensors, metadata=metadata))
    return config, distances(tensors_a, tensors_b)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path, help="adapter at alpha 0")
    parser.add_argument("b", type=Path, help="adapter at alpha 1 (its memory config is the blend's)")
    parser.add_argument("--alpha", type=float)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--distances",
        action="store_true",
        help="print |B - A| / |A| for every memory and write-embedding tensor, write nothing",
    )
    parser.add_argument(
        "--alpha-lora", type=float, default=None, help="the LoRA factors' alpha (default --alpha)"
    )
    parser.add_argument(
        "--answer-window", type=int, default=None, help="the blend's answer window (default B's)"
    )
    args = parser.parse_args(argv)
    if args.distances:
        try:
            (_, tensors_a), (_, tensors_b) = read_adapter(args.a), read_adapter(args.b)
            same_tensors(tensors_a, tensors_b)
        except EdgememError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        for name, d in distances(tensors_a, tensors_b, per_tensor=True).items():
            if not name.startswith("lora."):
                print(f"{name} {d:.4f}")
        return 0
    if args.alpha is None or args.out is None:
        parser.error("--alpha and --out are needed to blend (or --distances)")
    try:
        config, far = blend_files(args.a, args.b, args.alpha, args.out, args.answer_window, args.alpha_lora)
    except EdgememError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    apart = ", ".join(f"{g} {d:.3f}" for g, d in far.items())
    lora = args.alpha if args.alpha_lora is None else args.alpha_lora
    print(f"{args.out}: alpha {args.alpha} (LoRA {lora}), answer window {config.answer_window}")
    print(f"|B - A| / |A|: {apart}")
    return 0


if __name__ == "__main__":
    run_script(main)
