"""The fleet: agents' streams, nodes and replicas, drains and cordons, the models they serve.

:class:`FleetService` holds this control plane's members and their agents.

- Agents (``Fleet.Connect``): :meth:`FleetService.register`,
  :meth:`FleetService.telemetry`, :meth:`FleetService.disconnect`. A
  registration, and a telemetry message that adds a replica or moves one to
  another address, is checked against this control plane's view, then claims
  its node name, replica ids and addresses in the store
  (:mod:`controlplane.fleet.claims`), so a claim on what a live node holds on
  any control plane is refused (``AlreadyExists`` naming the field: the stream
  ends with ALREADY_EXISTS) before it reaches a table. While the store does
  not answer within ``store_timeout_seconds`` such a message is refused with
  ``Unavailable`` (loads alone need no store). Members are
  written to the store under a lease (``/ferry/members/{node}``, TTL
  ``grace_seconds``, refreshed every third of it while the agent stream is
  open, so a node whose control plane or stream is gone drops out of the store
  by itself) by :meth:`FleetService.sync_store`, woken by membership changes
  and every tick, so a slow or absent store never delays the tables. A node
  that registers gets the drains requested while it was away.
- Drains: :meth:`FleetService.set_drain` writes (or cancels) the drain
  through the :class:`controlplane.intent.writer.IntentWriter` (refused with
  ``Unavailable`` while the store is unreachable; waits for the echo and for
  the leader's tables to drop, or list again, the replica), then tells the
  replica's agent if its stream is here. Every other control plane tells its
  own agents when the intent reaches it (:meth:`FleetService.drain_changed`).
- Cordons: :meth:`FleetService.set_cordon`, through the same writer, returns
  once the tables reflect it. Nothing is sent to the agent: the node's
  replicas keep running what they run, out of the tables.
- Views: :meth:`FleetService.list_replicas`, :meth:`FleetService.list_nodes`,
  :meth:`FleetService.list_models`, :meth:`FleetService.usage`
  (:mod:`controlplane.tables.views`, :mod:`controlplane.tables.views`).

State: the members (:class:`controlplane.fleet.view.FleetView`), the agents'
sessions, the member leases, the drains being told by this call. Dependencies:
the settings, the catalog, the clocks, the metrics, the intent cache, the
intent writer, the peers (merged members, who holds a stream), the table
versions (for views and waits) and ``notify`` (something changed: recompute).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence

from controlplane import validate
from controlplane.config import ControlPlaneSettings
from controlplane.fleet import telemetry as telemetry_check
from controlplane.fleet.agents import Agents, AgentSession
from controlplane.fleet.claims import Claim, changed_claims, host_of, register_claims, served_at, served_field
from controlplane.fleet.members import MemberLeases
from controlplane.fleet.view import FleetView, Member, claim_conflict, is_live, replica_state
from controlplane.intent.cache import IntentCache
from controlplane.intent.writer import IntentWriter
from controlplane.metrics import Metrics
from controlplane.services.peers import PeerService
from controlplane.store.base import KeyValue, LeaseNotFound, cordon_key, drain_key, drain_value
from controlplane.tables import views
from controlplane.tables.compute import TableVersions, catalog_models
from controlplane.tables.views import model_views, node_view, usage_rows
from ferry.config import ModelConfig
from ferry.errors import AlreadyExists, InvalidArgument, NotFound, Overloaded, Unavailable
from ferry.logs import event
from ferry.v1 import admin_pb2, common_pb2, fleet_pb2

log = logging.getLogger(__name__)

NOT_DRAINING = (common_pb2.REPLICA_STATE_UNSPECIFIED, common_pb2.REPLICA_STATE_WARMING, common_pb2.REPLICA_STATE_READY)
KIND = fleet_pb2.Command


class FleetService:
    """Agents, members, drains, cordons and the views of nodes, replicas and models.

    State: the members, the agents' sessions, the member leases, the drains this control plane is
    telling its agents. Dependencies: settings, catalog, clocks, metrics, the intent cache, the intent
    writer, the peer service, the table versions, ``notify``.
    """

    def __init__(
        self,
        settings: ControlPlaneSettings,
        *,
        catalog: Sequence[ModelConfig],
        fleet: FleetView,
        agents: Agents,
        leases: MemberLeases,
        intent: IntentCache,
        writer: IntentWriter,
        peers: PeerService,
        tables: TableVersions,
        metrics: Metrics,
        clock: Callable[[], float],
        wall: Callable[[], float],
        notify: Callable[[], None],
    ) -> None:
        self.settings = settings
        self._catalog = tuple(catalog)
        self._strict_models = frozenset(m.name for m in self._catalog) if settings.strict_catalog else None
        self.fleet = fleet
        self.agents = agents
        self._leases = leases
        self._intent = intent
        self._writer = writer
        self._peers = peers
        self._tables = tables
        self._metrics = metrics
        self._clock = clock
        self._wall = wall
        self._notify = notify
        self._initiating: set[str] = set()
        self._store_due = asyncio.Event()
        self.stopping = False

    def stop(self) -> None:
        """Close every agent's stream (UNAVAILABLE)."""
        self.stopping = True
        self.agents.close_all("the control plane is stopping")

    # -- agents

    def open_stream(self) -> None:
        try:
            self.agents.open_stream()
        except Overloaded:
            self._metrics.reject("agents_limit")
            raise

    def close_stream(self) -> None:
        self.agents.close_stream()

    async def register(self, reg: fleet_pb2.Register) -> AgentSession:
        """Admit a registration: valid, claiming nothing a live node holds here or anywhere (the store's claims)."""
        try:
            validate.check_register(reg, self.settings, self._strict_models)
            claim_conflict(self.fleet, reg)  # this control plane's own view first: no store call to refuse
            hosts = frozenset(host_of(served_at(info)) for info in reg.replicas)
            await self._claim(reg.node, register_claims(reg), hosts, "register")
            member = self.fleet.register(reg)
        except InvalidArgument:
            self._metrics.reject("register_field")
            raise
        except Overloaded:
            self._metrics.reject("agents_limit")
            raise
        except AlreadyExists:
            self._metrics.reject("register_conflict")
            raise
        except Unavailable:
            self._metrics.reject("register_store")
            raise
        session = self.agents.attach(member)
        self._member_changed(member.node)
        for replica_id, info in member.replicas.items():  # drains requested while the node was away
            if replica_id in self._intent.drains and info.state in NOT_DRAINING:
                self._send(session, KIND.KIND_DRAIN, replica_id)
        self._notify()
        event(log, "node_registered", node=member.node, region=member.region, replicas=len(member.replicas))
        return session

    async def _claim(self, node: str, claims: list[Claim], hosts: frozenset[str], what: str) -> None:
        """Take ``claims`` in the store within ``store_timeout_seconds`` (``Unavailable`` naming ``what`` if not)."""
        if not claims:
            return
        try:
            async with asyncio.timeout(self.settings.store_timeout_seconds):
                await self._leases.claim(node, claims, hosts)
        except TimeoutError as exc:
            raise Unavailable(f"{what}: the store did not answer within {self.settings.store_timeout_seconds:g} s, "
                              "so ownership of the node and its replicas cannot be checked; retry") from exc
        except LeaseNotFound as exc:
            raise Unavailable(f"{what}: {exc}; retry") from exc

    def _telemetry_conflict(self, member: Member, telemetry: fleet_pb2.Telemetry) -> None:
        """Raise AlreadyExists naming the ``telemetry.changed`` entry that takes what another live node holds here."""
        for i, info in enumerate(telemetry.changed):
            holder = self.fleet.find(info.replica_id)
            if holder is not None and holder is not member and self.fleet.live(holder):
                raise AlreadyExists(f"telemetry.changed[{i}].replica_id",
                                    f"held by node {holder.node!r} on control plane {self.settings.id!r}")
            for node in sorted(self.fleet.serving(served_at(info)) - {member.node}):
                other = self.fleet.member(node)
                if other is not None and self.fleet.live(other):
                    raise AlreadyExists(f"telemetry.changed[{i}].{served_field(info)}",
                                        f"{served_at(info)!r} is served by node {node!r} on control plane "
                                        f"{self.settings.id!r}")

    async def telemetry(self, session: AgentSession, telemetry: fleet_pb2.Telemetry) -> None:
        """Apply one telemetry message; replicas it adds or moves are claimed first, like a registration's."""
        self._metrics.telemetry_messages.inc()
        if self.fleet.member(session.node) is not session.member:
            self._metrics.reject("stale_session")
            return
        try:
            validate.check_telemetry(telemetry, self.settings, self._strict_models)
            telemetry_check.check_loads(telemetry, self.settings.max_replicas_per_node)
        except InvalidArgument:
            self._metrics.reject("telemetry_field")
            raise
        member = session.member
        fresh = [info for info in telemetry.changed
                 if (old := member.replicas.get(info.replica_id)) is None or served_at(old) != served_at(info)]
        if fresh:
            try:
                self._telemetry_conflict(member, telemetry)
                hosts = frozenset(host_of(served_at(i)) for i in (*member.replicas.values(), *telemetry.changed))
                await self._claim(member.node, changed_claims(telemetry), hosts, "telemetry")
            except AlreadyExists:
                self._metrics.reject("telemetry_conflict")
                raise
            except Unavailable:
                self._metrics.reject("telemetry_store")
                raise
            if self.fleet.member(session.node) is not member:  # replaced while the store answered
                self._metrics.reject("stale_session")
                return
        outcome = self.fleet.apply_telemetry(member, telemetry)
        for reason, count in outcome.ignored.items():
            self._metrics.reject(reason, count)
        if outcome.membership_changed:
            self._member_changed(session.node)
        if outcome.membership_changed or outcome.state_changed:
            self._notify()  # loads alone ride the next tick: at most one version per tick for load

    def command_result(self, session: AgentSession, result: fleet_pb2.CommandResult) -> None:
        level = logging.INFO if result.ok else logging.WARNING
        log.log(level, "node %s: command %s ok=%s %s", session.node, result.command_id, result.ok, result.message)

    def disconnect(self, session: AgentSession) -> None:
        self.agents.detach(session)
        if self.fleet.disconnect(session.member):
            event(log, "agent_stream_ended", node=session.node)
            self._notify()

    def forget_expired(self) -> None:
        """Members not heard of for ``forget_after_seconds`` leave the view and the store."""
        for node in self.fleet.forget_expired():
            self._leases.forget(node)

    async def sync_store(self, seconds: float) -> None:
        """Wait (at most ``seconds``) for a membership change, then write the members' leases."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._store_due.wait()
        self._store_due.clear()
        await self._leases.sync(self.fleet.members())

    def _member_changed(self, node: str) -> None:
        self._leases.changed(node)
        self._store_due.set()

    def _send(self, session: AgentSession, kind: fleet_pb2.Command.Kind, replica_id: str) -> None:
        try:
            session.send(self.agents.command(kind, replica_id))
        except Overloaded as exc:
            self._metrics.reject("command_queue_full")
            log.warning("node %s: %s", session.node, exc)

    # -- drains

    async def set_drain(self, replica_id: str, drain: bool) -> admin_pb2.ReplicaView:
        """Record (or cancel) a drain in the store, wait for the tables, then tell the agent."""
        validate.check_name(replica_id, "replica_id", self.settings.max_name_bytes)
        member = self._peers.holder(replica_id)
        if member is None:
            raise NotFound("replica", replica_id)
        what = f"{'drain' if drain else 'undrain'} of {replica_id}"
        region = member.region

        def edit(kv: KeyValue | None) -> bytes | None:
            return drain_value(self._wall()) if drain else None

        self._initiating.add(replica_id)
        try:
            await self._writer.write(what, drain_key(replica_id), edit,
                                     reflected=lambda: self._reflects(region, {replica_id}))
            event(log, "drain_requested" if drain else "drain_cancelled", replica_id=replica_id,
                  control_plane=self.settings.id)
            member = self._peers.holder(replica_id)
            if member is None:
                raise NotFound("replica", replica_id)
            session = self.agents.get(member.node)
            if session is not None and session.member is member:
                try:
                    session.send(self.agents.command(KIND.KIND_DRAIN if drain else KIND.KIND_UNDRAIN, replica_id))
                except Overloaded as exc:
                    self._metrics.reject("command_queue_full")
                    raise Overloaded(f"the intent is recorded and the tables updated, but {exc.what}", 1.0) from exc
        finally:
            self._initiating.discard(replica_id)
        return views.replica_view(
            member, replica_id, drains=self._intent.drains, tables=self._tables, now=self._clock(),
            grace=self.settings.grace_seconds, cordons=self._intent.cordons,
        )

    def drain_changed(self, replica_id: str, drained: bool) -> None:
        """The store says a drain was requested or cancelled (by anyone): tell the agent, if it is ours."""
        if replica_id in self._initiating:
            return  # set_drain tells the agent itself, and reports a full queue
        member = self.fleet.find(replica_id)
        session = self.agents.get(member.node) if member is not None else None
        if session is not None:
            self._send(session, KIND.KIND_DRAIN if drained else KIND.KIND_UNDRAIN, replica_id)

    def _reflects(self, region: str, replica_ids: set[str]) -> bool:
        """The table of ``region`` routes exactly those of ``replica_ids`` that the intent leaves routable."""
        published = self._tables.get(region)
        routed = published.replica_ids if published is not None else frozenset()
        holders = {r: self._peers.holder(r) for r in replica_ids}
        return all((r in routed) == self._routable(holders[r], r) for r in replica_ids)

    def _routable(self, member: Member | None, replica_id: str) -> bool:
        """Whether the tables route ``replica_id`` by the intent held here (as compute_tables decides)."""
        if member is None or member.node in self._intent.cordons or replica_id in self._intent.drains:
            return False
        live = is_live(member, self._clock(), self.settings.grace_seconds)
        return live and replica_state(member, replica_id, True) == common_pb2.REPLICA_STATE_READY

    # -- cordons

    async def set_cordon(self, node: str, cordon: bool) -> admin_pb2.NodeView:
        """Record (or cancel) a cordon in the store; return once the tables reflect it."""
        validate.check_name(node, "node", self.settings.max_name_bytes)
        member = next((m for m in self._peers.members() if m.node == node), None)
        if member is None and (cordon or node not in self._intent.cordons):
            raise NotFound("node", node)

        def edit(kv: KeyValue | None) -> bytes | None:
            return drain_value(self._wall()) if cordon else None

        def reflected() -> bool:
            return member is None or self._reflects(member.region, set(member.replicas))

        await self._writer.write("cordon" if cordon else "uncordon", cordon_key(node), edit, reflected=reflected)
        event(log, "node_cordoned" if cordon else "node_uncordoned", node=node, control_plane=self.settings.id)
        member = next((m for m in self._peers.members() if m.node == node), member)
        if member is None:
            return admin_pb2.NodeView(node=node)
        return self._node(member, self._clock())

    # -- views

    def list_replicas(self, model: str, region: str) -> list[admin_pb2.ReplicaView]:
        validate.check_filter(model, "model", self.settings.max_name_bytes)
        validate.check_filter(region, "region", self.settings.max_region_bytes)
        return views.list_replicas(
            self._peers.members(), drains=self._intent.drains, tables=self._tables, now=self._clock(),
            grace=self.settings.grace_seconds, model=model, region=region, cordons=self._intent.cordons,
        )

    def _node(self, member: Member, now: float) -> admin_pb2.NodeView:
        return node_view(member, self._intent.allocations.get(member.node), now=now,
                         grace=self.settings.grace_seconds, cordoned=member.node in self._intent.cordons,
                         control_plane=self._peers.stream_holder(member))

    def list_nodes(self, region: str) -> list[admin_pb2.NodeView]:
        validate.check_filter(region, "region", self.settings.max_region_bytes)
        now = self._clock()
        members = sorted(self._peers.members(), key=lambda m: m.node)
        return [self._node(m, now) for m in members if not region or m.region == region]

    def list_models(self) -> list[admin_pb2.ModelView]:
        members = self._peers.members()
        rollouts = self._intent.rollouts  # a rollout sets the default version (controlplane.rollout.plan)
        catalog = [dataclasses.replace(m, default_version=rollouts[m.name].default_version) if m.name in rollouts
                   else m for m in catalog_models(self._catalog, members)]
        return model_views(members, catalog, self._tables,
                           allocations=self._intent.allocations, pending=self._intent.pending.values())

    def usage(self) -> admin_pb2.GetUsageResponse:
        rows = usage_rows(self._peers.members(), self._tables, now=self._clock())
        return admin_pb2.GetUsageResponse(rows=rows, sampled_at=self._wall())
