"""SWAX: sliding-window softmax attention alternating 1:1 with a recurrent layer (mLSTM or Gated DeltaNet).

The equations are REFERENCE.md section 2. Every layer has two forms that give the same outputs:

- chunkwise (`mlstm_chunkwise`, `gdn_chunkwise`, blocked window attention): the training form, and
  the form a multi-token `SwaxModel.step` uses; with one chunk as long as the sequence it is the
  fully parallel form;
- recurrent (`mlstm_recurrent`, `gdn_recurrent`, a key/value ring of the last W - 1 tokens): one
  token at a time from a fixed-size state.

`SwaxModel.step(input_ids [B, S], state) -> (state', logits | None)` follows the ARMT contract: the
state's shapes never depend on how many tokens were read (per attention layer the keys and values
of the last W - 1 tokens, per mLSTM layer C [B, H, dk, dv], n [B, H, dk], m [B, H], per Gated
DeltaNet layer S [B, H, dk, dv], and the position: how many tokens were read, which RoPE needs).

The window of the attention layers is a forward argument, so that training can change it per batch
(`WindowSchedule`); inference uses `SwaxConfig.window`, which sizes the state.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# The stabiliser of an mLSTM that has read nothing: -inf in the equations, a finite number here so
# that state files and exported graphs hold no infinities. exp(M_EMPTY + anything finite) == 0.
M_EMPTY = -1.0e30
EPS = 1e-6
POSITION = "position"  # the state tensor holding how many tokens were read
RECURRENT_KINDS = ("mlstm", "gdn")


@dataclass(frozen=True)
class SwaxConfig:
    """A SWAX decoder. Layers 0, 2, 4, ... are sliding-window attention, 1, 3, 5, ... recurrent."""

    vocab_size: int = 256  # bytes
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    mlp_hidden: int = 0  # 0: 8/3 d_model rounded to a multiple of 16
    window: int = 16  # the inference window (training may pass another per batch)
    recurrent: str = "mlstm"  # or "gdn"
    chunk: int = 64
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        if self.n_layers % 2:
            raise ValueError("n_layers must be even (attention and recurrent layers alternate 1:1)")
        if self.d_model % self.n_heads:
            raise ValueError("d_model must be a multiple of n_heads")
        if self.recurrent not in RECURRENT_KINDS:
            raise ValueError(f"recurrent must be one of {RECURRENT_KINDS}")
        if self.window < 1:
            raise ValueError("window must be >= 1")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def hidden(self) -> int:
        return self.mlp_hidden or 16 * round(self.d_model * 8 / 3 / 16)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SwaxConfig:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class SwaxState:
    """The fixed-size state of a SWAX model after `tokens` tokens: flat named tensors.

    `writes` counts the `step` calls that made it (the segments of an ingest), as
    `MemoryState.writes` does. `named_tensors()` adds the position as `position` [1] (int64), so
    that a saved or exported state is whole: the names and shapes are what the library stores and
    what an ONNX step graph takes and returns.
    """

    tensors: dict[str, Tensor] = field(default_factory=dict)
    tokens: int = 0
    writes: int = 0

    def named_tensors(self) -> dict[str, Tensor]:
        device = next(iter(self.tensors.values())).device if self.tensors else None
        position = torch.tensor([self.tokens], dtype=torch.long, device=device)
        return {**self.tensors, POSITION: position}

    @classmethod
    def from_named_tensors(cls, tensors: dict[str, Tensor], writes: int) -> SwaxState:
        """The inverse of `named_tensors` (ValueError when the position is not one count >= 0)."""
        position = tensors.get(POSITION)
        if position is None or position.dtype != torch.long or position.shape != (1,) or int(position) < 0:
            raise ValueError("a SWAX state needs its position: one int64 count >= 0")
        rest = {k: v for k, v in tensors.items() if k != POSITION}
        return cls(rest, int(position), writes)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.named_tensors().values())

    def layer(self, index: int) -> dict[str, Tensor]:
        prefix = f"layers.{index}."
        return {k[len(prefix) :]: v for k, v in self.tensors.items() if k.startswith(prefix)}


# ----- the recurrent equations: chunkwise and step by step -----


def mlstm_recurrent(
    q: Tensor, k: Tensor, v: Tensor, i_pre: Tensor, f_pre: Tensor, state: tuple[Tensor, Tensor, Tensor]
) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
    """The stabilised mLSTM, one token at a time (REFERENCE.md section 2).

    q, k [B, H, T, dk], v [B, H, T, dv], i_pre, f_pre [B, H, T] (gate pre-activations);
    state = (C [B, H, dk, dv], n [B, H, dk], m [B, H]) -> (h [B, H, T, dv], state').
    """
    C, n, m = state
    scale = k.shape[-1] ** -0.5
    out = []
    for t in range(q.shape[2]):
        qt, kt, vt = q[:, :, t], k[:, :, t] * scale, v[:, :, t]
        logf = F.logsigmoid(f_pre[:, :, t])
        m_new = torch.maximum(logf + m, i_pre[:, :, t])
        fp = torch.exp(logf + m - m_new)
        ip = torch.exp(i_pre[:, :, t] - m_new)
        C = fp[..., None, None] * C + ip[..., None, None] * kt[..., :, None] * vt[..., None, :]
        n = fp[..., None] * n + ip[..., None] * kt
        num = (qt[..., :, None] * C).sum(-2)
        den = torch.maximum((n * qt).sum(-1).abs(), torch.exp(-m_new))
        out.append(num / (den[..., None] + EPS))
        m = m_new
    return torch.stack(out, dim=2), (C, n, m)


def mlstm_chunkwise(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    i_pre: Tensor,
    f_pre: Tensor,
    state: tuple[Tensor, Tensor, Tensor],
    chunk: int = 64,
) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
    """The same mLSTM, parallel inside chunks of `chunk` tokens, recurrent across chunks.

    Shapes as `mlstm_recurrent`. Inside a chunk, with b_t the cumulated log forget gates,
    D_ts = b_t - b_s + i_s (s <= t) and m_t = max(b_t + m_prev, max_s D_ts), which is the
    recurrent stabiliser unrolled.
    """
    C, n, m = state
    T = q.shape[2]
    k = k * k.shape[-1] ** -0.5
    out = []
    for a in range(0, T, chunk):
        qc, kc, vc = q[:, :, a : a + chunk], k[:, :, a : a + chunk], v[:, :, a : a + chunk]
        ic = i_pre[:, :, a : a + chunk]
        c = qc.shape[2]
        b = F.logsigmoid(f_pre[:, :, a : a + chunk]).cumsum(-1)  # [B, H, c]
        causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
        D = (b[..., :, None] - b[..., None, :] + ic[..., None, :]).masked_fill(~causal, -math.inf)
        inter = b + m[..., None]  # [B, H, c]
        m_t = torch.maximum(inter, D.amax(-1))
        w = torch.exp(D - m_t[..., None])  # [B, H, c, c]
        g = torch.exp(inter - m_t)  # [B, H, c]
        s = (qc @ kc.transpose(-1, -2)) * w
        num = g[..., None] * (qc @ C) + s @ vc
        den = g * (qc @ n[..., None])[..., 0] + s.sum(-1)
        out.append(num / (torch.maximum(den.abs(), torch.exp(-m_t))[..., None] + EPS))
        m_new = m_t[..., -1]
        decay = torch.exp(b[..., -1:] - b + ic - m_new[..., None])  # [B, H, c]
        g_end = torch.exp(b[..., -1] + m - m_new)
        kd = kc * decay[..., None]
        C = g_end[..., None, None] * C + kd.transpose(-1, -2) @ vc
        n = g_end[..., None] * n + kd.sum(-2)
        m = m_new
    return torch.cat(out, dim=2), (C, n, m)


def gdn_recurrent(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, S: Tensor
) -> tuple[Tensor, Tensor]:
    """Gated DeltaNet, one token at a time (REFERENCE.md section 2).

    q, k [B, H, T, dk], v [B, H, T, dv], g [B, H, T] (log decay, <= 0), beta [B, H, T] in (0, 1);
    S [B, H, dk, dv] -> (o [B, H, T, dv], S').
    """
    scale = q.shape[-1] ** -0.5
    out = []
    for t in range(q.shape[2]):
        kt, qt = k[:, :, t], q[:, :, t]
        S = torch.exp(g[:, :, t])[..., None, None] * S
        vp = beta[:, :, t, None] * (v[:, :, t] - (kt[..., :, None] * S).sum(-2))
        S = S + kt[..., :, None] * vp[..., None, :]
        out.append((qt[..., :, None] * S).sum(-2) * scale)
    return torch.stack(out, dim=2), S


def gdn_chunkwise(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, S: Tensor, chunk: int = 64
) -> tuple[Tensor, Tensor]:
    """Gated DeltaNet, parallel inside chunks (a unit-triangular solve), recurrent across them.

    Shapes as `gdn_recurrent`. With G_t the cumulated log decays of the chunk, S_t = e^{G_t} S_0 +
    sum_{s<=t} e^{G_t - G_s} k_s u_s^T, where the u_s solve
    u_t + beta_t sum_{s<t} e^{G_t - G_s} (k_t . k_s) u_s = beta_t (v_t - e^{G_t} S_0^T k_t).
    """
    T = q.shape[2]
    scale = q.shape[-1] ** -0.5
    out = []
    for a in range(0, T, chunk):
        qc, kc, vc = q[:, :, a : a + chunk], k[:, :, a : a + chunk], v[:, :, a : a + chunk]
        bc = beta[:, :, a : a + chunk]
        c = qc.shape[2]
        G = g[:, :, a : a + chunk].cumsum(-1)  # [B, H, c]
        incl = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
        decay = torch.exp((G[..., :, None] - G[..., None, :]).masked_fill(~incl, -math.inf))  # [B, H, c, c]
        strict = (kc @ kc.transpose(-1, -2)) * decay * bc[..., None]
        strict = strict.masked_fill(~incl.tril(-1), 0.0)
        eye = torch.eye(c, dtype=q.dtype, device=q.device)
        eG = torch.exp(G)[..., None]
        rhs = bc[..., None] * (vc - eG * (kc @ S))
        U = torch.linalg.solve_triangular(eye + strict, rhs, upper=False, unitriangular=True)
        out.append((eG * (qc @ S) + ((qc @ kc.transpose(-1, -2)) * decay) @ U) * scale)
        to_end = torch.exp(G[..., -1:] - G)[..., None]  # [B, H, c, 1]
        S = torch.exp(G[..., -1])[..., None, None] * S + (kc * to_end).transpose(-1, -2) @ U
    return torch.cat(out, dim=2), S


# ----- sliding-window attention -----


def window_mask(q_pos: Tensor, k_pos: Tensor, window: int) -> Tensor:
    """[Tq, Tk] bool, True where query position t may see key position s: t - window < s <= t, s >= 0."""
    d = q_pos[:, None] - k_pos[None, :]
    return (d >= 0) & (d < window) & (k_pos[None, :] >= 0)


def window_attention(q: Tensor, k: Tensor, v: Tensor, q_start: int, k_start: int, window: int) -> Tensor:
    """Softmax attention of queries at positions q_start.. over keys at k_start.., each query seeing
    the `window` positions up to and including its own. Blocked: a query block only meets the keys
    its window can reach, so the cost is O(T (W + block)).

    q [B, H, Tq, d], k, v [B, H, Tk, d] -> [B, H, Tq, d]. Keys at negative positions are padding.
    """
    return _window_attention(q, k, v, q_start, q_start - k_start, window)


def _window_attention(
    q: Tensor, k: Tensor, v: Tensor, q_start: int | Tensor, offset: int, window: int
) -> Tensor:
    """`window_attention` with the keys starting `offset` positions before the queries: which keys a
    block meets depends on `offset` only, so `q_start` may be a 0-d tensor (an exported graph)."""
    Tq, Tk = q.shape[2], k.shape[2]
    block = max(64, window)
    out = []
    for a in range(0, Tq, block):
        b = min(Tq, a + block)
        lo = max(0, a - window + 1 + offset)
        hi = min(Tk, b + offset)
        q_pos = q_start + torch.arange(a, b, device=q.device)
        k_pos = q_start - offset + torch.arange(lo, hi, device=q.device)
        mask = window_mask(q_pos, k_pos, window)
        out.append(
            F.scaled_dot_product_attention(q[:, :, a:b], k[:, :, lo:hi], v[:, :, lo:hi], attn_mask=mask)
        )
    return torch.cat(out, dim=2)


def rope(x: Tensor, start: int | Tensor, base: float) -> Tensor:
    """Rotary position embedding (rotate-half) of x [B, H, T, d] at positions start..start+T-1
    (`start` an int, or a 0-d int64 tensor in an exported graph)."""
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    pos = start + torch.arange(x.shape[2], dtype=torch.float64, device=x.device)
    ang = pos[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _heads(x: Tensor, n_heads: int) -> Tensor:
    """[B, T, H * d] -> [B, H, T, d]"""
    B, T, _ = x.shape
    return x.view(B, T, n_heads, -1).transpose(1, 2)


def _merge(x: Tensor) -> Tensor:
    """[B, H, T, d] -> [B, T, H * d]"""
    B, H, T, d = x.shape
    return x.transpose(1, 2).reshape(B, T, H * d)


class SlidingWindowAttention(nn.Module):
    """Causal softmax attention over the last `window` positions, RoPE on queries and keys.

    State: `k`, `v` [B, H, W - 1, d], the rotated keys and values of the last W - 1 tokens (front
    padded while fewer were read)."""

    def __init__(self, config: SwaxConfig) -> None:
        super().__init__()
        self.config = config
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.out = nn.Linear(config.d_model, config.d_model, bias=False)

    def empty_state(self, batch: int, window: int, device: torch.device | None = None) -> dict[str, Tensor]:
        shape = (batch, self.config.n_heads, window - 1, self.config.d_head)
        dt = self.qkv.weight.dtype
        return {
            "k": torch.zeros(shape, device=device, dtype=dt),
            "v": torch.zeros(shape, device=device, dtype=dt),
        }

    def forward(
        self, x: Tensor, window: int, start: int | Tensor = 0, state: dict[str, Tensor] | None = None
    ) -> tuple[Tensor, dict[str, Tensor] | None]:
        """x [B, T, D] at positions start.. -> ([B, T, D], state' or None when no state was given)."""
        H = self.config.n_heads
        q, k, v = (_heads(t, H) for t in self.qkv(x).chunk(3, dim=-1))
        q, k = rope(q, start, self.config.rope_base), rope(k, start, self.config.rope_base)
        if state is None:
            y = window_attention(q, k, v, start, start, window)
            return self.out(_merge(y)), None
        keep = state["k"].shape[2]  # W - 1
        k_all, v_all = torch.cat([state["k"], k], dim=2), torch.cat([state["v"], v], dim=2)
        y = _window_attention(q, k_all, v_all, start, keep, window)
        new = {"k": k_all[:, :, k_all.shape[2] - keep :], "v": v_all[:, :, v_all.shape[2] - keep :]}
        return self.out(_merge(y)), new


class _RecurrentMixer(nn.Module):
    """What both recurrent mixers share: q, k, v and two gate pre-activations per head from x, and
    the output: per-head RMS norm, a sigmoid output gate, the output projection."""

    def __init__(self, config: SwaxConfig) -> None:
        super().__init__()
        self.config = config
        D, H = config.d_model, config.n_heads
        self.qkv = nn.Linear(D, 3 * D, bias=False)
        self.gates = nn.Linear(D, 2 * H)
        self.ogate = nn.Linear(D, D, bias=False)
        self.norm = RMSNorm(config.d_head)
        self.out = nn.Linear(D, D, bias=False)
        self.reset_gates()

    def reset_gates(self) -> None:
        raise NotImplementedError

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """x [B, T, D] -> q, k, v [B, H, T, d] and the two gate pre-activations [B, H, T]."""
        H = self.config.n_heads
        q, k, v = (_heads(t, H) for t in self.qkv(x).chunk(3, dim=-1))
        a, b = (t.transpose(1, 2) for t in self.gates(x).chunk(2, dim=-1))
        return q, k, v, a, b

    def _output(self, h: Tensor, x: Tensor) -> Tensor:
        """h [B, H, T, d], x [B, T, D] -> [B, T, D]"""
        return self.out(_merge(self.norm(h)) * torch.sigmoid(self.ogate(x)))


class MLSTMLayer(_RecurrentMixer):
    """mLSTM mixer: exponential input gate and sigmoid forget gate per head. State: C, n, m."""

    def reset_gates(self) -> None:
        H = self.config.n_heads
        with torch.no_grad():
            self.gates.weight.normal_(0.0, 0.02)
            self.gates.bias[:H].fill_(-3.0)
            self.gates.bias[H:] = torch.linspace(3.0, 6.0, H)  # long-lived memory at init

    def empty_state(self, batch: int, device: torch.device | None = None) -> dict[str, Tensor]:
        H, d, dt = self.config.n_heads, self.config.d_head, self.qkv.weight.dtype
        return {
            "C": torch.zeros(batch, H, d, d, device=device, dtype=dt),
            "n": torch.zeros(batch, H, d, device=device, dtype=dt),
            "m": torch.full((batch, H), M_EMPTY, device=device, dtype=dt),
        }

    def forward(
        self, x: Tensor, state: dict[str, Tensor] | None = None, recurrent: bool = False
    ) -> tuple[Tensor, dict[str, Tensor] | None]:
        """x [B, T, D] -> ([B, T, D], state'); chunkwise unless `recurrent`."""
        q, k, v, i_pre, f_pre = self._project(x)
        given = state is not None
        st = state if given else self.empty_state(x.shape[0], x.device)
        carry = (st["C"], st["n"], st["m"])
        if recurrent:
            h, (C, n, m) = mlstm_recurrent(q, k, v, i_pre, f_pre, carry)
        else:
            h, (C, n, m) = mlstm_chunkwise(q, k, v, i_pre, f_pre, carry, self.config.chunk)
        return self._output(h, x), ({"C": C, "n": n, "m": m} if given else None)


class GatedDeltaNetLayer(_RecurrentMixer):
    """Gated DeltaNet mixer: L2-normalised q, k, decay g = log sigmoid(.) and beta = sigmoid(.)
    per head. State: S."""

    def reset_gates(self) -> None:
        H = self.config.n_heads
        with torch.no_grad():
            self.gates.weight.normal_(0.0, 0.02)
            self.gates.bias[:H] = torch.linspace(3.0, 6.0, H)
            self.gates.bias[H:].zero_()

    def empty_state(self, batch: int, device: torch.device | None = None) -> dict[str, Tensor]:
        H, d, dt = self.config.n_heads, self.config.d_head, self.qkv.weight.dtype
        return {"S": torch.zeros(batch, H, d, d, device=device, dtype=dt)}

    def forward(
        self, x: Tensor, state: dict[str, Tensor] | None = None, recurrent: bool = False
    ) -> tuple[Tensor, dict[str, Tensor] | None]:
        """x [B, T, D] -> ([B, T, D], state'); chunkwise unless `recurrent`."""
        q, k, v, g_pre, b_pre = self._project(x)
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        g, beta = F.logsigmoid(g_pre), torch.sigmoid(b_pre)
        given = state is not None
        S0 = state["S"] if given else self.empty_state(x.shape[0], x.device)["S"]
        if recurrent:
            o, S = gdn_recurrent(q, k, v, g, beta, S0)
        else:
            o, S = gdn_chunkwise(q, k, v, g, beta, S0, self.config.chunk)
        return self._output(o, x), ({"S": S} if given else None)


class Block(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x)), then x + gated MLP(norm(x))."""

    def __init__(self, config: SwaxConfig, index: int) -> None:
        super().__init__()
        self.attention = index % 2 == 0
        if self.attention:
            self.mixer: nn.Module = SlidingWindowAttention(config)
        elif config.recurrent == "mlstm":
            self.mixer = MLSTMLayer(config)
        else:
            self.mixer = GatedDeltaNetLayer(config)
        self.norm1, self.norm2 = RMSNorm(config.d_model), RMSNorm(config.d_model)
        self.gate_up = nn.Linear(config.d_model, 2 * config.hidden, bias=False)
        self.down = nn.Linear(config.hidden, config.d_model, bias=False)

    def forward(
        self, x: Tensor, window: int, start: int, state: dict[str, Tensor] | None, recurrent: bool
    ) -> tuple[Tensor, dict[str, Tensor] | None]:
        h = self.norm1(x)
        if self.attention:
            y, state = self.mixer(h, window, start, state)
        else:
            y, state = self.mixer(h, state, recurrent)
        x = x + y
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up), state


class SwaxModel(nn.Module):
    """Byte-level (by default) SWAX decoder with tied input/output embeddings."""

    def __init__(self, config: SwaxConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.d_model)
        self.apply(self._init)
        for block in self.blocks:  # scaled residual projections
            nn.init.normal_(block.down.weight, 0.0, 0.02 / math.sqrt(2 * config.n_layers))
            nn.init.normal_(block.mixer.out.weight, 0.0, 0.02 / math.sqrt(2 * config.n_layers))
            if not block.attention:
                block.mixer.reset_gates()

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, 0.02)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def _logits(self, x: Tensor) -> Tensor:
        return self.norm(x) @ self.embed.weight.T

    def forward(self, input_ids: Tensor, window: int | None = None) -> Tensor:
        """input_ids [B, T] -> logits [B, T, V], from an empty state (the training form)."""
        w = window or self.config.window
        x = self.embed(input_ids)
        for block in self.blocks:
            x, _ = block(x, w, 0, None, False)
        return self._logits(x)

    def empty_state(self, batch: int = 1) -> SwaxState:
        device = self.embed.weight.device
        tensors: dict[str, Tensor] = {}
        for i, block in enumerate(self.blocks):
            if block.attention:
                st = block.mixer.empty_state(batch, self.config.window, device)
            else:
                st = block.mixer.empty_state(batch, device)
            tensors.update({f"layers.{i}.{k}": v for k, v in st.items()})
        return SwaxState(tensors, 0)

    def state_shapes(self, batch: int = 1) -> dict[str, tuple[int, ...]]:
        """Names and shapes of the state's tensors, the position included (`SwaxState.named_tensors`)."""
        return {name: tuple(t.shape) for name, t in self.empty_state(batch).named_tensors().items()}

    def step(
        self, input_ids: Tensor, state: SwaxState, return_logits: bool = False, recurrent: bool = False
    ) -> tuple[SwaxState, Tensor | None]:
        """Read S more tokens: input_ids [B, S] -> (state', logits [B, S, V] if asked).

        Uses the chunkwise form inside the segment (`recurrent=True`: token by token); either way
        the result equals `forward` on the whole stream with the inference window."""
        x = self.embed(input_ids)
        tensors: dict[str, Tensor] = {}
        for i, block in enumerate(self.blocks):
            x, st = block(x, self.config.window, state.tokens, state.layer(i), recurrent)
            assert st is not None
            tensors.update({f"layers.{i}.{k}": v for k, v in st.items()})
        new = SwaxState(tensors, state.tokens + input_ids.shape[1], state.writes + 1)
        return new, (self._logits(x) if return_logits else None)


# ----- stochastic window training -----


@dataclass(frozen=True)
class WindowSchedule:
    """The attention window of each training batch.

    `p` is the probability of the short window. p = 1: fixed short; p = 0: fixed long; in between:
    stochastic, with sampling switched off (long window) for the last `final_long` fraction of the
    steps, as SWAX does for its last 10%.
    """

    short: int
    long: int
    p: float
    total_steps: int
    final_long: float = 0.1

    @classmethod
    def fixed(cls, window: int, total_steps: int) -> WindowSchedule:
        return cls(window, window, 1.0, total_steps, 0.0)

    @property
    def stochastic(self) -> bool:
        return 0.0 < self.p < 1.0 and self.short != self.long

    @property
    def final_window(self) -> int:
        """The window the model ends its training with (and is evaluated with)."""
        return self.long if (self.stochastic or self.p == 0.0) else self.short

    def sampling_ends(self) -> int:
        """First step of the final long-window phase (total_steps when there is none)."""
        if not self.stochastic:
            return self.total_steps
        return self.total_steps - math.ceil(self.final_long * self.total_steps)

    def window(self, step: int, rng: random.Random) -> int:
        """The window of batch `step` (0-based); draws from `rng` only while sampling."""
        if self.p >= 1.0:
            return self.short
        if self.p <= 0.0:
            return self.long
        if step >= self.sampling_ends():
            return self.long
        return self.short if rng.random() < self.p else self.long
