"""The resource limits every way in shares (`edgemem ingest`/`ask`/`chat`, the chat app): a cap
on the bytes of text taken in (`--max-size`, EDGEMEM_MAX_SIZE) and on the time of one ingest
(`--max-time`, EDGEMEM_MAX_TIME). Nothing heavy is imported: the chat app reads these before torch.
"""

from __future__ import annotations

import re

from edgemem.errors import EdgememError

DEFAULT_MAX_SIZE = "4G"
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600}


def parse_size(text: str) -> int | None:
    """'4G' -> 4_000_000_000 bytes; '0' -> None (no limit)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)b?\s*", text.lower())
    if match is None:
        raise EdgememError(f"--max-size must be a size like 500M or 2G, not {text!r}")
    size = int(float(match[1]) * _UNITS[match[2]])
    return size or None


def parse_duration(text: str | None) -> float | None:
    """'90', '90s', '30m', '2h' -> seconds; None or '0' -> None (no limit)."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text.lower())
    if match is None:
        raise EdgememError(f"--max-time must be a duration like 90s, 30m or 2h, not {text!r}")
    seconds = float(match[1]) * _SECONDS[match[2]]
    return seconds or None


DEFAULT_MAX_BYTES = parse_size(DEFAULT_MAX_SIZE)
