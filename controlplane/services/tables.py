"""The routing tables: compute and version them, serve them to the proxies, wait until they reflect a write.

:class:`TableService` runs the computation loop (:meth:`TableService.run`):
it recomputes ``debounce_seconds`` (20 ms) after :meth:`TableService.notify`
(a change of membership, replica state, intent or leadership, or a
follower's report) and at least every ``tick_seconds`` (0.5 s): loads alone
ride the tick, so a large fleet whose loads always move gets one table
version per tick (plus one per follower report), not one per telemetry
message. Only the leader computes (:func:`controlplane.tables.compute.compute_tables`,
then tier quotas, spill weights and tenants attached, versioned by
:class:`controlplane.tables.compute.TableVersions`); a follower adopts the leader's
tables (:meth:`TableService.adopt`). Each new version goes at once to the
region's proxies (through the feed, :mod:`controlplane.tables.feed`: serialized
once, in full and as a delta from the version before it here, for all of
them) and, leading, to the followers. Cost per computation: see
:mod:`controlplane.tables.compute`.

``Tables.Watch`` from the servicer side: :meth:`TableService.subscribe`
validates the subscription (``controlplane.validate``; INVALID_ARGUMENT naming
the field, RESOURCE_EXHAUSTED past ``max_watchers`` or ``max_proxies``) and
offers the region's current table at once (computing it on the leader, asking
the leader on a follower); :meth:`TableService.ack` records what the proxy
applied or why it rejected a version (a stale or malformed ack is ignored and
counted; a resync sends the current table in full); :meth:`TableService.proxy_report` keeps the proxy's last usage
report (:mod:`controlplane.tables.usage`). O(1) per message, the acking proxy's
metrics included; a subscription observes every proxy's, O(proxies).

The fleet's metrics (members, replicas by state, utilisation, GPUs, load ages:
:meth:`controlplane.metrics.Metrics.observe_fleet` and the rest) cost about 35
ms for 5,000 replicas, so a pass for loads alone (the tick) observes them only
when ``OBSERVE_SECONDS`` (1 s) have passed since the last observation, rather
than twice a second: a scrape every 15 s or more reads loads at most a second
old. A pass after any other change observes them at once.

:meth:`TableService.reflect` is how an operator write waits for the tables
(:mod:`controlplane.intent.writer`): recomputed after the debounce on the
leader (the writes waiting together share that pass), then, leader or
follower alike, until the tables held here satisfy a predicate.

State: the table versions, the proxies' watchers and usage, the spill
planner, the pending recomputation. Dependencies: the settings, the catalog,
the clocks, the metrics, the intent cache, the peers (who leads, the merged
members, the followers) and ``before_pass`` (the housekeeping run before each
pass: forget expired members, follow the election).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from controlplane import validate
from controlplane.config import ControlPlaneSettings
from controlplane.fleet.view import Member
from controlplane.intent.cache import IntentCache
from controlplane.metrics import Metrics
from controlplane.services.peers import PeerService
from controlplane.services.traffic import TrafficService
from controlplane.tables import views
from controlplane.tables.cachestats import attach_cache, merge_cache
from controlplane.tables.compute import Published, RouteRows, TableVersions, compute_tables
from controlplane.tables.diff import diff_tables, pick_versions
from controlplane.tables.quotas import attach_quotas
from controlplane.tables.spill import SpillPlanner
from controlplane.tables.usage import ProxyUsage
from controlplane.tables.views import node_view, usage_rows
from controlplane.tables.watchers import Watcher, Watchers
from controlplane.tenants.records import attach_tenants
from ferry.config import TIERS, ModelConfig
from ferry.errors import InvalidArgument, Overloaded
from ferry.logs import event
from ferry.v1 import admin_pb2, tables_pb2

log = logging.getLogger(__name__)

OBSERVE_SECONDS = 1.0


class TableService:
    """Computes, versions and serves the tables.

    State: the table versions, the watchers, the proxies' usage, the spill planner, the pending
    recomputation. Dependencies: settings, catalog, clocks, metrics, the intent cache, the peer service,
    ``before_pass``.
    """

    def __init__(
        self,
        settings: ControlPlaneSettings,
        *,
        catalog: Sequence[ModelConfig],
        tables: TableVersions,
        watchers: Watchers,
        proxy_usage: ProxyUsage,
        spill: SpillPlanner,
        intent: IntentCache,
        peers: PeerService,
        metrics: Metrics,
        clock: Callable[[], float],
        wall: Callable[[], float],
        before_pass: Callable[[], None] = lambda: None,
        traffic: TrafficService | None = None,
    ) -> None:
        self.traffic = traffic  # the proxies' recorded rows, taken off their reports (controlplane.traffic)
        self.settings = settings
        self._catalog = tuple(catalog)
        self.versions = tables
        self.watchers = watchers
        self.proxy_usage = proxy_usage
        self.spill = spill
        self._intent = intent
        self._peers = peers
        self._metrics = metrics
        self._clock = clock
        self._wall = wall
        self._before_pass = before_pass
        self._rows = RouteRows()  # each replica's row, rebuilt only when its registration or load changed
        self._observed_at = float("-inf")  # the last pass that observed the fleet's metrics
        self._dirty = asyncio.Event()
        self._changed = asyncio.Event()  # pulsed whenever a table is published or adopted here
        self.stopping = False
        # the router configs each region's proxies run (controlplane.services.routerconfig.RouterService.attach)
        self.attach_router: Callable[[dict[str, tables_pb2.TableSnapshot]], None] | None = None

    def notify(self) -> None:
        """Something changed: recompute after the debounce."""
        self._dirty.set()

    def stop(self) -> None:
        """Close every proxy's stream (UNAVAILABLE)."""
        self.stopping = True
        self.watchers.close_all("the control plane is stopping")

    # -- computation

    async def run(self) -> None:
        """The computation loop: after the debounce of a change, and every tick."""
        while True:
            try:
                async with asyncio.timeout(self.settings.tick_seconds):
                    await self._dirty.wait()
                await asyncio.sleep(self.settings.debounce_seconds)
            except TimeoutError:
                pass
            changed = self._dirty.is_set()  # else the tick: loads alone
            self._dirty.clear()
            try:
                self._before_pass()
                if self._peers.leading:
                    self.recompute(changed=changed)
                else:
                    self._reabsorb()
                    self._observe(self._clock(), self._peers.members(), due_only=not changed)
            except Exception:  # the loop must outlive a bug in one pass
                log.exception("table computation failed")

    def _reabsorb(self) -> None:
        """A follower: the loads and telemetry ages of other control planes' replicas as the leader's last tables
        give them (the age the leader measured, not the time since the table arrived)."""
        for region in self.versions.regions():
            published = self.versions.get(region)
            if published is not None:
                self._peers.absorbed(published.snapshot)

    def recompute(self, *, changed: bool = True) -> list[Published]:
        """Compute every region's table; offer each new version to its watchers and followers at once.

        ``changed``: something other than loads may have changed (the fleet's metrics are observed now,
        not only when due)."""
        started = time.perf_counter()
        now = self._clock()
        members = self._peers.members()
        regions = self.watchers.regions() | self._peers.follower_regions()
        intent = self._intent
        tables = compute_tables(
            members, self._catalog, intent.drains, now=now, grace_seconds=self.settings.grace_seconds,
            regions=regions, cordons=intent.cordons, rollouts=intent.rollouts, rows=self._rows,
        )
        shares = dict(zip(TIERS, self.settings.tier_reserved, strict=True))
        for region, quotas in attach_quotas(tables, None, shares).items():  # tier reserves (controlplane.tables.quotas)
            for tier, slots in quotas.quota.items():
                self._metrics.tier_quota.labels(region=region, tier=tier).set(slots)
        leading = self._peers.leading
        weights = self.spill.attach(tables, self.proxy_usage.figures() if leading else None)  # sized by usage
        attach_tenants(tables, intent.tenants)  # the store's tenant set (controlplane.tenants.records)
        attach_cache(tables, merge_cache(self.proxy_usage.entries()) if leading else {})  # tables.cachestats
        if self.attach_router is not None:
            self.attach_router(tables)
        for source, target in self.spill.rtt:  # configured pairs only: a bounded label set
            self._metrics.spill_weight.labels(source=source, target=target).set(weights.get((source, target), 0.0))
        before = set(self.versions.regions())
        published = self.versions.publish(tables, self._wall())
        for region in before - set(tables):
            self._metrics.table_version.remove(region)
            self.watchers.feed.drop(region)
        for new in published:
            self._offer(new)
            self._peers.published(new)
        if published:
            self._pulse()
        self._metrics.table_compute.observe(time.perf_counter() - started)
        self._observe(now, members, due_only=not changed)
        return published

    def adopt(self, snapshot: tables_pb2.TableSnapshot) -> None:
        """A table the leader published: serve it here (ignored while this control plane leads)."""
        if self._peers.leading or self._peers.cluster is None:
            return
        published = self.versions.adopt(snapshot)
        self._peers.absorbed(snapshot)
        if published is not None:
            self._offer(published)
        self._pulse()

    async def reflect(self, reflected: Callable[[], bool], seconds: float) -> bool:
        """Until the leader's tables, as held here, satisfy ``reflected`` (at most ``seconds``; False then).

        Leading, the tables are recomputed after the debounce (writes that wait together share one pass: a
        burst of drains does not compute the fleet's tables once per drain); following, they come from the
        leader.
        """
        if self._peers.leading:
            self.notify()  # one pass after the debounce for every write waiting now, not one per write
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not reflected():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await changed.wait()
        return True

    def _pulse(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _offer(self, published: Published) -> None:
        self._metrics.table_version.labels(region=published.snapshot.region).set(published.version)
        push = self.watchers.feed.publish(published.snapshot)
        for watcher in self.watchers.of_region(published.snapshot.region):
            watcher.offer(push)

    def _observe(self, now: float, members: list[Member], *, due_only: bool = False) -> None:
        """The metrics of one pass. Those of the whole fleet (O(replicas)) only once ``OBSERVE_SECONDS`` have
        passed since the last, when ``due_only`` (a pass for loads alone); a follower measures telemetry ages
        of the nodes it holds only. The proxies' and the leader's own, O(proxies), at every pass."""
        metrics, intent, leading = self._metrics, self._intent, self._peers.leading
        metrics.leader.set(1 if leading else 0)
        metrics.observe_region_usage(self.proxy_usage.figures() if leading else {})
        self._observe_proxies()
        if due_only and now - self._observed_at < OBSERVE_SECONDS:
            return
        self._observed_at = now
        held = None if leading else self._peers.held_here()
        metrics.observe_fleet(members, self.versions, now=now, grace=self.settings.grace_seconds, aged=held)
        rows = usage_rows(members, self.versions, now=now)
        aged = None if held is None else usage_rows([m for m in members if m.node in held], self.versions, now=now)
        metrics.observe_usage(rows, aged)
        wall = self._wall()
        nodes = [node_view(m, intent.allocations.get(m.node), now=now, grace=self.settings.grace_seconds,
                           cordoned=m.node in intent.cordons, control_plane="") for m in members]
        metrics.observe_nodes(nodes, [wall - r.requested_at for r in intent.pending.values()])

    # -- views

    def snapshots(self, region: str) -> dict[str, tables_pb2.TableSnapshot]:
        """The current table of every region (or of ``region`` alone), by region."""
        validate.check_filter(region, "region", self.settings.max_region_bytes)
        out = {}
        for name in self.versions.regions():
            published = self.versions.get(name)
            if published is not None and (not region or name == region):
                out[name] = published.snapshot
        return out

    def get_table(self, region: str) -> admin_pb2.GetTableResponse:
        validate.check_filter(region, "region", self.settings.max_region_bytes)
        return views.get_table(self.versions, self.watchers.statuses(), now=self._clock(), region=region)

    def diff_table(self, region: str, from_version: int, to_version: int) -> admin_pb2.DiffTableResponse:
        validate.check_filter(region, "region", self.settings.max_region_bytes)
        if not region:
            regions = self.versions.regions()
            if len(regions) != 1:
                raise InvalidArgument("region", f"required: the fleet has regions {', '.join(regions) or 'none'}")
            region = regions[0]
        kept = self.versions.history(region)
        old, new = pick_versions(kept, region, from_version, to_version)
        return admin_pb2.DiffTableResponse(region=region, from_version=old.version, to_version=new.version,
                                           changes=diff_tables(old, new), kept_versions=[s.version for s in kept])

    # -- proxies

    def subscribe(self, sub: tables_pb2.Subscribe) -> Watcher:
        try:
            validate.check_subscribe(sub, self.settings)
            watcher = self.watchers.subscribe(sub.proxy_id, sub.region, deltas=sub.deltas,
                                              have_version=sub.have_version)
        except InvalidArgument:
            self._metrics.reject("subscribe_field")
            raise
        except Overloaded:
            self._metrics.reject("watchers_limit")
            raise
        published = self.versions.get(sub.region)
        if published is None and self._peers.leading:
            self.recompute()
            published = self.versions.get(sub.region)
        if published is not None:  # always, even to a proxy that holds it (tables.proto): an empty delta then
            watcher.offer(self.watchers.feed.publish(published.snapshot))
        else:
            self._peers.ask_leader()  # a follower: ask the leader for the region now
        self._observe_proxies()
        return watcher

    def ack(self, watcher: Watcher, ack: tables_pb2.Ack) -> None:
        ignored = self.watchers.ack(watcher, ack)
        if ignored is not None:
            self._metrics.reject(ignored)
        elif not ack.applied:
            event(log, "table_rejected_by_proxy", logging.WARNING, proxy_id=watcher.status.proxy_id,
                  version=ack.version, reason=ack.error)
        self._metrics.observe_proxy(watcher.status, self.versions, now=self._clock())

    def pushed(self, watcher: Watcher) -> None:
        self._metrics.table_pushes.labels(region=watcher.region).inc()

    def unsubscribe(self, watcher: Watcher) -> None:
        self.watchers.unsubscribe(watcher)
        self.proxy_usage.drop(watcher.status.proxy_id, watcher)

    def proxy_report(self, watcher: Watcher, report: tables_pb2.Report) -> None:
        """A proxy's usage report: kept as its last (tables.usage); a malformed one is ignored and counted."""
        if self.traffic is not None:  # its recorded rows, taken off first (controlplane.traffic)
            self.traffic.take(watcher.status.proxy_id, watcher.region, report)
        ignored = self.proxy_usage.put(watcher.status.proxy_id, watcher.region, report, stream=watcher)
        if ignored is not None:
            self._metrics.reject(ignored)

    def _observe_proxies(self) -> None:
        self._metrics.observe_proxies(self.watchers.statuses(), self.versions, now=self._clock())
