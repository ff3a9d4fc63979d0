"""The control plane's core: what the servicers call, and the loop that recomputes the tables.

It ties the state to its owners: members are written to the store under a
lease (``/ferry/members/{node}``, TTL ``grace_seconds``, refreshed every third
of it while the agent stream is open, so a node whose control plane or stream
is gone drops out of the store by itself) and held in the :class:`FleetView`;
operator intent is owned by the store and mirrored by :class:`IntentCache`;
telemetry stays in memory; the tables are computed by the pure
:func:`compute_tables` and versioned by :class:`TableVersions`.

Alone (``elect=False``, the embedded store) a control plane always leads.
With ``elect=True`` it joins the others on the store through a
:class:`controlplane.cluster.Cluster` once its server is bound
(:meth:`join`): only the leader computes tables, from its own members merged
with the others' (:func:`controlplane.remote.merge`), and pushes them to its
proxies and to the followers, which push them to theirs; a follower reports
its members' load to the leader every tick. A control plane that starts to
lead in a new term rebases its table versions above all it saw.

The loop recomputes ``debounce_seconds`` (20 ms) after a change of
membership, replica state, intent or leadership, or a follower's report, and
at least every ``tick_seconds`` (0.5 s): loads alone ride the tick, so a
large fleet whose loads always move gets one table version per tick (plus
one per follower report), not one per telemetry message. Store writes
(members, table heads) run in a loop of their own, woken by membership
changes and every tick, so a slow or absent store never delays the tables.
A drain or undrain is refused at once with ``Unavailable`` while the store is
unreachable; otherwise it waits for the store to echo its write, for the
tables to drop a drained replica (pushed before it returns), then tells the
replica's agent; every other control plane tells its own agents when the
intent reaches it. A cordoned node's replicas leave the tables (no command:
they keep running what they run). Gang allocation runs in a loop of its own
on the leader (:mod:`controlplane.allocator`), woken by the same changes and
every tick, so store writes of placements never delay the tables. Cost per
computation: see :mod:`controlplane.table`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from controlplane import telemetry_check, validate
from controlplane.agents import Agents, AgentSession
from controlplane.allocator import GangAllocator
from controlplane.cluster import Cluster
from controlplane.config import ControlPlaneSettings
from controlplane.fleet import FleetView, Member
from controlplane.fleetops import FleetOps
from controlplane.fleetviews import node_view, usage_rows
from controlplane.intent import IntentCache
from controlplane.members import MemberLeases
from controlplane.metrics import Metrics
from controlplane.operator import Operator
from controlplane.peers import Peers
from controlplane.proxies import Proxies
from controlplane.quotas import attach_quotas
from controlplane.regions import SpillPlanner
from controlplane.store import Store
from controlplane.table import Published, TableVersions, compute_tables, initial_version
from controlplane.tenantrpc import TenantOps
from controlplane.tenants import attach_tenants
from controlplane.usage import ProxyUsage
from controlplane.watchers import Watchers
from ferry.config import TIERS, ModelConfig, TenantConfig
from ferry.errors import AlreadyExists, InvalidArgument, Overloaded, Unavailable
from ferry.logs import event
from ferry.tls import TLSConfig
from ferry.v1 import common_pb2, fleet_pb2

log = logging.getLogger(__name__)

NOT_DRAINING = (common_pb2.REPLICA_STATE_UNSPECIFIED, common_pb2.REPLICA_STATE_WARMING, common_pb2.REPLICA_STATE_READY)
KIND = fleet_pb2.Command


class Controller(Operator, FleetOps, Peers, Proxies, TenantOps):
    """Everything the servicers call; holds no gRPC types but the generated messages."""

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
    ) -> None:
        self.settings = s = settings
        self._configured_tenants = tuple(tenants)  # the config file's, seeded once (controlplane.tenantrpc)
        self.store = store
        self._catalog = tuple(catalog)
        self._strict_models = frozenset(m.name for m in self._catalog) if settings.strict_catalog else None
        self._clock = clock
        self._wall = wall
        self.metrics = metrics
        self.elect = elect
        self._admin_metadata = admin_metadata  # a follower's credentials on Admin.Follow
        self._tls = tls  # a follower's mutual TLS to the leader (None: plain text)
        self.fleet = FleetView(
            clock=clock, grace_seconds=s.grace_seconds, forget_after_seconds=s.forget_after_seconds,
            max_members=s.max_agents, max_replicas_per_node=s.max_replicas_per_node,
        )
        self.agents = Agents(control_plane_id=s.id, max_streams=s.max_agents, queue_size=s.command_queue_size)
        self.watchers = Watchers(max_watchers=s.max_watchers, max_proxies=s.max_proxies, clock=clock)
        self.proxy_usage = ProxyUsage(clock=clock, max_proxies=s.max_proxies)  # controlplane.usage
        self.tables = TableVersions(initial_version(wall()), history=s.table_history)
        self.spill = SpillPlanner(s.region_rtt_ms, budget_ms=s.spill_budget_ms, headroom=s.spill_headroom,
                                  service_ms=s.spill_service_ms)  # region spill weights (controlplane.regions)
        self.intent = IntentCache(store, on_change=self.notify, on_drain=self._drain_changed)
        self.allocator = GangAllocator(store, self.intent, s.alloc_policy(), wall=wall, clock=clock,
                                       grace_seconds=s.grace_seconds, timeout=s.store_timeout_seconds,
                                       on_placed=metrics.placed)
        self._alloc_due = asyncio.Event()
        self.leases = MemberLeases(store, clock=clock, ttl_seconds=s.grace_seconds)
        self.cluster: Cluster | None = None
        self.address = ""
        self.stopping = False
        self.leading = not elect
        self._term = 0
        self._initiating: set[str] = set()
        self._adopted: asyncio.Event | None = None
        self._dirty = asyncio.Event()
        self._store_due = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle

    async def start(self) -> None:
        """Sync the intent from the store, compute the first tables (when alone), start the loops."""
        self._tasks.append(asyncio.create_task(self.intent.run(), name="controlplane-intent"))
        try:
            async with asyncio.timeout(self.settings.store_timeout_seconds):
                await self.intent.synced.wait()
        except TimeoutError as exc:
            await self.stop()
            health = self.store.health()
            where = f"{health.backend} at {health.endpoint}" if health.endpoint else health.backend
            raise Unavailable(f"the store ({where}) did not answer a listing of the intent within "
                              f"{self.settings.store_timeout_seconds:g} s") from exc
        await self.seed_tenants()
        if self.leading:
            self.recompute()
        self._tasks.append(asyncio.create_task(self._loop(), name="controlplane-loop"))
        self._tasks.append(asyncio.create_task(self._store_loop(), name="controlplane-store"))
        self._tasks.append(asyncio.create_task(self._alloc_loop(), name="controlplane-alloc"))

    async def join(self, address: str) -> None:
        """Take part in the election as ``address`` (when started with ``elect=True``)."""
        self.address = address
        if not self.elect:
            return
        self.cluster = Cluster(self.store, self.settings, address=address, clock=self._clock, wall=self._wall,
                               on_change=self.notify, report=self.follower_report, adopt=self.adopt,
                               metadata=self._admin_metadata, tls=self._tls)
        await self.cluster.start(self.settings.store_timeout_seconds)
        self._transition()
        if self.leading:
            self.recompute()

    async def stop(self) -> None:
        self.stopping = True
        self.agents.close_all("the control plane is stopping")
        self.watchers.close_all("the control plane is stopping")
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self.cluster is not None:
            await self.cluster.stop()

    def notify(self) -> None:
        """Something changed: recompute after the debounce; the allocator looks again."""
        self._dirty.set()
        self._alloc_due.set()

    def wake_allocator(self) -> None:
        self._alloc_due.set()

    def reject(self, reason: str, count: int = 1) -> None:
        self.metrics.reject(reason, count)

    # -- agents

    def register(self, reg: fleet_pb2.Register) -> AgentSession:
        try:
            validate.check_register(reg, self.settings, self._strict_models)
            member = self.fleet.register(reg)
        except InvalidArgument:
            self.reject("register_field")
            raise
        except Overloaded:
            self.reject("agents_limit")
            raise
        except AlreadyExists:
            self.reject("register_conflict")
            raise
        session = self.agents.attach(member)
        self._member_changed(member.node)
        for replica_id, info in member.replicas.items():  # drains requested while the node was away
            if replica_id in self.intent.drains and info.state in NOT_DRAINING:
                self._send(session, KIND.KIND_DRAIN, replica_id)
        self.notify()
        event(log, "node_registered", node=member.node, region=member.region, replicas=len(member.replicas))
        return session

    def telemetry(self, session: AgentSession, telemetry: fleet_pb2.Telemetry) -> None:
        self.metrics.telemetry_messages.inc()
        if self.fleet.member(session.node) is not session.member:
            self.reject("stale_session")
            return
        try:
            validate.check_telemetry(telemetry, self.settings, self._strict_models)
            telemetry_check.check_loads(telemetry, self.settings.max_replicas_per_node)
        except InvalidArgument:
            self.reject("telemetry_field")
            raise
        outcome = self.fleet.apply_telemetry(session.member, telemetry)
        for reason, count in outcome.ignored.items():
            self.reject(reason, count)
        if outcome.membership_changed:
            self._member_changed(session.node)
        if outcome.membership_changed or outcome.state_changed:
            self.notify()  # loads alone ride the next tick: at most one version per tick for load

    def command_result(self, session: AgentSession, result: fleet_pb2.CommandResult) -> None:
        level = logging.INFO if result.ok else logging.WARNING
        log.log(level, "node %s: command %s ok=%s %s", session.node, result.command_id, result.ok, result.message)

    def disconnect(self, session: AgentSession) -> None:
        self.agents.detach(session)
        if self.fleet.disconnect(session.member):
            event(log, "agent_stream_ended", node=session.node)
            self.notify()

    def _member_changed(self, node: str) -> None:
        self.leases.changed(node)
        self._store_due.set()

    # -- tables

    def recompute(self) -> list[Published]:
        """Compute every region's table; offer each new version to its watchers and followers at once."""
        started = time.perf_counter()
        now = self._clock()
        members = self.members()
        regions = self.watchers.regions()
        if self.cluster is not None:
            regions |= self.cluster.followers.regions()
        tables = compute_tables(
            members, self._catalog, self.intent.drains, now=now, grace_seconds=self.settings.grace_seconds,
            regions=regions, cordons=self.intent.cordons, rollouts=self.intent.rollouts,
        )
        shares = dict(zip(TIERS, self.settings.tier_reserved, strict=True))
        for region, quotas in attach_quotas(tables, None, shares).items():  # tier reserves (controlplane.quotas)
            for tier, slots in quotas.quota.items():
                self.metrics.tier_quota.labels(region=region, tier=tier).set(slots)
        weights = self.spill.attach(tables, self.proxy_usage.figures() if self.leading else None)  # sized by usage
        attach_tenants(tables, self.intent.tenants)  # the store's tenant set (controlplane.tenants)
        for source, target in self.spill.rtt:  # configured pairs only: a bounded label set
            self.metrics.spill_weight.labels(source=source, target=target).set(weights.get((source, target), 0.0))
        before = set(self.tables.regions())
        changed = self.tables.publish(tables, self._wall())
        for region in before - set(tables):
            self.metrics.table_version.remove(region)
        for published in changed:
            self._offer(published)
            if self.cluster is not None:
                self.cluster.published(published)
        self.metrics.table_compute.observe(time.perf_counter() - started)
        self._observe(now, members)
        return changed

    def _offer(self, published: Published) -> None:
        self.metrics.table_version.labels(region=published.snapshot.region).set(published.version)
        for watcher in self.watchers.of_region(published.snapshot.region):
            watcher.offer(published.snapshot)

    def _observe(self, now: float, members: list[Member]) -> None:
        self.metrics.observe_fleet(members, self.tables, now=now, grace=self.settings.grace_seconds)
        self.metrics.observe_usage(usage_rows(members, self.tables, now=now))
        self.metrics.observe_region_usage(self.proxy_usage.figures() if self.leading else {})
        wall = self._wall()
        nodes = [node_view(m, self.intent.allocations.get(m.node), now=now, grace=self.settings.grace_seconds,
                           cordoned=m.node in self.intent.cordons, control_plane="") for m in members]
        self.metrics.observe_nodes(nodes, [wall - r.requested_at for r in self.intent.pending.values()])
        self.metrics.leader.set(1 if self.leading else 0)
        self._observe_proxies()

    def _transition(self) -> None:
        """Follow the election: start or stop leading; a new term rebases the table versions."""
        if self.cluster is None:
            return
        leading = self.cluster.leading()
        if leading and not self.leading:
            term = self.cluster.election.term
            if term != self._term:
                self._term = term
                self.tables.rebase(max(initial_version(self._wall()), self.tables.high))
            event(log, "leader_elected", control_plane=self.settings.id, term=term)
        elif self.leading and not leading:
            self.cluster.followers.close_all(f"control plane {self.settings.id!r} no longer leads")
            event(log, "leadership_lost", logging.WARNING, control_plane=self.settings.id,
                  detail="serving the last tables")
        self.leading = leading

    async def _loop(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.settings.tick_seconds):
                    await self._dirty.wait()
                await asyncio.sleep(self.settings.debounce_seconds)
            except TimeoutError:
                pass
            self._dirty.clear()
            try:
                for node in self.fleet.forget_expired():
                    self.leases.forget(node)
                if self.cluster is not None:
                    self.cluster.remote.forget_expired()
                self._transition()
                if self.leading:
                    self.recompute()
                else:
                    self._observe(self._clock(), self.members())
            except Exception:  # the loop must outlive a bug in one pass
                log.exception("table computation failed")

    async def _store_loop(self) -> None:
        """Write members (and, leading, table heads) when they change and at every tick."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.tick_seconds):
                    await self._store_due.wait()
            self._store_due.clear()
            try:
                await self.leases.sync(self.fleet.members())
                if self.cluster is not None and self.leading:
                    await self.cluster.write_heads()
            except Exception:
                log.exception("store sync failed")

    def _send(self, session: AgentSession, kind: fleet_pb2.Command.Kind, replica_id: str) -> None:
        try:
            session.send(self.agents.command(kind, replica_id))
        except Overloaded as exc:
            self.reject("command_queue_full")
            log.warning("node %s: %s", session.node, exc)
