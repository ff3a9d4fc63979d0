"""The control plane's core: what the servicers call, and the loop that recomputes the tables.

It ties the state to its owners: members are written to the store under a
lease (``/ferry/members/{node}``, TTL ``grace_seconds``, refreshed every third
of it while the agent stream is open, so a node whose control plane or stream
is gone drops out of the store by itself) and held in the :class:`FleetView`;
the drain intent is owned by the store and cached by :class:`IntentCache`;
telemetry stays in memory; the tables are computed by the pure
:func:`compute_tables` and versioned by :class:`TableVersions`.

The loop recomputes ``debounce_seconds`` (20 ms) after a change, and at least
every ``tick_seconds`` (0.5 s) so that members expire on time; each new
version of a region is offered to its watchers at once. A drain or undrain
waits for the store to echo its write, recomputes and pushes before it
returns, then queues the command for the replica's agent. Members are
written to the store by the loop, before it recomputes; a store that fails
does not stop the tables: they are written again at the next tick.
Cost per computation: see :mod:`controlplane.table`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from controlplane import validate, views
from controlplane.agents import Agents, AgentSession
from controlplane.config import ControlPlaneSettings
from controlplane.fleet import FleetView
from controlplane.intent import IntentCache
from controlplane.members import MemberLeases
from controlplane.metrics import Metrics
from controlplane.store import Store
from controlplane.table import Published, TableVersions, compute_tables, initial_version
from controlplane.watchers import Watcher, Watchers
from ferry.config import ModelConfig
from ferry.errors import InvalidArgument, NotFound, Overloaded, Unavailable
from ferry.v1 import admin_pb2, common_pb2, fleet_pb2, tables_pb2

log = logging.getLogger(__name__)

NOT_DRAINING = (common_pb2.REPLICA_STATE_UNSPECIFIED, common_pb2.REPLICA_STATE_WARMING, common_pb2.REPLICA_STATE_READY)


class Controller:
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
    ) -> None:
        self.settings = s = settings
        self._catalog = tuple(catalog)
        self._clock = clock
        self._wall = wall
        self.metrics = metrics
        self.fleet = FleetView(
            clock=clock, grace_seconds=s.grace_seconds, forget_after_seconds=s.forget_after_seconds,
            max_members=s.max_agents, max_replicas_per_node=s.max_replicas_per_node,
        )
        self.agents = Agents(control_plane_id=s.id, max_streams=s.max_agents, queue_size=s.command_queue_size)
        self.watchers = Watchers(max_watchers=s.max_watchers, max_proxies=s.max_proxies, clock=clock)
        self.tables = TableVersions(initial_version(wall()))
        self.intent = IntentCache(store, on_change=self.notify)
        self.stopping = False
        self.leases = MemberLeases(store, clock=clock, ttl_seconds=s.grace_seconds)
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle

    async def start(self) -> None:
        """Sync the intent from the store, compute the first tables, start the loop."""
        self._tasks.append(asyncio.create_task(self.intent.run(), name="controlplane-intent"))
        try:
            async with asyncio.timeout(self.settings.store_timeout_seconds):
                await self.intent.synced.wait()
        except TimeoutError as exc:
            await self.stop()
            raise Unavailable("the store did not answer a listing of the intent") from exc
        self.recompute()
        self._tasks.append(asyncio.create_task(self._loop(), name="controlplane-loop"))

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

    def notify(self) -> None:
        """Something changed: recompute after the debounce."""
        self._dirty.set()

    def reject(self, reason: str, count: int = 1) -> None:
        self.metrics.reject(reason, count)

    # -- agents

    def register(self, reg: fleet_pb2.Register) -> AgentSession:
        try:
            validate.check_register(reg, self.settings)
            member = self.fleet.register(reg)
        except InvalidArgument:
            self.reject("register_field")
            raise
        except Overloaded:
            self.reject("agents_limit")
            raise
        session = self.agents.attach(member)
        self.leases.changed(member.node)  # written by the loop, before it recomputes
        for replica_id, info in member.replicas.items():  # drains requested while the node was away
            if replica_id in self.intent.drains and info.state in NOT_DRAINING:
                self._send(session, fleet_pb2.Command.KIND_DRAIN, replica_id)
        self.notify()
        log.info("node %s registered in region %s with %d replicas", member.node, member.region, len(member.replicas))
        return session

    def telemetry(self, session: AgentSession, telemetry: fleet_pb2.Telemetry) -> None:
        self.metrics.telemetry_messages.inc()
        if self.fleet.member(session.node) is not session.member:
            self.reject("stale_session")
            return
        try:
            validate.check_telemetry(telemetry, self.settings)
        except InvalidArgument:
            self.reject("telemetry_field")
            raise
        outcome = self.fleet.apply_telemetry(session.member, telemetry)
        for reason, count in outcome.ignored.items():
            self.reject(reason, count)
        if outcome.membership_changed:
            self.leases.changed(session.node)
        self.notify()

    def command_result(self, session: AgentSession, result: fleet_pb2.CommandResult) -> None:
        level = logging.INFO if result.ok else logging.WARNING
        log.log(level, "node %s: command %s ok=%s %s", session.node, result.command_id, result.ok, result.message)

    def disconnect(self, session: AgentSession) -> None:
        self.agents.detach(session)
        if self.fleet.disconnect(session.member):
            log.info("node %s: agent stream ended", session.node)
            self.notify()

    # -- proxies

    def subscribe(self, sub: tables_pb2.Subscribe) -> Watcher:
        try:
            validate.check_subscribe(sub, self.settings)
            watcher = self.watchers.subscribe(sub.proxy_id, sub.region)
        except InvalidArgument:
            self.reject("subscribe_field")
            raise
        except Overloaded:
            self.reject("watchers_limit")
            raise
        published = self.tables.get(sub.region)
        if published is None:
            self.recompute()
            published = self.tables.get(sub.region)
        assert published is not None  # the watched region was just computed
        watcher.offer(published.snapshot)  # always, even to a proxy that holds it (tables.proto)
        self._observe_proxies()
        return watcher

    def ack(self, watcher: Watcher, ack: tables_pb2.Ack) -> None:
        ignored = self.watchers.ack(watcher, ack)
        if ignored is not None:
            self.reject(ignored)
        elif not ack.applied:
            log.warning("proxy %s rejected version %d: %s", watcher.status.proxy_id, ack.version, ack.error)
        self._observe_proxies()

    def pushed(self, watcher: Watcher) -> None:
        self.metrics.table_pushes.labels(region=watcher.region).inc()

    def unsubscribe(self, watcher: Watcher) -> None:
        self.watchers.unsubscribe(watcher)

    # -- admin

    def list_replicas(self, model: str, region: str) -> list[admin_pb2.ReplicaView]:
        validate.check_filter(model, "model", self.settings.max_name_bytes)
        validate.check_filter(region, "region", self.settings.max_region_bytes)
        return views.list_replicas(
            self.fleet.members(), drains=self.intent.drains, tables=self.tables, now=self._clock(),
            grace=self.settings.grace_seconds, model=model, region=region,
        )

    def get_table(self, region: str) -> admin_pb2.GetTableResponse:
        validate.check_filter(region, "region", self.settings.max_region_bytes)
        return views.get_table(self.tables, self.watchers.statuses(), now=self._clock(), region=region)

    async def set_drain(self, replica_id: str, drain: bool) -> admin_pb2.ReplicaView:
        """Record (or cancel) a drain in the store, apply it to the tables, then tell the agent."""
        validate.check_name(replica_id, "replica_id", self.settings.max_name_bytes)
        if self.fleet.find(replica_id) is None:
            raise NotFound("replica", replica_id)
        if drain:
            revision = await self.intent.request_drain(replica_id, self._wall())
        else:
            revision = await self.intent.cancel_drain(replica_id)
        await self.intent.wait(revision, self.settings.store_timeout_seconds)
        self.recompute()
        member = self.fleet.find(replica_id)
        if member is None:
            raise NotFound("replica", replica_id)
        session = self.agents.get(member.node)
        if session is not None:
            kind = fleet_pb2.Command.KIND_DRAIN if drain else fleet_pb2.Command.KIND_UNDRAIN
            try:
                session.send(self.agents.command(kind, replica_id))
            except Overloaded as exc:
                self.reject("command_queue_full")
                raise Overloaded(f"the intent is recorded and the tables updated, but {exc.what}", 1.0) from exc
        return views.replica_view(
            member, replica_id, drains=self.intent.drains, tables=self.tables, now=self._clock(),
            grace=self.settings.grace_seconds,
        )

    # -- tables

    def recompute(self) -> list[Published]:
        """Compute every region's table; offer each new version to its watchers at once."""
        now = self._clock()
        tables = compute_tables(
            self.fleet.members(), self._catalog, self.intent.drains, now=now,
            grace_seconds=self.settings.grace_seconds, regions=self.watchers.regions(),
        )
        before = set(self.tables.regions())
        changed = self.tables.publish(tables, self._wall())
        for region in before - set(tables):
            self.metrics.table_version.remove(region)
        for published in changed:
            self.metrics.table_version.labels(region=published.snapshot.region).set(published.version)
            for watcher in self.watchers.of_region(published.snapshot.region):
                watcher.offer(published.snapshot)
        self._observe(now)
        return changed

    def _observe(self, now: float) -> None:
        self.metrics.observe_fleet(self.fleet.members(), self.tables, now=now, grace=self.settings.grace_seconds)
        self._observe_proxies()

    def _observe_proxies(self) -> None:
        self.metrics.observe_proxies(self.watchers.statuses(), self.tables)

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
                await self.leases.sync(self.fleet.members())
                self.recompute()
            except Exception:  # the loop must outlive a bug in one pass
                log.exception("table computation failed")

    def _send(self, session: AgentSession, kind: fleet_pb2.Command.Kind, replica_id: str) -> None:
        try:
            session.send(self.agents.command(kind, replica_id))
        except Overloaded as exc:
            self.reject("command_queue_full")
            log.warning("node %s: %s", session.node, exc)
