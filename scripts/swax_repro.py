"""SWAX at CPU scale: fixed short, fixed long and stochastic windows, several seeds, one thread.

    OMP_WAIT_POLICY=PASSIVE nice -n 10 python scripts/swax_repro.py run      # train + evaluate, resumable
    python scripts/swax_repro.py cross      # bits per byte of every finished model with both windows
    python scripts/swax_repro.py report     # table + plot from the results

`run` trains every (schedule, seed) pair in order seed by seed, each in its own folder under
--workdir (a safetensors checkpoint every 100 steps and a JSONL log; the same command run again
continues where it stopped), evaluates it, and appends one JSON line per finished pair to
docs/swax_repro.jsonl; then it runs `cross` and `report`. `report` writes the table between the
`swax-table` markers of docs/RESULTS.md and the plot docs/swax_repro.png.

Setting (see docs/RESULTS.md): byte vocabulary (256), real prose (train split of linux-doc,
python-doc, gnu-manuals), every training sequence a niah item, sequence length L = 256, windows L/16 = 16 and
L/2 = 128; niah accuracy at L..16L on test-split prose, bits per byte on validation-split prose.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from edgemem.cli_common import run_script
from edgemem.data import corpora
from edgemem.data.tasks import PROSE, item_depth
from edgemem.paths import data_dir
from edgemem.swax import SwaxConfig, WindowSchedule
from edgemem.swax_train import (
    ByteStream,
    TrainConfig,
    answer_scores,
    append_jsonl,
    bits_per_byte,
    load_checkpoint,
    needle_key_value,
    new_model,
    niah_overhead,
    niah_sequence,
    read_jsonl,
    train,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "swax_repro.jsonl"
PLOT = ROOT / "docs" / "swax_repro.png"
DOC = ROOT / "docs" / "RESULTS.md"
BEGIN, END = "<!-- swax-table:begin -->", "<!-- swax-table:end -->"

L = 256
SHORT, LONG = L // 16, L // 2
SCHEDULES = {  # name -> probability of the short window (1: fixed short, 0: fixed long)
    "fixed-short": 1.0,
    "fixed-long": 0.0,
    "stochastic-p0.5": 0.5,
    "stochastic-p0.75": 0.75,
}
MODEL = SwaxConfig(
    vocab_size=256, d_model=128, n_layers=4, n_heads=4, window=SHORT, recurrent="mlstm", chunk=64
)
TRAIN = TrainConfig(steps=500, batch=8, length=L, lr=3e-3, warmup=50, needle_frac=1.0, answer_weight=1.0)
MULTIPLES = (1, 2, 4, 8, 16)
NIAH_ITEMS = 24
PPL_SEQS = 64


def texts(split: str, limit: int) -> list[str]:
    """Documents of the prose corpora in `split`, at most `limit` characters per source."""
    out = []
    for source in PROSE:
        size = 0
        for row in corpora.load(source, split):
            out.append(row["text"])
            size += len(row["text"])
            if size >= limit:
                break
    return out


def schedule_of(name: str, steps: int) -> WindowSchedule:
    p = SCHEDULES[name]
    return WindowSchedule(SHORT, LONG, p, steps)


def niah_items(stream: ByteStream, multiple: int, n: int) -> list[tuple[bytes, int, int]]:
    """n items of multiple * L input bytes (+ 1), needle depths on the golden-ratio sequence;
    seeded by (multiple, index) only, so every model meets the same items."""
    items = []
    for i in range(n):
        gen = torch.Generator().manual_seed(1_000 * multiple + i)
        key, value = needle_key_value(gen)
        hay = stream.window(multiple * L + 1 - niah_overhead(), gen)
        items.append(niah_sequence(hay, key, value, item_depth(i)))
    return items


def evaluate(model: torch.nn.Module, window: int, test: ByteStream, valid: ByteStream) -> dict:
    out: dict = {"window_eval": window, "niah": {}, "niah_digits": {}, "niah_beyond_window": {}}
    for mult in MULTIPLES:
        items = niah_items(test, mult, NIAH_ITEMS)
        scores: list[tuple[bool, float]] = []
        batch = max(1, 16 // mult)
        for a in range(0, len(items), batch):
            chunk = items[a : a + batch]
            scores += answer_scores(model, [s for s, _, _ in chunk], [ans for _, _, ans in chunk], window)
        correct = [c for c, _ in scores]
        far = [c for c, (_, at, ans) in zip(correct, items, strict=True) if ans - at > window]
        out["niah"][str(mult * L)] = sum(correct) / len(correct)
        out["niah_digits"][str(mult * L)] = sum(d for _, d in scores) / len(scores)
        out["niah_beyond_window"][str(mult * L)] = [sum(far), len(far)]
    gen = torch.Generator().manual_seed(7)
    out["bpb"] = bits_per_byte(model, [valid.window(L + 1, gen) for _ in range(PPL_SEQS)], window)
    return out


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    steps = args.steps or TRAIN.steps
    done = {(r["schedule"], r["seed"]) for r in _rows(args.results, steps, args.recurrent)}
    print("loading corpora ...", flush=True)
    train_stream = ByteStream(texts("train", 4_000_000))
    test_stream = ByteStream(texts("test", 2_000_000))
    valid_stream = ByteStream(texts("validation", 2_000_000))
    for seed in range(args.seeds):
        for name in args.schedules:
            if (name, seed) in done:
                continue
            cfg = TrainConfig(**{**asdict(TRAIN), "steps": steps, "seed": seed})
            sched = schedule_of(name, steps)
            suffix = "" if args.recurrent == "mlstm" else f"-{args.recurrent}"
            workdir = args.workdir / f"{name}-s{seed}-{steps}{suffix}"
            config = replace(
                MODEL, window=sched.final_window, recurrent=args.recurrent
            )  # the window it ends with
            model = new_model(config, seed)
            t0 = time.perf_counter()
            records = train(
                model, train_stream, sched, cfg, workdir, log=lambda r, n=name, s=seed: _show(n, s, r)
            )
            train_s = time.perf_counter() - t0
            ckpt = workdir / "ckpt.safetensors"
            load_checkpoint(ckpt, model)  # what is evaluated is what the checkpoint holds
            t1 = time.perf_counter()
            with torch.no_grad():
                result = evaluate(model.eval(), sched.final_window, test_stream, valid_stream)
            shorts = sum(1 for s in range(steps) if sched.window(s, _rng(seed, s)) == SHORT)
            result.update(
                schedule=name,
                seed=seed,
                steps=steps,
                p_short=SCHEDULES[name],
                short_window_steps=shorts,
                train_s=records[-1]["elapsed_s"] if records else round(train_s, 1),
                eval_s=round(time.perf_counter() - t1, 1),
                params=model.num_parameters(),
                model=json.loads(model.config.to_json()),
                train=json.loads(cfg.to_json()),
                checkpoint=str(ckpt),
                machine=f"{platform.processor() or platform.machine()}, torch {torch.__version__}, 1 thread",
                date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            )
            append_jsonl(args.results, result)
            print(
                json.dumps({k: result[k] for k in ("schedule", "seed", "niah", "bpb", "eval_s")}), flush=True
            )
    if args.results == RESULTS:
        cross(args)
        report(args)


def _rows(results: Path, steps: int, recurrent: str) -> list[dict]:
    """Finished runs of this step count and recurrent layer (rows without the field are mLSTM)."""
    return [
        r
        for r in read_jsonl(results)
        if r["steps"] == steps and r.get("model", {}).get("recurrent", "mlstm") == recurrent
    ]


def _rng(seed: int, step: int):
    from edgemem.swax_train import step_rng

    return step_rng(seed, step)


def _show(name: str, seed: int, rec: dict) -> None:
    if rec["step"] % 100 == 0:
        ans = f"{rec['answer']:.3f}" if "answer" in rec else "-"
        print(
            f"{name} s{seed} step {rec['step']} W={rec['window']} lm {rec['lm']:.3f} answer {ans}", flush=True
        )


def _mean_sd(values: list[float], scale: float = 1.0, digits: int = 0) -> str:
    if not values:
        return "-"
    m = statistics.mean(values) * scale
    sd = statistics.stdev(values) * scale if len(values) > 1 else 0.0
    return f"{m:.{digits}f} ± {sd:.{digits}f}"


def cross(args: argparse.Namespace) -> None:
    """Bits per byte of every finished model with both windows (16 and 128), whatever it ended
    training with: appended to docs/swax_repro_bpb.jsonl, read by `report`."""
    torch.set_num_threads(1)
    out = args.results.with_name(args.results.stem + "_bpb.jsonl")
    have = {(r["schedule"], r["seed"], r["steps"], r["recurrent"]) for r in read_jsonl(out)}
    valid = ByteStream(texts("validation", 2_000_000))
    for r in _rows(args.results, args.steps or TRAIN.steps, args.recurrent):
        if (r["schedule"], r["seed"], r["steps"], args.recurrent) in have:
            continue
        model = new_model(SwaxConfig(**r["model"]), 0)
        load_checkpoint(Path(r["checkpoint"]), model)
        model.eval()
        gen = torch.Generator().manual_seed(7)  # the same sequences as `evaluate`
        seqs = [valid.window(L + 1, gen) for _ in range(PPL_SEQS)]
        bpb = {str(w): bits_per_byte(model, seqs, w) for w in (SHORT, LONG)}
        rec = {"schedule": r["schedule"], "seed": r["seed"], "steps": r["steps"], "recurrent": args.recurrent}
        rec.update(bpb=bpb, date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"))
        append_jsonl(out, rec)
        print(json.dumps(rec), flush=True)


def report(args: argparse.Namespace) -> None:
    rows = _rows(args.results, args.steps or TRAIN.steps, args.recurrent)
    if not rows:
        sys.exit("no results yet: run `python scripts/swax_repro.py run` first")
    names = [n for n in SCHEDULES if any(r["schedule"] == n for r in rows)]
    lengths = [str(m * L) for m in MULTIPLES]
    head = "| schedule | eval window | seeds | " + " | ".join(f"niah {n}" for n in lengths)
    head += " | bits/byte (val, 256) | train min / run |"
    lines = [head, "|" + "---|" * (len(lengths) + 5)]
    digits = [
        "| schedule | " + " | ".join(f"digits {n}" for n in lengths) + " |",
        "|" + "---|" * (len(lengths) + 1),
    ]
    for name in names:
        rs = [r for r in rows if r["schedule"] == name]
        cells = [_mean_sd([r["niah"][n] for r in rs], 100) for n in lengths]
        train_min = statistics.mean(r["train_s"] / 60 for r in rs)
        lines.append(
            f"| {name} | {rs[0]['window_eval']} | {len(rs)} | "
            + " | ".join(cells)
            + f" | {_mean_sd([r['bpb'] for r in rs], 1, 3)} | {train_min:.1f} |"
        )
        digits.append(
            f"| {name} | "
            + " | ".join(_mean_sd([r["niah_digits"][n] for r in rs], 100) for n in lengths)
            + " |"
        )
    lines += ["", "Share of answer digits right (teacher forcing; chance is about 10%):", "", *digits]
    bpb_rows = [
        r
        for r in read_jsonl(args.results.with_name(args.results.stem + "_bpb.jsonl"))
        if r["steps"] == (args.steps or TRAIN.steps) and r["recurrent"] == args.recurrent
    ]
    if bpb_rows:
        lines += ["", "Bits per byte with either window (`python scripts/swax_repro.py cross`):", ""]
        lines += [f"| schedule | seeds | W = {SHORT} | W = {LONG} |", "|---|---|---|---|"]
        for name in names:
            rs = [r for r in bpb_rows if r["schedule"] == name]
            if rs:
                cells = [_mean_sd([r["bpb"][str(w)] for r in rs], 1, 3) for w in (SHORT, LONG)]
                lines.append(f"| {name} | {len(rs)} | " + " | ".join(cells) + " |")
    r0 = rows[0]
    kind = "mLSTM" if args.recurrent == "mlstm" else "Gated DeltaNet"
    suffix = "" if args.recurrent == "mlstm" else f"-{args.recurrent}"
    begin, end = (
        BEGIN.replace("swax-table", f"swax{suffix}-table"),
        END.replace("swax-table", f"swax{suffix}-table"),
    )
    note = (
        f"niah: % of {NIAH_ITEMS} items per length with all 4 answer digits right (greedy), "
        "mean ± sd over seeds. "
        f"Model: {r0['params']:,} parameters, byte vocabulary, d={MODEL.d_model}, {MODEL.n_layers} layers "
        f"(SWA/{kind} 1:1), {r0['steps']} steps x {TRAIN.batch} x {L} bytes per run. "
        f"{r0['machine']}; last result {max(r['date'] for r in rows)}. "
        "Regenerate: `python scripts/swax_repro.py run` (then `report`)."
    )
    table = "\n".join([begin, "", *lines, "", note, "", end])
    text = DOC.read_text()
    if begin in text:
        text = text[: text.index(begin)] + table + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + table + "\n"
    DOC.write_text(text)
    _plot(rows, names, lengths, PLOT.with_name(f"swax_repro{suffix}.png"))
    print("\n".join(lines))


def _plot(rows: list[dict], names: list[str], lengths: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, dx, bx) = plt.subplots(1, 3, figsize=(13, 3.8), gridspec_kw={"width_ratios": [2, 2, 1]})
    xs = [int(n) for n in lengths]
    for i, name in enumerate(names):
        rs = [r for r in rows if r["schedule"] == name]
        for axis, key in ((ax, "niah"), (dx, "niah_digits")):
            ms = [statistics.mean(r[key][n] for r in rs) * 100 for n in lengths]
            sds = [statistics.stdev([r[key][n] * 100 for r in rs]) if len(rs) > 1 else 0 for n in lengths]
            axis.errorbar(xs, ms, yerr=sds, marker="o", capsize=3, label=name, color=f"C{i}")
        b = [r["bpb"] for r in rs]
        bx.bar(i, statistics.mean(b), yerr=statistics.stdev(b) if len(b) > 1 else 0, capsize=3, color=f"C{i}")
    for axis, label in ((ax, "niah: whole answer right (%)"), (dx, "niah: answer digits right (%)")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(xs, [str(x) for x in xs])
        axis.axvline(L, color="grey", lw=0.8, ls=":")
        axis.set_xlabel("niah length (bytes; trained at 256)")
        axis.set_ylabel(label)
        axis.set_ylim(-3, 103)
    ax.legend(fontsize=8)
    bx.set_xticks(
        range(len(names)), [n.replace("stochastic-", "stoch ") for n in names], rotation=20, fontsize=8
    )
    bx.set_ylabel("bits per byte (validation, 256)")
    lo = min(r["bpb"] for r in rows)
    bx.set_ylim(lo - 0.15, max(r["bpb"] for r in rows) + 0.1)
    fig.suptitle("SWAX at CPU scale: windows 16 / 128, L = 256, mean ± sd over seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["run", "report", "cross"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=list(SCHEDULES))
    parser.add_argument(
        "--steps", type=int, default=0, help=f"training steps per run (default {TRAIN.steps})"
    )
    parser.add_argument("--recurrent", choices=["mlstm", "gdn"], default="mlstm", help="the recurrent layer")
    parser.add_argument("--workdir", type=Path, default=data_dir() / "swax-repro")
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="JSONL of finished runs (the report reads it)"
    )
    args = parser.parse_args()
    {"run": run, "report": report, "cross": cross}[args.command](args)


if __name__ == "__main__":
    run_script(main)
