"""Operator calls on nodes, models and allocations (a mixin of ``Controller``, beside ``Operator``).

- :meth:`FleetOps.list_nodes`, :meth:`FleetOps.list_models`,
  :meth:`FleetOps.usage`, :meth:`FleetOps.diff_table`: views
  (:mod:`controlplane.fleetviews`, :mod:`controlplane.tablediff`);
- :meth:`FleetOps.set_cordon`: cordon or uncordon a node. Intent in the store
  (``intent/cordon/{node}``); refused with ``Unavailable`` while the store is
  unreachable, as a drain is. It returns once the tables reflect it (leading:
  recomputed here; following: relayed by the leader, at most
  ``store_timeout_seconds``). Nothing is sent to the agent: the node's
  replicas keep running what they run;
- :meth:`FleetOps.allocate`, :meth:`FleetOps.list_allocations`,
  :meth:`FleetOps.release`: gang allocation (:mod:`controlplane.allocator`),
  whose passes :meth:`FleetOps._alloc_loop` runs on the leader.
  ``allocate`` validates, writes the requests, wakes the leader's pass and
  returns what that pass did with them (on a follower: what the store shows
  within ``store_timeout_seconds`` plus two ticks).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable

from controlplane import validate
from controlplane.allocator import GangAllocator, new_request_id
from controlplane.cluster import Cluster
from controlplane.config import ControlPlaneSettings
from controlplane.fleet import FleetView, Member
from controlplane.fleetviews import model_views, node_view, pending_view, slot_view, usage_rows
from controlplane.gang import Request
from controlplane.intent import IntentCache
from controlplane.store import Store, cordon_key, drain_value
from controlplane.table import Published, TableVersions, catalog_models
from controlplane.tablediff import diff_tables, pick_versions
from ferry.config import ModelConfig
from ferry.errors import FerryError, InvalidArgument, NotFound, Overloaded, Unavailable
from ferry.logs import event
from ferry.v1 import admin_pb2

log = logging.getLogger(__name__)


class FleetOps:
    """Nodes, cordons, models, usage, table diffs and allocations."""

    settings: ControlPlaneSettings
    store: Store
    fleet: FleetView
    tables: TableVersions
    intent: IntentCache
    cluster: Cluster | None
    allocator: GangAllocator
    leading: bool
    _catalog: tuple[ModelConfig, ...]
    _clock: Callable[[], float]
    _wall: Callable[[], float]

    _alloc_due: asyncio.Event

    # Provided by Controller and Operator (annotations only, so that they do not shadow them).
    members: Callable[[], list[Member]]
    recompute: Callable[[], list[Published]]
    notify: Callable[[], None]
    wake_allocator: Callable[[], None]
    _check_store: Callable[[str], None]
    _refusal: Callable[[str, str], str]

    def _node_cp(self, member: Member) -> str:
        """Id of the control plane holding the node's agent stream, as far as this one knows."""
        local = self.fleet.member(member.node)
        if local is not None and local.connected:
            return self.settings.id
        if self.cluster is not None:
            entry = self.cluster.remote.entries.get(member.node)
            if entry is not None and entry.connected:
                return entry.reporter
        return ""

    def _node(self, member: Member, now: float) -> admin_pb2.NodeView:
        return node_view(member, self.intent.allocations.get(member.node), now=now,
                         grace=self.settings.grace_seconds, cordoned=member.node in self.intent.cordons,
                         control_plane=self._node_cp(member))

    def list_nodes(self, region: str) -> list[admin_pb2.NodeView]:
        validate.check_filter(region, "region", self.settings.max_region_bytes)
        now = self._clock()
        members = sorted(self.members(), key=lambda m: m.node)
        return [self._node(m, now) for m in members if not region or m.region == region]

    async def set_cordon(self, node: str, cordon: bool) -> admin_pb2.NodeView:
        """Record (or cancel) a cordon in the store; return once the tables reflect it."""
        validate.check_name(node, "node", self.settings.max_name_bytes)
        member = next((m for m in self.members() if m.node == node), None)
        if member is None and (cordon or node not in self.intent.cordons):
            raise NotFound("node", node)
        what = "cordon" if cordon else "uncordon"
        self._check_store(what)
        try:
            if cordon:
                revision = await self.store.put(cordon_key(node), drain_value(self._wall()))
            else:
                revision = await self.store.delete(cordon_key(node))
            if revision:
                await self.intent.wait(revision, self.settings.store_timeout_seconds)
        except Unavailable as exc:
            raise Unavailable(self._refusal(what, str(exc))) from exc
        event(log, "node_cordoned" if cordon else "node_uncordoned", node=node, control_plane=self.settings.id)
        if self.leading:
            self.recompute()
        elif member is not None:
            await self._until_reflected(member, cordon)
        member = next((m for m in self.members() if m.node == node), member)
        if member is None:
            return admin_pb2.NodeView(node=node)
        return self._node(member, self._clock())

    async def _until_reflected(self, member: Member, cordon: bool) -> None:
        """A follower: wait (bounded) until the relayed table of the node's region shows the cordon."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.store_timeout_seconds
        while loop.time() < deadline:
            published = self.tables.get(member.region)
            if published is not None and (not cordon or published.replica_ids.isdisjoint(member.replicas)):
                return
            await asyncio.sleep(self.settings.debounce_seconds or 0.01)

    def list_models(self) -> list[admin_pb2.ModelView]:
        members = self.members()
        rollouts = self.intent.rollouts  # a rollout sets the default version (controlplane.rollout)
        catalog = [dataclasses.replace(m, default_version=rollouts[m.name].default_version) if m.name in rollouts
                   else m for m in catalog_models(self._catalog, members)]
        return model_views(members, catalog, self.tables,
                           allocations=self.intent.allocations, pending=self.intent.pending.values())

    def usage(self) -> admin_pb2.GetUsageResponse:
        rows = usage_rows(self.members(), self.tables, now=self._clock())
        return admin_pb2.GetUsageResponse(rows=rows, sampled_at=self._wall())

    def diff_table(self, region: str, from_version: int, to_version: int) -> admin_pb2.DiffTableResponse:
        validate.check_filter(region, "region", self.settings.max_region_bytes)
        if not region:
            regions = self.tables.regions()
            if len(regions) != 1:
                raise InvalidArgument("region", f"required: the fleet has regions {', '.join(regions) or 'none'}")
            region = regions[0]
        kept = self.tables.history(region)
        old, new = pick_versions(kept, region, from_version, to_version)
        return admin_pb2.DiffTableResponse(region=region, from_version=old.version, to_version=new.version,
                                           changes=diff_tables(old, new), kept_versions=[s.version for s in kept])

    # -- allocations

    async def _alloc_loop(self) -> None:
        """On the leader: a gang allocation pass when requests wait or displaced replicas need a drain."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.tick_seconds):
                    await self._alloc_due.wait()
            self._alloc_due.clear()
            if not self.leading or not self.allocator.may_be_due():  # O(slots): no merge of members for nothing
                continue
            try:
                members = self.members()
                if self.allocator.due(members):
                    result = await self.allocator.run_pass(members, self.intent.cordons)
                    if result.placements:
                        self.notify()
            except FerryError as exc:
                log.warning("allocation pass: %s", exc)
            except Exception:  # the loop must outlive a bug in one pass
                log.exception("allocation pass failed")

    async def allocate(self, request: admin_pb2.AllocateRequest) -> admin_pb2.AllocateResponse:
        s = self.settings
        validate.check_name(request.model, "model", s.max_name_bytes)
        validate.check_filter(request.version, "version", s.max_version_bytes)
        validate.check_filter(request.region, "region", s.max_region_bytes)
        model = next((m for m in catalog_models(self._catalog, self.members()) if m.name == request.model), None)
        if model is None:
            raise NotFound("model", request.model)
        gpus = request.gpus or model.min_gpus
        if not 1 <= gpus <= s.max_alloc_gpus:
            raise InvalidArgument("gpus", f"must be between 1 and {s.max_alloc_gpus}")
        count = request.replicas or 1
        if count > s.max_alloc_replicas:
            raise InvalidArgument("replicas", f"at most {s.max_alloc_replicas} per call")
        waiting = len(self.intent.pending)
        if waiting + count > s.max_pending_allocations:
            raise Overloaded(f"allocation requests: {waiting} wait, the limit is {s.max_pending_allocations}",
                             s.tick_seconds)
        self._check_store("allocation")
        taken = {slot.replica_id for r in self.intent.allocations.values() for slot in r.slots}

        def used(candidate: str) -> bool:
            return candidate in taken or candidate in self.intent.pending or self.fleet.find(candidate) is not None

        requests = []
        wall = self._wall()
        for _ in range(count):
            request_id = new_request_id(model.name, used)
            taken.add(request_id)
            requests.append(Request(request_id, model.name, request.version or model.default_version, gpus, wall,
                                    request.region))
        try:
            revision = await self.allocator.submit(requests)
            await self.intent.wait(revision, s.store_timeout_seconds)
        except Unavailable as exc:
            raise Unavailable(self._refusal("allocation", str(exc))) from exc
        ids = {r.request_id for r in requests}
        self.wake_allocator()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + s.store_timeout_seconds + 2 * s.tick_seconds
        while loop.time() < deadline:  # until a pass placed each request, or said why it waits
            unplaced = ids & self.intent.pending.keys()
            if not unplaced or (self.leading and unplaced <= self.allocator.reasons.keys()):
                break
            if self.leading:
                await self.allocator.wait_pass(self.allocator.passes, deadline - loop.time())
            else:
                await self.intent.changed(deadline - loop.time())
        listing = self.list_allocations("")
        return admin_pb2.AllocateResponse(placed=[v for v in listing.slots if v.replica_id in ids],
                                          pending=[v for v in listing.pending if v.request_id in ids])

    def list_allocations(self, model: str) -> admin_pb2.ListAllocationsResponse:
        validate.check_filter(model, "model", self.settings.max_name_bytes)
        now, wall = self._clock(), self._wall()
        members = {m.node: m for m in self.members()}
        response = admin_pb2.ListAllocationsResponse()
        for node in sorted(self.intent.allocations):
            for slot in self.intent.allocations[node].slots:
                if not model or slot.model == model:
                    response.slots.append(slot_view(node, slot, members.get(node), now=now,
                                                    grace=self.settings.grace_seconds))
        for request in sorted(self.intent.pending.values(), key=lambda r: (r.requested_at, r.request_id)):
            if not model or request.model == model:
                reason = self.allocator.reasons.get(request.request_id) or (
                    "waiting for the leader's next allocation pass" if not self.leading else "not planned yet")
                response.pending.append(pending_view(request, wall=wall, reason=reason))
        return response

    async def release(self, replica_id: str) -> admin_pb2.ReleaseResponse:
        validate.check_name(replica_id, "replica_id", self.settings.max_name_bytes)
        if replica_id not in self.intent.pending and self.intent.slot(replica_id) is None:
            raise NotFound("allocation", replica_id)
        self._check_store("release")
        try:
            released, undrained = await self.allocator.release(replica_id)
        except Unavailable as exc:
            raise Unavailable(self._refusal("release", str(exc))) from exc
        if self.leading:
            self.recompute()
        return admin_pb2.ReleaseResponse(released=released, undrained=undrained)
