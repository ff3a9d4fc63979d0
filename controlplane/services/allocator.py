"""The edge of gang allocation: requests in the store, passes of the pure planner, writes back.

:class:`GangAllocator` holds no policy (that is :func:`controlplane.allocation.gang.plan`):

- :meth:`GangAllocator.submit` writes each requested replica as a pending
  request, ``/ferry/intent/pending/{id}`` (any control plane may; the intent
  mirror brings them to the leader, and a restarted control plane finds them);
- :meth:`GangAllocator.run_pass` (the leader's allocation loop, on every
  change of intent or membership and every tick) turns the members and the
  intent mirror into :class:`controlplane.allocation.gang.NodeState`, plans, and for each
  placement writes, in this order: (1) the node's allocation record, in **one
  transaction** that adds the slot and removes the slots of the replicas it
  displaces (:func:`controlplane.allocation.records.place`: compare-and-put on the
  revision read, so a record changed meanwhile is re-read and checked again,
  never overwritten); (2) a drain intent for each displaced replica, which
  every control plane turns into a ``KIND_DRAIN`` command to the replica's
  agent (the only thing that reaches an agent: loading the large model is the
  agent's part, which does not exist yet); (3) the deletion of the request.
  A crash between steps is repaired by the next pass: a request whose id is a
  slot already is deleted; a displaced replica still registered and not
  drained is drained again (so an undrain of a displaced replica does not
  last while the slot holds its GPUs: release the slot instead);
- :meth:`GangAllocator.release` removes a slot (or a pending request) and
  cancels the drains it made.

Why a request waits is known on the leader (``reasons``). Bounds: requests
waiting at most ``max_pending_allocations`` (checked by the caller); one pass
at a time. Cost per pass: the planner's, plus one store read and one
transaction per placement and one put per displaced replica.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Iterable, Sequence

from controlplane.allocation.gang import Placement, Plan, Request, plan
from controlplane.allocation.records import place, release
from controlplane.config import Policy
from controlplane.fleet.view import Member, is_live
from controlplane.intent.cache import IntentCache
from controlplane.store.base import Store, pending_key
from controlplane.tables.views import node_state
from ferry.errors import FerryError

log = logging.getLogger(__name__)


def new_request_id(model: str, taken: Callable[[str], bool]) -> str:
    """A fresh id for a replica of ``model`` (it becomes the slot's replica id)."""
    while True:
        candidate = f"{model[:96]}-a{secrets.token_hex(4)}"
        if not taken(candidate):
            return candidate


class GangAllocator:
    """Requests in, placements and drains out; every time from ``wall`` (unix seconds, persisted)."""

    def __init__(self, store: Store, intent: IntentCache, policy: Policy, *, wall: Callable[[], float],
                 grace_seconds: float, clock: Callable[[], float], timeout: float = 2.0,
                 on_placed: Callable[[Placement], None] | None = None) -> None:
        self._store = store
        self._intent = intent
        self.policy = policy
        self._wall = wall
        self._clock = clock
        self._grace = grace_seconds
        self._timeout = timeout
        self._on_placed = on_placed
        self._lock = asyncio.Lock()
        self.reasons: dict[str, str] = {}  # request id -> why it waits (the last pass here)
        self.passes = 0  # passes finished
        self._passed = asyncio.Event()

    async def submit(self, requests: Sequence[Request]) -> int:
        """Write ``requests`` as pending; returns the store revision of the last write."""
        revision = 0
        for request in requests:
            revision = await self._store.put(pending_key(request.request_id), request.encode())
        return revision

    async def wait_pass(self, after: int, seconds: float) -> bool:
        """Wait (at most ``seconds``) until pass number ``after`` + 1 has finished; False on timeout."""
        try:
            async with asyncio.timeout(seconds):
                while self.passes <= after:
                    await self._passed.wait()
        except TimeoutError:
            return False
        return True

    def may_be_due(self) -> bool:
        """Requests wait, or some slot displaced replicas (which may need a drain again): without members."""
        return bool(self._intent.pending) or any(
            slot.displaces for record in self._intent.allocations.values() for slot in record.slots)

    def due(self, members: Iterable[Member]) -> bool:
        """Whether a pass has anything to do: requests waiting, or displaced replicas to drain again."""
        return bool(self._intent.pending) or bool(self._undrained(members))

    async def run_pass(self, members: Sequence[Member], cordons: Iterable[str]) -> Plan:
        """Plan and write every placement of one pass (the leader's loop calls this)."""
        async with self._lock:
            try:
                return await self._pass(members, set(cordons))
            finally:
                self.passes += 1
                self._passed.set()
                self._passed = asyncio.Event()

    async def _pass(self, members: Sequence[Member], cordons: set[str]) -> Plan:
        now, wall = self._clock(), self._wall()
        placed_ids = {s.replica_id for r in self._intent.allocations.values() for s in r.slots}
        revision = 0
        for request_id in [r for r in self._intent.pending if r in placed_ids]:  # a crash after step 1
            revision = max(revision, await self._store.delete(pending_key(request_id)))
        requests = [r for r in self._intent.pending.values() if r.request_id not in placed_ids]
        by_node = {m.node: m for m in members}
        nodes = [node_state(m, self._intent.allocations.get(m.node), live=is_live(m, now, self._grace),
                            cordoned=m.node in cordons) for m in members]
        result = plan(nodes, requests, now=wall, policy=self.policy)
        reasons = dict(result.waiting)
        for placement in result.placements:
            member = by_node[placement.node]
            try:
                revision = await place(self._store, placement.node, placement.slot, placement.removed,
                                       node_gpus=member.gpus)
            except (FerryError, ValueError) as exc:  # a conflict, the store, or a malformed record
                reasons[placement.request.request_id] = f"placement on {placement.node} failed ({exc}); next pass"
                log.warning("allocation of %s on %s: %s", placement.request.request_id, placement.node, exc)
                continue
            for replica_id in placement.slot.displaces:
                if replica_id not in self._intent.drains:
                    revision = await self._intent.request_drain(replica_id, wall)
            revision = max(revision, await self._store.delete(pending_key(placement.request.request_id)))
            log.info("allocated %s (%s, %d GPUs) on %s, branch %s, drain cost %g, displacing %s",
                     placement.request.request_id, placement.request.model, placement.request.gpus, placement.node,
                     placement.branch, placement.cost, ", ".join(placement.slot.displaces) or "nothing")
            if self._on_placed is not None:
                self._on_placed(placement)
        for replica_id in self._undrained(members):
            revision = max(revision, await self._intent.request_drain(replica_id, wall))
        self.reasons = reasons
        if revision:
            await self._intent.wait(revision, self._timeout)
        return result

    def _undrained(self, members: Iterable[Member]) -> list[str]:
        """Displaced replicas still registered on their node whose drain intent is missing."""
        registered = {m.node: m.replicas for m in members}
        return sorted(
            replica_id for node, record in self._intent.allocations.items() for slot in record.slots
            for replica_id in slot.displaces
            if replica_id in registered.get(node, {}) and replica_id not in self._intent.drains
        )

    async def release(self, replica_id: str) -> tuple[bool, list[str]]:
        """Remove the slot of ``replica_id`` (or its pending request): (released, replicas undrained)."""
        async with self._lock:
            if replica_id in self._intent.pending:
                revision = await self._store.delete(pending_key(replica_id))
                await self._intent.wait(revision, self._timeout)
                return bool(revision), []
            found = self._intent.slot(replica_id)
            if found is None:
                return False, []
            node, index = found
            displaced = self._intent.allocations[node].slots[index].displaces
            revision = await release(self._store, node, replica_id)
            undrained = []
            for other in displaced:
                if other in self._intent.drains:
                    revision = max(revision, await self._intent.cancel_drain(other))
                    undrained.append(other)
            if revision:
                await self._intent.wait(revision, self._timeout)
            return True, undrained
