"""Training a SWAX model: byte data, niah-style retrieval items, the loop, checkpoints, logs.

Files go through the project's helpers (`edgemem.files`: atomic writes, the one safetensors reader).
Three things stay apart from the project trainer (edgemem/train.py) on purpose:
- `cosine_lr` is `train.learning_rate`'s formula (warm-up, cosine to 10%) written with other
  floating-point operations: the two differ in the last bit at 160 of the reproduction's 500 steps,
  and the reproduction in docs/RESULTS.md was trained with this one, so switching would stop
  `scripts/swax_repro.py run` from regenerating its numbers exactly; `step_rng` likewise draws the
  windows the reproduction was trained with;
- the checkpoint also holds the data generator's state, the optimizer's parameter groups and the
  SWAX configuration (`swax_config`, which marks a SWAX checkpoint for `edgemem ask --model`), which
  `train.save_checkpoint` (ARMT's trainable parameters, torch RNG, step) does not carry;
- `append_jsonl` / `read_jsonl`: the trainer's log helpers are private to it and split records
  by their evaluation fields.

Data is bytes (vocabulary 256): `ByteStream` samples fixed-length windows of real text;
`niah_sequence` hides a needle " magic <key>=<digits>. " in a haystack at a given depth and ends
the sequence with the query "\\nmagic <key>=" and the digits, the answer.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor

from edgemem.files import atomic_write, read_safetensors
from edgemem.swax import SwaxConfig, SwaxModel, WindowSchedule

# ----- generic helpers -----


def cosine_lr(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warm-up to `peak` over `warmup` steps, then cosine down to `floor * peak` at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def save_checkpoint(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    rng: dict[str, Tensor],
    meta: dict[str, str],
) -> None:
    """model weights ('model.*'), optimizer state ('optim.<param>.<key>'), RNG states ('rng.*') and
    string metadata (step, optimizer hyper-parameters) in one safetensors file, written atomically."""
    tensors = {f"model.{k}": v.detach().contiguous() for k, v in model.state_dict().items()}
    sd = optimizer.state_dict()
    for index, state in sd["state"].items():
        for key, value in state.items():
            tensors[f"optim.{index}.{key}"] = torch.as_tensor(value).detach().clone().contiguous()
    tensors.update({f"rng.{k}": v.contiguous() for k, v in rng.items()})
    metadata = {**meta, "step": str(step), "param_groups": json.dumps(sd["param_groups"])}
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> tuple[int, dict[str, Tensor], dict[str, str]]:
    """Restore what `save_checkpoint` wrote -> (step, rng tensors, metadata). An unreadable file
    is one EdgememError."""
    meta, tensors = read_safetensors(path, "SWAX checkpoint")
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    if optimizer is not None:
        state: dict[int, dict[str, Tensor]] = {}
        for name, value in tensors.items():
            if name.startswith("optim."):
                _, index, key = name.split(".", 2)
                state.setdefault(int(index), {})[key] = value
        optimizer.load_state_dict({"state": state, "param_groups": json.loads(meta["param_groups"])})
    rng = {k[4:]: v for k, v in tensors.items() if k.startswith("rng.")}
    return int(meta.get("step", 0)), rng, meta


def append_jsonl(path: Path, record: dict) -> None:
    """One JSON line, flushed and fsynced (a crash loses at most the line being written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ----- byte data -----


class ByteStream:
    """Real text as one uint8 tensor; windows drawn at random offsets with a torch.Generator."""

    def __init__(self, texts: list[str]) -> None:
        data = "\n\n".join(texts).encode("utf-8")
        if len(data) < 2:
            raise ValueError("no text")
        self.data = torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def __len__(self) -> int:
        return self.data.numel()

    def window(self, length: int, gen: torch.Generator) -> bytes:
        start = int(torch.randint(0, len(self) - length, (1,), generator=gen))
        return bytes(self.data[start : start + length].tolist())


NEEDLE = " magic {key}={value}. "
QUERY = "\nmagic {key}="
KEY_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def needle_key_value(gen: torch.Generator, key_len: int = 4, digits: int = 4) -> tuple[str, str]:
    key = "".join(KEY_LETTERS[int(i)] for i in torch.randint(0, 26, (key_len,), generator=gen))
    value = str(int(torch.randint(10 ** (digits - 1), 10**digits, (1,), generator=gen)))
    return key, value


def niah_sequence(haystack: bytes, key: str, value: str, depth: float) -> tuple[bytes, int, int]:
    """haystack (any length) -> (sequence, needle offset, answer offset): the needle is inserted at
    `depth` (0..1) of the haystack, then the query, then the answer digits end the sequence.
    len(sequence) == len(haystack) + len(needle) + len(query) + len(value)."""
    needle = NEEDLE.format(key=key, value=value).encode()
    query = QUERY.format(key=key).encode()
    at = round(depth * len(haystack))
    seq = haystack[:at] + needle + haystack[at:] + query + value.encode()
    return seq, at, len(seq) - len(value)


def niah_overhead(key_len: int = 4, digits: int = 4) -> int:
    k, v = "k" * key_len, "1" * digits
    return len(NEEDLE.format(key=k, value=v)) + len(QUERY.format(key=k)) + digits


@dataclass(frozen=True)
class Batch:
    """inputs, targets [B, T] (byte ids); answer_mask [B, T] True at the targets that are answer digits."""

    inputs: Tensor
    targets: Tensor
    answer_mask: Tensor


def make_batch(
    stream: ByteStream, batch: int, length: int, needle_frac: float, gen: torch.Generator
) -> Batch:
    """`batch` sequences of `length` + 1 bytes: a `needle_frac` share are niah items with the needle
    at a uniform depth, the others plain text."""
    rows, masks = [], []
    over = niah_overhead()
    if needle_frac > 0 and length + 1 - over < 1:
        raise ValueError(f"niah items need length > {over}")
    for _ in range(batch):
        mask = torch.zeros(length, dtype=torch.bool)
        if float(torch.rand((), generator=gen)) < needle_frac:
            key, value = needle_key_value(gen)
            depth = float(torch.rand((), generator=gen))
            seq, _, ans = niah_sequence(stream.window(length + 1 - over, gen), key, value, depth)
            mask[ans - 1 :] = True  # target t is byte t + 1
        else:
            seq = stream.window(length + 1, gen)
        rows.append(torch.tensor(list(seq), dtype=torch.long))
        masks.append(mask)
    ids = torch.stack(rows)
    return Batch(ids[:, :-1], ids[:, 1:], torch.stack(masks))


def batch_loss(
    model: SwaxModel, batch: Batch, window: int, answer_weight: float
) -> tuple[Tensor, dict[str, float]]:
    """Mean next-byte cross-entropy, plus `answer_weight` times the mean over answer digits."""
    logits = model(batch.inputs, window)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch.targets.reshape(-1), reduction="none")
    ce = ce.view_as(batch.targets.float())
    lm = ce.mean()
    loss = lm
    stats = {"lm": lm.item()}
    if batch.answer_mask.any():
        ans = ce[batch.answer_mask].mean()
        loss = loss + answer_weight * ans
        stats["answer"] = ans.item()
    return loss, stats


# ----- the loop -----


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 600
    batch: int = 8
    length: int = 256
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.1
    clip: float = 1.0
    needle_frac: float = 0.5
    answer_weight: float = 1.0
    seed: int = 0
    checkpoint_every: int = 100
    log_every: int = 20

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def train(
    model: SwaxModel,
    stream: ByteStream,
    schedule: WindowSchedule,
    config: TrainConfig,
    workdir: Path | None = None,
    log: Callable[[dict], None] | None = None,
    stop_at: int | None = None,
) -> list[dict]:
    """Train `model` for `config.steps` steps with the windows of `schedule`; resumable.

    With `workdir`: `ckpt.safetensors` every `checkpoint_every` steps and at the end (a run started
    again continues from it with the same data, windows and optimizer state) and `log.jsonl`.
    `stop_at` ends the call after that step (saving), as an interruption would. Returns the log
    records of this call.
    """
    gen = torch.Generator().manual_seed(config.seed)
    opt = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.95)
    )
    step, before = 0, 0.0  # seconds trained by earlier calls
    ckpt = workdir / "ckpt.safetensors" if workdir else None
    if ckpt is not None and ckpt.is_file():
        step, rng, meta = load_checkpoint(ckpt, model, opt)
        gen.set_state(rng["data"])
        torch.set_rng_state(rng["torch"])
        before = float(meta.get("elapsed_s", 0.0))
    records: list[dict] = []
    started = time.perf_counter()

    def save() -> None:
        if ckpt is None:
            return
        rng = {"data": gen.get_state(), "torch": torch.get_rng_state()}
        meta = {"swax_config": model.config.to_json(), "train_config": config.to_json()}
        meta["elapsed_s"] = f"{before + time.perf_counter() - started:.2f}"
        save_checkpoint(ckpt, model, opt, step, rng, meta)

    model.train()
    while step < config.steps:
        window = schedule.window(step, step_rng(config.seed, step))
        lr = cosine_lr(step, config.steps, config.lr, config.warmup)
        for group in opt.param_groups:
            group["lr"] = lr
        batch = make_batch(stream, config.batch, config.length, config.needle_frac, gen)
        loss, stats = batch_loss(model, batch, window, config.answer_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip)
        opt.step()
        step += 1
        if step % config.log_every == 0 or step == config.steps:
            rec = {
                "step": step,
                "window": window,
                "lr": lr,
                "loss": loss.item(),
                "grad_norm": float(norm),
                **stats,
            }
            rec["elapsed_s"] = round(before + time.perf_counter() - started, 2)  # training time, all calls
            records.append(rec)
            if workdir is not None:
                append_jsonl(workdir / "log.jsonl", rec)
            if log is not None:
                log(rec)
        if step % config.checkpoint_every == 0 or step == config.steps or step == stop_at:
            save()
        if step == stop_at:
            break
    model.eval()
    return records


def step_rng(seed: int, step: int) -> random.Random:
    """The window draw of one step depends on (seed, step) only, so a resumed run draws the same."""
    return random.Random(seed * 1_000_003 + step)


# ----- evaluation -----


@torch.no_grad()
def answer_scores(
    model: SwaxModel, seqs: list[bytes], answer_at: list[int], window: int
) -> list[tuple[bool, float]]:
    """Per sequence: (whole answer right, share of answer bytes right). With teacher forcing the
    argmax at every answer position is checked against the gold byte: all right is exactly greedy
    decoding getting the whole answer. Sequences of one call must have equal lengths."""
    ids = torch.tensor([list(s) for s in seqs], dtype=torch.long)
    pred = model(ids[:, :-1], window).argmax(-1)
    out = []
    for row, at in enumerate(answer_at):
        hits = pred[row, at - 1 :] == ids[row, at:]
        out.append((bool(hits.all()), float(hits.float().mean())))
    return out


@torch.no_grad()
def bits_per_byte(model: SwaxModel, texts: list[bytes], window: int, batch: int = 16) -> float:
    """Mean next-byte cross-entropy in bits over equal-length byte strings."""
    total, count = 0.0, 0
    for a in range(0, len(texts), batch):
        ids = torch.tensor([list(t) for t in texts[a : a + batch]], dtype=torch.long)
        logits = model(ids[:, :-1], window)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum")
        total += float(ce)
        count += ids[:, 1:].numel()
    return total / count / math.log(2)


def new_model(config: SwaxConfig, seed: int) -> SwaxModel:
    torch.manual_seed(seed)
    return SwaxModel(config)
