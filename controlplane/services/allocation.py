"""Gang allocation as the operator sees it: allocate, list, release, and the leader's allocation passes.

:class:`AllocationService` fronts :class:`controlplane.services.allocator.GangAllocator`.
:meth:`AllocationService.allocate` validates, refuses with ``Unavailable``
while the store is unreachable (as every intent write,
:class:`controlplane.intent.writer.IntentWriter`), writes the requests, waits
for the store's echo, wakes the leader's pass and returns what that pass did
with them (on a follower: what the store shows within
``store_timeout_seconds`` plus two ticks). :meth:`AllocationService.release`
removes a slot (or a waiting request) and undrains what it displaced, then
waits like every intent write for the leader's tables. The requests and slots
span several keys, written by the allocator, so they do not take the
writer's one-key conditional put. :meth:`AllocationService.run` is the
leader's allocation loop: a pass when requests wait or displaced replicas need
a drain, woken by :meth:`AllocationService.wake` and every tick, so store
writes of placements never delay the tables.

State: whether a pass is due. Dependencies: the settings, the catalog, the
clocks, the allocator, the intent cache, the intent writer, the peers (who
leads, the merged members), the members held here (to keep request ids
unique) and ``notify`` (placements changed the intent: recompute).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from controlplane import validate
from controlplane.allocation.gang import Request
from controlplane.config import ControlPlaneSettings
from controlplane.fleet.view import FleetView
from controlplane.intent.cache import IntentCache
from controlplane.intent.writer import IntentWriter
from controlplane.services.allocator import GangAllocator, new_request_id
from controlplane.services.peers import PeerService
from controlplane.tables.compute import catalog_models
from controlplane.tables.views import pending_view, slot_view
from ferry.config import ModelConfig
from ferry.errors import FerryError, InvalidArgument, NotFound, Overloaded, Unavailable
from ferry.v1 import admin_pb2

log = logging.getLogger(__name__)


class AllocationService:
    """Allocation requests, slots and the leader's passes.

    State: whether a pass is due. Dependencies: settings, catalog, clocks, the allocator, the intent
    cache, the intent writer, the peer service, the members held here, ``notify``.
    """

    def __init__(
        self,
        settings: ControlPlaneSettings,
        *,
        catalog: Sequence[ModelConfig],
        allocator: GangAllocator,
        intent: IntentCache,
        writer: IntentWriter,
        peers: PeerService,
        fleet: FleetView,
        clock: Callable[[], float],
        wall: Callable[[], float],
        notify: Callable[[], None],
    ) -> None:
        self.settings = settings
        self._catalog = tuple(catalog)
        self._allocator = allocator
        self._intent = intent
        self._writer = writer
        self._peers = peers
        self._fleet = fleet
        self._clock = clock
        self._wall = wall
        self._notify = notify
        self._due = asyncio.Event()

    def wake(self) -> None:
        """Something changed: the leader's allocation loop looks again."""
        self._due.set()

    async def run(self) -> None:
        """On the leader: a gang allocation pass when requests wait or displaced replicas need a drain."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.tick_seconds):
                    await self._due.wait()
            self._due.clear()
            if not self._peers.leading or not self._allocator.may_be_due():  # O(slots): no merge for nothing
                continue
            try:
                members = self._peers.members()
                if self._allocator.due(members):
                    result = await self._allocator.run_pass(members, self._intent.cordons)
                    if result.placements:
                        self._notify()
            except FerryError as exc:
                log.warning("allocation pass: %s", exc)
            except Exception:  # the loop must outlive a bug in one pass
                log.exception("allocation pass failed")

    async def allocate(self, request: admin_pb2.AllocateRequest) -> admin_pb2.AllocateResponse:
        s = self.settings
        validate.check_name(request.model, "model", s.max_name_bytes)
        validate.check_filter(request.version, "version", s.max_version_bytes)
        validate.check_filter(request.region, "region", s.max_region_bytes)
        model = next((m for m in catalog_models(self._catalog, self._peers.members()) if m.name == request.model),
                     None)
        if model is None:
            raise NotFound("model", request.model)
        gpus = request.gpus or model.min_gpus
        if not 1 <= gpus <= s.max_alloc_gpus:
            raise InvalidArgument("gpus", f"must be between 1 and {s.max_alloc_gpus}")
        count = request.replicas or 1
        if count > s.max_alloc_replicas:
            raise InvalidArgument("replicas", f"at most {s.max_alloc_replicas} per call")
        waiting = len(self._intent.pending)
        if waiting + count > s.max_pending_allocations:
            raise Overloaded(f"allocation requests: {waiting} wait, the limit is {s.max_pending_allocations}",
                             s.tick_seconds)
        self._writer.check("allocation")
        taken = {slot.replica_id for r in self._intent.allocations.values() for slot in r.slots}

        def used(candidate: str) -> bool:
            return candidate in taken or candidate in self._intent.pending or self._fleet.find(candidate) is not None

        requests = []
        wall = self._wall()
        for _ in range(count):
            request_id = new_request_id(model.name, used)
            taken.add(request_id)
            requests.append(Request(request_id, model.name, request.version or model.default_version, gpus, wall,
                                    request.region))
        try:
            revision = await self._allocator.submit(requests)
        except Unavailable as exc:
            raise Unavailable(self._writer.refusal("allocation", str(exc))) from exc
        await self._writer.echo("allocation", revision)
        ids = {r.request_id for r in requests}
        self.wake()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + s.store_timeout_seconds + 2 * s.tick_seconds
        while loop.time() < deadline:  # until a pass placed each request, or said why it waits
            unplaced = ids & self._intent.pending.keys()
            leading = self._peers.leading
            if not unplaced or (leading and unplaced <= self._allocator.reasons.keys()):
                break
            if leading:
                await self._allocator.wait_pass(self._allocator.passes, deadline - loop.time())
            else:
                await self._intent.changed(deadline - loop.time())
        listing = self.list_allocations("")
        return admin_pb2.AllocateResponse(placed=[v for v in listing.slots if v.replica_id in ids],
                                          pending=[v for v in listing.pending if v.request_id in ids])

    def list_allocations(self, model: str) -> admin_pb2.ListAllocationsResponse:
        validate.check_filter(model, "model", self.settings.max_name_bytes)
        now, wall = self._clock(), self._wall()
        members = {m.node: m for m in self._peers.members()}
        leading = self._peers.leading
        response = admin_pb2.ListAllocationsResponse()
        for node in sorted(self._intent.allocations):
            for slot in self._intent.allocations[node].slots:
                if not model or slot.model == model:
                    response.slots.append(slot_view(node, slot, members.get(node), now=now,
                                                    grace=self.settings.grace_seconds))
        for request in sorted(self._intent.pending.values(), key=lambda r: (r.requested_at, r.request_id)):
            if not model or request.model == model:
                reason = self._allocator.reasons.get(request.request_id) or (
                    "waiting for the leader's next allocation pass" if not leading else "not planned yet")
                response.pending.append(pending_view(request, wall=wall, reason=reason))
        return response

    async def release(self, replica_id: str) -> admin_pb2.ReleaseResponse:
        validate.check_name(replica_id, "replica_id", self.settings.max_name_bytes)
        if replica_id not in self._intent.pending and self._intent.slot(replica_id) is None:
            raise NotFound("allocation", replica_id)
        self._writer.check("release")
        try:
            released, undrained = await self._allocator.release(replica_id)
        except Unavailable as exc:
            raise Unavailable(self._writer.refusal("release", str(exc))) from exc
        await self._writer.settle(lambda: True)  # leading: recomputed; the slots themselves are not in the tables
        return admin_pb2.ReleaseResponse(released=released, undrained=undrained)
