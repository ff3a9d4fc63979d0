"""The leader's scaling task: every ``interval_seconds``, gather the demand, plan each model and region, publish.

One step (:meth:`ScalingService.step`, only while this control plane leads:
it alone holds every proxy's report and every member):

1. the first step loads the history and the kept timings from the store
   (:class:`controlplane.scaling.history.History`); until it succeeds the
   plan runs with no history and the step retries the load next time;
2. :func:`controlplane.scaling.demand.gather` and
   :func:`controlplane.scaling.demand.standby_nodes` read the members and the
   proxies' merged figures; :class:`controlplane.scaling.timings.Timings`
   measures start-up and replacement times;
3. :func:`controlplane.scaling.plan.plan` decides each (model, region) with
   the previous decision (the cool-down's state, kept here: at most
   ``max_series`` pairs, those not seen for a day are forgotten);
4. the plans become ``admin_pb2.ScaleView`` and ``StandbyView`` rows:
   metrics (:meth:`controlplane.metrics.Metrics.observe_scaling`) and
   ``Admin.GetScale``; a region's ``standby_to_keep`` is
   :func:`controlplane.scaling.plan.standby_for` of its models' plans;
5. each pair's arrival rate raises its hour's peak in the history, which is
   written to the store every ``history_write_seconds`` with the timings
   (a store error is logged and retried at the next write).

A control plane that stops leading publishes nothing more (its series are
removed, so an autoscaler never reads a stale plan) and, leading again,
reads the history afresh.

:class:`ScalingSettings` carries every parameter, checked at construction
(``ConfigError`` naming ``scaling.<key>``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable

from controlplane.fleet.view import Member, is_live, replica_state
from controlplane.metrics import Metrics
from controlplane.scaling.demand import READY, WARMING, gather, standby_nodes
from controlplane.scaling.history import History
from controlplane.scaling.plan import DAY, Plan, State, Targets, plan, standby_for
from controlplane.scaling.timings import Timings
from controlplane.store.base import Store
from controlplane.tables.usage import Figures
from controlplane.validate import check_filter
from ferry.errors import ConfigError, FerryError
from ferry.v1 import admin_pb2

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScalingSettings:
    """The scaling task's parameters: the plan's targets and the edge's timing and bounds.

    ``interval_seconds``: between steps; ``history_write_seconds``: between writes of the history;
    ``startup_default_seconds`` / ``replacement_default_seconds``: before either is measured;
    ``default_service_seconds``: a request's slot time before one is measured; ``default_slots``: a
    replica's slots when the model has none yet; ``max_series``: (model, region) pairs planned and kept.
    """

    targets: Targets = dataclasses.field(default_factory=Targets)
    interval_seconds: float = 5.0
    history_write_seconds: float = 60.0
    startup_default_seconds: float = 120.0
    replacement_default_seconds: float = 600.0
    default_service_seconds: float = 2.0
    default_slots: int = 16
    max_series: int = 1024

    def __post_init__(self) -> None:
        try:
            self.targets.check()
        except FerryError as exc:
            raise ConfigError("scaling", str(exc)) from exc
        for key in ("interval_seconds", "history_write_seconds", "startup_default_seconds",
                    "replacement_default_seconds", "default_service_seconds"):
            if not 0 < getattr(self, key) <= 7 * DAY:
                raise ConfigError(f"scaling.{key}", "must be > 0 and at most a week")
        for key in ("default_slots", "max_series"):
            if not 0 < getattr(self, key) <= 1_000_000:
                raise ConfigError(f"scaling.{key}", "must be > 0")


class ScalingService:
    """Plans scaling on the leader and keeps the last plan for the metrics and ``Admin.GetScale``.

    Dependencies: the store (history), ``members`` and ``figures`` (the leader's merged view),
    ``leading``, ``cordoned``, the metrics, a monotonic ``clock`` and the ``wall`` clock (hours of the week).
    """

    def __init__(self, settings: ScalingSettings, *, store: Store, members: Callable[[], Iterable[Member]],
                 figures: Callable[[], dict[tuple[str, str, str], Figures]], leading: Callable[[], bool],
                 cordoned: Callable[[], set[str]], metrics: Metrics, clock: Callable[[], float],
                 wall: Callable[[], float], grace_seconds: float, max_region_bytes: int = 64) -> None:
        self.settings = settings
        self._max_region_bytes = max_region_bytes
        self.history = History(store, max_series=settings.max_series)
        self.timings = Timings(startup_default=settings.startup_default_seconds,
                               replacement_default=settings.replacement_default_seconds)
        self._members = members
        self._figures = figures
        self._leading = leading
        self._cordoned = cordoned
        self._metrics = metrics
        self._clock = clock
        self._wall = wall
        self._grace = grace_seconds
        self._states: dict[tuple[str, str], tuple[State, float]] = {}  # pair -> (decision, last seen, wall)
        self._written_at: float | None = None
        self.views: list[admin_pb2.ScaleView] = []
        self.standby: list[admin_pb2.StandbyView] = []
        self.sampled_at = 0.0

    async def run(self) -> None:
        """Step every ``interval_seconds`` while leading; a failed step is logged, the loop goes on."""
        while True:
            await asyncio.sleep(self.settings.interval_seconds)
            if not self._leading():
                self.forget()
                continue
            try:
                await self.step()
            except Exception:  # the loop must outlive a bug in one step
                log.exception("scaling step failed")

    def forget(self) -> None:
        """Not leading: publish nothing (no stale series for an autoscaler), and start afresh when leading
        again: the decisions are dropped and the history is read again (the other leader wrote it since)."""
        if self.views or self.standby or self._states or self.history.loaded:
            self.views, self.standby, self._states = [], [], {}
            self.history = History(self.history.store, max_series=self.settings.max_series)
            self._metrics.observe_scaling([], [])

    async def step(self) -> None:
        """One step (see the module docstring)."""
        if not self.history.loaded:
            try:
                await self.history.load()
                for region, (startup, replacement) in (await self.history.load_timings()).items():
                    self.timings.restore(region, startup=startup, replacement=replacement)
            except FerryError as exc:
                log.warning("scaling history not loaded (retried next step): %s", exc)
        self.compute()
        await self._write()

    def compute(self) -> None:
        """Gather, measure, plan and publish, without I/O."""
        s, now, wall = self.settings, self._clock(), self._wall()
        members = list(self._members())
        live = [m for m in members if is_live(m, now, self._grace)]
        self.timings.observe(
            now,
            ((rid, m.region, replica_state(m, rid, True) == READY) for m in live for rid in m.replicas
             if replica_state(m, rid, True) in (WARMING, READY)),
            ((m.node, m.region) for m in live))
        gathered = gather(live, self._figures(), now=now, grace=self._grace,
                          default_service_seconds=s.default_service_seconds, default_slots=s.default_slots,
                          max_pairs=s.max_series)
        if gathered.dropped:
            self._metrics.reject("scaling_series", gathered.dropped)
        standby = standby_nodes(live, now=now, grace=self._grace, cordoned=self._cordoned())
        views: list[admin_pb2.ScaleView] = []
        plans: dict[str, list[Plan]] = {region: [] for region in standby}
        for (model, region), seen in sorted(gathered.pairs.items()):
            previous = self._states.get((model, region))
            try:
                decided = plan(seen.demand, seen.shape, s.targets, history=self.history.records(model, region),
                               now=wall, startup_seconds=self.timings.startup(region),
                               replacement_seconds=self.timings.replacement(region), current=seen.current,
                               standby_nodes=standby.get(region, 0),
                               previous=previous[0] if previous is not None else None)
            except FerryError as exc:
                log.warning("scaling plan of %s in %s: %s", model, region, exc)
                continue
            self._states[(model, region)] = (decided.state, wall)
            self.history.observe(model, region, wall, seen.demand.arrival_rate, seen.demand.service_seconds)
            plans.setdefault(region, []).append(decided)
            views.append(admin_pb2.ScaleView(
                model=model, region=region, current=seen.current, ready=seen.demand.ready,
                needed_now=decided.needed_now, needed_for_ramp=decided.needed_for_ramp, desired=decided.desired,
                promote=decided.promote, arrival_rate=seen.demand.arrival_rate,
                forecast_rate=decided.forecast_rate, queue_wait_seconds=seen.demand.queue_wait_seconds,
                service_seconds=seen.demand.service_seconds))
        for pair in [p for p, (_, seen_at) in self._states.items() if wall - seen_at > DAY]:
            del self._states[pair]
        self.views = views
        self.standby = [admin_pb2.StandbyView(
            region=region, standby_nodes=standby.get(region, 0), standby_to_keep=standby_for(decided),
            startup_seconds=self.timings.startup(region), replacement_seconds=self.timings.replacement(region))
            for region, decided in sorted(plans.items())]
        self.sampled_at = wall
        self._metrics.observe_scaling(self.views, self.standby)

    async def _write(self) -> None:
        now = self._clock()
        if self._written_at is not None and now - self._written_at < self.settings.history_write_seconds:
            return
        self._written_at = now
        try:
            await self.history.flush()
            await self.history.save_timings(self.timings.measured())
        except FerryError as exc:
            log.warning("scaling history not written (retried in %g s): %s", self.settings.history_write_seconds,
                        exc)

    def scale(self, request: admin_pb2.GetScaleRequest) -> admin_pb2.GetScaleResponse:
        """The last plan, filtered by ``request.region`` (``InvalidArgument`` naming ``region`` when bad)."""
        region = request.region
        check_filter(region, "region", self._max_region_bytes)
        return admin_pb2.GetScaleResponse(
            models=[v for v in self.views if not region or v.region == region],
            regions=[v for v in self.standby if not region or v.region == region],
            sampled_at=self.sampled_at, leading=self._leading())
