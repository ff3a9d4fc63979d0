"""The control plane's composition root: builds the state and the services, wires them, runs the loops.

:class:`Controller` owns no operation of its own: each lives in the service
that holds its state (see each module):

- :class:`controlplane.services.peers.PeerService`: leadership, the shared fleet,
  ``Admin.Follow`` both ways;
- :class:`controlplane.services.tables.TableService`: the computation loop, the
  table versions, the proxies' watch streams;
- :class:`controlplane.intent.writer.IntentWriter`: every operator write of
  intent (check the store, conditional put, echo, the leader's tables);
- :class:`controlplane.services.fleet.FleetService`: agents, members, drains,
  cordons, node, replica and model views;
- :class:`controlplane.services.scaling.ScalingService`: the scaling plan (replicas
  needed now and for the next ramp, standby to keep), on the leader;
- :class:`controlplane.services.routerconfig.RouterService`: router config
  rollouts, their tables' part and the guard's tick on the leader;
- :class:`controlplane.services.tenants.TenantService`,
  :class:`controlplane.services.rollout.RolloutService`,
  :class:`controlplane.services.allocation.AllocationService`,
  :class:`controlplane.services.status.StatusService`.

The state they share is built here: members (:class:`FleetView`), intent
(owned by the store, mirrored by :class:`IntentCache`), telemetry in memory,
tables versioned by :class:`TableVersions`. :meth:`Controller.start` syncs the
intent (``Unavailable`` naming the store when it does not answer a listing
within ``store_timeout_seconds``), seeds the tenants, computes the first
tables when alone, then runs four loops: the tables' computation, the store
writes (members' leases and, leading, table heads, woken by membership
changes and every tick, so a slow or absent store never delays the tables)
and, on the leader, gang allocation and the scaling plan. :meth:`Controller.join` takes part in
the election once the server is bound. :meth:`Controller.notify` is the one
signal of a change: the tables recompute after the debounce and the allocator
looks again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from controlplane.config import ControlPlaneSettings
from controlplane.fleet.agents import Agents
from controlplane.fleet.members import MemberLeases
from controlplane.fleet.view import FleetView, is_live
from controlplane.intent.cache import IntentCache
from controlplane.intent.writer import IntentWriter
from controlplane.metrics import Metrics
from controlplane.services.allocation import AllocationService
from controlplane.services.allocator import GangAllocator
from controlplane.services.engines import EngineService
from controlplane.services.fleet import FleetService
from controlplane.services.peers import PeerService
from controlplane.services.rollout import RolloutService
from controlplane.services.routerconfig import RouterService
from controlplane.services.scaling import ScalingService, ScalingSettings
from controlplane.services.status import StatusService
from controlplane.services.tables import TableService
from controlplane.services.tenants import TenantService
from controlplane.services.traffic import TrafficService
from controlplane.store.base import Store
from controlplane.tables.compute import TableVersions, initial_version
from controlplane.tables.spill import SpillPlanner
from controlplane.tables.usage import ProxyUsage
from controlplane.tables.watchers import Watchers
from controlplane.tasks import TaskGroup
from ferry.config import ModelConfig, TenantConfig
from ferry.errors import Unavailable
from ferry.tls import TLSConfig

log = logging.getLogger(__name__)


class Controller:
    """Builds and wires the services of one control plane and runs its loops.

    State: the shared state objects and the services, the loops' tasks. Dependencies: settings, store,
    catalog, clocks, metrics, and for the election the admin credentials and TLS.
    """

    def __init__(
        self,
        settings: ControlPlaneSettings,
        *,
        store: Store,
        catalog: Sequence[ModelConfig],
        clock: Callable[[], float],
        wall: Callable[[], float],
        metrics: Metrics,
        elect: bool = False,
        admin_metadata: tuple[tuple[str, str], ...] = (),
        tls: TLSConfig | None = None,
        tenants: Sequence[TenantConfig] = (),
        scaling: ScalingSettings | None = None,
    ) -> None:
        self.settings = s = settings
        self.metrics = metrics
        # -- shared state
        self.fleet = FleetView(
            clock=clock, grace_seconds=s.grace_seconds, forget_after_seconds=s.forget_after_seconds,
            max_members=s.max_agents, max_replicas_per_node=s.max_replicas_per_node,
        )
        self.agents = Agents(control_plane_id=s.id, max_streams=s.max_agents, queue_size=s.command_queue_size)
        self.watchers = Watchers(max_watchers=s.max_watchers, max_proxies=s.max_proxies, clock=clock)
        self.proxy_usage = ProxyUsage(clock=clock, max_proxies=s.max_proxies)  # controlplane.tables.usage
        self.traffic = TrafficService(s, leading=lambda: self.peers.leading, wall=wall,  # controlplane.traffic
                                      registry=metrics.registry)
        self.tables = TableVersions(initial_version(wall()), history=s.table_history)
        spill = SpillPlanner(s.region_rtt_ms, budget_ms=s.spill_budget_ms, headroom=s.spill_headroom,
                             service_ms=s.spill_service_ms)  # region spill weights (controlplane.tables.spill)
        self.intent = IntentCache(store, on_change=self.notify, on_drain=self._drain_changed)
        allocator = GangAllocator(store, self.intent, s.alloc_policy(), wall=wall, clock=clock,
                                  grace_seconds=s.grace_seconds, timeout=s.store_timeout_seconds,
                                  on_placed=metrics.placed)
        self._clock = clock
        # the engines' step samples and their fits (controlplane.engines): relayed while following
        self.engines = EngineService(clock=clock, wall=wall, relaying=lambda: not self.peers.leading,
                                     members=lambda: self.peers.members(), grace_seconds=s.grace_seconds)
        leases = MemberLeases(store, clock=clock, ttl_seconds=s.grace_seconds, control_plane=s.id,
                              dead=self._seen_dead)
        # -- services
        self.peers = PeerService(
            s, store, fleet=self.fleet, tables=self.tables, watchers=self.watchers, proxy_usage=self.proxy_usage,
            metrics=metrics, clock=clock, wall=wall, notify=self.notify, elect=elect,
            admin_metadata=admin_metadata, tls=tls, traffic=self.traffic, engines=self.engines,
        )
        self.table_service = TableService(
            s, catalog=catalog, tables=self.tables, watchers=self.watchers, proxy_usage=self.proxy_usage,
            spill=spill, intent=self.intent, peers=self.peers, metrics=metrics, clock=clock, wall=wall,
            before_pass=self._before_pass, traffic=self.traffic,
        )
        self.writer = IntentWriter(store, self.intent, self.table_service.reflect, timeout=s.store_timeout_seconds)
        self.fleet_service = FleetService(
            s, catalog=catalog, fleet=self.fleet, agents=self.agents, leases=leases, intent=self.intent,
            writer=self.writer, peers=self.peers, tables=self.tables, metrics=metrics, clock=clock, wall=wall,
            notify=self.notify,
        )
        self.tenant_service = TenantService(s, store=store, configured=tenants, intent=self.intent,
                                            writer=self.writer, tables=self.tables, wall=wall)
        self.rollout_service = RolloutService(s, catalog=catalog, intent=self.intent, writer=self.writer,
                                              peers=self.peers, tables=self.tables, wall=wall)
        self.allocation_service = AllocationService(
            s, catalog=catalog, allocator=allocator, intent=self.intent, writer=self.writer, peers=self.peers,
            fleet=self.fleet, clock=clock, wall=wall, notify=self.notify,
        )
        self.status_service = StatusService(s, writer=self.writer, fleet=self.fleet, intent=self.intent,
                                            peers=self.peers, tables=self.tables, watchers=self.watchers,
                                            clock=clock)
        self.scaling_service = ScalingService(
            scaling or ScalingSettings(), store=store, members=self.peers.members, figures=self.proxy_usage.figures,
            leading=lambda: self.peers.leading, cordoned=lambda: self.intent.cordons, metrics=metrics, clock=clock,
            wall=wall, grace_seconds=s.grace_seconds, max_region_bytes=s.max_region_bytes)
        self.router_service = RouterService(  # router config rollouts (controlplane.routerconfig)
            intent=self.intent, writer=self.writer, watchers=self.watchers, usage=self.proxy_usage, peers=self.peers,
            tables=self.tables, clock=clock, wall=wall, notify=self.notify)
        self.table_service.attach_router = self.router_service.attach
        self._tasks = TaskGroup(logger=log)

    # -- wiring

    def notify(self) -> None:
        """Something changed: recompute after the debounce; the allocator looks again."""
        self.table_service.notify()
        self.allocation_service.wake()

    def _seen_dead(self, node: str) -> bool:
        """Whether ``node`` is known here (held here or by a peer) and not live: its claims may be taken."""
        member = next((m for m in self.peers.members() if m.node == node), None)
        return member is not None and not is_live(member, self._clock(), self.settings.grace_seconds)

    def _drain_changed(self, replica_id: str, drained: bool) -> None:
        self.fleet_service.drain_changed(replica_id, drained)

    def _before_pass(self) -> None:
        self.metrics.store_up.set(1 if self.writer.store.health().ok else 0)  # StoreHealth: no I/O
        self.fleet_service.forget_expired()
        self.peers.forget_expired()
        self.peers.transition()

    # -- lifecycle

    async def start(self) -> None:
        """Sync the intent from the store, compute the first tables (when alone), start the loops."""
        self._tasks.start(self.intent.run(), name="controlplane-intent")
        try:
            async with asyncio.timeout(self.settings.store_timeout_seconds):
                await self.intent.synced.wait()
        except TimeoutError as exc:
            await self.stop()
            health = self.writer.store.health()
            where = f"{health.backend} at {health.endpoint}" if health.endpoint else health.backend
            raise Unavailable(f"the store ({where}) did not answer a listing of the intent within "
                              f"{self.settings.store_timeout_seconds:g} s") from exc
        await self.tenant_service.seed()
        if self.peers.leading:
            self.table_service.recompute()
        self._tasks.start(self.table_service.run(), name="controlplane-loop")
        self._tasks.start(self._store_loop(), name="controlplane-store")
        self._tasks.start(self.allocation_service.run(), name="controlplane-alloc")
        self._tasks.start(self.scaling_service.run(), name="controlplane-scaling")
        self._tasks.start(self.router_service.run(), name="controlplane-router")

    async def join(self, address: str) -> None:
        """Take part in the election as ``address`` (when started with ``elect=True``)."""
        await self.peers.join(address, adopt=self.table_service.adopt)
        if self.peers.elect and self.peers.leading:
            self.table_service.recompute()

    async def stop(self) -> None:
        self.fleet_service.stop()
        self.table_service.stop()
        await self._tasks.stop()
        await self.peers.stop()
        self.traffic.close()

    async def _store_loop(self) -> None:
        """Write members (and, leading, table heads) when they change and at every tick."""
        while True:
            try:
                await self.fleet_service.sync_store(self.settings.tick_seconds)
                await self.peers.write_heads()
            except Exception:
                log.exception("store sync failed")
