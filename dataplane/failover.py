"""What the request path does about failing replicas and saturated regions, gathered for the router.

:class:`Failover` owns, per proxy: the retry budget
(:mod:`dataplane.retrybudget`), the outlier detector
(:mod:`dataplane.outlier`) fed with every attempt's result, the stream
continuation decision (:mod:`dataplane.continuation`) and the region step of
the request path (:mod:`dataplane.spill` with the table's remote replicas,
:mod:`dataplane.regions`). The router calls it at a handful of points and
keeps no state of its own for these. Settings: the ``retry_budget_*``,
``outlier_*``, ``max_continuations`` and ``simulate_region_rtt`` keys of
``[proxy]`` (:mod:`dataplane.config`).

Cost per request: O(1) (a spilled request adds one weighted draw over a
handful of regions); an attempt's result adds O(pool) for the latency test.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import Callable, Mapping

from dataplane.config import ProxySettings
from dataplane.continuation import Delivered, continuable, continuation, cut_error
from dataplane.forward import Call
from dataplane.metrics import ProxyMetrics
from dataplane.outlier import OutlierDetector, OutlierParams
from dataplane.pool import Replica
from dataplane.regions import EMPTY, RemoteView, pick_remote, remote_view
from dataplane.retrybudget import RetryBudget, charged
from dataplane.spill import LocalQueue, RegionBranch, local_wait_ms, region_for
from dataplane.table import Table, TableHolder
from ferry.errors import DeadlineExceeded, FerryError
from ferry.logs import event

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class Spilled:
    """A request sent to another region: the replica there, its region and the round trip."""

    replica: Replica
    region: str
    rtt_ms: float


class Failover:
    """Retry budget, outlier ejection, stream continuation and region spill for one proxy."""

    def __init__(self, settings: ProxySettings, metrics: ProxyMetrics, holder: TableHolder, *,
                 rng: random.Random, clock: Callable[[], float]) -> None:
        self._settings = settings
        self._metrics = metrics
        self._rng = rng
        self._clock = clock
        self.budget = RetryBudget(ratio=settings.retry_budget_ratio,
                                  min_per_second=settings.retry_budget_min_per_second,
                                  window_seconds=settings.retry_budget_window_seconds)
        self.outliers = OutlierDetector(OutlierParams(
            consecutive_failures=settings.outlier_consecutive_failures,
            latency_factor=settings.outlier_latency_factor,
            base_ejection_seconds=settings.outlier_base_ejection_seconds,
            max_ejection_seconds=settings.outlier_max_ejection_seconds,
            max_ejected_share=settings.outlier_max_ejected_share))
        self._view: tuple[Table | None, RemoteView] = (None, EMPTY)  # the last table spilled from, its view
        holder.on_applied(self._forget)

    def _remote(self, table: Table) -> RemoteView:
        """The spill routes of ``table`` as a view, built once per table (the last one kept)."""
        held, view = self._view
        if held is not table:
            view = remote_view(table)
            self._view = (table, view)
        return view

    def _forget(self, table: Table) -> None:
        self.outliers.forget({r.replica_id for entry in table.models.values()
                              for pool in (entry.default, *entry.by_version.values()) for r in pool})

    def note_request(self) -> None:
        """A request was admitted (the budget's denominator)."""
        self.budget.note_request(self._clock())

    def may_retry(self, error: FerryError, model: str) -> bool:
        """Whether the retry budget allows retrying after ``error`` (counts a refusal)."""
        if charged(error) and not self.budget.try_spend(self._clock()):
            self._metrics.retry_budget_exhausted.labels(model).inc()
            return False
        return True

    def resume(self, original: Call, error: FerryError, delivered: Delivered, model: str) -> Call | None:
        """The call continuing a stream cut after output (None: all was delivered); raises Unavailable if none."""
        why = ""
        if isinstance(error, DeadlineExceeded):
            why = "the request's deadline passed"
        elif not continuable(error):
            why = "the failure is not the replica's"
        elif delivered.continuations >= self._settings.max_continuations:
            why = f"{delivered.continuations} continuation(s) already"
        elif not self.may_retry(error, model):
            why = "retry budget exhausted"
        if why:
            self._metrics.continuations.labels(model, "cut").inc()
            event(log, "stream_cut", logging.WARNING, request_id=original.request_id, model=model,
                  tokens_delivered=delivered.tokens, error=str(error), reason=why)
            raise cut_error(delivered, error, why) from None
        self._metrics.continuations.labels(model, "continued").inc()
        event(log, "stream_continued", request_id=original.request_id, model=model,
              tokens_delivered=delivered.tokens, error=str(error), continuation=delivered.continuations + 1)
        return continuation(original, delivered)

    def ejected(self) -> frozenset[str]:
        """Replica ids to keep traffic off now."""
        return self.outliers.ejected(self._clock())

    def result(self, replica_id: str, model: str, *, ok: bool, started: float, tokens: int, pool_size: int) -> None:
        """One attempt's result (``ok``: answered; else the replica failed) for the outlier detector."""
        now = self._clock()
        per_token = (now - started) / max(1, tokens) if ok else None
        reason = self.outliers.record(replica_id, model, ok=ok, seconds_per_token=per_token, now=now,
                                      pool_size=pool_size)
        if reason is not None:
            self._metrics.ejections.labels(model, reason).inc()
            event(log, "replica_ejected", logging.WARNING, replica_id=replica_id, model=model, reason=reason)

    def spill(self, table: Table, model: str, tier: str, local: Mapping[str, int],
              queue: Callable[[], LocalQueue | None] | None = None, counted: Mapping[str, int] | None = None,
              trust: Callable[[float], float] | None = None) -> Spilled | None:
        """Step 3 of the request path: a replica of another region when the spill weights say so, or when
        the local ``queue`` (read only when the table has spill routes) would wait too long and a target has room
        (:func:`dataplane.spill.spill_on_queue`);
        ``local``: this proxy's in-flight per replica, ``counted``: the part the table's loads include,
        ``trust``: the share of a pushed load still standing at its age (:class:`dataplane.policy.LocalLoad`)."""
        view = self._remote(table)
        if not view.targets:
            return None
        waiting = queue() if queue is not None else None
        choice = region_for(
            self._settings.region, view.targets, tier=tier, u=self._rng.random(), usable=view.usable(model),
            wait_ms=0.0 if waiting is None else local_wait_ms(waiting), threshold_ms=self._settings.spill_queue_ms,
            rooms=lambda: view.rooms(model, local, counted or {}, headroom=self._settings.spill_headroom,
                                     share=self._settings.admission_capacity_share))
        if choice.branch is RegionBranch.LOCAL:
            return None
        replica = pick_remote(view.replicas.get((choice.region, model), ()), local, self._rng, counted=counted,
                              trust=trust, table_age=self._clock() - table.applied_at)
        if replica is None:
            return None
        self._metrics.spilled.labels(self._settings.region, choice.region).inc()
        return Spilled(replica, choice.region, choice.rtt_ms)

    async def cross_region(self, rtt_ms: float) -> None:
        """On one machine, a spilled forward waits the configured round trip (``simulate_region_rtt``)."""
        if rtt_ms and self._settings.simulate_region_rtt:
            await asyncio.sleep(rtt_ms / 1000.0)
