"""Operator intent (drains, cordons, GPU allocations and requests): owned by the store, mirrored here.

The cache is fed only by the store, through a :class:`controlplane.store.mirror.Mirror`
of ``/ferry/intent/``: a write made here, or by another control plane on the
same store, reaches it the same way, and a control plane that restarts finds
every drain and allocation again. :meth:`IntentCache.wait` lets the writer wait
until its own write is applied, so a drain takes effect in the tables before
the Admin call returns.

- ``drains``: replica ids under ``intent/drain/``;
- ``allocations``: node -> :class:`controlplane.allocation.records.NodeAllocations`
  under ``intent/alloc/`` (a malformed record is logged and skipped);
- ``cordons``: node names under ``intent/cordon/``;
- ``pending``: request id -> :class:`controlplane.allocation.gang.Request` under
  ``intent/pending/`` (allocation requests waiting for a node);
- ``rollouts``: model -> :class:`controlplane.rollout.plan.Rollout` under
  ``intent/rollout/`` (a malformed record is logged and skipped);
- ``tenants``: a :class:`controlplane.tenants.records.TenantBook` of the records under
  ``intent/tenant/`` and the marker ``intent/tenants``;
- keys under other ``intent/`` kinds (tier, spill) are kept in the
  mirror, for the issues that will read them.

``on_change()`` is called once for each change of the drain or cordon set,
the allocations or the requests (a listing that changes nothing calls
nothing), and :meth:`IntentCache.changed` wakes whoever waits for one;
``on_drain(replica_id, drained)`` once per replica whose drain was requested
or cancelled. When the store is away the cache keeps what it had and lists
again when it returns (see the mirror). Cost: O(1) per drain event, O(slots
of the node) per allocation event.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from controlplane.allocation.gang import Request
from controlplane.allocation.records import NodeAllocations, decode
from controlplane.rollout.plan import Rollout
from controlplane.store.base import (
    ALLOC_PREFIX,
    CORDON_PREFIX,
    DRAIN_PREFIX,
    INTENT_PREFIX,
    PENDING_PREFIX,
    ROLLOUT_PREFIX,
    KeyValue,
    Store,
    drain_key,
    drain_value,
)
from controlplane.store.mirror import Mirror
from controlplane.tenants.records import TenantBook

log = logging.getLogger(__name__)


class IntentCache:
    """The drain set and allocation records, as of ``revision``."""

    def __init__(
        self,
        store: Store,
        *,
        on_change: Callable[[], None],
        on_drain: Callable[[str, bool], None] | None = None,
        retry_seconds: float = 0.2,
    ) -> None:
        self._store = store
        self._on_change = on_change
        self._on_drain = on_drain
        self.drains: set[str] = set()
        self.allocations: dict[str, NodeAllocations] = {}
        self.cordons: set[str] = set()
        self.pending: dict[str, Request] = {}
        self.rollouts: dict[str, Rollout] = {}
        self.tenants = TenantBook()
        self._pulse = asyncio.Event()
        self.mirror = Mirror(store, INTENT_PREFIX, on_change=self._changed, retry_seconds=retry_seconds)

    @property
    def revision(self) -> int:
        return self.mirror.revision

    @property
    def synced(self) -> asyncio.Event:
        return self.mirror.synced

    async def request_drain(self, replica_id: str, requested_at: float) -> int:
        """Write the drain intent to the store; returns the revision to :meth:`wait` for."""
        return await self._store.put(drain_key(replica_id), drain_value(requested_at))

    async def cancel_drain(self, replica_id: str) -> int:
        return await self._store.delete(drain_key(replica_id))

    async def wait(self, revision: int, seconds: float) -> None:
        """Wait until the cache reflects store ``revision``; ``Unavailable`` after ``seconds``."""
        await self.mirror.wait(revision, seconds)

    async def run(self) -> None:
        """Keep the cache in step with the store until cancelled."""
        await self.mirror.run()

    async def changed(self, seconds: float) -> bool:
        """Wait (at most ``seconds``) for the next change of the intent; False on timeout."""
        try:
            async with asyncio.timeout(seconds):
                await self._pulse.wait()
        except TimeoutError:
            return False
        return True

    def slot(self, replica_id: str) -> tuple[str, int] | None:
        """(node, index in its record's slots) of the allocation slot of ``replica_id``, if any."""
        for node, record in self.allocations.items():
            for i, slot in enumerate(record.slots):
                if slot.replica_id == replica_id:
                    return node, i
        return None

    def _changed(self, key: str, kv: KeyValue | None) -> None:
        self._apply(key, kv)
        self._pulse.set()
        self._pulse = asyncio.Event()

    def _apply(self, key: str, kv: KeyValue | None) -> None:
        if key.startswith(CORDON_PREFIX):
            node = key.removeprefix(CORDON_PREFIX)
            if (node in self.cordons) != (kv is not None):
                (self.cordons.add if kv is not None else self.cordons.discard)(node)
                self._on_change()
        elif key.startswith(PENDING_PREFIX):
            request_id = key.removeprefix(PENDING_PREFIX)
            if kv is None:
                self.pending.pop(request_id, None)
            else:
                try:
                    self.pending[request_id] = Request.decode(request_id, kv.value)
                except ValueError as exc:
                    log.warning("%s", exc)
                    return
            self._on_change()
        elif key.startswith(DRAIN_PREFIX):
            replica_id = key.removeprefix(DRAIN_PREFIX)
            before = replica_id in self.drains
            if kv is None:
                self.drains.discard(replica_id)
            else:
                self.drains.add(replica_id)
            if before != (kv is not None):
                if self._on_drain is not None:
                    self._on_drain(replica_id, kv is not None)
                self._on_change()
        elif key.startswith(ROLLOUT_PREFIX):
            model = key.removeprefix(ROLLOUT_PREFIX)
            if kv is None:
                self.rollouts.pop(model, None)
            else:
                try:
                    self.rollouts[model] = Rollout.decode(model, kv.value)
                except ValueError as exc:
                    log.warning("%s", exc)
                    return
            self._on_change()
        elif key.startswith(ALLOC_PREFIX):
            node = key.removeprefix(ALLOC_PREFIX)
            if kv is None:
                self.allocations.pop(node, None)
            else:
                try:
                    self.allocations[node] = decode(node, kv.value)
                except ValueError as exc:
                    log.warning("%s", exc)
                    return
            self._on_change()
        elif TenantBook.owns(key) and self.tenants.apply(key, kv.value if kv is not None else None):
            self._on_change()
