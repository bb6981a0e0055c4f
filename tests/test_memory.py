"""The associative memory equations (REFERENCE.md section 1)."""

import torch

from edgemem.memory import AssociativeMemory, dpfp, memory_read, memory_write, write_gamma


def test_dpfp_size_and_non_negative():
    x = torch.randn(2, 5, 64)
    phi = dpfp(x, nu=3)
    assert phi.shape == (2, 5, 2 * 3 * 64)
    assert bool((phi >= 0).all())


def test_dpfp_matches_definition():
    x = torch.randn(7)
    xp = torch.cat([x.clamp_min(0), (-x).clamp_min(0)])
    expected = torch.cat([xp * torch.roll(xp, j) for j in (1, 2)])
    assert torch.allclose(dpfp(x, nu=2), expected)


def test_gamma_is_clipped_to_unit_interval():
    k = torch.rand(1, 4, 8)
    assert torch.allclose(write_gamma(k, torch.zeros(1, 8)), torch.ones(1, 4))  # empty memory: 1
    assert torch.allclose(write_gamma(k, torch.full((1, 8), 100.0)), torch.zeros(1, 4))  # saturated: 0
    g = write_gamma(k, torch.rand(1, 8) * 0.1)
    assert bool(((g >= 0) & (g <= 1)).all())


def test_read_is_zero_before_first_write():
    mem = AssociativeMemory(16, d_mem=4)
    A, z = mem.empty_state(batch=2)
    assert torch.count_nonzero(mem.read(torch.randn(2, 3, 16), A, z)) == 0


def _one_hot_keys(n: int, size: int) -> torch.Tensor:
    return torch.eye(size)[:n].unsqueeze(0)  # [1, n, size], orthogonal


def test_delta_rule_recalls_orthogonal_keys_exactly():
    k = _one_hot_keys(4, 8)
    v = torch.randn(1, 4, 5)
    beta = torch.ones(1, 4)
    A, z = memory_write(k, v, beta, torch.zeros(1, 8, 5), torch.zeros(1, 8), first=True)
    assert torch.allclose(memory_read(k, A, z), v, atol=1e-4)


def test_delta_rule_overwritten_key_returns_new_value():
    k = _one_hot_keys(2, 8)
    v_old, v_new = torch.randn(1, 2, 5), torch.randn(1, 2, 5)
    beta = torch.ones(1, 2)
    A, z = memory_write(k, v_old, beta, torch.zeros(1, 8, 5), torch.zeros(1, 8), first=True)
    A, z = memory_write(k[:, :1], v_new[:, :1], beta[:, :1], A, z, first=False)
    recalled = memory_read(k, A, z)
    assert torch.allclose(recalled[:, 0], v_new[:, 0], atol=1e-4)  # overwritten
    assert torch.allclose(recalled[:, 1], v_old[:, 1], atol=1e-4)  # untouched


def test_fresh_memory_has_zero_value_projection():
    mem = AssociativeMemory(16, d_mem=4)
    assert torch.count_nonzero(mem.W_V.weight) == 0
    A, z = mem.empty_state()
    A, z = mem.write(torch.randn(1, 3, 16), A, z, first=True)
    assert torch.count_nonzero(A) == 0  # an untrained memory stores nothing readable
    assert torch.count_nonzero(mem.read(torch.randn(1, 2, 16), A, z)) == 0
