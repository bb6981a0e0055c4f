"""Associative memory: the DPFP feature map, the read, and the delta-rule write.

Exactly the equations of ARMT (shared REFERENCE.md section 1). Shapes use B batch, T tokens,
M write tokens, D model width, K = 2 * nu * d_mem the key size after the feature map.

The memory state of one layer is a pair of tensors (A [B, K, D], z [B, K]); these functions take
the state and return a new one, nothing is kept on the module.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

EPS = 1e-5


def dpfp(x: Tensor, nu: int = 3) -> Tensor:
    """Deterministic parameter-free projection of order nu. [..., d] -> [..., 2 * nu * d], all >= 0.

    x' = [relu(x), relu(-x)];  phi(x) = concat_{j=1..nu} x' * roll(x', j).
    """
    xp = torch.cat([F.relu(x), F.relu(-x)], dim=-1)
    return torch.cat([xp * xp.roll(shifts=j, dims=-1) for j in range(1, nu + 1)], dim=-1)


def memory_read(phi_q: Tensor, A: Tensor, z: Tensor) -> Tensor:
    """Read values for feature-mapped queries. phi_q [B, T, K], A [B, K, D], z [B, K] -> [B, T, D].

    (phi(q) A) / (phi(q) . z + eps): zero while the memory is empty.
    """
    numerator = phi_q @ A
    denominator = (phi_q * z.unsqueeze(1)).sum(-1, keepdim=True) + EPS
    return numerator / denominator


def write_gamma(k: Tensor, z: Tensor) -> Tensor:
    """Normaliser correction gamma = clip(1 - (k . z) / ||k||^2, 0, 1). k [B, M, K], z [B, K] -> [B, M]."""
    kz = (k * z.unsqueeze(1)).sum(-1)
    return (1 - kz / (k * k).sum(-1).clamp_min(EPS)).clamp(0, 1)


def memory_write(
    k: Tensor, v: Tensor, beta: Tensor, A: Tensor, z: Tensor, first: bool
) -> tuple[Tensor, Tensor]:
    """Delta-rule write of M key/value pairs. Returns the new (A [B, K, D], z [B, K]).

    k [B, M, K] (feature-mapped keys), v [B, M, D], beta [B, M] in (0, 1).
    On the first write the previous value is 0 and gamma is 1; afterwards both come from the
    current memory and are detached:
        vbar = (k A) / (k . z + eps),  gamma = clip(1 - (k . z) / ||k||^2, 0, 1)
        A <- A + sum_i beta_i k_i^T (v_i - vbar_i),  z <- z + sum_i gamma_i k_i
    """
    if first:
        vbar = torch.zeros_like(v)
        gamma = torch.ones_like(beta)
    else:
        vbar = memory_read(k, A, z).detach()
        gamma = write_gamma(k, z).detach()
    # one batched matmul k^T [B, K, M] @ [B, M, D]; a three-operand einsum built the [B, M, K, D]
    # outer product first (283 MB per layer for 80 pairs at batch 4)
    A = A + k.transpose(1, 2) @ ((v - vbar) * beta.unsqueeze(-1))
    z = z + (gamma.unsqueeze(-1) * k).sum(1)
    return A, z


class AssociativeMemory(nn.Module):
    """The trainable part of one memory layer: W_Q, W_K (d -> d_mem), W_V (d -> d, zero-init), W_b (d -> 1),
    and with `gate` a read gate (`gate_w` [d], `gate_b` []).

    With W_V at zero the memory only ever holds zeros, so a fresh memory reads nothing and the
    wrapped model equals the base model.

    The read (phi(q) A) / (phi(q) . z) is a weighted mean of what was written, whatever the query:
    every token that reads gets a full-size value, and an ungated memory cannot read "nothing" for
    one token and something for another. The gate g = 2 sigmoid(x . gate_w + gate_b) in (0, 2),
    per token from the same input x, scales the read; it starts at zero weights, g = 1, so a gate
    added to a trained memory changes nothing until it trains (docs/RESULTS.md, "Twenty-ninth
    session"; it trains at its own rate, `TrainConfig.gate_lr_scale`).
    """

    def __init__(self, d_model: int, d_mem: int = 64, nu: int = 3, gate: bool = False) -> None:
        super().__init__()
        self.nu = nu
        self.W_Q = nn.Linear(d_model, d_mem, bias=False)
        self.W_K = nn.Linear(d_model, d_mem, bias=False)
        self.W_V = nn.Linear(d_model, d_model, bias=False)
        self.W_b = nn.Linear(d_model, 1, bias=True)
        nn.init.zeros_(self.W_V.weight)
        self.gated = gate
        if gate:  # plain zero tensors: no draw from the RNG, so the other weights init as without
            self.gate_w = nn.Parameter(torch.zeros(d_model))
            self.gate_b = nn.Parameter(torch.zeros(()))

    @property
    def key_size(self) -> int:
        return 2 * self.nu * self.W_K.out_features

    def empty_state(self, batch: int = 1, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
        """Zero state: A [B, K, D], z [B, K] in float32."""
        d_model = self.W_V.out_features
        return (
            torch.zeros(batch, self.key_size, d_model, device=device),
            torch.zeros(batch, self.key_size, device=device),
        )

    def gate(self, h: Tensor) -> Tensor:
        """The read gate for hidden states h [B, T, D] (float32) -> [B, T, 1] in (0, 2)."""
        return 2 * torch.sigmoid(h.float() @ self.gate_w + self.gate_b).unsqueeze(-1)

    def read(self, h: Tensor, A: Tensor, z: Tensor) -> Tensor:
        """What the memory returns for hidden states h [B, T, D] (computed in float32) -> [B, T, D]."""
        phi_q = dpfp(self.W_Q(h.float()), self.nu)
        out = memory_read(phi_q, A, z)
        return out * self.gate(h) if self.gated else out

    def write(self, m: Tensor, A: Tensor, z: Tensor, first: bool) -> tuple[Tensor, Tensor]:
        """Write the layer outputs of the write tokens m [B, M, D]; returns the new (A, z)."""
        m = m.float()
        k = dpfp(self.W_K(m), self.nu)
        v = self.W_V(m)
        beta = torch.sigmoid(self.W_b(m)).squeeze(-1)
        return memory_write(k, v, beta, A, z, first)
