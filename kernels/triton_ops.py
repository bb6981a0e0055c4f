"""Fused Triton kernels for the associative memory, with the reference's signatures.

    dpfp(x [..., d], nu) -> [..., 2 * nu * d]
    memory_read(phi_q [B, T, K], A [B, K, D], z [B, K]) -> [B, T, D]
    memory_write(k [B, M, K], v [B, M, D], beta [B, M], A, z, first) -> (A' [B, K, D], z' [B, K])

- `dpfp`: one pass, each output element gathered from x (no intermediate [relu(x), relu(-x)] or
  rolled copies).
- `memory_read`: numerator phi_q A and denominator phi_q . z in the same K loop, divided in
  registers: one read of A per (T, D) tile, nothing written but the result.
- `memory_write`: two launches. The first is the read kernel run on the keys, which also gives
  gamma = clip(1 - (k . z) / ||k||^2, 0, 1); the second updates each (K, D) tile of A in place of a
  copy (A' = A + k^T (beta (v - vbar))) and z. On the first write vbar = 0 and gamma = 1.

Float32 throughout. On a GPU they run compiled; on a CPU they run for correctness only under
`TRITON_INTERPRET=1` (set before this module is imported). `tests/test_kernels.py` compares each
with the reference (`edgemem.memory`) on random shapes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from edgemem.memory import EPS


@triton.jit
def _dpfp_kernel(x_ptr, out_ptr, d, width, NU: tl.constexpr, BLOCK: tl.constexpr):
    """A block of one row: x [N, d] -> out [N, 2 * NU * d], out[j * 2d + i] = xp[i] * xp[(i - j - 1) mod 2d]
    with xp = [relu(x), relu(-x)] (torch.roll's convention)."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    two_d = 2 * d
    shift = cols // two_d + 1
    i = cols % two_d
    r = (i - shift % two_d + two_d) % two_d
    xi = tl.load(x_ptr + row * d + i % d, mask=mask, other=0.0)
    xr = tl.load(x_ptr + row * d + r % d, mask=mask, other=0.0)
    xi = tl.where(i < d, tl.maximum(xi, 0.0), tl.maximum(-xi, 0.0))
    xr = tl.where(r < d, tl.maximum(xr, 0.0), tl.maximum(-xr, 0.0))
    tl.store(out_ptr + row * width + cols, xi * xr, mask=mask)


def dpfp(x: Tensor, nu: int = 3) -> Tensor:
    """DPFP-nu feature map. x [..., d] -> [..., 2 * nu * d] (float32)."""
    d = x.shape[-1]
    rows = x.reshape(-1, d).float().contiguous()
    width = 2 * nu * d
    out = torch.empty(rows.shape[0], width, device=x.device, dtype=torch.float32)
    block = min(256, triton.next_power_of_2(width))
    _dpfp_kernel[(rows.shape[0], triton.cdiv(width, block))](rows, out, d, width, NU=nu, BLOCK=block)
    return out.reshape(*x.shape[:-1], width)


@triton.jit
def _read_kernel(
    q_ptr,
    a_ptr,
    z_ptr,
    out_ptr,
    gamma_ptr,
    T,
    K,
    D,
    eps,
    WITH_GAMMA: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BD: tl.constexpr,
):
    """out[b, t, :] = (q[b, t] A[b]) / (q[b, t] . z[b] + eps) for a [BT, BD] tile; with WITH_GAMMA
    the first D tile also writes gamma[b, t] = clip(1 - (q . z) / max(||q||^2, eps), 0, 1)."""
    b = tl.program_id(0)
    t = tl.program_id(1) * BT + tl.arange(0, BT)
    dd = tl.program_id(2) * BD + tl.arange(0, BD)
    acc = tl.zeros((BT, BD), dtype=tl.float32)
    qz = tl.zeros((BT,), dtype=tl.float32)
    qq = tl.zeros((BT,), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + tl.arange(0, BK)
        q = tl.load(
            q_ptr + b * T * K + t[:, None] * K + kk[None, :],
            mask=(t[:, None] < T) & (kk[None, :] < K),
            other=0.0,
        )
        a = tl.load(
            a_ptr + b * K * D + kk[:, None] * D + dd[None, :],
            mask=(kk[:, None] < K) & (dd[None, :] < D),
            other=0.0,
        )
        zk = tl.load(z_ptr + b * K + kk, mask=kk < K, other=0.0)
        acc += tl.dot(q, a, input_precision="ieee")
        qz += tl.sum(q * zk[None, :], axis=1)
        qq += tl.sum(q * q, axis=1)
    out = acc / (qz + eps)[:, None]
    tl.store(
        out_ptr + b * T * D + t[:, None] * D + dd[None, :], out, mask=(t[:, None] < T) & (dd[None, :] < D)
    )
    if WITH_GAMMA and tl.program_id(2) == 0:
        gamma = tl.minimum(tl.maximum(1.0 - qz / tl.maximum(qq, eps), 0.0), 1.0)
        tl.store(gamma_ptr + b * T + t, gamma, mask=t < T)


def _blocks(T: int, K: int, D: int) -> tuple[int, int, int]:
    # tl.dot needs every block dimension >= 16
    return (
        max(16, min(64, triton.next_power_of_2(T))),
        max(16, min(64, triton.next_power_of_2(K))),
        max(16, min(64, triton.next_power_of_2(D))),
    )


def _read(phi: Tensor, A: Tensor, z: Tensor, with_gamma: bool) -> tuple[Tensor, Tensor | None]:
    phi, A, z = phi.float().contiguous(), A.float().contiguous(), z.float().contiguous()
    B, T, K = phi.shape
    D = A.shape[-1]
    out = torch.empty(B, T, D, device=phi.device, dtype=torch.float32)
    gamma = torch.empty(B, T, device=phi.device, dtype=torch.float32) if with_gamma else out
    BT, BK, BD = _blocks(T, K, D)
    grid = (B, triton.cdiv(T, BT), triton.cdiv(D, BD))
    _read_kernel[grid](phi, A, z, out, gamma, T, K, D, EPS, WITH_GAMMA=with_gamma, BT=BT, BK=BK, BD=BD)
    return out, (gamma if with_gamma else None)


def memory_read(phi_q: Tensor, A: Tensor, z: Tensor) -> Tensor:
    """(phi_q A) / (phi_q . z + eps). phi_q [B, T, K], A [B, K, D], z [B, K] -> [B, T, D]."""
    return _read(phi_q, A, z, with_gamma=False)[0]


@triton.jit
def _update_kernel(
    k_ptr,
    u_ptr,
    gamma_ptr,
    a_ptr,
    z_ptr,
    a_out_ptr,
    z_out_ptr,
    M,
    K,
    D,
    BM: tl.constexpr,
    BK: tl.constexpr,
    BD: tl.constexpr,
):
    """A'[b, K tile, D tile] = A + k^T u (u = beta (v - vbar), [M, D]); the first D tile also
    writes z'[b, K tile] = z + sum_m gamma_m k_m."""
    b = tl.program_id(0)
    kk = tl.program_id(1) * BK + tl.arange(0, BK)
    dd = tl.program_id(2) * BD + tl.arange(0, BD)
    m = tl.arange(0, BM)
    acc = tl.zeros((BK, BD), dtype=tl.float32)
    zacc = tl.zeros((BK,), dtype=tl.float32)
    for m0 in range(0, M, BM):
        mm = m0 + m
        k = tl.load(
            k_ptr + b * M * K + mm[:, None] * K + kk[None, :],
            mask=(mm[:, None] < M) & (kk[None, :] < K),
            other=0.0,
        )
        u = tl.load(
            u_ptr + b * M * D + mm[:, None] * D + dd[None, :],
            mask=(mm[:, None] < M) & (dd[None, :] < D),
            other=0.0,
        )
        g = tl.load(gamma_ptr + b * M + mm, mask=mm < M, other=0.0)
        acc += tl.dot(tl.trans(k), u, input_precision="ieee")
        zacc += tl.sum(k * g[:, None], axis=0)
    tile = b * K * D + kk[:, None] * D + dd[None, :]
    tile_mask = (kk[:, None] < K) & (dd[None, :] < D)
    a = tl.load(a_ptr + tile, mask=tile_mask, other=0.0)
    tl.store(a_out_ptr + tile, a + acc, mask=tile_mask)
    if tl.program_id(2) == 0:
        z = tl.load(z_ptr + b * K + kk, mask=kk < K, other=0.0)
        tl.store(z_out_ptr + b * K + kk, z + zacc, mask=kk < K)


def memory_write(
    k: Tensor, v: Tensor, beta: Tensor, A: Tensor, z: Tensor, first: bool
) -> tuple[Tensor, Tensor]:
    """Delta-rule write of M key/value pairs -> the new (A [B, K, D], z [B, K]); A and z are not modified.

    k [B, M, K] (feature-mapped keys), v [B, M, D], beta [B, M].
    """
    k, A, z = k.float().contiguous(), A.float().contiguous(), z.float().contiguous()
    B, M, K = k.shape
    D = A.shape[-1]
    if first:
        vbar = torch.zeros(B, M, D, device=k.device, dtype=torch.float32)
        gamma = torch.ones(B, M, device=k.device, dtype=torch.float32)
    else:
        vbar, gamma = _read(k, A, z, with_gamma=True)
        assert gamma is not None
    u = (beta.float().unsqueeze(-1) * (v.float() - vbar)).contiguous()
    A_out, z_out = torch.empty_like(A), torch.empty_like(z)
    BM = max(16, min(32, triton.next_power_of_2(M)))
    _, BK, BD = _blocks(M, K, D)
    grid = (B, triton.cdiv(K, BK), triton.cdiv(D, BD))
    _update_kernel[grid](k, u, gamma.contiguous(), A, z, A_out, z_out, M, K, D, BM=BM, BK=BK, BD=BD)
    return A_out, z_out
