#!/usr/bin/env python3
"""The training issue's two ablations, as runs of `edgemem train` that resume where they stopped.

    python scripts/train_ablations.py configs                        # write runs/ablations/<name>/config.toml
    python scripts/train_ablations.py run [--threads N] [--until STEP] [NAME ...]  # in order (resumable)
    python scripts/train_ablations.py run --seed N NAME ...          # a run again, in <name>-seedN
    python scripts/train_ablations.py run --prefix-seed P BRANCH ... # from prefix-*-seedP: <branch>-prefixP
    python scripts/train_ablations.py table [DIR] [--at STEP]        # recall at 2x and 8x the training length
    python scripts/train_ablations.py steps [DIR] [--at 100,200,300] # each branch's recall at those steps
    python scripts/train_ablations.py cost [LOG]                     # their step time, from a run's steps

Every run shares one short recipe, the shipped one's learnable start (SmolLM2-135M-Instruct, LoRA
r=16, the memory on the layer's input norm, every segment token writing; configs/train/
smollm2-135m.toml), cut in two:

- a **prefix** per memory placement (`prefix-<layers>`, 500 steps): the bootstrap stages on 1, 3
  then 7 digits (the needle at the end of one 64-token segment), then one 128-token segment with
  the needle anywhere; checked once at its end on one 128-token segment;
- a **branch** (300 steps) that starts from its prefix's adapter (`init`, a fresh optimizer) and
  trains the length stage: 2 written segments of 128 tokens (the training length L = 256 written
  tokens plus the tail). Recall is measured on the validation split at 2x and 8x L (4 and 16
  segments of 128 tokens, 8 and 32 of 64), 32 items each, every 100 steps.

- Layer selection: the memory in about 20% of the layers, placed low (0-5), middle (12-17), high
  (24-29) or spread from 40% depth (the default, 12-27), against every layer (0-29): one prefix
  and one branch (`layers-<placement>`) each.
- Segment length, all branches of `prefix-spread`: fixed 128 (`layers-spread`), fixed 64 (twice the
  segments: the same tokens), and stochastic 64/128 with p_short 0.5 and 0.75 (fixed at 128 for the
  last 10%); all at the same steps and tokens per step (a short segment keeps the document's
  length), so at equal compute.

The segment-length branches differ from the same 500-step start only in what they ablate, and
three of the eight full runs' first 500 steps are not repeated. Measured on the 2-core Zen 5 at one
thread beside one to three other jobs (`cost docs/train/ablations/<run>/log.jsonl`, first line):
a prefix 0.41-0.45 h of step time, the fixed-128 branch 0.96 h; about 10 h for all 13. On a
2-core AVX2 machine in float32: a prefix 0.94 h at two threads, a 64-token or stochastic branch
2.9 h for its 300 steps at one thread beside another (docs/train/ablations-avx2).
Run two `run --threads 1` processes side by side on a 2-core machine, each with its own names.

One run per cell says little about a ranking: `run --seed N` trains a run again on other batches
(`seed = N`), evaluated on the same held-out items (`eval_seed = 0`): a branch from the same prefix
adapter (`<branch>-seedN`), or a prefix (`prefix-<placement>-seedN`). `run --prefix-seed P` trains a
branch on its own batches from the prefix replicate `prefix-<placement>-seedP` (`<branch>-prefixP`):
a placement measured on two prefixes. `table` and `steps` list each replicate under its run.

Every run uses bf16 autocast where the machine runs bf16 natively, and recomputes each segment in
backward in the multi-segment stage (`checkpointing`: the same gradients, flat activation memory).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

from edgemem.cli_common import run_script

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "runs" / "ablations"

HEADER = """model = "smollm2-135m-instruct"
backbone = "lora"
lora_rank = 16
lora_alpha = 16.0
norm_inputs = true
write_source = "segment"
seed = 0
threads = 2
autocast = "auto"  # bf16 where the hardware has it natively, else float32
checkpoint_every = 10
eval_items = 32
{layers}
"""

PREFIX = """eval_every = 500
eval_segments = [1]

{bootstrap}
[[stage]]
name = "position"
task = "recall"
steps = 200
segment_len = 128
segments = [1]
tail = 32
"""

BRANCH = """eval_every = 100
eval_segments = [{eval_at}]
init = "{init}"

[[stage]]
name = "length"
task = "recall"
steps = 300
segment_len = {segment_len}
segments = [{segments}]
lr = 5e-4
checkpointing = true
{stochastic}"""

# Where the memory sits, as each config says it ("": the default, spread from 40% depth).
LAYERS = {
    "spread": "",
    "low": "memory_layers = [0, 1, 2, 3, 4, 5]",
    "middle": "memory_layers = [12, 13, 14, 15, 16, 17]",
    "high": "memory_layers = [24, 25, 26, 27, 28, 29]",
    "all": f"memory_layers = {list(range(30))}",
}

# The bootstrap stages (the needle at the end of one 64-token segment), 1 -> 3 -> 7 digits:
# (digits, warmup, min_lr_ratio), as in configs/train/smollm2-135m.toml.
BOOTSTRAP = ((1, 20, 0.5), (3, 10, 0.5), (7, 10, 0.3))


def bootstrap_stages() -> str:
    return "\n".join(
        f'[[stage]]\nname = "bootstrap-{digits}"\ntask = "recall"\nsteps = 100\nsegment_len = 64\n'
        f'segments = [1]\nneedle = "end"\nneedle_segment = "first"\ntail = 8\ndigits = {digits}\n'
        f"warmup = {warmup}\nmin_lr_ratio = {ratio}\n"
        for digits, warmup, ratio in BOOTSTRAP
    )


REPLICA = re.compile(r"(?P<run>.+?)(?:-prefix(?P<prefix_seed>\d+))?(?:-seed(?P<seed>\d+))?")


def split_replica(name: str) -> tuple[str, int, int]:
    """(the run a name replicates, its prefix's seed, its seed): "layers-middle-seed1" ->
    ("layers-middle", 0, 1), "layers-middle-prefix2" -> ("layers-middle", 2, 0)."""
    match = REPLICA.fullmatch(name)
    assert match is not None  # every part but the run is optional
    return match["run"], int(match["prefix_seed"] or 0), int(match["seed"] or 0)


def prefix_of(name: str) -> str | None:
    """The prefix run a branch (or a replicate of one) starts from (None for a prefix):
    `<branch>-prefix<P>` starts from the prefix's replicate `prefix-<placement>-seed<P>`."""
    run, prefix_seed, _ = split_replica(name)
    if run.startswith("prefix-"):
        return None
    prefix = "prefix-" + (run.removeprefix("layers-") if run.startswith("layers-") else "spread")
    return f"{prefix}-seed{prefix_seed}" if prefix_seed else prefix


def replica_name(name: str, seed: int, prefix_seed: int = 0) -> str:
    """The folder of `name`'s replicate (`split_replica` reads it back):
    `<name>[-prefix<P>][-seed<N>]`."""
    return name + (f"-prefix{prefix_seed}" if prefix_seed else "") + (f"-seed{seed}" if seed else "")


def replicate(name: str, text: str, seed: int, prefix_seed: int = 0) -> tuple[str, str]:
    """A run again. `prefix_seed` P (a branch): from the adapter of its prefix's replicate under
    seed P, in `<name>-prefix<P>`. `seed` N: on other batches (`seed = N`) with the same held-out
    items (`eval_seed = 0`), in `<name>-seed<N>` (after -prefix<P> when both are given)."""
    if prefix_seed:
        prefix = prefix_of(name)
        assert prefix is not None, f"{name} is a prefix: it starts from no prefix"
        init = f'init = "runs/ablations/{prefix}/adapter.safetensors"'
        assert init in text
        text = text.replace(init, init.replace(f"/{prefix}/", f"/{prefix}-seed{prefix_seed}/"))
    if seed:
        assert "\nseed = 0\n" in text
        text = text.replace("\nseed = 0\n", f"\nseed = {seed}\neval_seed = 0\n")
    return replica_name(name, seed, prefix_seed), text


def variants() -> dict[str, str]:
    """Every run's config, prefixes first (a branch needs its prefix's finished adapter)."""

    def prefix(layers: str) -> str:
        return HEADER.format(layers=LAYERS[layers]) + PREFIX.format(bootstrap=bootstrap_stages())

    def branch(layers: str, segment_len: int = 128, segments: int = 2, stochastic: str = "") -> str:
        scale = 128 // segment_len  # evaluate at the same document lengths: 2x and 8x L
        return HEADER.format(layers=LAYERS[layers]) + BRANCH.format(
            eval_at=f"{4 * scale}, {16 * scale}",
            init=f"runs/ablations/prefix-{layers}/adapter.safetensors",
            segment_len=segment_len,
            segments=segments,
            stochastic=stochastic,
        )

    out = {f"prefix-{layers}": prefix(layers) for layers in LAYERS}
    out |= {f"layers-{layers}": branch(layers) for layers in LAYERS}  # layers-spread: fixed 128
    out["segment-fixed-64"] = branch("spread", segment_len=64, segments=4)
    for p in (0.5, 0.75):
        out[f"segment-stochastic-{p}"] = branch(
            "spread", stochastic=f"short_segment_len = 64\np_short = {p}\n"
        )
    return out


def write_configs(seed: int = 0, prefix_seed: int = 0) -> dict[str, Path]:
    """Every run's config on disk; with `seed` and / or `prefix_seed`, their replicates instead
    (a prefix has no prefix to replicate: `prefix_seed` replicates the branches only)."""
    texts = variants()
    if seed or prefix_seed:
        texts = dict(
            replicate(name, text, seed, prefix_seed)
            for name, text in texts.items()
            if not prefix_seed or prefix_of(name) is not None
        )
    paths = {}
    for name, text in texts.items():
        folder = OUT / name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "config.toml"
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
        paths[name] = path
    return paths


def finished_steps(name: str) -> int:
    """The step a run's adapter was last written at (0: none yet)."""
    from safetensors import safe_open

    adapter = OUT / name / "adapter.safetensors"
    if not adapter.is_file():
        return 0
    with safe_open(str(adapter), framework="pt") as handle:
        return int((handle.metadata() or {}).get("train_steps", 0))


def run(
    names: list[str], threads: int | None, until: int | None = None, seed: int = 0, prefix_seed: int = 0
) -> None:
    """Train `names` in order. `until`: stop each branch at that step (a checkpoint the same
    command resumes from later): the branches compared at an equal step, when time is short.
    `seed`, `prefix_seed`: the named runs' replicates (`replicate`)."""
    import tomllib

    from edgemem.train import TrainConfig

    paths = write_configs()
    targets = write_configs(seed, prefix_seed) if seed or prefix_seed else paths
    for given in names or [split_replica(n)[0] for n in targets]:
        name = replica_name(given, seed, prefix_seed)
        if name not in targets:
            kind = f"ablation run {given!r}"
            if prefix_seed:
                kind = f"ablation branch {given!r} to start from a prefix replicate"
            elif seed:
                kind += " to replicate"
            sys.exit(f"no {kind} (choose from {', '.join(split_replica(n)[0] for n in targets)})")
        prefix = prefix_of(name)
        if prefix is not None:
            prefix_run, _, its_seed = split_replica(prefix)
            need = TrainConfig.from_dict(tomllib.loads(paths[prefix_run].read_text())).total_steps
            if finished_steps(prefix) < need:
                how = f"run --seed {its_seed} {prefix_run}" if its_seed else "run it"
                sys.exit(f"{name} starts from {prefix}, which has not finished ({need} steps): {how} first")
        cmd = [sys.executable, "-m", "edgemem.cli", "train", str(targets[name]), "--out", str(OUT / name)]
        cmd += ["--threads", str(threads)] if threads else []
        if until is not None and prefix is not None:
            done = finished_steps(name)
            if done >= until:
                print(f"{name}: at step {done} already (--until {until})", flush=True)
                continue
            cmd += ["--max-steps", str(until - done)]
        print("+", " ".join(cmd), flush=True)
        train_one(cmd, name)


def train_one(cmd: list[str], name: str) -> None:
    """Run one `edgemem train` to its end. A SIGTERM to this script stops it too: left running, the
    training would go on without the script (and hold its folder's lock). Ctrl-C reaches both
    processes (one process group): the script waits for the training to stop, then says so in one
    line instead of a traceback."""
    child = subprocess.Popen(cmd, cwd=ROOT)
    previous = signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    try:
        code = child.wait()
    except KeyboardInterrupt:
        code = child.wait()
        sys.exit(f"{name}: interrupted (edgemem train exit status {code}); the same command resumes it")
    finally:
        signal.signal(signal.SIGTERM, previous)
    if code != 0:
        sys.exit(f"{name}: edgemem train stopped (exit status {code})")


def reported(root: Path) -> list[str]:
    """Every run in the configs' order, each followed by its replicates under `root` that have
    started (a log), by prefix seed then seed."""
    names = []
    for name in variants():
        names.append(name)
        found = [p.parent.name for p in root.glob(f"{name}-*/log.jsonl")]
        names += sorted((n for n in found if split_replica(n)[0] == name), key=split_replica)
    return names


def evals(name: str, root: Path = OUT) -> list[dict]:
    log = root / name / "log.jsonl"
    if not log.is_file():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if "eval_exact" in line]


def short_long(eval_exact: dict[str, float]) -> tuple[float, float]:
    """A branch evaluation's recall at 2x and 8x L (its two segment counts, keyed as strings)."""
    short, long = sorted(eval_exact.items(), key=lambda kv: int(kv[0]))
    return short[1], long[1]


def table(root: Path = OUT, at: int | None = None) -> None:
    """Each branch's last evaluation (the step it was at), or its evaluation at step `at` (branches
    compared at equal compute while some run on; one not there yet shows its last, marked), and its
    prefix's recall from one 128-token segment at the prefix's end, from the run folders under
    `root` (or copies of their logs, as docs/train/ablations keeps them)."""
    print("| run | from | prefix recall, 1 x 128 | steps | recall at 2x L (512 tokens) ", end="")
    print("| recall at 8x L (2,048 tokens) |")
    print("|---|---|---:|---:|---:|---:|")
    for name in reported(root):
        prefix = prefix_of(name)
        if prefix is None:
            continue
        start = evals(prefix, root)
        start_recall = f"{start[-1]['eval_exact']['1']:.2f}" if start else "not run"
        own = evals(name, root)
        if not own:
            print(f"| {name} | {prefix} | {start_recall} | - | not run | not run |")
            continue
        chosen = [r for r in own if r["step"] == at]
        last = chosen[-1] if chosen else own[-1]
        steps = f"{last['step']}" if at is None or chosen else f"{last['step']} (not at {at} yet)"
        short, long = short_long(last["eval_exact"])
        print(f"| {name} | {prefix} | {start_recall} | {steps} | {short:.2f} | {long:.2f} |")


def steps_table(root: Path, at: list[int]) -> None:
    """One row per branch that has run, a column per step in `at`: its recall at 2x / 8x L there
    (the training curve of each branch side by side; "-" where it has not evaluated that step)."""
    print("| branch (recall at 2x / 8x L) | from | " + " | ".join(f"step {s}" for s in at) + " |")
    print("|---|---|" + "---:|" * len(at))
    for name in reported(root):
        prefix = prefix_of(name)
        own = {r["step"]: r["eval_exact"] for r in evals(name, root)} if prefix else {}
        if not own:
            continue
        cells = ["{:.2f} / {:.2f}".format(*short_long(own[step])) if step in own else "-" for step in at]
        print(f"| {name} | {prefix} | " + " | ".join(cells) + " |")


def cost(log: Path) -> None:
    """Project each configuration's step time from a run's log: every step's (segment length,
    segments), drawn as training draws it (`batch_shape`), costs the log's median seconds for that
    shape. Shapes the log never ran are counted, not guessed. `layers-all` puts memory in 30 layers
    instead of 6, so its projection is a lower bound."""
    import statistics
    import tomllib

    from edgemem.train import TrainConfig, batch_shape

    times: dict[tuple[int, int], list[float]] = {}
    rss, tokens = [], 0
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        if "seconds" in rec:
            times.setdefault((rec["segment_len"], rec["segments"]), []).append(rec["seconds"])
            rss += [rec["peak_rss_mb"]] if "peak_rss_mb" in rec else []
            tokens += rec.get("tokens", 0)
    median = {shape: statistics.median(v) for shape, v in times.items()}
    steps, seconds = sum(map(len, times.values())), sum(map(sum, times.values()))
    print(f"the run: {steps} steps, {seconds / 3600:.2f} h of step time, {tokens:,} tokens")
    if rss:
        print(f"peak RSS of the run: {max(rss)} MB ({len(rss)} steps record it)")
    print(f"median seconds per step in {log}:")
    for (S, n), v in sorted(times.items()):
        print(f"  {n} x {S} tokens: {median[S, n]:.1f} s ({len(v)} steps)")
    total = 0.0
    for name, text in variants().items():
        config = TrainConfig.from_dict(tomllib.loads(text))
        shapes = [batch_shape(config, step) for step in range(config.total_steps)]
        seconds = sum(median.get(shape, 0.0) for shape in shapes)
        missing = sum(shape not in median for shape in shapes)
        total += seconds
        note = f", {missing} steps of shapes the log never ran" if missing else ""
        print(f"{name}: {config.total_steps} steps, {seconds / 3600:.1f} h{note}")
    print(f"all: at least {total / 3600:.1f} h of step time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = ("configs", "run", "table", "steps", "cost")
    parser.add_argument("command", nargs="?", default="table", choices=commands)
    parser.add_argument("names", nargs="*", help="run: these runs (default: all, in order); cost: a log")
    parser.add_argument("--threads", type=int, default=None, help="run: torch threads per run")
    parser.add_argument("--until", type=int, default=None, help="run: stop each branch at this step")
    parser.add_argument(
        "--seed", type=int, default=0, help="run, configs: the runs' replicates under this seed"
    )
    parser.add_argument(
        "--prefix-seed",
        type=int,
        default=0,
        help="run, configs: the branches from their prefix's replicate under this seed",
    )
    parser.add_argument(
        "--at",
        default=None,
        help="table: each branch's evaluation at this step; steps: these steps (100,200,300)",
    )
    args = parser.parse_intermixed_args()
    for option, value in (("--seed", args.seed), ("--prefix-seed", args.prefix_seed)):
        if value < 0:
            sys.exit(f"{option} takes a seed of 1 or more (0: the runs themselves), not {value}")
    if args.command == "configs":
        for name, path in write_configs(args.seed, args.prefix_seed).items():
            print(name, path)
    elif args.command == "run":
        run(args.names, args.threads, args.until, args.seed, args.prefix_seed)
    elif args.command in ("table", "steps"):
        root = Path(args.names[0]) if args.names else OUT
        try:
            at = [int(step) for step in args.at.split(",")] if args.at else []
        except ValueError:
            sys.exit(f"--at takes step numbers (100 or 100,200,300), not {args.at!r}")
        if args.command == "steps":
            steps_table(root, at or [100, 200, 300])
        elif len(at) > 1:
            sys.exit("table --at takes one step; `steps --at 100,200,300` compares several")
        else:
            table(root, at[0] if at else None)
    else:
        default = ROOT / "docs" / "train" / "smollm2-135m" / "log.jsonl"
        cost(Path(args.names[0]) if args.names else default)


if __name__ == "__main__":
    run_script(main)
