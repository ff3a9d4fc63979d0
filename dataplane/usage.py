"""What one proxy saw per model and tier over a window: the usage report it sends on ``Tables.Watch``.

:class:`UsageWindow` is a tumbling-window accumulator. The servicer calls
:meth:`UsageWindow.record` once per request as it ends (where it counts
``ferry_proxy_requests_total``), with the final gRPC status name and the
time from arrival to the last byte; :meth:`UsageWindow.report` turns what
was counted since the previous report into a ``tables_pb2.Report`` and starts
a new window. Per (model, tier):

- ``requests``: requests that ended, not shed; ``errors`` those of them that
  failed on the server side (:data:`SERVER_ERRORS`; a caller's mistake, such
  as INVALID_ARGUMENT or CANCELLED, is a request but not an error);
- ``shed``: refused with RESOURCE_EXHAUSTED (in-flight limit, tenant limits,
  tier queues); ``spilled``: sent to another region;
- ``p50_seconds``, ``p99_seconds``: quantiles of the durations of the requests
  answered OK (0 when none), from a :class:`LatencySketch`;
- ``offered_per_second``: (requests + shed) / window, arrivals counted when
  they end; ``queued``: the tier queue's depth when the report is made
  (given by the caller, so rows with a queue and no request are reported);
  ``guard_seconds``: the guardrail hooks' time summed over the requests
  that ended (:mod:`dataplane.guard.hooks`);
- ``ttft_p50_seconds``, ``ttft_p99_seconds`` over ``ttft_samples``: the time to
  first token of the requests answered OK (:meth:`UsageWindow.first_token`,
  from ``Requests.succeed``), another :class:`LatencySketch`;
- ``router_version``: the router config version in force when the report is
  made (:meth:`UsageWindow.router`), ``router_mixed`` when it changed during
  the window (the control plane's router guard skips such a window).

Requests whose model was never resolved (``dataplane.metrics.UNKNOWN``:
refused before the table named it) belong to no model and are not counted.

Bounds: at most ``max_rows`` (model, tier) rows per window; a request of a
further pair is not counted and adds one to :attr:`UsageWindow.dropped`
(models come from the table, so the limit is reached only by a table with
hundreds of models). Each sketch holds at most :data:`BUCKETS` counters.

Pure: no I/O, the caller passes the time. Cost: O(1) per request (a
logarithm); O(rows x buckets) per report.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from ferry.v1 import tables_pb2

UNKNOWN_MODEL = "_unknown"  # dataplane.metrics.UNKNOWN: not resolved to a model
OK = "OK"
SHED = "RESOURCE_EXHAUSTED"
SERVER_ERRORS = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "UNKNOWN", "ABORTED", "DATA_LOSS",
                           "UNIMPLEMENTED"})

GROWTH = 1.05            # each bucket's upper edge is 5 % above the previous one
MIN_SECONDS = 0.0005     # bucket 0 holds [0, 0.5 ms]
MAX_SECONDS = 3600.0     # the last bucket holds everything above one hour
BUCKETS = math.ceil(math.log(MAX_SECONDS / MIN_SECONDS) / math.log(GROWTH)) + 2
_LOG_GROWTH = math.log(GROWTH)


class LatencySketch:
    """Quantiles of durations from fixed log-spaced histogram buckets.

    Bucket 0 holds durations up to ``MIN_SECONDS``; bucket ``i >= 1`` holds
    (``MIN_SECONDS x GROWTH^(i-1)``, ``MIN_SECONDS x GROWTH^i``], the last one
    everything above ``MAX_SECONDS``. A quantile ``q`` is the nearest rank
    (the ``ceil(q x n)``-th smallest duration), estimated by the geometric middle
    of its bucket, clamped to the smallest and largest duration seen. Error
    bound: between ``MIN_SECONDS`` and ``MAX_SECONDS`` the estimate is within a
    factor ``sqrt(GROWTH)`` of the true rank's value (under 2.5 % relative
    error); below, within ``MIN_SECONDS`` (0.5 ms) of it; above, it is the
    largest duration seen. At most :data:`BUCKETS` (about 330) counters.
    """

    __slots__ = ("count", "counts", "high", "low")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.count = 0
        self.low = math.inf
        self.high = 0.0

    @staticmethod
    def bucket(seconds: float) -> int:
        """The bucket index of a duration."""
        if not seconds > MIN_SECONDS:  # also NaN and negatives
            return 0
        if seconds >= MAX_SECONDS:
            return BUCKETS - 1
        return min(BUCKETS - 1, max(1, math.ceil(math.log(seconds / MIN_SECONDS) / _LOG_GROWTH)))

    def add(self, seconds: float) -> None:
        seconds = min(seconds, MAX_SECONDS * 1000) if seconds > 0 else 0.0  # NaN, negatives: 0; no infinity
        index = self.bucket(seconds)
        self.counts[index] = self.counts.get(index, 0) + 1
        self.count += 1
        self.low = min(self.low, seconds)
        self.high = max(self.high, seconds)

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0 < q <= 1) of the durations added; 0.0 when none."""
        if not self.count:
            return 0.0
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        index = 0
        for index in sorted(self.counts):
            seen += self.counts[index]
            if seen >= rank:
                break
        middle = MIN_SECONDS / 2 if index == 0 else MIN_SECONDS * GROWTH ** (index - 0.5)
        return min(max(middle, self.low), self.high)


@dataclasses.dataclass(slots=True)
class Counts:
    """One (model, tier) row of a window."""

    requests: int = 0
    errors: int = 0
    shed: int = 0
    spilled: int = 0
    guard_seconds: float = 0.0  # guardrail hook time of the requests that ended
    latency: LatencySketch = dataclasses.field(default_factory=LatencySketch)
    ttft: LatencySketch = dataclasses.field(default_factory=LatencySketch)  # time to first token, answered OK


class UsageWindow:
    """Per (model, tier) counts and latencies since the last report; see the module docstring."""

    def __init__(self, *, start: float, max_rows: int = 1024) -> None:
        if max_rows <= 0:
            raise ValueError("max_rows must be positive")
        self.max_rows = max_rows
        self.dropped = 0  # requests not counted because the window had max_rows rows (cumulative)
        self._since = start
        self._rows: dict[tuple[str, str], Counts] = {}
        self._router = 0  # the router config version in force (dataplane.routerconfig)
        self._mixed = False  # it changed during this window

    def router(self, version: int) -> None:
        """The router config ``version`` runs from now on: this window mixes two configs."""
        if version != self._router:
            self._router = version
            self._mixed = True

    def first_token(self, model: str, tier: str, seconds: float) -> None:
        """The time to first token of a request answered OK, counted (:meth:`record`) before."""
        row = self._rows.get((model, tier))
        if row is not None:
            row.ttft.add(seconds)

    def record(self, model: str, tier: str, status: str, seconds: float, *, spilled: bool = False,
               guard_seconds: float = 0.0) -> None:
        """Count one request that ended with gRPC status ``status`` after ``seconds`` (``guard_seconds`` of them
        in guardrail hooks)."""
        if not model or model == UNKNOWN_MODEL:
            return
        key = (model, tier)
        row = self._rows.get(key)
        if row is None:
            if len(self._rows) >= self.max_rows:
                self.dropped += 1
                return
            row = self._rows[key] = Counts()
        row.spilled += spilled
        if status == SHED:
            row.shed += 1
            return
        row.requests += 1
        row.guard_seconds += guard_seconds
        if status == OK:
            row.latency.add(seconds)
        elif status in SERVER_ERRORS:
            row.errors += 1

    def report(self, now: float, queued: Mapping[tuple[str, str], int] | None = None) -> tables_pb2.Report:
        """The window since the last report (rows sorted by model and tier); a new window starts at ``now``."""
        window = max(now - self._since, 1e-6)
        depths = {k: v for k, v in (queued or {}).items() if v > 0 and k[0] and k[0] != UNKNOWN_MODEL}
        keys = sorted(set(self._rows) | set(depths))[: self.max_rows]
        samples = []
        for model, tier in keys:
            row = self._rows.get((model, tier)) or Counts()
            samples.append(tables_pb2.UsageSample(
                model=model, tier=tier, requests=row.requests, errors=row.errors, shed=row.shed,
                spilled=row.spilled, p99_seconds=row.latency.quantile(0.99), p50_seconds=row.latency.quantile(0.5),
                offered_per_second=(row.requests + row.shed) / window,
                queued=min(depths.get((model, tier), 0), 2**32 - 1), guard_seconds=row.guard_seconds,
                ttft_p50_seconds=row.ttft.quantile(0.5), ttft_p99_seconds=row.ttft.quantile(0.99),
                ttft_samples=row.ttft.count, router_version=self._router, router_mixed=self._mixed,
            ))
        self._rows = {}
        self._mixed = False
        self._since = now
        return tables_pb2.Report(window_seconds=window, usage=samples)
