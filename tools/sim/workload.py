"""Workloads of the fleet simulator: a trace's requests, with prefix blocks, placed in virtual time.

:func:`requests` reads a trace with :func:`tools.trace.load` (Azure CSV or
Mooncake JSONL, chosen by content) into :class:`SimRequest` rows. A request's
``hash_ids`` are its prompt's chained 512-token block ids: equal leading ids
mean an equal prefix, as the chained hashes of :mod:`ferry.tokens` do for
text, so the engine's prefix cache and the proxy's key derivation take them
as they are.

- **Mooncake**: the trace's ``hash_ids``, as given (block 0 is shared by every
  request; conversations share longer runs).
- **Azure** (no prefix information): synthetic conversations
  (:func:`converse`). Walking the trace in order, a request continues an
  open conversation with probability ``follow`` (default 0.5) when one
  fits: last turn at most ``idle`` (600 s) of trace time ago and its prompt
  plus answer no longer than this request's prompt; among the ``window``
  (64) most recent open conversations that fit, one is drawn at random. A
  continuation repeats the previous turn's full prompt blocks and adds fresh
  blocks for the rest; a new conversation starts with block 0 (a system
  prompt shared by all, as in Mooncake) and fresh blocks. So turn *k* + 1
  shares turn *k*'s prompt, as a chat client resends the history; the
  answer's tokens are new blocks (an engine caches prompts, not outputs).
  Seeded, so a run is reproducible.

:func:`shorten` turns a share of the long prompts' answers into 1 to 10
tokens (``--short-answers`` of the simulator), the long-prompt, short-answer
share of real traffic that the traces under-represent.

:func:`scale` stretches arrival times so that the trace's mean rate is a
given share of a measured capacity (:mod:`tools.sim.capacity`).
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from ferry.config import TIERS
from ferry.tokens import BLOCK_TOKENS, blocks_for
from tools import trace as tracefile

FRESH_BASE = 1 << 40  # synthetic block ids start here, clear of the trace's
TENANT = "tenant-1"


@dataclasses.dataclass(frozen=True, slots=True)
class SimRequest:
    """One request of a simulated run."""

    index: int
    arrival: float              # seconds of virtual time
    prompt_tokens: int
    max_tokens: int             # the engine generates exactly this many
    hash_ids: tuple[int, ...]   # chained 512-token block ids of the prompt
    tenant: str = TENANT
    tier: str = TIERS[0]        # the admission tier (Ferry's policy: its queue, queue timeout and retries)
    proxy: int = -1             # the proxy it arrives at (recorded traffic); -1: drawn at random


@dataclasses.dataclass(slots=True)
class _Conversation:
    """One conversation being replayed: when it last spoke, its block ids, and its last prompt and answer sizes."""

    last: float
    ids: tuple[int, ...]
    prompt: int
    answer: int


def converse(rows: list[tracefile.TraceRequest], *, seed: int = 1, follow: float = 0.5, idle: float = 600.0,
             window: int = 64) -> list[tracefile.TraceRequest]:
    """The rows with synthetic conversation prefixes; see the module docstring."""
    rng = random.Random(seed)
    fresh = FRESH_BASE
    open_: deque[_Conversation] = deque(maxlen=window)
    out = []
    for row in rows:
        fits = [c for c in open_ if row.offset - c.last <= idle and c.prompt + c.answer <= row.input_tokens]
        blocks = blocks_for(row.input_tokens, BLOCK_TOKENS)
        if fits and rng.random() < follow:
            conv = rng.choice(fits)
            open_.remove(conv)
            shared = conv.ids[:max(1, conv.prompt // BLOCK_TOKENS)]  # block 0 at least: the system prompt
        else:
            conv = _Conversation(row.offset, (), 0, 0)
            shared = (0,)
        ids = (*shared, *range(fresh, fresh + max(0, blocks - len(shared))))[:blocks]
        fresh += blocks
        conv.last, conv.ids, conv.prompt, conv.answer = row.offset, ids, row.input_tokens, row.output_tokens
        open_.append(conv)
        out.append(dataclasses.replace(row, hash_ids=ids))
    return out


def is_mooncake(path: str | Path) -> bool:
    """Whether ``path`` is a Mooncake JSONL trace (else Azure CSV)."""
    with Path(path).open() as f:
        return f.read(1) == "{"


def requests(path: str | Path, *, minutes: float | None = None, seed: int = 1,
             max_output: int | None = None, short_answers: float = 0.0) -> list[SimRequest]:
    """The trace's requests in trace time (seconds from the first), prefixes as the module docstring says;
    ``short_answers`` of the long prompts answered in 1 to 10 tokens (:func:`shorten`)."""
    rows = tracefile.load(path, minutes=minutes)
    if not is_mooncake(path):
        rows = converse(rows, seed=seed)
    cap = max_output or 1 << 30
    out = [SimRequest(i, r.offset, r.input_tokens, max(1, min(r.output_tokens, cap)), r.hash_ids)
           for i, r in enumerate(rows)]
    return shorten(out, short_answers, seed=seed) if short_answers else out


LONG_PROMPT = 4096  # tokens: a prompt this long may get a short answer (shorten)


def shorten(reqs: list[SimRequest], share: float, *, seed: int = 1) -> list[SimRequest]:
    """The requests with ``share`` of those whose prompt has at least ``LONG_PROMPT`` tokens answered in 1 to
    10 tokens (drawn, seeded): the long-prompt, short-answer traffic of classification, extraction and
    agents' tool calls, which makes a healthy replica's seconds per output token look slow."""
    if not 0.0 <= share <= 1.0:
        raise ValueError("share must be in [0, 1]")
    rng = random.Random(seed)
    return [dataclasses.replace(r, max_tokens=min(r.max_tokens, rng.randint(1, 10)))
            if r.prompt_tokens >= LONG_PROMPT and rng.random() < share else r for r in reqs]


def rate(reqs: list[SimRequest]) -> float:
    """Mean arrival rate in requests per second (requests over the span of arrivals)."""
    if len(reqs) < 2:
        return float(len(reqs))
    span = reqs[-1].arrival - reqs[0].arrival
    return len(reqs) / span if span > 0 else float(len(reqs))


def scale(reqs: list[SimRequest], factor: float) -> list[SimRequest]:
    """The requests with arrival times multiplied by ``factor`` (< 1: faster)."""
    return [dataclasses.replace(r, arrival=r.arrival * factor) for r in reqs]


def at_load(reqs: list[SimRequest], load: float, capacity: float) -> list[SimRequest]:
    """The requests stretched so that their mean rate is ``load`` x ``capacity`` (requests per second)."""
    return scale(reqs, rate(reqs) / (load * capacity))


def cached_lead(hashes: Sequence[int], seen: set[int]) -> int:
    """Leading blocks of ``hashes`` an infinite cache that holds ``seen`` would serve; then adds them to it."""
    lead = 0
    for h in hashes:
        if h not in seen:
            break
        lead += 1
    seen.update(hashes)
    return lead


def infinite_cache_hit_ratio(reqs: list[SimRequest]) -> float:
    """Prompt tokens an infinite prefix cache shared by all would serve, over all prompt tokens."""
    seen: set[int] = set()
    hit = total = 0
    for r in reqs:
        lead = cached_lead(r.hash_ids, seen)
        hit += min(lead * BLOCK_TOKENS, r.prompt_tokens)
        total += r.prompt_tokens
    return hit / total if total else 0.0
