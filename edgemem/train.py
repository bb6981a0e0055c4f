"""Training the memory: the ARMT recipe as stages, resumable, on one process or several (DDP).

A run is a folder: `config.toml` (a copy of what it was started with), `checkpoint.safetensors`
(trainable parameters, AdamW state, step and the torch RNG: resumed exactly), `adapter.safetensors`
(the memory adapter at the last checkpoint, what `--adapter` loads), `log.jsonl` (one line per
step, one per evaluation) and `curves.png` (`edgemem train --plot --out RUN`). A step taken in
micro-batches also leaves `partial.safetensors` after each of them but the last (the summed
gradients so far): a run killed mid-step resumes after its last finished micro-batch.

Stages run in order. Each stage has its own task, segment length, number of written segments
(sampled per batch from a list: the curriculum), learning rate with linear warm-up and cosine
annealing, and optionally a stochastic segment length (short with probability p, long for the
last 10% of the stage's steps). Tasks:

- `lm`: continued pretraining on long real text; LM loss on every segment after the first.
- `recall`: needles ("One of the special magic numbers for <key> is: <7 digits>.") in real prose,
  written into memory; the question and the answer prefix come in the read-only answer segment
  after the document's tail, exactly as `edgemem ask` and the `niah` evaluation build it; loss on
  the answer only.
- `vt`, `docqa`, `types`: the evaluation's other tasks (`edgemem.data.tasks`), drawn from the
  train split: the item's context is cut into the written segments and its tail, the question
  and answer prefix follow as in the evaluation, loss on the gold answer.
- `mix`: each item of a batch draws one of the stage's `mix` tasks (recall, vt, docqa, types).
- `tokens`: a synthetic key/value recall over raw token ids, for tiny models in tests.

A run may start from another run's adapter (`init`): a later recipe continues an earlier one.

What a step samples is a pure function of (seed, step): a resumed run sees the same batches, and
every DDP rank builds the same global batch and takes its share.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save
from torch import Tensor

from edgemem.armt import (
    ARMT,
    ARMTConfig,
    MemoryState,
    answer_window_problem,
    prompt_ids,
    read_adapter,
    save_adapter,
    stop_token_ids,
)
from edgemem.data.tasks import (
    NIAH_NEEDLE,
    NIAH_PREFIX,
    NIAH_QUESTION,
    PROSE,
    Builder,
    Item,
    random_key,
    random_number,
)
from edgemem.errors import EdgememError
from edgemem.evaluate import peak_rss_mb
from edgemem.files import (
    atomic_write_bytes,
    atomic_write_text,
    lock_exclusively,
    read_safetensors,
    require_file,
)
from edgemem.models import cpu_model

CHECKPOINT_FORMAT = "edgemem-train/1"
PARTIAL_FORMAT = "edgemem-train-partial/1"
TASKS = ("lm", "recall", "vt", "docqa", "types", "mix", "tokens")
ITEM_TASKS = ("vt", "docqa", "types")  # built by the evaluation's generators on the train split
MIX_TASKS = ("recall", *ITEM_TASKS)
NEEDLE_SEGMENTS = ("first", "last", "any", "late")
FINAL_FRACTION = 0.1  # the last 10% of a stage's steps use its long segment length only


# ----- configuration -----


@dataclass(frozen=True)
class Stage:
    """One stage of the recipe.

    segments: number of written segments, one sampled per batch (the curriculum inside a stage).
      0 (recall, vt, docqa, types, mix): nothing is written and the memory is empty, as an answer
      window over a document shorter than the window has it: the whole item is in view (a recall
      item's asked needle in its tail, without distractors; a vt/docqa/types item whole).
    needle: where the needle sits in its segment ("end": its last tokens; "random").
    needle_segment: which written segment holds it ("first", "last", "any", or "late": one of the
      last `late` segments, written into a memory that has taken in the whole stream before it).
    late: with needle_segment "late", how many of the last written segments may hold a needle.
    p_tail: prose recall only (`ProseTasks`): the probability that the asked needle sits instead
      in the unwritten tail next to the question, where it is read by attention, not from memory
      (the evaluation puts it there whenever its depth falls past the last full segment).
    tail: the document's unwritten tail before the question has 1..tail tokens (0: 1..S).
    p_view: vt/docqa/types items only: the probability that the whole item sits in the unwritten
      tail (tail // 4..tail tokens of it), after written segments of other prose, as an answer
      window shows a document's end (`ARMTConfig.answer_window`): the answer is copied from view,
      with a memory full of something else.
    view: what the written segments of a `p_view` docqa item hold: "other" prose, or the "same"
      document's first part (the item is redrawn until its evidence paragraph sits in the tail),
      as an answer window over a long document has it.
    keys: needles per document; the others are distractors with other keys.
    distractor_segment: which written segment holds each distractor (the needle_segment choices;
      "" places them as the asked needle). "any" with a "late" needle spreads other keys' numbers
      over the whole stream written before the asked one, as a long haystack's own numbers are.
    digits: how many digits each needle's number has (the evaluation's niah uses 7).
    haystack_numbers: prose recall only: numbers (1-7 random digits, after a space) written over
      the prose of the written segments, this many per 1,000 of its tokens, never over a needle.
      A needle's first digit at 64k is lost to the haystack's own digit tokens: the answer comes
      back with their writes taken out of the memory (docs/RESULTS.md, "Forty-third session"), and
      a 16k-32k training stream holds fewer of them than a 64k haystack.
    lead_weight: prose recall only: the loss weight of the answer's first digit, against 1 for
      every other answer token. The first digit is the one memory must bring back with nothing of
      the number before it (each later digit follows the needle's digits before it); past the
      trained stream lengths it is the one the answers lose, written as one digit whatever the
      gold one.
    short_segment_len / p_short: stochastic segment length (0: fixed at segment_len).
    bptt: back-propagate through the last K written segments only (0: all of them): the state
      is cut from the graph before each earlier segment, so the last K segments' reads and the
      last K + 1 segments' writes get a gradient.
    write_grad: with bptt, the writes of the segments before those still back-propagate into their
      memory projections (W_K, W_V, W_b): the state keeps them in the graph, computed from the
      layer outputs taken as constants, so the backbone runs those segments without a graph.
      Without it nothing written earlier gets a gradient, and a long haystack's writes (its digit
      tokens at 64k, docs/RESULTS.md "Forty-third session") cannot learn to stay small.
    mix: with task = "mix", the tasks each item of a batch draws from (uniformly).
    """

    name: str
    task: str
    steps: int
    segment_len: int
    segments: tuple[int, ...] = (1,)
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int = 10
    batch_size: int = 4
    needle: str = "random"
    needle_segment: str = "any"
    late: int = 8
    p_tail: float = 0.0
    tail: int = 0
    p_view: float = 0.0
    view: str = "other"
    keys: int = 1
    distractor_segment: str = ""
    digits: int = 7
    haystack_numbers: float = 0.0
    lead_weight: float = 1.0
    short_segment_len: int = 0
    p_short: float = 0.5
    bptt: int = 0
    write_grad: bool = False
    checkpointing: bool = False
    mix: tuple[str, ...] = MIX_TASKS

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise EdgememError(f"stage {self.name!r}: unknown task {self.task!r} (choose from {TASKS})")
        if self.steps < 0 or self.segment_len < 1 or not self.segments or min(self.segments) < 0:
            raise EdgememError(f"stage {self.name!r}: steps and segment_len must be positive, segments >= 0")
        if self.task == "tokens" and min(self.segments) < 1:
            raise EdgememError(f"stage {self.name!r}: the tokens task needs at least 1 segment")
        if not self.mix or any(t not in MIX_TASKS for t in self.mix):
            raise EdgememError(f"stage {self.name!r}: mix draws from {', '.join(MIX_TASKS)}")
        if self.task == "lm" and min(self.segments) < 2:
            raise EdgememError(f"stage {self.name!r}: the lm task needs at least 2 segments")
        if self.needle not in ("end", "random") or self.needle_segment not in NEEDLE_SEGMENTS:
            raise EdgememError(
                f"stage {self.name!r}: needle is end|random, needle_segment {'|'.join(NEEDLE_SEGMENTS)}"
            )
        if self.distractor_segment not in ("", *NEEDLE_SEGMENTS):
            raise EdgememError(
                f"stage {self.name!r}: distractor_segment is {'|'.join(NEEDLE_SEGMENTS)} "
                "(or empty: placed as needle_segment)"
            )
        if self.late < 1:
            raise EdgememError(f"stage {self.name!r}: late must be at least 1 segment")
        if not 1 <= self.digits <= 12:
            raise EdgememError(f"stage {self.name!r}: digits must lie in 1..12")
        if not 0 <= self.haystack_numbers <= 100:
            raise EdgememError(f"stage {self.name!r}: haystack_numbers must lie in [0, 100] per 1,000 tokens")
        if self.lead_weight <= 0:
            raise EdgememError(f"stage {self.name!r}: lead_weight must be positive")
        if self.view not in ("other", "same"):
            raise EdgememError(f"stage {self.name!r}: view is other|same, not {self.view!r}")
        if not 0 <= self.p_short <= 1 or not 0 <= self.p_tail <= 1 or not 0 <= self.p_view <= 1:
            raise EdgememError(f"stage {self.name!r}: p_short, p_tail and p_view must lie in [0, 1]")
        if self.write_grad and (self.bptt < 1 or self.task == "lm"):
            raise EdgememError(
                f"stage {self.name!r}: write_grad needs bptt (the segments before the last K) and a "
                "task scored on its answer, not lm"
            )


@dataclass(frozen=True)
class TrainConfig:
    """A whole run: the model, the memory, the stages, and how often to save and evaluate."""

    model: str
    stages: tuple[Stage, ...]
    memory_layers: tuple[int, ...] = ()  # empty: the default ~20% of the layers
    backbone: str = "frozen"  # "frozen": the memory trains; "lora": and low-rank adapters; "full": all
    lora_rank: int = 16  # with backbone = "lora"
    lora_alpha: float = 16.0
    norm_inputs: bool = False  # the memory sees the layer's input RMSNorm of h (ARMTConfig.norm_inputs)
    write_source: str = "write_tokens"  # or "segment": every token of a segment writes (ARMTConfig)
    read_gate: bool = False  # a per-token gate on each memory read (ARMTConfig.read_gate); an
    # ungated `init` adapter gets it open
    memory_lr_scale: float = 1.0  # the memory and write embeddings step at this multiple of the lr
    gate_lr_scale: float = 1.0  # the read gates (read_gate) step at this multiple of the lr
    # the write gates (each memory's W_b: beta, how much a row writes) step at this multiple of
    # the memory's rate (lr x memory_lr_scale)
    write_gate_lr_scale: float = 1.0
    num_write_tokens: int = 16
    d_mem: int = 64
    seed: int = 0
    # the held-out items' seed (None: `seed`): replicates of a run under other seeds then differ
    # only in what they train on, and are evaluated on the same items
    eval_seed: int | None = None
    threads: int = 0  # 0: leave torch's default
    # processes that build the next batches while the model trains (forked; each batch is a
    # function of (seed, step) alone, so the batches are the same for any number): 0 builds each
    # in the training loop, as the CPU runs do (a long-stream batch takes seconds on one core)
    data_workers: int = 0
    # rows of a batch per forward/backward pass, their gradients summed before the optimizer step
    # (0: the whole batch at once): the batch's update in the memory of a smaller one, as a CPU needs
    # for a GPU config's batch 16 at 64 segments; the same run up to float rounding
    micro_batch: int = 0
    device: str = "auto"  # "auto": CUDA when present, else CPU; or "cpu", "cuda", "cuda:1"
    # bf16 autocast: true, false, or "auto": where the device runs bf16 natively (GPUs with bf16,
    # CPUs with AMX / AVX512-BF16; emulated elsewhere, and slower than float32)
    autocast: bool | str = False
    checkpoint_every: int = 10  # steps
    eval_every: int = 50  # steps; 0: never
    eval_items: int = 32
    eval_segments: tuple[int, ...] = (1, 2, 4, 8)
    corpora: tuple[str, ...] = ("linux-doc", "python-doc", "gnu-manuals")
    corpus_tokens: int = 2_000_000  # how much of the train split to tokenize for the haystacks
    init: str = ""  # an adapter (.safetensors) whose weights start the run; "" : fresh memory
    # the adapter's answer window (ARMTConfig.answer_window; 0: off): what a run trained with an
    # unwritten tail (Stage.tail, p_view) tells `ask` and `eval` to leave beside the question
    answer_window: int = 0

    def __post_init__(self) -> None:
        if self.backbone not in ("frozen", "lora", "full"):
            raise EdgememError(f"backbone must be 'frozen', 'lora' or 'full', not {self.backbone!r}")
        if not self.stages:
            raise EdgememError("a training config needs at least one stage")
        for name in ("memory_lr_scale", "gate_lr_scale", "write_gate_lr_scale"):
            if not 0 < getattr(self, name) <= 1000:
                raise EdgememError(f"{name} must lie in (0, 1000], not {getattr(self, name)}")
        if self.data_workers < 0:
            raise EdgememError(f"data_workers must be 0 or more, not {self.data_workers}")
        if self.micro_batch < 0:
            raise EdgememError(f"micro_batch must be 0 (the whole batch) or more, not {self.micro_batch}")
        # the adapter's segment length is the last stage's
        if problem := answer_window_problem(self.answer_window, self.stages[-1].segment_len):
            raise EdgememError(problem)
        if not (isinstance(self.autocast, bool) or self.autocast == "auto"):
            raise EdgememError(f'autocast must be true, false or "auto", not {self.autocast!r}')

    @property
    def total_steps(self) -> int:
        return sum(s.steps for s in self.stages)

    def stage_at(self, step: int) -> tuple[Stage, int]:
        """The stage that global step `step` (0-based) belongs to, and the step inside it."""
        for stage in self.stages:
            if step < stage.steps:
                return stage, step
            step -= stage.steps
        raise EdgememError("step beyond the last stage")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        data = dict(data)
        raw = data.pop("stage", None) or data.pop("stages", None)
        if not raw:
            raise EdgememError("a training config needs at least one [[stage]]")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise EdgememError(f"unknown training option(s): {', '.join(unknown)}")
        stage_keys = {f.name for f in fields(Stage)}
        stages = []
        for entry in raw:
            bad = sorted(set(entry) - stage_keys)
            if bad:
                raise EdgememError(f"unknown stage option(s): {', '.join(bad)}")
            entry = dict(entry)
            entry["segments"] = tuple(entry.get("segments", (1,)))
            if "mix" in entry:
                entry["mix"] = tuple(entry["mix"])
            try:
                stages.append(Stage(**entry))
            except TypeError as exc:
                raise EdgememError(f"stage {entry.get('name', '?')!r}: {exc}") from exc
        for key in ("memory_layers", "eval_segments", "corpora"):
            if key in data:
                data[key] = tuple(data[key])
        try:
            return cls(stages=tuple(stages), **data)
        except TypeError as exc:
            raise EdgememError(f"training config: {exc}") from exc


def load_config(path: Path) -> TrainConfig:
    path = Path(path)
    require_file(path, "training config")
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise EdgememError(f"training config {path} is not valid TOML: {exc}") from exc
    return TrainConfig.from_dict(data)


# ----- schedules -----


def learning_rate(stage: Stage, step: int) -> float:
    """Linear warm-up to stage.lr, then cosine annealing to lr * min_lr_ratio at the stage's end."""
    if stage.warmup and step < stage.warmup:
        return stage.lr * (step + 1) / stage.warmup
    span = max(1, stage.steps - stage.warmup)
    progress = min(1.0, (step - stage.warmup) / span)
    floor = stage.lr * stage.min_lr_ratio
    return floor + (stage.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def step_rng(seed: int, step: int, what: str) -> random.Random:
    digest = hashlib.sha256(f"{seed}|{step}|{what}".encode()).hexdigest()
    return random.Random(int(digest[:16], 16))


def batch_shape(config: TrainConfig, step: int) -> tuple[int, int]:
    """(segment length, written segments) of global step `step`.

    The number of segments is sampled from the stage's list; with a stochastic segment length the
    short one is drawn with probability p_short, except in the stage's last 10% of steps. A short
    segment keeps the document's length: the number of segments grows by long / short, so both
    lengths cost about the same tokens per step and differ only in how the text is cut.
    """
    stage, local = config.stage_at(step)
    rng = step_rng(config.seed, step, "shape")
    segments = rng.choice(stage.segments)
    length = stage.segment_len
    stochastic = stage.short_segment_len and local < stage.steps * (1 - FINAL_FRACTION)
    if stochastic and rng.random() < stage.p_short:
        length = stage.short_segment_len
        segments = max(1, segments * stage.segment_len // length) if segments else 0
    return length, segments


# ----- batches -----


@dataclass
class Batch:
    """One global batch.

    written [B, N * S]: the document's written segments; answer [B, T] (right-padded): the
    read-only last segment (tail, question, answer prefix, answer); targets [B, T]: the next token
    to predict at each answer position, -100 where there is no loss. For the lm task `answer` is
    empty and the loss is on the written segments after the first. weights [B, T] (None: all 1):
    each target's weight in its item's loss (`Stage.lead_weight`).
    """

    written: Tensor
    answer: Tensor
    targets: Tensor
    segment_len: int
    weights: Tensor | None = None

    def rows(self, index: list[int]) -> Batch:
        weights = None if self.weights is None else self.weights[index]
        return Batch(self.written[index], self.answer[index], self.targets[index], self.segment_len, weights)


def _pad(rows: list[list[int]], value: int) -> Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)


class TokenRecall:
    """Synthetic key/value recall over raw token ids (no tokenizer, for tiny models).

    Ids 0..3 are markers (0 pad, 1 "key follows", 2 "question", 3 "answer"); keys and values are
    drawn from the rest of the vocabulary. The document is random filler with the pairs
    `1 key value` in it; the answer segment is `2 key 3` and the target is the value.
    """

    def __init__(self, vocab: int, values: int = 10) -> None:
        if vocab < 4 + values:
            raise EdgememError(
                f"a token recall task with {values} values needs a vocabulary of {4 + values}+"
            )
        self.vocab = vocab
        self.values = values  # values are ids 4 .. 4 + values - 1: chance is 1 / values

    def batch(self, rng: random.Random, stage: Stage, segment_len: int, segments: int) -> Batch:
        S = segment_len
        written, answers, targets = [], [], []
        for _ in range(stage.batch_size):
            doc = [rng.randrange(4, self.vocab) for _ in range(S * segments)]
            keys = rng.sample(range(4, self.vocab), stage.keys)
            values = [rng.randrange(4, 4 + self.values) for _ in keys]
            for i, (key, value) in enumerate(zip(keys, values, strict=True)):
                seg = _needle_segment(rng, stage, segments, distractor=i > 0)
                pos = S - 3 if stage.needle == "end" else rng.randrange(0, S - 2)
                doc[seg * S + pos : seg * S + pos + 3] = [1, key, value]
            written.append(doc)
            answers.append([2, keys[0], 3, values[0]])
            targets.append([-100, -100, values[0], -100])
        return Batch(torch.tensor(written), torch.tensor(answers), torch.tensor(targets), S)


def _needle_segment(rng: random.Random, stage: Stage, segments: int, distractor: bool = False) -> int:
    """The written segment a needle goes into; `distractor`: one of the other keys' needles."""
    where = (stage.distractor_segment or stage.needle_segment) if distractor else stage.needle_segment
    if where == "first":
        return 0
    if where == "last":
        return segments - 1
    if where == "late":
        return rng.randrange(max(0, segments - stage.late), segments)
    return rng.randrange(segments)


def answer_text(item: Item) -> tuple[str, bool]:
    """What the assistant says after a vt/docqa/types item's answer prefix, and whether its turn
    ends there (recall items build their own answer: `ProseTasks.recall_item`)."""
    if item.task == "vt":
        return " " + " ".join(item.answers), True  # RULER's form: "... they are: A B C D E"
    if item.task == "docqa":
        return " " + item.answers[0], False  # the quoted sentence goes on after its next word
    return item.answers[0] + "`", True  # types: the prefix opened the backtick


class ProseTasks:
    """Batches from real prose (a token stream of the corpora's train or validation split).

    `recall` items are built like the evaluation's `niah` items: the same needle sentence,
    question, chat template and answer prefix. `vt`, `docqa` and `types` items come from the
    evaluation's generators (`builder`, on the same split).
    """

    def __init__(self, tokenizer: object, stream: Tensor, builder: Builder | None = None) -> None:
        self.tokenizer = tokenizer
        self.stream = stream
        self.builder = builder
        stops = sorted(stop_token_ids(tokenizer))
        self.end_id = stops[0] if stops else None
        im_end = tokenizer.get_vocab().get("<|im_end|>")  # type: ignore[attr-defined]
        if im_end is not None:
            self.end_id = im_end

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids  # type: ignore[operator]

    def _window(self, rng: random.Random, length: int) -> list[int]:
        start = rng.randrange(0, len(self.stream) - length)
        return self.stream[start : start + length].tolist()

    def batch(self, task: str, rng: random.Random, stage: Stage, segment_len: int, segments: int) -> Batch:
        S = segment_len
        if task == "lm":
            rows = [self._window(rng, S * segments) for _ in range(stage.batch_size)]
            empty = torch.zeros(len(rows), 0, dtype=torch.long)
            return Batch(torch.tensor(rows), empty, empty.clone(), S)
        written, answers, targets, weights = [], [], [], []
        weigh = stage.lead_weight != 1.0  # no weights at 1: the loss of older runs, bit for bit
        for _ in range(stage.batch_size):
            kind = rng.choice(stage.mix) if task == "mix" else task
            if kind == "recall":
                doc, prompt, answer = self.recall_item(rng, stage, S, segments)
            else:
                doc, prompt, answer = self.task_item(kind, rng, stage, S, segments)
            written.append(doc[: S * segments])
            answers.append(prompt + answer)
            targets.append([-100] * (len(prompt) - 1) + answer + [-100])
            if weigh:
                row = [1.0] * len(targets[-1])
                if kind == "recall":
                    row[len(prompt) - 1 + self.lead(answer)] = stage.lead_weight
                weights.append(row)
        written_ids = torch.tensor(written, dtype=torch.long).view(len(written), S * segments)
        lead = _pad(weights, 0).float() if weigh else None
        return Batch(written_ids, _pad(answers, 0), _pad(targets, -100), S, lead)

    def lead(self, answer: list[int]) -> int:
        """Index in a recall answer's ids of its first digit (after the space token)."""
        return next(i for i, t in enumerate(answer) if self.tokenizer.decode([t]).strip())  # type: ignore[attr-defined]

    def recall_item(
        self, rng: random.Random, stage: Stage, S: int, segments: int
    ) -> tuple[list[int], list[int], list[int]]:
        """(document ids: written segments then the tail, answer-segment prompt, answer ids)."""
        taken: set[str] = set()
        tail_len = rng.randint(1, stage.tail or S)
        doc = self._window(rng, S * segments + tail_len)
        # no draw at p_tail 0 (older runs replay); nothing written: the asked needle in the tail
        in_tail = segments == 0 or (stage.p_tail > 0 and rng.random() < stage.p_tail)
        keys = [random_key(rng, taken) for _ in range(stage.keys)]
        values = [random_number(rng, stage.digits) for _ in keys]
        needles: list[tuple[int, int]] = []  # the written needles' spans, kept clear of numbers
        for i, (key, value) in enumerate(zip(keys, values, strict=True)):
            needle = self._ids(" " + NIAH_NEEDLE.format(key, value))[: S - 1]
            if i == 0 and in_tail:
                if tail_len < len(needle):  # a tail too short for it: a longer window
                    tail_len = len(needle)
                    doc = self._window(rng, S * segments + tail_len)
                pos = rng.randrange(0, tail_len - len(needle) + 1)
                doc[S * segments + pos : S * segments + pos + len(needle)] = needle
                continue
            if segments == 0:  # no memory to hold the distractors
                break
            seg = _needle_segment(rng, stage, segments, distractor=i > 0)
            pos = S - len(needle) if stage.needle == "end" else rng.randrange(0, S - len(needle) + 1)
            doc[seg * S + pos : seg * S + pos + len(needle)] = needle
            needles.append((seg * S + pos, seg * S + pos + len(needle)))
        if stage.haystack_numbers > 0:  # no draw at 0: older runs replay
            self._write_numbers(rng, doc, S * segments, stage.haystack_numbers, needles)
        tail = doc[S * segments :]
        prompt = prompt_ids(self.tokenizer, tail, NIAH_QUESTION.format(keys[0])) + self._ids(
            NIAH_PREFIX.format(keys[0])
        )
        answer = self._ids(" " + values[0] + ".") + ([self.end_id] if self.end_id is not None else [])
        return doc, prompt, answer

    def _write_numbers(
        self, rng: random.Random, doc: list[int], written: int, per_1k: float, keep: list[tuple[int, int]]
    ) -> None:
        """Write round(per_1k * written / 1000) numbers of 1-7 random digits (" 3491") over
        doc[:written], in place, none overlapping a span of `keep` (a number that would is skipped)."""
        for _ in range(round(per_1k * written / 1000)):
            number = self._ids(" " + random_number(rng, rng.randint(1, 7)))
            at = rng.randrange(0, max(1, written - len(number) + 1))
            stop = at + len(number)
            if stop > written or any(at < end and start < stop for start, end in keep):
                continue
            doc[at : at + len(number)] = number

    def task_item(
        self, kind: str, rng: random.Random, stage: Stage, S: int, segments: int
    ) -> tuple[list[int], list[int], list[int]]:
        """A vt/docqa/types item of the evaluation's generator, its context cut into `segments`
        written segments of S tokens and a tail of 1..tail tokens (or so: the question's length
        varies): (document ids, answer-segment prompt, answer ids)."""
        if self.builder is None:
            raise EdgememError(f"the {kind} task needs the corpora's documents (a Builder)")
        if stage.p_view > 0 and rng.random() < stage.p_view:  # no draw at 0: older runs replay
            return self.view_item(kind, rng, stage, S, segments)
        tail = rng.randint(1, stage.tail or S)
        for _ in range(20):  # a generator may not fit a short bin (a types file too long for it)
            index = rng.randrange(10**9)
            try:
                item = self.builder.item(kind, S * segments + tail + 64, index, 10**9)
            except EdgememError:
                continue
            doc = self._ids(item.context)
            if len(doc) <= S * segments:
                continue
            prompt = prompt_ids(self.tokenizer, doc[S * segments :], item.question)
            prompt += self._ids(item.answer_prefix)
            text, ends = answer_text(item)
            answer = self._ids(text) + ([self.end_id] if ends and self.end_id is not None else [])
            return doc, prompt, answer
        raise EdgememError(f"could not build a {kind} item of {segments} x {S} tokens from the corpora")

    def view_item(
        self, kind: str, rng: random.Random, stage: Stage, S: int, segments: int
    ) -> tuple[list[int], list[int], list[int]]:
        """A vt/docqa/types item in the unwritten tail (`Stage.p_view`) of tail // 4..tail tokens:
        the whole item after `segments` written segments of other prose, or (`Stage.view` "same",
        docqa) the end of a longer item, its evidence paragraph in the tail and its first part
        written: (document ids, answer-segment prompt, answer ids)."""
        assert self.builder is not None
        top, cut = stage.tail or S, S * segments
        same = stage.view == "same" and kind == "docqa"
        # the evidence lands after the cut in about view / (cut + view) of the draws: a cut longer
        # than the tail needs more of them (the first 50 draws are as before)
        for _ in range(max(50, 50 * cut // top) if same else 20):
            index = rng.randrange(10**9)
            view_len = rng.randint(max(1, top // 4), top)
            try:
                item = self.builder.item(kind, view_len + (cut if same else 0), index, 10**9)
            except EdgememError:
                continue
            ids = self._ids(item.context)
            if same:
                at = item.context.find(item.passage)
                if not cut < len(ids) <= cut + top + 64 or at < 0 or len(self._ids(item.context[:at])) < cut:
                    continue
                written, view = ids[:cut], ids[cut:]
            elif len(ids) > top + 64:
                continue
            else:
                written, view = [], ids
            prompt = prompt_ids(self.tokenizer, view, item.question) + self._ids(item.answer_prefix)
            text, ends = answer_text(item)
            answer = self._ids(text) + ([self.end_id] if ends and self.end_id is not None else [])
            return (written or self._window(rng, cut)) + view, prompt, answer
        raise EdgememError(f"could not build a {kind} item of at most {top} tokens from the corpora")


def prose_stream(tokenizer: object, corpora: tuple[str, ...], split: str, limit: int) -> Tensor:
    """Token ids [N] of a corpus split's documents (shuffled by a fixed seed), at most `limit`."""
    from edgemem.data import corpora as corpora_mod

    docs = [r for name in corpora for r in corpora_mod.load(name, split)]
    docs.sort(key=lambda r: r["sha256"])
    random.Random(f"train-{split}").shuffle(docs)
    ids: list[int] = []
    for row in docs:
        ids += tokenizer(row["text"].strip() + "\n\n", add_special_tokens=False).input_ids  # type: ignore[operator]
        if len(ids) >= limit:
            break
    if len(ids) < 10_000:
        raise EdgememError(
            f"the {split} split of {', '.join(corpora)} has too little text ({len(ids)} tokens)"
        )
    return torch.tensor(ids[:limit], dtype=torch.int32)


# ----- the loss -----


def _detach(state: MemoryState) -> MemoryState:
    return MemoryState(
        {k: v.detach() for k, v in state.A.items()}, {k: v.detach() for k, v in state.z.items()}, state.writes
    )


def forward_loss(armt: ARMT, batch: Batch, stage: Stage, global_batch: int) -> tuple[Tensor, dict]:
    """Summed per-item mean losses divided by the global batch size (so that DDP ranks add up).

    Returns (loss, stats) with stats["segment_loss"]: mean loss per scored segment index.
    """
    device = armt.write_embeddings.device
    weights = None if batch.weights is None else batch.weights.to(device)
    written, answer, targets = batch.written.to(device), batch.answer.to(device), batch.targets.to(device)
    batch = Batch(written, answer, targets, batch.segment_len, weights)
    S = batch.segment_len
    n = batch.written.shape[1] // S
    B = batch.written.shape[0]
    state = armt.empty_state(B)
    per_item = torch.zeros(B, device=device)
    segment_loss: list[float] = []
    head = armt.base.get_output_embeddings()
    for j in range(n):
        ids = batch.written[:, j * S : (j + 1) * S]
        want_logits = stage.task == "lm" and j > 0
        if stage.bptt and n - j > stage.bptt:  # this segment's input state is cut from the graph
            if not stage.write_grad:
                state = _detach(state)
            elif n - j > stage.bptt + 1 and torch.is_grad_enabled():  # its output state is too
                state = _write_only_step(armt, ids, state)
                continue
        if stage.checkpointing and torch.is_grad_enabled():
            state, logits = _checkpointed_step(armt, ids, state, want_logits)
        else:
            state, logits = armt.step(ids, state, return_logits=want_logits)
        if want_logits:
            losses = F.cross_entropy(
                logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten(), reduction="none"
            ).view(B, -1)
            item = losses.mean(1)
            per_item = per_item + item / (n - 1)
            segment_loss.append(float(item.detach().mean()))
    if stage.task != "lm":
        hidden = armt.read_only_hidden(batch.answer, state)
        mask = batch.targets != -100
        logits = head(hidden[mask]).float()
        losses = F.cross_entropy(logits, batch.targets[mask], reduction="none")
        rows = mask.nonzero()[:, 0]
        counts = mask.sum(1).clamp_min(1)
        total = counts
        if batch.weights is not None:  # a weighted mean per item (Stage.lead_weight)
            w = batch.weights[mask]
            losses, total = losses * w, torch.zeros(B, device=device).index_add(0, rows, w).clamp_min(1e-9)
        per_item = per_item + torch.zeros(B, device=device).index_add(0, rows, losses) / total
        correct = (logits.argmax(-1) == batch.targets[mask]).float()
        exact = torch.zeros(B, device=device).index_add(0, rows, correct) == counts
        segment_loss.append(float(per_item.detach().mean()))
        stats = {"segment_loss": segment_loss, "exact": float(exact.float().mean())}
    else:
        stats = {"segment_loss": segment_loss}
    return per_item.sum() / global_batch, stats


def merge_stats(parts: list[tuple[int, dict]]) -> dict:
    """The stats of a batch from those of its micro-batches [(rows, stats)]: means weighted by rows."""
    total = sum(rows for rows, _ in parts)
    merged: dict = {
        "segment_loss": [
            sum(rows * stats["segment_loss"][i] for rows, stats in parts) / total
            for i in range(len(parts[0][1]["segment_loss"]))
        ]
    }
    if "exact" in parts[0][1]:
        merged["exact"] = sum(rows * stats["exact"] for rows, stats in parts) / total
    return merged


def _write_only_step(armt: ARMT, ids: Tensor, state: MemoryState) -> MemoryState:
    """armt.step with the backbone out of the graph (Stage.write_grad): the new state
    back-propagates into the state before it and into the memory projections of this segment's
    writes, not into the layer outputs they are computed from. The same values as armt.step."""
    with torch.no_grad():
        inputs = armt.write_inputs(ids, state)
    A, z = {}, {}
    for i, m in inputs.items():
        A[i], z[i] = armt.memories[str(i)].write(m, state.A[i], state.z[i], first=state.writes == 0)
    return MemoryState(A, z, state.writes + 1)


def _checkpointed_step(armt: ARMT, ids: Tensor, state: MemoryState, want_logits: bool):
    """armt.step, recomputed in the backward pass instead of keeping its activations."""
    from torch.utils.checkpoint import checkpoint

    layers = sorted(state.A)

    def run(*flat: Tensor):
        s = MemoryState(
            dict(zip(layers, flat[: len(layers)], strict=True)),
            dict(zip(layers, flat[len(layers) :], strict=True)),
            state.writes,
        )
        new, logits = armt.step(ids, s, return_logits=want_logits)
        out = [new.A[k] for k in layers] + [new.z[k] for k in layers]
        return (*out, logits) if want_logits else tuple(out)

    flat = [state.A[k] for k in layers] + [state.z[k] for k in layers]
    out = checkpoint(run, *flat, use_reentrant=False)
    k = len(layers)
    new = MemoryState(
        dict(zip(layers, out[:k], strict=True)),
        dict(zip(layers, out[k : 2 * k], strict=True)),
        state.writes + 1,
    )
    return new, (out[2 * k] if want_logits else None)


# ----- checkpoints -----


def _is_memory(name: str) -> bool:
    """A memory parameter (W_Q, W_K, W_V, W_b of a memory layer) or the write embeddings."""
    return ".memory." in name or name.startswith("memories.") or name == "write_embeddings"


def _is_gate(name: str) -> bool:
    """A memory's read gate (`AssociativeMemory.gate_w`, `gate_b`)."""
    return _is_memory(name) and name.rsplit(".", 1)[-1] in ("gate_w", "gate_b")


def _is_write_gate(name: str) -> bool:
    """A memory's write gate (`AssociativeMemory.W_b`: beta = sigmoid(W_b m))."""
    return _is_memory(name) and ".W_b." in name


def _trainable(armt: ARMT) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in armt.named_parameters() if p.requires_grad}


def save_checkpoint(
    path: Path,
    armt: ARMT,
    optimizer: torch.optim.Optimizer,
    step: int,
    config_json: str,
    evaluate: bool = False,
) -> None:
    """Parameters, AdamW moments and step counts, the torch RNG, the step: one safetensors file.
    `evaluate`: the run evaluates this step right after the checkpoint (`checkpoint_evaluates`)."""
    params = _trainable(armt)
    tensors: dict[str, Tensor] = {f"param.{n}": p.detach().contiguous() for n, p in params.items()}
    for name, p in params.items():
        for key, value in optimizer.state.get(p, {}).items():
            tensors[f"opt.{name}.{key}"] = value.detach().contiguous().reshape(value.shape)
    tensors["rng.torch"] = torch.get_rng_state()
    meta = {
        "format": CHECKPOINT_FORMAT,
        "step": str(step),
        "config": config_json,
        "evaluate": "1" if evaluate else "0",
    }
    atomic_write_bytes(path, save(tensors, metadata=meta))


def checkpoint_evaluates(path: Path) -> bool | None:
    """Whether the run evaluates the checkpoint's step after writing it (a resume finds that
    evaluation in the log, or runs it: the run may have been killed during it); None for a
    checkpoint from before it said so."""
    with safe_open(str(path), framework="pt") as handle:  # the metadata only: no tensors read
        flag = (handle.metadata() or {}).get("evaluate")
    return None if flag is None else flag == "1"


def load_checkpoint(path: Path, armt: ARMT, optimizer: torch.optim.Optimizer) -> tuple[int, str]:
    """Restore what `save_checkpoint` wrote; returns (step, config json)."""
    meta, tensors = read_safetensors(path, "checkpoint")
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise EdgememError(f"{path} is not an edgemem training checkpoint")
    params = _trainable(armt)
    missing = [n for n in params if f"param.{n}" not in tensors]
    if missing:
        raise EdgememError(f"checkpoint {path} does not fit this model (missing {missing[0]})")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(tensors[f"param.{name}"])
    for name, p in params.items():
        state = {
            key[len(f"opt.{name}.") :]: value.to(p.device)
            for key, value in tensors.items()
            if key.startswith(f"opt.{name}.")
            and key[len(f"opt.{name}.") :] in ("step", "exp_avg", "exp_avg_sq")
        }
        if state:
            optimizer.state[p] = state
    torch.set_rng_state(tensors["rng.torch"])
    return int(meta["step"]), meta.get("config", "")


def params_digest(params: dict[str, torch.nn.Parameter]) -> str:
    """sha256 of the trainable parameters' names and bytes: what a partial step's gradients were
    computed on."""
    digest = hashlib.sha256()
    for name, p in params.items():
        digest.update(name.encode())
        digest.update(p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@dataclass
class PartialStep:
    """A step cut short after some of its micro-batches: `rows` of its local rows done, their
    summed (weighted) loss, their stats [(rows, stats)] and the compute seconds they took."""

    rows: int
    loss: Tensor
    parts: list[tuple[int, dict]]
    seconds: float


def save_partial(
    path: Path,
    step: int,
    digest: str,
    config_json: str,
    params: dict[str, torch.nn.Parameter],
    done: PartialStep,
) -> None:
    """The gradients summed over a step's finished micro-batches, with what the step's record
    needs and the torch RNG: one safetensors file, written atomically. `step` counts the steps
    before this one; `digest` is `params_digest` of the parameters the gradients belong to."""
    tensors = {f"grad.{n}": p.grad.detach().contiguous() for n, p in params.items() if p.grad is not None}
    tensors["loss"] = done.loss.detach().reshape(1).contiguous()
    tensors["rng.torch"] = torch.get_rng_state()
    meta = {
        "format": PARTIAL_FORMAT,
        "step": str(step),
        "params": digest,
        "config": config_json,
        "rows": str(done.rows),
        "parts": json.dumps(done.parts),
        "seconds": repr(done.seconds),
    }
    atomic_write_bytes(path, save(tensors, metadata=meta))


def load_partial(
    path: Path, step: int, digest: str, config_json: str, params: dict[str, torch.nn.Parameter]
) -> PartialStep | None:
    """Restore the gradients and RNG of `save_partial` when the partial belongs to this step of
    this run on these parameters; None (nothing restored) for any other, which is stale, and for
    an unreadable file (the step runs whole: the parts are redone, nothing else is lost)."""
    try:
        meta, tensors = read_safetensors(path, "partial training step")
    except EdgememError:
        return None
    if (
        meta.get("format") != PARTIAL_FORMAT
        or meta.get("step") != str(step)
        or meta.get("params") != digest
        or _defining(meta.get("config", "")) != _defining(config_json)
    ):
        return None
    for name, p in params.items():
        grad = tensors.get(f"grad.{name}")
        p.grad = None if grad is None else grad.to(p.device).clone()
    torch.set_rng_state(tensors["rng.torch"])
    parts = [(int(rows), stats) for rows, stats in json.loads(meta["parts"])]
    loss = tensors["loss"].to(next(iter(params.values())).device).reshape(())
    return PartialStep(int(meta["rows"]), loss, parts, float(meta["seconds"]))


# ----- evaluation during training -----


@torch.no_grad()
def recall_accuracy(
    armt: ARMT,
    make_batch: Callable[[random.Random, Stage, int, int], Batch],
    seed: int,
    items: int,
    segment_len: int,
    segments: int,
    stage: Stage,
) -> float:
    """Exact answers (every answer token the argmax, i.e. what greedy decoding would produce) on
    `items` fixed held-out items with `segments` written segments."""
    probe = replace(stage, batch_size=min(8, items), keys=1)
    scored = replace(probe, task="recall", bptt=0, write_grad=False, checkpointing=False)
    exact = 0.0
    done = 0
    k = 0
    while done < items:
        batch = make_batch(step_rng(seed, k, f"eval-{segments}"), probe, segment_len, segments)
        _, stats = forward_loss(armt, batch, scored, 1)
        exact += stats["exact"] * batch.written.shape[0]
        done += batch.written.shape[0]
        k += 1
    return exact / done


# ----- the loop -----


class _StepBatches(torch.utils.data.Dataset):
    """Batch `i` of a run is step `start + i`'s: a function of (seed, step) alone."""

    def __init__(self, config: TrainConfig, make_batch: Callable, start: int, stop: int) -> None:
        self.config, self.make_batch, self.start, self.stop = config, make_batch, start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, i: int) -> Batch:
        step = self.start + i
        stage, _ = self.config.stage_at(step)
        S, n = batch_shape(self.config, step)
        return self.make_batch(step_rng(self.config.seed, step, "batch"), stage, S, n)


def step_batches(config: TrainConfig, make_batch: Callable, start: int, stop: int) -> Iterator[Batch]:
    """The batches of steps start..stop-1 in order: built in the loop (`data_workers` 0), or by
    that many forked processes a few steps ahead of it (the same batches either way)."""
    batches = _StepBatches(config, make_batch, start, stop)
    if not config.data_workers or stop <= start:
        return (batches[i] for i in range(len(batches)))
    loader = torch.utils.data.DataLoader(
        batches,
        batch_size=None,  # each item is a whole Batch already
        num_workers=config.data_workers,
        prefetch_factor=4,
        multiprocessing_context="fork",  # the workers inherit the tokenizer and token stream
    )
    return iter(loader)


@dataclass
class Run:
    """What `train` needs besides the config: the model, the batch makers, where to write."""

    armt: ARMT
    out: Path
    make_batch: Callable[[random.Random, Stage, int, int], Batch]  # (rng, stage, S, segments) -> Batch
    make_eval_batch: Callable[[random.Random, Stage, int, int], Batch] | None = None
    log: Callable[[str], None] = print
    rank: int = 0
    world: int = 1
    extra_meta: dict[str, str] = field(default_factory=dict)


OPERATIONAL = (
    "threads",
    "data_workers",
    "micro_batch",
    "device",
    "autocast",
    "checkpoint_every",
    "eval_every",
    "eval_items",
    "eval_segments",
    "eval_seed",
    "init",  # only seeds step 0: a resume loads the checkpoint, and the adapter pins the init's sha256
    "answer_window",  # how the adapter answers, not what it learns (the batches hold the tails)
)


def _defining(config_json: str) -> dict:
    """The part of a config that defines the training itself: a run may resume with other
    threads, another checkpoint/evaluation cadence or its init adapter moved elsewhere. Options
    added to edgemem since the run started take their defaults."""
    data = json.loads(TrainConfig.from_dict(json.loads(config_json)).to_json())
    return {k: v for k, v in data.items() if k not in OPERATIONAL}


def _all_reduce_grads(params: list[torch.nn.Parameter], world: int) -> None:
    import torch.distributed as dist

    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def train(config: TrainConfig, run: Run, max_steps: int | None = None) -> int:
    """Run (or resume) the recipe until its last step, or `max_steps` more steps. Returns the step
    reached. One process at a time trains a folder: its rank 0 holds `out/.lock` throughout, and a
    second run into the same folder is refused (two would interleave their logs and checkpoints)."""
    run.out.mkdir(parents=True, exist_ok=True)
    if run.rank != 0:
        return _train(config, run, max_steps)
    with open(run.out / ".lock", "a") as lock:
        lock_exclusively(
            lock, f"{run.out} is being trained by another process: wait for it, or use another --out"
        )
        return _train(config, run, max_steps)


def _train(config: TrainConfig, run: Run, max_steps: int | None) -> int:
    smallest = min(stage.batch_size for stage in config.stages)
    if run.world > smallest:  # a process with no rows would have nothing to step on
        raise EdgememError(f"{run.world} processes need batches of {run.world} or more rows, not {smallest}")
    armt = run.armt
    out = run.out
    ckpt = out / "checkpoint.safetensors"
    partial = out / "partial.safetensors"
    trainable = _trainable(armt)
    params = list(trainable.values())
    gates = [p for n, p in trainable.items() if _is_gate(n)]
    # a group of their own only when they step at their own rate: runs from before resume as they were
    own_rate = config.write_gate_lr_scale != 1.0
    write_gates = [p for n, p in trainable.items() if own_rate and _is_write_gate(n)]
    memory = [
        p
        for n, p in trainable.items()
        if _is_memory(n) and not _is_gate(n) and not (own_rate and _is_write_gate(n))
    ]
    rest = [p for n, p in trainable.items() if not _is_memory(n)]
    groups = [
        {"params": memory, "scale": config.memory_lr_scale},
        {"params": rest, "scale": 1.0},
        {"params": gates, "scale": config.gate_lr_scale},  # empty (dropped) without read_gate
        {"params": write_gates, "scale": config.memory_lr_scale * config.write_gate_lr_scale},  # empty at 1.0
    ]
    optimizer = torch.optim.AdamW(
        [g for g in groups if g["params"]], lr=config.stages[0].lr, weight_decay=0.0
    )
    step = 0
    if ckpt.is_file():
        step, saved = load_checkpoint(ckpt, armt, optimizer)
        if saved and _defining(saved) != _defining(config.to_json()):
            raise EdgememError(f"{out} holds a run with another config: use a new folder or delete it")
        run.log(f"resumed at step {step}")
    log_path = out / "log.jsonl"
    if run.rank == 0 and log_path.is_file():
        _truncate_log(log_path, step)
    if run.rank == 0 and step and config.eval_every:
        # the checkpoint is written before its step's evaluation: one killed mid-evaluation runs now
        due = checkpoint_evaluates(ckpt)
        if due is None:  # a checkpoint from before the flag: its step's evaluation by the cadence
            due = step % config.eval_every == 0 or step == config.total_steps
        logged = {r["step"] for r in read_log(log_path)[1]} if log_path.is_file() else set()
        if due and step not in logged:
            _evaluate(config, run, config.stage_at(step - 1)[0], step)
    adapter_meta = {**run.extra_meta, **_init_meta(config, out, resumed=step > 0)}
    stop_at = config.total_steps if max_steps is None else min(config.total_steps, step + max_steps)
    bf16 = autocast_enabled(config.autocast, armt.write_embeddings.device)
    cpu = cpu_model()
    batches = step_batches(config, run.make_batch, step, stop_at)
    while step < stop_at:
        stage, local = config.stage_at(step)
        S, n = batch_shape(config, step)
        lr = learning_rate(stage, local)
        for group in optimizer.param_groups:
            group["lr"] = lr * group["scale"]
        started = time.perf_counter()
        batch = next(batches)
        local_rows = list(range(run.rank, batch.written.shape[0], run.world))
        armt.train()
        optimizer.zero_grad(set_to_none=True)
        micro = config.micro_batch or len(local_rows)
        # one process taking its step in parts keeps the parts done on disk (a resume goes on after them)
        keeps_parts = run.world == 1 and micro < len(local_rows)
        digest = params_digest(trainable) if keeps_parts else ""
        done = PartialStep(0, torch.zeros((), device=armt.write_embeddings.device), [], 0.0)
        if keeps_parts and partial.is_file():
            found = load_partial(partial, step, digest, config.to_json(), trainable)
            if found is None:
                run.log(f"{partial} is not this step's on these parameters: step {step + 1} runs whole")
            else:
                done = found
                run.log(f"step {step + 1} goes on after {done.rows} of its {len(local_rows)} rows")
        resumed_rows = done.rows
        for start in range(done.rows, len(local_rows), micro):
            rows = local_rows[start : start + micro]
            with autocast_context(armt, bf16):
                part, part_stats = forward_loss(armt, batch.rows(rows), stage, batch.written.shape[0])
            part.backward()  # each part is already over the global batch: the gradients add up
            done.loss = done.loss + part.detach()
            done.parts.append((len(rows), part_stats))
            done.rows = start + len(rows)
            if keeps_parts and done.rows < len(local_rows):
                so_far = replace(done, seconds=done.seconds + time.perf_counter() - started)
                save_partial(partial, step, digest, config.to_json(), trainable, so_far)
        loss, stats = done.loss, merge_stats(done.parts)
        if run.world > 1:
            _all_reduce_grads(params, run.world)
            stats_loss = loss.detach().clone()
            import torch.distributed as dist

            dist.all_reduce(stats_loss)
            loss_value = float(stats_loss)
        else:
            loss_value = float(loss.detach())
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, 1.0))
        optimizer.step()
        step += 1
        seconds = done.seconds + time.perf_counter() - started  # a resumed step: both processes' parts
        tokens = (
            batch.written.numel()
            + batch.answer.numel()
            + batch.written.shape[0] * n * (armt.config.num_write_tokens)
        )
        record = {
            "step": step,
            "stage": stage.name,
            "segment_len": S,
            "segments": n,
            "lr": lr,
            "loss": round(loss_value, 5),
            "segment_loss": [round(x, 5) for x in stats["segment_loss"]],
            "grad_norm": round(grad_norm, 4),
            "tokens": tokens,
            "seconds": round(seconds, 3),
            "tokens_per_s": round(tokens / seconds, 1),
            "peak_rss_mb": round(peak_rss_mb()),
            "precision": "bf16 autocast" if bf16 else "float32",  # a resume may run elsewhere:
            "threads": torch.get_num_threads(),  # the log says how each step computed
            "device": device_name(armt.write_embeddings.device),
            "cpu": cpu,  # the card names the machine that trained, not the one that shipped
        }
        if armt.write_embeddings.device.type == "cuda":
            record["peak_cuda_mb"] = round(torch.cuda.max_memory_allocated() / 2**20)
        if "exact" in stats:
            record["exact"] = stats["exact"]
        if resumed_rows:
            record["resumed_rows"] = resumed_rows  # taken by an earlier process (their seconds count)
        if run.rank == 0:
            _append(log_path, record)
        last = step == stop_at
        evaluate = bool(config.eval_every) and (step % config.eval_every == 0 or last)
        if run.rank == 0 and (step % config.checkpoint_every == 0 or last):
            save_checkpoint(ckpt, armt, optimizer, step, config.to_json(), evaluate)
            if config.backbone != "full":  # a fully trained backbone is not an adapter
                meta = {"train_steps": str(step), "train_config": config.to_json(), **adapter_meta}
                save_adapter(armt, out / "adapter.safetensors", meta)
        if run.rank == 0:  # the step is taken: any partial is stale (one of this step, or left by a
            partial.unlink(missing_ok=True)  # process that took its steps in other parts)
        if run.rank == 0 and evaluate:
            _evaluate(config, run, stage, step)
        if run.rank == 0 and (step % 10 == 0 or last):
            run.log(
                f"step {step}/{config.total_steps} [{stage.name}] S={S} n={n} loss {loss_value:.4f} "
                f"lr {lr:.2e} {record['tokens_per_s']:.0f} tok/s"
            )
    return step


def _evaluate(config: TrainConfig, run: Run, stage: Stage, step: int) -> None:
    """Held-out exact recall at each of the config's segment counts, appended to the log (a
    language-modelling stage has no recall to measure)."""
    if stage.task == "lm":
        return
    run.armt.eval()
    maker = run.make_eval_batch or run.make_batch
    seed = config.seed if config.eval_seed is None else config.eval_seed
    acc = {
        str(k): recall_accuracy(run.armt, maker, seed, config.eval_items, stage.segment_len, k, stage)
        for k in config.eval_segments
    }
    _append(run.out / "log.jsonl", {"step": step, "stage": stage.name, "eval_exact": acc})
    run.log(f"step {step}: eval exact {acc}")


def _init_meta(config: TrainConfig, out: Path, resumed: bool) -> dict[str, str]:
    """The sha256 of the `init` adapter the run started from. A resumed run keeps the one its own
    adapter recorded: the file at `config.init` may have been replaced since."""
    if not config.init:
        return {}
    own = out / "adapter.safetensors"
    if resumed and own.is_file():
        with safe_open(str(own), framework="pt") as handle:
            if recorded := (handle.metadata() or {}).get("init_sha256"):
                return {"init_sha256": recorded}
    from edgemem.files import sha256_file

    return {"init_sha256": sha256_file(Path(config.init))}


def autocast_enabled(setting: bool | str, device: torch.device) -> bool:
    """Whether a run's `autocast` setting turns bf16 autocast on for `device` ("auto": where it is native)."""
    if setting == "auto":
        from edgemem.models import preferred_dtype

        return preferred_dtype(device.type) == torch.bfloat16
    return bool(setting)


def autocast_context(armt: ARMT, enabled: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on the model's device (the memory itself computes in float32 regardless)."""
    device = armt.write_embeddings.device.type
    return torch.autocast(device, dtype=torch.bfloat16, enabled=enabled)


def device_name(device: torch.device) -> str:
    """How a step's log line names where it ran: "cpu", or the GPU's name ("NVIDIA H200")."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise EdgememError(f"device {name!r} asked for, but no CUDA device is available")
    return torch.device(name)


def _truncate_log(path: Path, step: int) -> None:
    """Drop the records of steps after the checkpoint (they will run again), atomically."""
    steps, evals = read_log(path)
    keep = [r for r in steps + evals if r["step"] <= step]
    keep.sort(key=lambda r: (r["step"], "eval_exact" in r))
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in keep))


def _append(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()
        with contextlib.suppress(OSError):
            os.fsync(handle.fileno())


def build_armt(base: torch.nn.Module, config: TrainConfig) -> ARMT:
    """The model to train: a frozen base with fresh memory (and fresh LoRA matrices with
    backbone = "lora"), or the weights of the `init` adapter; only the adapter's parameters
    train, or everything with "full"."""
    layers = base.config.num_hidden_layers
    overrides: dict[str, object] = {
        "segment_len": config.stages[-1].segment_len,
        "num_write_tokens": config.num_write_tokens,
        "d_mem": config.d_mem,
        "norm_inputs": config.norm_inputs,
        "write_source": config.write_source,
        "read_gate": config.read_gate,
        "answer_window": config.answer_window,
    }
    if config.memory_layers:
        overrides["memory_layers"] = config.memory_layers
    if config.backbone == "lora":
        overrides.update(lora_rank=config.lora_rank, lora_alpha=config.lora_alpha)
    armt = ARMT(base, ARMTConfig.for_model(layers, **overrides), seed=config.seed)
    if config.init:
        init_config, tensors = read_adapter(Path(config.init))
        if init_config.read_gate and not config.read_gate:
            raise EdgememError(f"init adapter {config.init} has a read gate: set read_gate = true")
        same_memory = replace(  # how an adapter reads (segments, alignment, answer window) may differ
            init_config,
            segment_len=armt.config.segment_len,
            segment_align=armt.config.segment_align,
            read_gate=config.read_gate,
            answer_window=config.answer_window,
        )
        if same_memory != armt.config:
            raise EdgememError(
                f"init adapter {config.init} has another memory (layers, size, LoRA) than this config's"
            )
        if config.read_gate and not init_config.read_gate:  # the gate starts open: g = 1
            tensors = {**armt.adapter_tensors(), **tensors}
        armt.load_adapter_tensors(tensors)
    for p in armt.parameters():  # the adapter sits inside the base's layers: freeze all, then thaw
        p.requires_grad_(config.backbone == "full")
    for p in armt.adapter_parameters():
        p.requires_grad_(True)
    return armt


# ----- a real run: model, corpora, processes -----


def cached_stream(tokenizer: object, model_id: str, config: TrainConfig, split: str) -> Tensor:
    """`prose_stream`, cached as safetensors under the cache directory (keyed by model and corpora)."""
    from edgemem.data.corpora import corpora_dir
    from edgemem.paths import cache_dir

    stamp = [model_id, split, str(config.corpus_tokens), *config.corpora]
    for name in config.corpora:
        meta = corpora_dir() / f"{name}.jsonl"
        stamp.append(str(meta.stat().st_mtime_ns) if meta.is_file() else "missing")
    key = hashlib.sha256("|".join(stamp).encode()).hexdigest()[:16]
    path = cache_dir() / "train" / f"stream-{split}-{key}.safetensors"
    if path.is_file():
        return load_file(str(path))["ids"]
    ids = prose_stream(tokenizer, config.corpora, split, config.corpus_tokens)
    atomic_write_bytes(path, save({"ids": ids}))
    return ids


def train_tasks(tokenizer: object, model_id: str, config: TrainConfig) -> ProseTasks:
    """The run's training items: the train split's token stream and a Builder on its prose corpora."""
    stream = cached_stream(tokenizer, model_id, config, "train")
    prose = tuple(c for c in config.corpora if c in PROSE)
    return ProseTasks(tokenizer, stream, Builder(tokenizer, prose=prose, split="train"))


def run_config(
    config: TrainConfig, out: Path, max_steps: int | None = None, log: Callable[[str], None] = print
):
    """`edgemem train CONFIG`: load the model, build the tasks from the corpora, train or resume.

    Under `torchrun --nproc_per_node N` each process joins a gloo (CPU) or NCCL (CUDA) group and
    takes every N-th item of each global batch.
    """
    import torch.distributed as dist

    from edgemem.models import load_model

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    device = resolve_device(config.device)
    if device.type == "cuda" and world > 1:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    loaded = load_model(config.model, dtype=torch.float32)
    armt = build_armt(loaded.model, config).to(device)
    tasks = train_tasks(loaded.tokenizer, loaded.model_id, config)
    held_out = ProseTasks(
        loaded.tokenizer, cached_stream(loaded.tokenizer, loaded.model_id, config, "validation")
    )
    run = Run(
        armt,
        Path(out),
        lambda rng, stage, S, n: tasks.batch(stage.task, rng, stage, S, n),
        lambda rng, stage, S, n: held_out.batch("recall", rng, stage, S, n),
        log=log if rank == 0 else (lambda _: None),
        rank=rank,
        world=world,
        extra_meta={"model_id": loaded.model_id},
    )
    try:
        return train(config, run, max_steps)
    finally:
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def read_log(path: Path) -> tuple[list[dict], list[dict]]:
    """(step records, evaluation records) of a run's log.jsonl; a torn last line is ignored."""
    steps, evals = [], []
    for line in Path(path).read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        (evals if "eval_exact" in record else steps).append(record)
    return steps, evals


def plot(run_dir: Path, out: Path | None = None) -> Path:
    """curves.png: training loss (smoothed) and held-out exact recall per number of segments."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    log = Path(run_dir) / "log.jsonl"
    if not log.is_file():
        raise EdgememError(f"{run_dir} has no log.jsonl: not a training run")
    steps, evals = read_log(log)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    xs = [r["step"] for r in steps]
    ys = [r["loss"] for r in steps]
    k = 20
    smooth = [sum(ys[max(0, i - k + 1) : i + 1]) / len(ys[max(0, i - k + 1) : i + 1]) for i in range(len(ys))]
    left.plot(xs, ys, alpha=0.25, color="tab:blue")
    left.plot(xs, smooth, color="tab:blue")
    for r in steps:
        if r["step"] > 1 and r["stage"] != steps[xs.index(r["step"]) - 1]["stage"]:
            left.axvline(r["step"], color="grey", lw=0.5)
            left.text(r["step"], max(ys), r["stage"], fontsize=7, rotation=90, va="top")
    left.set(xlabel="step", ylabel="loss", title="training loss (20-step mean)")
    if evals:
        for n in sorted({n for r in evals for n in r["eval_exact"]}, key=int):
            pts = [(r["step"], r["eval_exact"][n]) for r in evals if n in r["eval_exact"]]
            right.plot(*zip(*pts, strict=True), marker="o", label=f"{n} segment(s)")
        right.legend()
    right.set(xlabel="step", ylabel="exact recall", ylim=(0, 1), title="held-out recall (validation split)")
    fig.tight_layout()
    target = out or Path(run_dir) / "curves.png"
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target
