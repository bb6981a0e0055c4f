"""The delta-rule write: the batched matmul edgemem uses against the three-operand einsum it replaced.

    python scripts/bench_memory_write.py [--pairs 16,80,528] [--batch 4] [--repeat 10]

Both compute A + sum_i beta_i k_i^T v_i; the einsum ("bmk,bmd,bm->bkd") materialised the
[B, M, K, D] outer product first. Prints seconds per call for each, side by side in one run, and
the largest difference between the two results. Behind docs/RESULTS.md, "Training the memory".
"""

from __future__ import annotations

import argparse
import time

import torch

from edgemem.cli_common import run_script
from edgemem.memory import memory_write


def seconds(fn, repeat: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", default="16,80,528", help="key/value pairs written per segment (M)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--key-size", type=int, default=384, help="2 * nu * d_mem (SmolLM2: 384)")
    parser.add_argument("--d-model", type=int, default=576)
    args = parser.parse_args()
    torch.manual_seed(0)
    B, K, D = args.batch, args.key_size, args.d_model
    print(f"batch {B}, K {K}, D {D}, {torch.get_num_threads()} threads")
    for M in (int(m) for m in args.pairs.split(",")):
        k, v, beta = torch.rand(B, M, K), torch.randn(B, M, D), torch.rand(B, M)
        A, z = torch.zeros(B, K, D), torch.zeros(B, K)

        def einsum(k=k, v=v, beta=beta, A=A):
            return A + torch.einsum("bmk,bmd,bm->bkd", k, v, beta)

        def matmul(k=k, v=v, beta=beta, A=A, z=z):
            return memory_write(k, v, beta, A, z, first=True)[0]

        old, new = seconds(einsum, args.repeat), seconds(matmul, args.repeat)
        diff = (einsum() - matmul()).abs().max()
        print(
            f"M {M:4d}: einsum {old * 1e3:8.1f} ms, matmul {new * 1e3:7.1f} ms, x{old / new:5.1f}, ", end=""
        )
        print(f"max diff {diff:.1e}")


if __name__ == "__main__":
    run_script(main)
