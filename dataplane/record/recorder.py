"""The recorder of one proxy: sampled rows, bounded, taken by the usage reports.

:meth:`Recorder.record` is called once per request where it is counted
(:meth:`dataplane.api.service.InferenceServicer.count`); a sampled request's
row (:func:`dataplane.record.row.row_of`) joins the buffer, or, when
``record_max_rows`` rows already wait, is dropped and counted.
:meth:`Recorder.fill` moves the oldest ``record_report_rows`` of them onto a
usage report (:mod:`dataplane.usage`, sent on the table watch every
``usage_report_seconds``) with the number dropped since the last report; the
rest wait for the next report. Reports are made only while a watch stream is
open, so rows wait across a control plane's absence, up to the bound.

A report's rows are sent at most once: a report lost with its stream loses its
rows (they are not counted as dropped; the control plane's store counts what
reaches it).

Metrics (read when scraped, nothing per request): ``ferry_proxy_recorded_total``
(rows recorded), ``ferry_proxy_recorded_dropped_total`` (sampled requests not
recorded because the buffer was full), ``ferry_proxy_recorded_waiting`` (rows
waiting for a report).

Cost per request: one bound check (rate 1) or one CRC-32 (below 1); per
recorded request, the row (about 2 µs) and, in the report, its share of the
serialization (``python -m tools.bench.recorder``).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from dataplane.record.row import Finished, Sampler, row_of
from ferry.grpcutil import take_within
from ferry.metrics import name
from ferry.v1 import tables_pb2

if TYPE_CHECKING:
    from dataplane.record.settings import RecordSettings


class Recorder:
    """Sampled rows of the requests that ended, waiting for a report; see the module docstring."""

    def __init__(self, *, rate: float = 1.0, max_rows: int = 20_000, report_rows: int = 2_000,
                 report_bytes: int = 1 << 20, wall: Callable[[], float] = time.time,
                 registry: CollectorRegistry | None = None) -> None:
        if max_rows <= 0 or report_rows <= 0:
            raise ValueError("max_rows and report_rows must be positive")
        self.sampler = Sampler(rate)
        self.max_rows = max_rows
        self.report_rows = report_rows
        self.report_bytes = report_bytes
        self._wall = wall
        self._rows: collections.deque[tables_pb2.TrafficRow] = collections.deque()
        self.recorded = 0  # rows recorded (cumulative)
        self.dropped = 0  # sampled requests dropped because max_rows rows waited (cumulative)
        self._unreported = 0  # of those, dropped since the last report
        if registry is not None:
            registry.register(_Collected(self))

    @classmethod
    def from_settings(cls, settings: RecordSettings, *, wall: Callable[[], float] = time.time,
                      registry: CollectorRegistry | None = None) -> Recorder:
        """The recorder of a proxy's ``[proxy] record_*`` keys."""
        return cls(rate=settings.record_rate, max_rows=settings.record_max_rows,
                   report_rows=settings.record_report_rows, report_bytes=settings.record_report_bytes, wall=wall,
                   registry=registry)

    def __len__(self) -> int:
        return len(self._rows)

    def record(self, state: Finished, status: str, elapsed: float) -> None:
        """A request ended with ``status`` after ``elapsed`` seconds: its row kept when it is sampled."""
        sampler = self.sampler
        if not sampler.every and (sampler.never or not sampler.sampled(state.request_id)):
            return
        if len(self._rows) >= self.max_rows:
            self.dropped += 1
            self._unreported += 1
            return
        self._rows.append(row_of(state, status, elapsed, self._wall() - elapsed))
        self.recorded += 1

    def take(self, limit: int | None = None) -> list[tables_pb2.TrafficRow]:
        """The oldest rows waiting, at most ``limit`` (``report_rows`` by default) and ``report_bytes`` serialized
        (:func:`ferry.grpcutil.take_within`: a report stays far under the watch's message limit whatever the
        prompts' lengths), taken off the buffer."""
        return take_within(self._rows, max_rows=self.report_rows if limit is None else limit,
                           max_bytes=self.report_bytes)

    def fill(self, report: tables_pb2.Report) -> None:
        """Move the oldest rows onto ``report`` (at most ``report_rows``, ``report_bytes``) with the drops since
        the last report."""
        report.traffic.extend(self.take())
        report.traffic_dropped = self._unreported
        self._unreported = 0


class _Collected:
    """The recorder's counters, read when scraped."""

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        r = self._recorder
        yield CounterMetricFamily(name("proxy_recorded"), "Requests recorded by the traffic recorder "
                                  "(dataplane.record).", value=r.recorded)
        yield CounterMetricFamily(name("proxy_recorded_dropped"), "Sampled requests not recorded: "
                                  "record_max_rows rows were waiting for a report.", value=r.dropped)
        yield GaugeMetricFamily(name("proxy_recorded_waiting"), "Recorded rows waiting for a usage report.",
                                value=len(r))
