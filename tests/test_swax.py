"""SWAX model: the chunkwise and recurrent forms agree, the window is exact, the state is fixed-size,
the window schedule keeps its probabilities and final-10% rule."""

import random

import pytest
import torch

from edgemem.swax import (
    M_EMPTY,
    SlidingWindowAttention,
    SwaxConfig,
    SwaxModel,
    WindowSchedule,
    gdn_chunkwise,
    gdn_recurrent,
    mlstm_chunkwise,
    mlstm_recurrent,
    window_attention,
    window_mask,
)

B, H, T, DK, DV = 2, 3, 37, 8, 6


def _mlstm_inputs(seed: int, started: bool):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    q, k, v = r(B, H, T, DK), r(B, H, T, DK), r(B, H, T, DV)
    i_pre, f_pre = 2 * r(B, H, T), 2 * r(B, H, T) + 2
    if started:  # a state that has already read something
        state = (r(B, H, DK, DV), r(B, H, DK), r(B, H))
    else:
        state = (torch.zeros(B, H, DK, DV, dtype=torch.float64), torch.zeros(B, H, DK, dtype=torch.float64),
                 torch.full((B, H), M_EMPTY, dtype=torch.float64))  # fmt: skip
    return q, k, v, i_pre, f_pre, state


@pytest.mark.parametrize("chunk", [1, 5, 16, T])
@pytest.mark.parametrize("started", [False, True])
def test_mlstm_chunkwise_equals_recurrent(chunk, started):
    """The chunkwise (training) form of the stabilised mLSTM gives the recurrence's outputs and
    final state (C, n, m), from an empty or a non-empty state, for any chunk size."""
    q, k, v, i_pre, f_pre, state = _mlstm_inputs(0, started)
    h_ref, st_ref = mlstm_recurrent(q, k, v, i_pre, f_pre, state)
    h, st = mlstm_chunkwise(q, k, v, i_pre, f_pre, state, chunk)
    torch.testing.assert_close(h, h_ref, rtol=1e-9, atol=1e-9)
    for a, b in zip(st, st_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def _gdn_inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    q = torch.nn.functional.normalize(r(B, H, T, DK), dim=-1)
    k = torch.nn.functional.normalize(r(B, H, T, DK), dim=-1)
    v = r(B, H, T, DV)
    decay = torch.nn.functional.logsigmoid(r(B, H, T) + 2)
    beta = torch.sigmoid(r(B, H, T))
    return q, k, v, decay, beta, r(B, H, DK, DV)


@pytest.mark.parametrize("chunk", [1, 5, 16, T])
def test_gated_deltanet_chunkwise_equals_recurrent(chunk):
    """The chunkwise Gated DeltaNet (triangular solve inside a chunk) gives the delta-rule
    recurrence's outputs and final state S, from a non-empty state, for any chunk size."""
    q, k, v, decay, beta, S0 = _gdn_inputs(1)
    o_ref, S_ref = gdn_recurrent(q, k, v, decay, beta, S0)
    o, S = gdn_chunkwise(q, k, v, decay, beta, S0, chunk)
    torch.testing.assert_close(o, o_ref, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(S, S_ref, rtol=1e-9, atol=1e-9)


def test_window_mask_is_exact():
    """Query t sees exactly the keys t-W+1..t: never one further back, never a future one."""
    pos = torch.arange(50)
    for w in (1, 4, 16):
        m = window_mask(pos, pos, w)
        for t in range(50):
            assert m[t].nonzero().flatten().tolist() == list(range(max(0, t - w + 1), t + 1))


@pytest.mark.parametrize("window", [1, 3, 16, 70])
def test_blocked_window_attention_equals_dense_masked(window):
    """The blocked attention (query blocks meet only reachable keys) equals dense softmax attention
    under the full [T, T] window mask."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 150, 8, generator=g) for _ in range(3))
    pos = torch.arange(150)
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=window_mask(pos, pos, window))
    torch.testing.assert_close(window_attention(q, k, v, 0, 0, window), dense, rtol=1e-5, atol=1e-6)


def test_attention_layer_never_sees_beyond_window():
    """Changing the input at position s changes the attention layer's outputs at s..s+W-1 and
    leaves every later position bit-identical."""
    torch.manual_seed(0)
    W, s = 8, 10
    layer = SlidingWindowAttention(SwaxConfig(d_model=16, n_heads=2, window=W)).double()
    x = torch.randn(1, 40, 16, dtype=torch.float64)
    y, _ = layer(x, W)
    x2 = x.clone()
    x2[0, s] += 1.0
    y2, _ = layer(x2, W)
    changed = (y2 - y).abs().amax(-1)[0]
    assert (changed[:s] == 0).all()
    assert (changed[s : s + W] > 0).all()
    assert (changed[s + W :] == 0).all()


@pytest.mark.parametrize("recurrent", ["mlstm", "gdn"])
def test_model_step_equals_forward(recurrent):
    """The inference path (step over segments of any sizes, chunkwise or token by token, from the
    fixed-size state) gives the same logits as the training forward on the whole sequence."""
    torch.manual_seed(0)
    cfg = SwaxConfig(vocab_size=50, d_model=16, n_layers=4, n_heads=2, window=5, recurrent=recurrent, chunk=8)
    model = SwaxModel(cfg).double().eval()
    ids = torch.randint(0, 50, (2, 41))
    with torch.no_grad():
        full = model(ids)
        for sizes, tokenwise in (([41], False), ([3, 1, 17, 20], False), ([1] * 41, False), ([41], True)):
            state, outs, a = model.empty_state(2), [], 0
            for n in sizes:
                state, logits = model.step(ids[:, a : a + n], state, return_logits=True, recurrent=tokenwise)
                outs.append(logits)
                a += n
            torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("recurrent", ["mlstm", "gdn"])
def test_state_size_does_not_depend_on_length(recurrent):
    """The state after 3 tokens and after 300 tokens has the same names, shapes and bytes."""
    cfg = SwaxConfig(vocab_size=50, d_model=16, n_layers=2, n_heads=2, window=6, recurrent=recurrent)
    model = SwaxModel(cfg).eval()
    with torch.no_grad():
        short, _ = model.step(torch.randint(0, 50, (1, 3)), model.empty_state())
        long, _ = model.step(torch.randint(0, 50, (1, 300)), model.empty_state())
    shapes = {k: tuple(v.shape) for k, v in short.named_tensors().items()}
    assert shapes == {k: tuple(v.shape) for k, v in long.named_tensors().items()} == model.state_shapes()
    assert short.nbytes() == long.nbytes()
    assert long.tokens == 300


def test_schedule_probabilities_and_final_ten_percent():
    """Stochastic schedule: the short window with probability p while sampling, only the long window
    in the last 10% of steps; the fixed schedules never change."""
    for p in (0.5, 0.75):
        sched = WindowSchedule(16, 128, p, total_steps=20000)
        rng = random.Random(0)
        windows = [sched.window(s, rng) for s in range(20000)]
        assert sched.sampling_ends() == 18000
        assert set(windows[18000:]) == {128}
        share = sum(w == 16 for w in windows[:18000]) / 18000
        assert abs(share - p) < 0.015  # ~4 standard deviations
        assert sched.final_window == 128
    rng = random.Random(0)
    assert {WindowSchedule.fixed(16, 100).window(s, rng) for s in range(100)} == {16}
    assert {WindowSchedule(16, 128, 0.0, 100).window(s, rng) for s in range(100)} == {128}
    assert WindowSchedule.fixed(16, 100).final_window == 16


def test_config_rejects_odd_layers_and_unknown_kind():
    """Attention and recurrent layers alternate 1:1, so an odd layer count is refused."""
    with pytest.raises(ValueError):
        SwaxConfig(n_layers=3)
    with pytest.raises(ValueError):
        SwaxConfig(recurrent="lstm")
    assert SwaxConfig.from_json(SwaxConfig(recurrent="gdn").to_json()) == SwaxConfig(recurrent="gdn")
