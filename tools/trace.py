"""Request traces: Azure LLM inference CSV and Mooncake JSONL (docs/traces.md; ``python -m tools.fetch_traces``).

:func:`load` reads either format (chosen by content) into :class:`TraceRequest`
rows with arrival offsets in seconds from the first request.

- Mooncake: ``timestamp`` (ms), ``input_length``, ``output_length``,
  ``hash_ids`` (one id per 512-token block, chained). Timestamps are quantised
  to about 3 s, so requests that share a timestamp are spread evenly over the
  step up to the next distinct timestamp (deterministic).
- Azure: ``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens``; no prefix
  information. Each row gets synthetic block ids: block 0 (a shared leading
  system prompt, as in Mooncake) and then ids of its own, so only that first
  block is shared.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import json
from pathlib import Path

from ferry.tokens import BLOCK_TOKENS, blocks_for

_AZURE_ID_BASE = 1 << 40


@dataclasses.dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace."""

    offset: float               # seconds after the first request
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]   # one per block of BLOCK_TOKENS input tokens


def load(path: str | Path, *, minutes: float | None = None, limit: int | None = None) -> list[TraceRequest]:
    """The requests of a trace file, optionally the first ``minutes`` and at most ``limit`` of them."""
    p = Path(path)
    with p.open() as f:
        head = f.read(1)
    rows = _mooncake(p) if head == "{" else _azure(p)
    if minutes is not None:
        rows = [r for r in rows if r.offset < minutes * 60.0]
    return rows[:limit] if limit is not None else rows


def _mooncake(path: Path) -> list[TraceRequest]:
    raw = []
    with path.open() as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                raw.append((d["timestamp"] / 1000.0, int(d["input_length"]), int(d["output_length"]),
                            tuple(int(h) for h in d["hash_ids"])))
    raw.sort(key=lambda r: r[0])
    offsets = spread([r[0] for r in raw])
    return [TraceRequest(at, inp, outp, ids) for at, (_, inp, outp, ids) in zip(offsets, raw, strict=True)]


def spread(stamps: list[float]) -> list[float]:
    """Offsets from the first of ``stamps`` (seconds, sorted), the requests that share a stamp spread evenly over
    the step up to the next distinct stamp (1 s after the last one); deterministic."""
    distinct = sorted(set(stamps))
    step = {t: (distinct[i + 1] - t if i + 1 < len(distinct) else 1.0) for i, t in enumerate(distinct)}
    counts: dict[float, int] = {}
    for t in stamps:
        counts[t] = counts.get(t, 0) + 1
    seen: dict[float, int] = {}
    start = stamps[0] if stamps else 0.0
    out = []
    for t in stamps:
        k = seen.get(t, 0)
        seen[t] = k + 1
        out.append(t - start + step[t] * k / counts[t])
    return out


def _azure(path: Path) -> list[TraceRequest]:
    out = []
    start: dt.datetime | None = None
    with path.open(newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            stamp = _parse_time(row["TIMESTAMP"])
            start = start or stamp
            inp = int(row["ContextTokens"])
            ids = (0, *(_AZURE_ID_BASE + i * 1024 + b for b in range(1, blocks_for(inp, BLOCK_TOKENS))))
            out.append(TraceRequest((stamp - start).total_seconds(), inp, int(row["GeneratedTokens"]), ids))
    return out


def _parse_time(text: str) -> dt.datetime:
    """``YYYY-MM-DD HH:MM:SS.fffffff`` (7 fractional digits) to a datetime (microseconds)."""
    whole, _, frac = text.strip().partition(".")
    return dt.datetime.strptime(f"{whole}.{(frac + '000000')[:6]}", "%Y-%m-%d %H:%M:%S.%f")
