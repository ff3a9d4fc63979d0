"""What operators ask the controller, through ``Admin`` (a mixin of ``Controller``).

- :meth:`Operator.members`: every member this control plane knows, its own
  merged with the others' (:func:`controlplane.remote.merge`) when it has peers;
- :meth:`Operator.list_replicas`, :meth:`Operator.get_table`: views of them
  (:mod:`controlplane.views`);
- :meth:`Operator.set_drain`: a drain or undrain, refused with ``Unavailable``
  (naming the store and why) while the store is unreachable: at once when
  its last calls failed, else after a read that gets no answer, before
  anything is written (a write that times out may still land later: that
  case says so). Intent lives in the store, so a control plane that cannot
  write it must not pretend. Otherwise it waits for the store to echo the write, for the tables
  to reflect it (recomputed here when leading; relayed from the leader, at
  most ``store_timeout_seconds``, when following), then tells the replica's
  agent if its stream is here. Every other control plane tells its own agents
  when the intent reaches it (:meth:`Operator._drain_changed`);
- :meth:`Operator.status`: ``Admin.GetStatus`` (:mod:`controlplane.status`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from controlplane import validate, views
from controlplane.agents import Agents, AgentSession
from controlplane.cluster import Cluster
from controlplane.config import ControlPlaneSettings
from controlplane.election import PlaneInfo
from controlplane.fleet import FleetView, Member, is_live
from controlplane.intent import IntentCache
from controlplane.remote import merge
from controlplane.status import Counts, build_status
from controlplane.store import Store, drain_key
from controlplane.table import Published, TableVersions
from controlplane.watchers import Watchers
from ferry.errors import NotFound, Overloaded, Unavailable
from ferry.logs import event
from ferry.v1 import admin_pb2, fleet_pb2

log = logging.getLogger(__name__)

KIND = fleet_pb2.Command


class Operator:
    """The ``Admin`` operations of the controller."""

    settings: ControlPlaneSettings
    store: Store
    fleet: FleetView
    agents: Agents
    watchers: Watchers
    tables: TableVersions
    intent: IntentCache
    cluster: Cluster | None
    address: str
    leading: bool
    _clock: Callable[[], float]
    _wall: Callable[[], float]
    _initiating: set[str]

    # Provided by Controller and Peers (annotations only, so that they do not shadow them).
    recompute: Callable[[], list[Published]]
    reject: Callable[..., None]
    _send: Callable[[AgentSession, fleet_pb2.Command.Kind, str], None]
    _adopted: asyncio.Event | None  # pulsed by Peers.adopt

    def members(self) -> list[Member]:
        """Every member this control plane knows: its own, merged with the others' when it has peers."""
        local = list(self.fleet.members())
        if self.cluster is None:
            return local
        remote = self.cluster.remote.members(own={m.node for m in local})
        return merge(local, remote, now=self._clock(), grace=self.settings.grace_seconds)

    def list_replicas(self, model: str, region: str) -> list[admin_pb2.ReplicaView]:
        validate.check_filter(model, "model", self.settings.max_name_bytes)
        validate.check_filter(region, "region", self.settings.max_region_bytes)
        return views.list_replicas(
            self.members(), drains=self.intent.drains, tables=self.tables, now=self._clock(),
            grace=self.settings.grace_seconds, model=model, region=region, cordons=self.intent.cordons,
        )

    def get_table(self, region: str) -> admin_pb2.GetTableResponse:
        validate.check_filter(region, "region", self.settings.max_region_bytes)
        return views.get_table(self.tables, self.watchers.statuses(), now=self._clock(), region=region)

    async def set_drain(self, replica_id: str, drain: bool) -> admin_pb2.ReplicaView:
        """Record (or cancel) a drain in the store, apply it to the tables, then tell the agent."""
        validate.check_name(replica_id, "replica_id", self.settings.max_name_bytes)
        if self._holder(replica_id) is None:
            raise NotFound("replica", replica_id)
        what = "drain" if drain else "undrain"
        self._check_store(what)
        try:  # a read first: a store that does not answer refuses before anything is sent
            await self.store.get(drain_key(replica_id))
        except Unavailable as exc:
            raise Unavailable(self._refusal(what, str(exc))) from exc
        self._initiating.add(replica_id)
        try:
            try:
                if drain:
                    revision = await self.intent.request_drain(replica_id, self._wall())
                else:
                    revision = await self.intent.cancel_drain(replica_id)
            except Unavailable as exc:
                raise Unavailable(f"{what} of {replica_id}: the store did not confirm the write ({exc}); it may "
                                  "still apply when the store answers again (see ferryctl replicas)") from exc
            await self.intent.wait(revision, self.settings.store_timeout_seconds)
            event(log, "drain_requested" if drain else "drain_cancelled", replica_id=replica_id,
                  control_plane=self.settings.id)
            if self.leading:
                self.recompute()
            member = self._holder(replica_id)
            if member is not None and drain and not self.leading:
                await self._until_routed(member.region, replica_id, False, self.settings.store_timeout_seconds)
            if member is None:
                raise NotFound("replica", replica_id)
            session = self.agents.get(member.node)
            if session is not None and session.member is member:
                try:
                    session.send(self.agents.command(KIND.KIND_DRAIN if drain else KIND.KIND_UNDRAIN, replica_id))
                except Overloaded as exc:
                    self.reject("command_queue_full")
                    raise Overloaded(f"the intent is recorded and the tables updated, but {exc.what}", 1.0) from exc
        finally:
            self._initiating.discard(replica_id)
        return views.replica_view(
            member, replica_id, drains=self.intent.drains, tables=self.tables, now=self._clock(),
            grace=self.settings.grace_seconds, cordons=self.intent.cordons,
        )

    async def _until_routed(self, region: str, replica_id: str, routed: bool, seconds: float) -> None:
        """Wait (at most ``seconds``, then return) until the table of ``region`` lists ``replica_id`` or not."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while loop.time() < deadline:
            published = self.tables.get(region)
            if published is not None and (replica_id in published.replica_ids) == routed:
                return
            if self._adopted is None:
                self._adopted = asyncio.Event()
            try:
                async with asyncio.timeout(max(0.0, deadline - loop.time())):
                    await self._adopted.wait()
            except TimeoutError:
                return

    def _holder(self, replica_id: str) -> Member | None:
        local = self.fleet.find(replica_id)
        if local is not None or self.cluster is None:
            return local
        return next((m for m in self.members() if replica_id in m.replicas), None)

    def _check_store(self, what: str) -> None:
        health = self.store.health()
        if not health.ok:
            raise Unavailable(self._refusal(what, health.error))

    def _refusal(self, what: str, detail: str) -> str:
        health = self.store.health()
        where = f"{health.backend} at {health.endpoint}" if health.endpoint else health.backend
        return (f"{what} refused: the store ({where}) is unreachable, so intent changes are refused until it "
                f"returns; routing continues on the last tables ({detail})")

    def _drain_changed(self, replica_id: str, drained: bool) -> None:
        """The store says a drain was requested or cancelled (by anyone): tell the agent, if it is ours."""
        if replica_id in self._initiating:
            return  # set_drain tells the agent itself, and reports a full queue
        member = self.fleet.find(replica_id)
        session = self.agents.get(member.node) if member is not None else None
        if session is not None:
            self._send(session, KIND.KIND_DRAIN if drained else KIND.KIND_UNDRAIN, replica_id)

    # -- status

    def status(self) -> admin_pb2.GetStatusResponse:
        now = self._clock()
        members = self.members()
        counts = Counts(
            members=sum(is_live(m, now, self.settings.grace_seconds) for m in members),
            drains=len(self.intent.drains),
            allocations=sum(len(r.slots) for r in self.intent.allocations.values()),
            agents=sum(m.connected for m in self.fleet.members()),
        )
        revision = self.intent.revision
        if self.cluster is None:
            me = PlaneInfo(self.settings.id, self.address)
            leader: PlaneInfo | None = me
            role, term, planes, followers = "single", 0, [me], []
        else:
            election = self.cluster.election
            role, leader, term = election.role(), election.leader, election.term
            planes, followers = election.members(), self.cluster.followers.sessions()
            revision = max(revision, self.cluster.members.revision, election.keys.revision)
        return build_status(
            cp_id=self.settings.id, address=self.address, role=role, leader=leader, term=term, planes=planes,
            followers=followers, health=self.store.health(), revision=revision, tables=self.tables,
            proxies=self.watchers.statuses(), counts=counts, now=now,
        )
