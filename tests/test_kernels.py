"""The fused Triton kernels against the PyTorch reference (`edgemem.memory`) on random shapes.

On a machine without a GPU they run under Triton's interpreter (TRITON_INTERPRET=1, set here
before the kernels are imported): the same kernel code, executed on the CPU for correctness. On a
GPU, `TRITON_INTERPRET=0 python -m pytest tests/test_kernels.py` runs them compiled, on the device
(scripts/gpu_check.sh).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton sees the kernels

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (pip install 'edgemem[kernels]')")

from edgemem.kernels import reference  # noqa: E402
from edgemem.kernels import triton_ops as fused  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def random_shapes(seed: int) -> dict[str, int]:
    g = torch.Generator().manual_seed(seed)

    def pick(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    return {
        "B": pick(1, 2),
        "T": pick(1, 40),
        "d": pick(2, 12),
        "D": pick(3, 70),
        "M": pick(1, 20),
        "nu": pick(1, 3),
    }


@pytest.mark.parametrize("seed", range(6))
def test_dpfp_matches_reference(seed):
    s = random_shapes(seed)
    x = torch.randn(s["B"], s["T"], s["d"], device=DEVICE)
    torch.testing.assert_close(fused.dpfp(x, s["nu"]), reference.dpfp(x, s["nu"]), rtol=0, atol=0)


def memory(s: dict[str, int], writes: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """A state reached by `writes` reference writes of random keys and values (so z and A are realistic)."""
    K = 2 * s["nu"] * s["d"]
    A, z = torch.zeros(s["B"], K, s["D"], device=DEVICE), torch.zeros(s["B"], K, device=DEVICE)
    for i in range(writes):
        k = reference.dpfp(torch.randn(s["B"], s["M"], s["d"], device=DEVICE), s["nu"])
        v = torch.randn(s["B"], s["M"], s["D"], device=DEVICE)
        beta = torch.rand(s["B"], s["M"], device=DEVICE)
        A, z = reference.memory_write(k, v, beta, A, z, first=i == 0)
    return A, z


@pytest.mark.parametrize("seed", range(6))
def test_memory_read_matches_reference(seed):
    s = random_shapes(seed)
    A, z = memory(s)
    phi = reference.dpfp(torch.randn(s["B"], s["T"], s["d"], device=DEVICE), s["nu"])
    torch.testing.assert_close(
        fused.memory_read(phi, A, z), reference.memory_read(phi, A, z), rtol=1e-5, atol=1e-5
    )


def test_memory_read_of_an_empty_memory_is_exactly_zero():
    phi = reference.dpfp(torch.randn(1, 5, 4, device=DEVICE))
    A, z = torch.zeros(1, 24, 16, device=DEVICE), torch.zeros(1, 24, device=DEVICE)
    assert torch.equal(fused.memory_read(phi, A, z), torch.zeros(1, 5, 16, device=DEVICE))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("first", [True, False])
def test_memory_write_matches_reference(seed, first):
    s = random_shapes(seed)
    A, z = memory(s, writes=0 if first else 3)
    k = reference.dpfp(torch.randn(s["B"], s["M"], s["d"], device=DEVICE), s["nu"])
    v = torch.randn(s["B"], s["M"], s["D"], device=DEVICE)
    beta = torch.rand(s["B"], s["M"], device=DEVICE)
    A_before, z_before = A.clone(), z.clone()
    got = fused.memory_write(k, v, beta, A, z, first)
    want = reference.memory_write(k, v, beta, A, z, first)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    assert torch.equal(A, A_before) and torch.equal(z, z_before)  # a new state, the old one untouched


def test_sixteen_segments_of_fused_writes_track_the_reference():
    """Errors must not grow along the recurrence: 16 writes, then a read (DPFP-3 of d_mem 16: K = 96;
    D = 64; 16 write tokens; SmolLM2's own K = 384, D = 576 take minutes in the interpreter)."""
    g = torch.Generator().manual_seed(0)
    d_mem, D, M = 16, 64, 16
    K = 6 * d_mem
    A_ref = A_fused = torch.zeros(1, K, D)
    z_ref = z_fused = torch.zeros(1, K)
    for i in range(16):
        k = reference.dpfp(torch.randn(1, M, d_mem, generator=g) * 0.3)
        v = torch.randn(1, M, D, generator=g)
        beta = torch.rand(1, M, generator=g)
        A_ref, z_ref = reference.memory_write(k, v, beta, A_ref, z_ref, first=i == 0)
        A_fused, z_fused = fused.memory_write(
            k.to(DEVICE), v.to(DEVICE), beta.to(DEVICE), A_fused.to(DEVICE), z_fused.to(DEVICE), i == 0
        )
        A_fused, z_fused = A_fused.cpu(), z_fused.cpu()
    torch.testing.assert_close(A_fused, A_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(z_fused, z_ref, rtol=1e-5, atol=1e-5)
    phi = reference.dpfp(torch.randn(1, 7, d_mem, generator=g))
    torch.testing.assert_close(
        fused.memory_read(phi.to(DEVICE), A_fused.to(DEVICE), z_fused.to(DEVICE)).cpu(),
        reference.memory_read(phi, A_ref, z_ref),
        rtol=1e-4,
        atol=1e-4,
    )
