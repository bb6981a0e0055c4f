"""One training step's gradients on a tiny model, in 1 process or under torchrun (gloo).

python tests/ddp_worker.py OUT            -> OUT/grads.safetensors
torchrun --nproc_per_node 2 tests/ddp_worker.py OUT
Used by tests/test_train.py; the global batch is the same in both cases.
"""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from tiny import VOCAB, tiny_llama

from edgemem.train import (
    Stage,
    TokenRecall,
    TrainConfig,
    _all_reduce_grads,
    _trainable,
    build_armt,
    forward_loss,
    step_rng,
)


def main(out: Path) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    stage = Stage(name="kv", task="tokens", steps=1, segment_len=8, segments=(2,), batch_size=8)
    config = TrainConfig(
        model="tiny", stages=(stage,), backbone="full", memory_layers=(1, 3), d_mem=16, num_write_tokens=4
    )
    torch.manual_seed(0)
    armt = build_armt(tiny_llama(), config)
    batch = TokenRecall(VOCAB).batch(step_rng(0, 0, "batch"), stage, 8, 2)
    loss, _ = forward_loss(armt, batch.rows(list(range(rank, 8, world))), stage, 8)
    loss.backward()
    params = _trainable(armt)
    if world > 1:
        _all_reduce_grads(list(params.values()), world)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        save_file(
            {n: p.grad.contiguous() for n, p in params.items() if p.grad is not None},
            str(out / "grads.safetensors"),
        )
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
