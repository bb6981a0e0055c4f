"""`edgemem bench ingest`: ARMT ingest vs the plain base model over the same segments.

Each size runs in its own child process, so that peak RSS is that run's own. The real text goes
through the tokenizer stream and segmenter that `ingest` uses; every segment runs through the ARMT
step (write tokens and memory included), and right after it, on the same segment, the plain decoder
stack (every segment up to 32k tokens, every 8th above), both without the LM head (ingest needs no
logits). Pairing the two on the same segments at the same moment keeps the ratio honest on a noisy
shared machine. Reported: tokens/s of each, their ratio, peak RSS sampled after every segment, the
process's lifetime peak, the fixed state size, and the KV cache full attention would need.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from edgemem.errors import EdgememError
from edgemem.files import atomic_write_text


def corpus_pieces(corpus: str | None) -> Iterator[str]:
    """Real text: the given file/folder, or by default the Python standard library source (sorted)."""
    from edgemem.documents import file_pieces, iter_text, scan

    if corpus:
        yield from iter_text(scan(corpus))
        return
    root = Path(sysconfig.get_paths()["stdlib"])
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "__pycache__"))
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield f"\n# file: {name}\n"
                yield from file_pieces(Path(dirpath) / name)


def _limited(chunks: Iterator[list[int]], limit: int) -> Iterator[list[int]]:
    """Token chunks cut to exactly `limit` tokens in total (cycling the corpus if it is shorter)."""
    left = limit
    for chunk in chunks:
        if left <= 0:
            return
        yield chunk[:left]
        left -= min(left, len(chunk))
    if left > 0:
        raise EdgememError(f"the corpus has fewer than {limit} tokens")


def _child(tokens: int, corpus: str | None, model: str, plain_every: int) -> dict[str, object]:
    """One process, one size: ARMT steps over every segment; the plain decoder forward over the same
    segment right after it on every `plain_every`-th segment, so the ratio is measured side by side."""
    import torch

    from edgemem.armt import ARMT, ARMTConfig, iter_segments, tokenize_stream
    from edgemem.models import load_model

    loaded = load_model(model)
    armt = ARMT(loaded.model, ARMTConfig.for_model(loaded.model.config.num_hidden_layers))
    decoder = loaded.model.model
    process = psutil.Process()
    rss_after_load = peak = process.memory_info().rss
    stream = _limited(tokenize_stream(corpus_pieces(corpus), loaded.tokenizer), tokens)
    state = armt.empty_state()
    armt_seconds = paired_armt = paired_plain = 0.0
    segments = paired = 0
    tail: list[int] = []
    wall = time.perf_counter()
    with torch.inference_mode():
        for segment in iter_segments(stream, armt.config.segment_len, tail):
            ids = torch.tensor([segment])
            t0 = time.perf_counter()
            state, _ = armt.step(ids, state)
            t1 = time.perf_counter()
            armt_seconds += t1 - t0
            if segments % plain_every == 0:
                decoder(input_ids=ids, use_cache=False)
                paired_plain += time.perf_counter() - t1
                paired_armt += t1 - t0
                paired += 1
            segments += 1
            peak = max(peak, process.memory_info().rss)
    wall = time.perf_counter() - wall
    seg = armt.config.segment_len
    cfg = loaded.model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_bytes_per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * 2  # fp16
    return {
        "tokens": tokens,
        "segments": segments,
        "paired_segments": paired,
        "armt_tokens_per_s": round(segments * seg / armt_seconds, 1),
        "plain_tokens_per_s": round(paired * seg / paired_plain, 1),
        "armt_over_plain": round(paired_plain / paired_armt, 3),
        "wall_seconds": round(wall, 1),
        "rss_after_load_mb": round(rss_after_load / 1e6, 1),
        "peak_rss_during_ingest_mb": round(peak / 1e6, 1),
        "process_max_rss_mb": round(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6, 1
        ),  # KiB
        "state_mb": round(state.nbytes() / 1e6, 2),
        "full_attention_kv_cache_mb": round(kv_bytes_per_token * tokens / 1e6, 1),
        "dtype": str(loaded.dtype).replace("torch.", ""),
        "segment_len": seg,
        "threads": torch.get_num_threads(),
    }


def run_ingest_bench(sizes: list[int], corpus: str | None, model: str, output: str, console) -> list[dict]:
    """Run every (size, method) pair in a child process, print a table, write JSON."""
    from rich.table import Table

    results = []
    for tokens in sizes:
        plain_every = 1 if tokens <= 32768 else 8
        console.print(f"running {tokens:,} tokens (plain forward on every {plain_every}. segment)...")
        cmd = [sys.executable, "-m", "edgemem.bench", str(tokens), model, corpus or "", str(plain_every)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise EdgememError(f"benchmark child ({tokens} tokens) failed: {last}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    table = Table(
        "tokens",
        "ARMT tok/s",
        "plain tok/s",
        "ARMT/plain",
        "peak RSS (MB)",
        "state (MB)",
        "full-attn KV fp16 (MB)",
    )
    for r in results:
        table.add_row(
            f"{r['tokens']:,}",
            f"{r['armt_tokens_per_s']:,.0f}",
            f"{r['plain_tokens_per_s']:,.0f}",
            f"{r['armt_over_plain']:.2f}",
            f"{r['peak_rss_during_ingest_mb']:,.0f}",
            f"{r['state_mb']}",
            f"{r['full_attention_kv_cache_mb']:,.0f}",
        )
    console.print(table)
    report = {
        "command": "edgemem bench ingest " + " ".join(sys.argv[3:]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB",
        "results": results,
    }
    atomic_write_text(Path(output), json.dumps(report, indent=1))
    console.print(f"wrote {output}")
    return results


if __name__ == "__main__":
    tokens_arg, model_arg, corpus_arg, every_arg = sys.argv[1:5]
    print(json.dumps(_child(int(tokens_arg), corpus_arg or None, model_arg, int(every_arg))))
