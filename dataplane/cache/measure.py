"""The duplicate rate per (model, tenant) over a sliding window, reported on the table watch.

:class:`DuplicateMeter` feeds every completed deterministic request (and
every answer from the cache) to one :class:`dataplane.cache.sketch.SeenSet`
(hashes already include the tenant) and counts, per (model, tenant) and per
model, in ``buckets`` consecutive buckets of ``window / buckets`` seconds:
deterministic requests, duplicates (payload seen within the window), the
service seconds of the duplicates (what a cache would have saved: the
replica's time for a forwarded duplicate, the cached answer's original time
for a hit) and hits. A bucket older than the window is dropped, so the
counts cover between ``window - window / buckets`` and ``window`` seconds
(:meth:`DuplicateMeter.samples` reports the exact span).

Bounds: at most ``max_rows`` (model, tenant) rows (and as many model rows);
a request of a further pair is not counted and adds one to
:attr:`DuplicateMeter.dropped`; ``buckets`` counters per row. Cost: O(1)
amortised per request, O(rows x buckets) per report. Pure: the caller passes
the time.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable

from dataplane.cache.sketch import SeenSet
from ferry.v1 import tables_pb2


@dataclasses.dataclass(slots=True)
class Bucket:
    """Counts of one slice of the window, from ``start``."""

    start: float
    deterministic: int = 0
    duplicates: int = 0
    seconds: float = 0.0
    hits: int = 0


@dataclasses.dataclass(slots=True)
class Totals:
    """A row's counts summed over its live buckets."""

    deterministic: int = 0
    duplicates: int = 0
    seconds: float = 0.0
    hits: int = 0
    since: float = 0.0  # start of the oldest live bucket


class Row:
    """One row's buckets, oldest first (at most ``buckets`` of them)."""

    __slots__ = ("buckets",)

    def __init__(self) -> None:
        self.buckets: deque[Bucket] = deque()

    def add(self, now: float, width: float, *, duplicate: bool, seconds: float, hit: bool) -> None:
        """Count one request in the bucket of ``now`` (a new bucket when the last one is ``width`` old)."""
        if not self.buckets or now - self.buckets[-1].start >= width:
            self.buckets.append(Bucket(now))
        b = self.buckets[-1]
        b.deterministic += 1
        if duplicate:
            b.duplicates += 1
            b.seconds += max(seconds, 0.0)
        b.hits += hit

    def totals(self, now: float, window: float) -> Totals:
        """Drop buckets that ended ``window`` ago or more; the rest summed."""
        buckets = self.buckets
        while buckets and now - buckets[0].start >= window:
            buckets.popleft()
        t = Totals(since=buckets[0].start if buckets else now)
        for b in buckets:
            t.deterministic += b.deterministic
            t.duplicates += b.duplicates
            t.seconds += b.seconds
            t.hits += b.hits
        return t


class DuplicateMeter:
    """Sliding-window duplicate counts per (model, tenant) and per model; see the module docstring."""

    def __init__(self, *, window: float, capacity: int, max_rows: int, buckets: int = 10) -> None:
        if max_rows <= 0 or buckets <= 0:
            raise ValueError("max_rows and buckets must be positive")
        self.window = window
        self.width = window / buckets
        self.max_rows = max_rows
        self.seen = SeenSet(window=window, capacity=capacity)
        self.dropped = 0  # requests not counted: their (model, tenant) found the rows full (cumulative)
        self._rows: dict[tuple[str, str], Row] = {}
        self._models: dict[str, Row] = {}

    def observe(self, model: str, tenant: str, key: int, now: float, *, seconds: float, hit: bool = False) -> bool:
        """One completed deterministic request (or cache hit) of payload hash ``key``; True when a duplicate.

        ``seconds``: the replica's service seconds of the answer (a hit: the cached answer's)."""
        duplicate = self.seen.observe(key, now) or hit
        row = self._rows.get((model, tenant))
        if row is None:
            if len(self._rows) >= self.max_rows or (model not in self._models and len(self._models) >= self.max_rows):
                self.dropped += 1
                return duplicate
            row = self._rows[(model, tenant)] = Row()
        model_row = self._models.get(model)
        if model_row is None:
            model_row = self._models[model] = Row()
        row.add(now, self.width, duplicate=duplicate, seconds=seconds, hit=hit)
        model_row.add(now, self.width, duplicate=duplicate, seconds=seconds, hit=hit)
        return duplicate

    def model_totals(self, model: str, now: float) -> Totals:
        """The model's counts over the window, all tenants."""
        row = self._models.get(model)
        return row.totals(now, self.window) if row is not None else Totals(since=now)

    def samples(self, now: float, enabled: Callable[[str], bool]) -> list[tables_pb2.CacheSample]:
        """The window's rows, sorted by model and tenant; rows left empty are forgotten."""
        out = []
        for key in sorted(self._rows):
            t = self._rows[key].totals(now, self.window)
            if not t.deterministic:
                del self._rows[key]
                continue
            model, tenant = key
            out.append(tables_pb2.CacheSample(
                model=model, tenant=tenant, deterministic=t.deterministic, duplicates=t.duplicates,
                duplicate_seconds=t.seconds, window_seconds=max(now - t.since, self.width), hits=t.hits,
                enabled=enabled(model)))
        for model in [m for m, row in self._models.items() if not row.totals(now, self.window).deterministic]:
            del self._models[model]
        return out
