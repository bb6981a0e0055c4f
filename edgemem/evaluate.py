"""The evaluation harness: any method on the same items, one JSONL line per item, a summary, a plot.

    edgemem eval --task niah --lengths 1k,2k,4k --method armt -n 20
    edgemem eval plot

Results live in one folder (default `docs/eval/`), `<model>/<task>.<method>.jsonl`. A run appends
and skips items already there, so an interrupted sweep resumes where it stopped. Each line holds
the prediction, gold, correct, the tokens of the item and those the method computed, seconds,
the process's peak RSS so far, and the memory the method holds for the context next to the KV
cache full attention over the whole context would need.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edgemem.data.tasks import LENGTHS, Builder, Item
from edgemem.errors import EdgememError
from edgemem.files import require_file, try_lock
from edgemem.scoring import Score, score

if TYPE_CHECKING:
    import torch

    from edgemem.methods import Prediction

DEFAULT_RESULTS = Path("docs/eval")
# The splits an eval draws items from: `test` (the reported figures) and `validation` (for choosing
# between adapters, so the test items are not what a choice was fitted to). Training draws `train`.
EVAL_SPLITS = ("test", "validation")
# The adapter of armt lines run with a fresh memory (and of lines from before it was recorded).
UNTRAINED = "untrained"
MAX_NEW_TOKENS = {"niah": 32, "niah-mk": 32, "niah-mv": 96, "vt": 64, "docqa": 8, "types": 16}
TABLE_BEGIN, TABLE_END = "<!-- eval-table:begin -->", "<!-- eval-table:end -->"


def parse_lengths(text: str) -> list[int]:
    """ "1k,2k,64k" or "1024,2048" -> [1024, 2048, 65536]; only the task bins are allowed."""
    out = []
    for part in filter(None, (p.strip().lower() for p in text.split(","))):
        try:
            value = int(float(part[:-1]) * 1024) if part.endswith("k") else int(part)
        except ValueError:
            raise EdgememError(f"bad length {part!r}: use numbers like 1k,2k,4k or 1024") from None
        if value not in LENGTHS:
            raise EdgememError(
                f"length {part} is not a bin: choose from {', '.join(f'{n // 1024}k' for n in LENGTHS)}"
            )
        out.append(value)
    if not out:
        raise EdgememError("no lengths given")
    return sorted(set(out))


def method_label(
    method: str,
    engine: str,
    segment_len: int | None = None,
    answer_window: int | None = None,
    split: str = "test",
    segment_align: int | None = None,
) -> str:
    """The results file's and the table's name for a run: `armt` (`armt-s64` read in 64-token
    segments instead of the adapter's own, `armt-a0` in fixed segments instead of the adapter's
    sentence-aligned ones, `armt-w768` with an answer window of 768 tokens instead of the adapter's
    own, `armt-s64-a0-w768` all three), `window` (llama.cpp) or `window-hf`, ...; on the
    validation split's items `-val` after it (`armt-val`, `window-val`): item ids do not name their
    split, so its lines need their own file and row."""
    if split not in EVAL_SPLITS:
        raise EdgememError(f"unknown split {split!r}: evaluate on {' or '.join(EVAL_SPLITS)}")
    val = "-val" if split == "validation" else ""
    if method == "armt":
        segments = f"-s{segment_len}" if segment_len is not None else ""
        align = f"-a{segment_align}" if segment_align is not None else ""
        window = f"-w{answer_window}" if answer_window is not None else ""
        return "armt" + segments + align + window + val
    if segment_len is not None:
        raise EdgememError(f"--segment-len is for armt only, not {method}")
    if segment_align is not None:
        raise EdgememError(f"--segment-align is for armt only, not {method}")
    if answer_window is not None:
        raise EdgememError(f"--answer-window is for armt only, not {method}")
    return (method if engine == "llama" else f"{method}-{engine}") + val


def is_armt(label: str) -> bool:
    """A results label of the memory (`armt`, `armt-s64`, `armt-w768`, `armt-val`), whose lines are
    kept apart by memory."""
    return label == "armt" or label.startswith("armt-")


def _model_dir_name(model: str) -> str:
    return Path(model).stem if ("/" in model or model.endswith(".gguf")) else model


def results_file(results: Path, model: str, task: str, label: str) -> Path:
    return results / _model_dir_name(model) / f"{task}.{label}.jsonl"


def adapter_id(model: str, adapter: str | None) -> str:
    """Which memory an `armt` run uses: the first 16 hex digits of the sha256 of its adapter file
    (the one given, else the one shipped for the model), or UNTRAINED. Recorded on every armt
    line, so items run with another memory are neither skipped on resume nor mixed in a row."""
    from edgemem.files import sha256_file

    path = _adapter_path(model, adapter)
    return UNTRAINED if path is None else sha256_file(path)[:16]


def _adapter_path(model: str, adapter: str | None) -> Path | None:
    """The adapter file an armt run loads (the one given, else the one shipped), None: untrained."""
    from edgemem.assistant import shipped_adapter
    from edgemem.models import REGISTRY

    path = Path(adapter).expanduser() if adapter else (shipped_adapter(model) if model in REGISTRY else None)
    if path is not None:
        require_file(path, "adapter")
    return path


def answer_window_of(model: str, adapter: str | None, override: int | None = None) -> int:
    """The answer window an armt run answers with: `override`, else its adapter's (0 untrained)."""
    from edgemem.armt import read_adapter

    if override is not None:
        return override
    path = _adapter_path(model, adapter)
    return 0 if path is None else read_adapter(path)[0].answer_window


# How armt answers, recorded on its lines: since the tail is written before answering
# (`armt.answer_state`), lines without it are an older answer path and run again.
ARMT_ANSWER = "tail-written"


def armt_answer(answer_window: int) -> str:
    """The `answer` an armt line records: `tail-written`, or `window768-unwritten` when the context's
    last 768 tokens or fewer were left unwritten beside the question (`ARMTConfig.answer_window`)."""
    return f"window{answer_window}-unwritten" if answer_window else ARMT_ANSWER


def memory_key(record: dict) -> str:
    """Which memory, answered how, made an armt line: its adapter id, plus `+<answer>` where the line
    records one (lines before the tail was written record none)."""
    answer = record.get("answer")
    return record.get("adapter", UNTRAINED) + (f"+{answer}" if answer else "")


def _done_ids(path: Path, adapter: str | None = None, corpora: str | None = None) -> set[str]:
    """Ids already in a results file (for armt, `adapter` given: only those with that `memory_key`;
    `corpora` given: not those a line says another corpora build made, as an id fixes the needle but
    the build fixes the haystack around it; lines from before builds were recorded still count)."""
    if not path.is_file():
        return set()
    done = set()
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
            if adapter is not None and memory_key(record) != adapter:
                continue
            if corpora is not None and record.get("corpora", corpora) != corpora:
                continue
            done.add(record["id"])
        except (json.JSONDecodeError, KeyError, AttributeError):
            continue  # a line cut by a kill: that item runs again
    return done


def _latest_build(records: list[dict]) -> list[dict]:
    """The lines of one row's method: those of the latest corpora build any of them records, and
    those that record none (from before builds were recorded)."""
    builds = [r["corpora"] for r in records if "corpora" in r]
    return [r for r in records if r.get("corpora", builds[-1]) == builds[-1]] if builds else records


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


@dataclass
class RunReport:
    path: Path
    ran: int
    skipped: int  # already in the results file when the run began
    correct: int
    elsewhere: int = 0  # left to another run of the same bin beside this one (or written by it meanwhile)


def fix_mmap_threshold(threshold: int = 128 * 1024) -> bool:
    """Pin glibc's mmap threshold so freed large tensors go back to the OS at once.

    glibc raises the threshold dynamically after large frees; a long run then keeps freed
    activations in the heap and its peak RSS measures the allocator, not the method
    (scripts/armt_eval_rss.py: 2.47 GB -> 1.15 GB on a 16k armt item). Same effect as
    MALLOC_MMAP_THRESHOLD_=131072. Returns False where there is no glibc.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return bool(libc and libc.mallopt(-3, threshold))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


def run(
    task: str,
    lengths: list[int],
    method: str,
    n: int,
    model: str,
    engine: str = "llama",
    adapter: str | None = None,
    results: Path = DEFAULT_RESULTS,
    log: Callable[[str], None] = print,
    items: Callable[[int], list[Item]] | None = None,
    dtype: torch.dtype | None = None,
    batch: int = 1,
    segment_len: int | None = None,
    corpora: str | None = None,
    answer_window: int | None = None,
    split: str = "test",
    segment_align: int | None = None,
) -> RunReport:
    """Run one method on `n` items per length bin of one task; append to its JSONL. `dtype`: the
    torch weights' dtype (None: the machine's preferred one); each line records the one used.
    `segment_len` (armt only): read in segments of that many tokens instead of the adapter's own;
    such runs have their own label and file (`armt-s64`), and every armt line records its length.
    `answer_window` (armt only): answer with that window instead of the adapter's own
    (`ARMTConfig.answer_window`); label `armt-w768`. Every armt line records how it answered
    (`answer`: `tail-written`, or `window768-unwritten`).
    `segment_align` (armt only): end segments after a sentence in their last N tokens instead of as
    the adapter does (0: fixed segments); label `armt-a0`; aligned lines record their N.
    `split`: `validation` draws the validation split's items (other documents and seeds) into their
    own file and row (`armt-val`); their lines record the split.
    `corpora`: the build `items` come from, where they are passed in (else the prepared corpora's);
    lines record it, and an item is done only for its build. Two runs of one bin into one results
    file (two processes, one per core) share its items: each claims the next item the other neither
    holds nor has written (`_claim`), so every item runs once, whichever process runs it.

    Items run deepest needle first, so each shares with the one before it all the haystack before
    its own needle (the armt prefix cache then skips that part). `batch` > 1 (armt only) ingests
    that many items side by side; each of their lines gets the batch's seconds divided among them.
    """
    from edgemem import methods
    from edgemem.models import load_tokenizer

    fix_mmap_threshold()
    label = method_label(method, engine, segment_len, answer_window, split, segment_align)
    path = results_file(results, model, task, label)
    memory = adapter_id(model, adapter) if method == "armt" else None
    armt_fields = {}
    if memory is not None:
        window = answer_window_of(model, adapter, answer_window)
        armt_fields = {"adapter": memory, "answer": armt_answer(window)}
    corpora_id = corpora
    if items is None:
        builder = Builder(load_tokenizer(model), split=split)
        corpora_id = builder.corpora_id(task)

        def items(length: int) -> list[Item]:
            return list(builder.build(task, length, n))

    if batch < 1 or (batch > 1 and method != "armt"):
        raise EdgememError(f"batch {batch}: items run side by side only with armt (batch 1 otherwise)")
    runner = None
    path.parent.mkdir(parents=True, exist_ok=True)
    ran = skipped = elsewhere = correct = 0
    key = memory_key(armt_fields) if armt_fields else None
    # unbuffered: each line is one write(2) to a file opened for appending, so the lines of two
    # runs beside each other never interleave
    with open(path, "ab", buffering=0) as out:
        done = _done_ids(path, key, corpora_id)
        for length in lengths:
            todo = [it for it in items(length) if it.id not in done]
            todo.sort(key=lambda it: -float(it.meta.get("depth") or 0.0))  # stable: no depth, same order
            skipped += n - len(todo)
            queue = iter(todo)
            while True:
                with contextlib.ExitStack() as held:
                    group, passed = _claim(held, queue, batch, path, key, corpora_id)
                    elsewhere += passed
                    if not group:
                        break
                    if runner is None:  # loaded only when there is work
                        runner = methods.build(
                            method, model, engine, adapter, dtype, segment_len, answer_window, segment_align
                        )
                    start = time.perf_counter()
                    if len(group) == 1:
                        predictions = [runner.predict(group[0], MAX_NEW_TOKENS[task])]
                    else:
                        predictions = runner.predict_batch(group, MAX_NEW_TOKENS[task])  # type: ignore[attr-defined]
                    seconds = (time.perf_counter() - start) / len(group)
                    extra = dict(armt_fields)
                    extra |= {"dtype": runner.dtype} if runner.dtype is not None else {}
                    if method == "armt":
                        config = runner.armt.config  # type: ignore[attr-defined]
                        extra["segment_len"] = config.segment_len
                        extra |= {"segment_align": config.segment_align} if config.segment_align else {}
                    extra |= {"corpora": corpora_id} if corpora_id is not None else {}
                    extra |= {"split": split} if split != "test" else {}
                    for item, pred in zip(group, predictions, strict=True):
                        sc = score(task, pred.text, item.answers)
                        record = result_record(item, pred, sc, model, label, seconds, len(group))
                        record["kv_full_mb"] = round(item.tokens * _kv_per_token(runner) / 2**20, 2)
                        out.write((json.dumps(record | extra) + "\n").encode())  # one append a line
                        os.fsync(out.fileno())
                        drop_item_lock(path, item.id)
                        ran += 1
                        correct += sc.correct
                        log(
                            f"{item.id} {label}: {'ok ' if sc.correct else 'bad'} {seconds:6.1f}s "
                            f"pred={pred.text.strip()[:60]!r} gold={item.answers[:4]}"
                        )
    return RunReport(path, ran, skipped, correct, elsewhere)


def item_lock(path: Path, item_id: str) -> Path:
    """The lock file of one item of a results file (by its absolute path), in the cache directory."""
    from edgemem.paths import cache_dir

    folder = cache_dir() / "locks"
    folder.mkdir(exist_ok=True)
    results = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    return folder / f"eval-{results}-{hashlib.sha256(item_id.encode()).hexdigest()[:16]}.lock"


def drop_item_lock(path: Path, item_id: str) -> None:
    """Remove an item's lock file once its line is written, while its lock is still held: a run
    that opened the file before sees it gone (`_same_file`) and finds the line; so the lock
    folder does not grow with every item ever run."""
    with contextlib.suppress(OSError):
        item_lock(path, item_id).unlink()


def _same_file(handle: object, lock: Path) -> bool:
    """Whether the open `handle` is still the file at `lock` (not one removed since it was opened)."""
    try:
        return os.fstat(handle.fileno()).st_ino == os.stat(lock).st_ino  # type: ignore[attr-defined]
    except OSError:
        return False


def _claim(
    held: contextlib.ExitStack,
    queue: Iterator[Item],
    want: int,
    path: Path,
    key: str | None,
    corpora: str | None,
) -> tuple[list[Item], int]:
    """Up to `want` items from `queue` for this run, each locked (until `held` closes, after its
    line is written), and how many it passed over: those another run of the results file holds,
    or has written a line for since this run read the file. The lock files live in the cache
    directory (`item_lock`); the OS drops a killed run's locks, and its unfinished items run again
    on the next run. A run removes an item's lock file once its line is written, still holding
    the lock (`drop_item_lock`); a claim whose file was removed under it (another run took and
    finished the item meanwhile) passes the item over."""
    group: list[Item] = []
    passed = 0
    for item in queue:
        lock = item_lock(path, item.id)
        handle = open(lock, "a")  # noqa: SIM115 (closed here or by `held`)
        locked = try_lock(handle) and _same_file(handle, lock)
        done = locked and item.id in _done_ids(path, key, corpora)
        if done:  # written meanwhile by another run: its lock file goes, as after a line of ours
            drop_item_lock(path, item.id)
        if not locked or done:
            handle.close()
            passed += 1
            continue
        held.enter_context(handle)
        group.append(item)
        if len(group) == want:
            break
    return group, passed


def result_record(
    item: Item, pred: Prediction, sc: Score, model: str, label: str, seconds: float, batch: int
) -> dict:
    """One results line: the item, the prediction and its score, and what it cost."""
    return {
        "id": item.id,
        "task": item.task,
        "length": item.length,
        "method": label,
        "model": model,
        "prediction": pred.text,
        "gold": item.answers,
        "correct": sc.correct,
        "score": round(sc.score, 4),
        "em": sc.em,
        "tokens": item.tokens,
        "computed_tokens": pred.processed_tokens,
        "seconds": round(seconds, 3),
        "batch": batch,
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "memory_mb": round(pred.memory_bytes / 2**20, 2),
        "depth": item.meta.get("depth"),
    }


def _kv_per_token(runner: object) -> int:
    return int(getattr(runner, "kv_per_token", 0))


# --- summary, table, plot ----------------------------------------------------------------------------


def load_records(results: Path) -> list[dict]:
    """Every result line. armt lines are labelled by their memory: `armt-untrained` for the fresh
    one, `armt` for the `memory_key` (trained adapter, answer path) of the file's latest trained
    line; lines of older adapters or answer paths are left out (the fresh memory's: its latest).
    Of each method's lines in a file, those another corpora build made than its latest are left out
    too (`_latest_build`): a row does not mix two recorded builds (two haystacks, same needles)."""
    records = []
    for path in sorted(results.glob("*/*.jsonl")):
        lines = []
        for line in path.read_text().splitlines():
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        armt = [r for r in lines if is_armt(r.get("method", ""))]
        trained = [memory_key(r) for r in armt if r.get("adapter", UNTRAINED) != UNTRAINED]
        untrained = [memory_key(r) for r in armt if r.get("adapter", UNTRAINED) == UNTRAINED]
        by_method: dict[str, list[dict]] = {}
        for r in lines:
            if is_armt(r.get("method", "")):
                if r.get("adapter", UNTRAINED) == UNTRAINED:
                    if memory_key(r) != untrained[-1]:
                        continue
                    r = {**r, "method": f"{r['method']}-untrained"}
                elif memory_key(r) != trained[-1]:
                    continue
            by_method.setdefault(r.get("method", ""), []).append(r)
        for kept in by_method.values():
            records.extend(_latest_build(kept))
    return records


def summarize(records: list[dict]) -> list[dict]:
    """One row per (model, task, method, length): accuracy and the cost columns."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["model"], r["task"], r["method"], r["length"]), []).append(r)
    rows = []
    for (model, task, method, length), rs in sorted(groups.items()):
        seconds = sum(r["seconds"] for r in rs)
        rows.append(
            {
                "model": model,
                "task": task,
                "method": method,
                "length": length,
                "n": len(rs),
                "accuracy": sum(r["correct"] for r in rs) / len(rs),
                "score": sum(r["score"] for r in rs) / len(rs),
                "s_per_item": seconds / len(rs),
                "tokens_per_s": sum(r["computed_tokens"] for r in rs) / seconds if seconds else 0.0,
                "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
                "memory_mb": sum(r["memory_mb"] for r in rs) / len(rs),
                "kv_full_mb": sum(r["kv_full_mb"] for r in rs) / len(rs),
            }
        )
    return rows


def markdown_table(rows: list[dict]) -> str:
    lines = [
        "| model | task | method | length | n | accuracy | s/item | computed tok/s | peak RSS MB "
        "| method memory MB | full-attention KV MB |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['task']} | {r['method']} | {r['length'] // 1024}k | {r['n']} "
            f"| {r['accuracy']:.2f} | {r['s_per_item']:.1f} | {r['tokens_per_s']:.0f} "
            f"| {r['peak_rss_mb']:.0f} "
            f"| {r['memory_mb']:.1f} | {r['kv_full_mb']:.0f} |"
        )
    return "\n".join(lines)


def update_results_md(path: Path, table: str) -> None:
    text = path.read_text() if path.is_file() else "# Results\n"
    block = f"{TABLE_BEGIN}\n{table}\n{TABLE_END}"
    if TABLE_BEGIN in text and TABLE_END in text:
        head, rest = text.split(TABLE_BEGIN, 1)
        text = head + block + rest.split(TABLE_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n## Long-context evaluation\n\n" + block + "\n"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def plot(rows: list[dict], out: Path) -> Path:
    """Accuracy vs context length, one panel per (model, task), one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["model"], r["task"]) for r in rows})
    if not panels:
        raise EdgememError("no evaluation results to plot")
    cols = min(3, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False)
    methods = sorted({r["method"] for r in rows})
    colors = {m: f"C{i % 10}" for i, m in enumerate(methods)}  # one colour per method in every panel
    for ax, (model, task) in zip(axes.flat, panels, strict=False):
        for method in sorted({r["method"] for r in rows if (r["model"], r["task"]) == (model, task)}):
            pts = sorted(
                (r["length"], r["accuracy"])
                for r in rows
                if (r["model"], r["task"], r["method"]) == (model, task, method)
            )
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method, color=colors[method])
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["length"] for r in rows}))
        ax.set_xticklabels([f"{n // 1024}k" for n in sorted({r["length"] for r in rows})], fontsize=7)
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"{task} ({model})", fontsize=9)
        ax.set_xlabel("context tokens", fontsize=8)
        ax.set_ylabel("accuracy", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(".tmp-" + out.name)
    fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    os.replace(tmp, out)
    return out
