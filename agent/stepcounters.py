"""A replica's engine step counters as the agent scrapes them, and the deltas it sends (pure).

The step time of a continuous-batching engine is modelled as linear
(docs/engine.md): a step takes ``prefill_base + per_token x tokens prefilled``
if it prefills, plus ``decode_base + per_request x requests decoding`` if it
decodes. So over any interval the time in steps is linear in four counts,
which a replica exposes as counters (:data:`COUNTERS`, the simulated replica's
``ferry_replica_*`` names; docs/engine.md, "Counters", names a real engine's
equivalents) beside the wall time of its steps. The agent reads them on each
scrape (:func:`read`), keeps the last reading per replica and sums the deltas
of the scrapes since its last telemetry message (:func:`advance`); the message
carries the sum (:func:`sample`) and the engine's static facts. The control
plane fits the four step parameters from the samples (``controlplane.engines``).

Deltas follow Prometheus' rule for counters: a reading lower than the one
before (any counter: they reset together, with the engine) means the replica
restarted, and the reading itself is the delta since. The first reading only
sets the baseline. A replica that exports no step counters reads None and
sends no sample. Cost: O(1) per replica per scrape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ferry.v1 import common_pb2

# The counters, in the order of :class:`Counts`' fields.
COUNTERS = ("ferry_replica_prefill_steps_total", "ferry_replica_prefill_tokens_total",
            "ferry_replica_decode_steps_total", "ferry_replica_decode_tokens_total",
            "ferry_replica_step_seconds_total")
MAX_STEP_TOKENS = "ferry_replica_max_step_tokens"  # gauge: the chunked-prefill budget (0: no limit)
PREFIX_CACHE_BLOCKS = "ferry_replica_prefix_cache_blocks"  # gauge: the prefix cache's size in blocks
NAMES = frozenset((*COUNTERS, MAX_STEP_TOKENS, PREFIX_CACHE_BLOCKS))  # every family read here


@dataclasses.dataclass(frozen=True, kw_only=True)
class Counts:
    """The step counters at one reading, or their deltas over an interval (``intervals`` scrapes)."""

    prefill_steps: float = 0.0
    prefill_tokens: float = 0.0
    decode_steps: float = 0.0
    decode_tokens: float = 0.0
    step_seconds: float = 0.0
    intervals: int = 0

    def values(self) -> tuple[float, float, float, float, float]:
        return (self.prefill_steps, self.prefill_tokens, self.decode_steps, self.decode_tokens, self.step_seconds)

    def __add__(self, other: Counts) -> Counts:
        return _counts([x + y for x, y in zip(self.values(), other.values(), strict=True)],
                       self.intervals + other.intervals)


def _counts(values: list[float], intervals: int = 0) -> Counts:
    prefill_steps, prefill_tokens, decode_steps, decode_tokens, step_seconds = values
    return Counts(prefill_steps=prefill_steps, prefill_tokens=prefill_tokens, decode_steps=decode_steps,
                  decode_tokens=decode_tokens, step_seconds=step_seconds, intervals=intervals)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reading:
    """One scrape of a replica's step counters and its chunked-prefill budget (None: not exported)."""

    counts: Counts
    max_step_tokens: int | None = None
    prefix_cache_blocks: int = 0  # 0: not exported


def read(value: Callable[[str], float | None]) -> Reading | None:
    """The step counters from a scrape, ``value(name)`` giving a family's (summed) value or None; None when the
    replica exports not all of :data:`COUNTERS` (it sends no sample then)."""
    found = [value(name) for name in COUNTERS]
    if any(v is None for v in found):
        return None
    limit, cache = value(MAX_STEP_TOKENS), value(PREFIX_CACHE_BLOCKS)
    return Reading(counts=_counts([max(0.0, float(v)) for v in found if v is not None]),
                   max_step_tokens=None if limit is None else max(0, int(limit)),
                   prefix_cache_blocks=0 if cache is None else max(0, int(cache)))


def delta(before: Counts, now: Counts) -> Counts:
    """``now - before`` over one scrape interval; ``now`` itself when any counter went down (a restart)."""
    if any(b > n for b, n in zip(before.values(), now.values(), strict=True)):
        return dataclasses.replace(now, intervals=1)
    return _counts([n - b for b, n in zip(before.values(), now.values(), strict=True)], 1)


def advance(last: Counts | None, pending: Counts | None, now: Counts | None) -> tuple[Counts | None, Counts | None]:
    """(the new baseline, the deltas pending for the next message) after a scrape that read ``now``.

    No reading (the scrape failed, or the replica exports no counters) keeps both: a later reading's delta
    spans the gap. The first reading only sets the baseline.
    """
    if now is None:
        return last, pending
    if last is None:
        return now, pending
    step = delta(last, now)
    return now, step if pending is None else pending + step


def sample(pending: Counts | None, *, kv_blocks_total: int, kv_block_tokens: int, max_running: int,
           max_step_tokens: int | None, prefix_cache_blocks: int = 0) -> common_pb2.EngineSample | None:
    """The message of the deltas ``pending`` with the engine's facts (0: unknown); None without deltas."""
    if pending is None:
        return None
    return common_pb2.EngineSample(
        prefill_steps=round(pending.prefill_steps), prefill_tokens=round(pending.prefill_tokens),
        decode_steps=round(pending.decode_steps), decode_tokens=round(pending.decode_tokens),
        step_seconds=pending.step_seconds, intervals=pending.intervals,
        kv_blocks_total=max(0, kv_blocks_total), kv_block_tokens=max(0, kv_block_tokens),
        max_running=max(0, max_running), max_step_tokens=max_step_tokens or 0, unchunked=max_step_tokens == 0,
        prefix_cache_blocks=max(0, prefix_cache_blocks))
