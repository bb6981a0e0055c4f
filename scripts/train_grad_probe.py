"""Where a training run's gradient goes, and how large the memory's inputs are.

    python scripts/train_grad_probe.py RUN/checkpoint.safetensors --steps 21,23,24
    python scripts/train_grad_probe.py RUN/checkpoint.safetensors --activations

Replays the batches of the given (1-based, as in log.jsonl) steps on the checkpoint's weights,
with the config the checkpoint was written with, and prints the loss, the gradient norm per
parameter group (before clipping) and, per memory read, the smallest and median normaliser
phi(q) . z and |A|. With --activations it prints, for each memory layer, the scale of the hidden
states the memory sees (rms, largest entry, the segment's first token) before and after the
layer's input RMSNorm. Behind docs/RESULTS.md, "Training the memory".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from edgemem import memory
from edgemem import train as T
from edgemem.cli_common import run_script
from edgemem.files import read_safetensors
from edgemem.models import load_model


def group_of(name: str) -> str:
    """'W_V', 'lora', 'write_embeddings'...: parameters reached through the base model's layers."""
    if name.endswith((".A", ".B")):
        return "lora"
    if ".memory." in name or name.startswith("memories."):
        return name.rsplit(".", 2)[-2]  # W_Q / W_K / W_V / W_b
    return name.rsplit(".", 1)[-1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--steps", default="", help="comma-separated steps of log.jsonl to replay")
    parser.add_argument("--activations", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    meta, _ = read_safetensors(args.checkpoint, "checkpoint")
    config = T.TrainConfig.from_dict(json.loads(meta["config"]))
    loaded = load_model(config.model, dtype=torch.float32)
    armt = T.build_armt(loaded.model, config)
    optimizer = torch.optim.AdamW(list(T._trainable(armt).values()))
    at, _ = T.load_checkpoint(args.checkpoint, armt, optimizer)
    print(f"checkpoint at step {at}; norm_inputs={config.norm_inputs}; backbone={config.backbone}")

    if args.activations:
        text = Path(__file__).resolve().parents[1].joinpath("README.md").read_text()[:4000]
        ids = torch.tensor([loaded.tokenizer.encode(text)[:200]])
        with torch.no_grad():
            hidden = loaded.model.model(ids, output_hidden_states=True, use_cache=False).hidden_states
        for i in config.memory_layers or armt.config.memory_layers:
            h = hidden[i][0]
            layer = armt.base.model.layers[i].layer
            n = layer.input_layernorm(h)
            rest = h[1:]
            print(
                f"layer {i:2d} raw: rms {rest.pow(2).mean(-1).sqrt().median():7.1f}  "
                f"max {rest.abs().amax(-1).median():7.1f}  first token max {h[0].abs().max():8.1f} | "
                f"normed: rms {n[1:].pow(2).mean(-1).sqrt().median():.2f}  "
                f"max {n[1:].abs().amax(-1).median():.2f}  "
                f"first token max {n[0].abs().max():.2f}"
            )

    if not args.steps:
        return
    tasks = T.ProseTasks(
        loaded.tokenizer, T.cached_stream(loaded.tokenizer, loaded.model_id, config, "train")
    )
    reads: list[tuple[float, float, float]] = []
    plain_read = memory.memory_read

    def watched_read(phi_q, A, z):
        den = (phi_q * z.unsqueeze(1)).sum(-1)
        reads.append((den.min().item(), den.median().item(), A.norm().item()))
        return plain_read(phi_q, A, z)

    memory.memory_read = watched_read  # the module-level name the read path calls
    try:
        for logged in (int(s) for s in args.steps.split(",")):
            step = logged - 1
            stage, _ = config.stage_at(step)
            S, n = T.batch_shape(config, step)
            batch = tasks.batch(stage.task, T.step_rng(config.seed, step, "batch"), stage, S, n)
            reads.clear()
            loss, _ = T.forward_loss(armt, batch, stage, batch.written.shape[0])
            armt.zero_grad(set_to_none=True)
            loss.backward()
            groups: dict[str, float] = {}
            for name, p in T._trainable(armt).items():
                if p.grad is not None:
                    groups[group_of(name)] = groups.get(group_of(name), 0.0) + float(p.grad.norm()) ** 2
            total = sum(groups.values()) ** 0.5
            parts = ", ".join(f"{k} {v**0.5:.2g}" for k, v in sorted(groups.items(), key=lambda kv: -kv[1]))
            print(
                f"step {logged} ({stage.name}): loss {loss.item():.3f}, gradient norm {total:.1f} = {parts}"
            )
            for lo, med, a in reads[:6]:
                print(f"    read: phi(q).z min {lo:.3g} median {med:.3g}, |A| {a:.3g}")
    finally:
        memory.memory_read = plain_read


if __name__ == "__main__":
    run_script(main)
