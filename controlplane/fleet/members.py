"""Members in the store: each connected node's registration under a lease.

``/ferry/members/{node}`` holds the node's ``fleet_pb2.Register`` as it stands
(replicas added or removed by telemetry included), written under a lease of
TTL ``grace_seconds`` (3 s) that is refreshed every third of it while the
agent stream is open. When the stream or this control plane is gone, the lease
runs out and the store deletes the key by itself: membership expires without
anyone cleaning up.

A write that fails (store down, lease lost) is not an error for the agent:
the member stays in the fleet view and in the tables, and :meth:`sync` writes
it again at the next tick. A pass runs its calls ``batch`` (64) at a time and
stops at the first batch that finds the store unreachable, so an absent
store costs one timeout per pass, not one per member. Cost: one store call
per member per third of the grace (a lease keep-alive: no write in etcd),
plus one write per registration change.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from controlplane.fleet.view import Member
from controlplane.store.base import LeaseNotFound, Store, member_key
from ferry.errors import FerryError

log = logging.getLogger(__name__)


@dataclass
class _Record:
    """One member's store side: its lease, when it was last refreshed, and whether its value needs writing."""

    lease: int = 0
    refreshed_at: float = float("-inf")
    dirty: bool = True  # the stored value is stale (or was never written)


class MemberLeases:
    """The store side of each member: its lease and whether its value needs writing."""

    def __init__(self, store: Store, *, clock: Callable[[], float], ttl_seconds: float, batch: int = 64) -> None:
        self._store = store
        self._clock = clock
        self._ttl = ttl_seconds
        self._batch = batch
        self._records: dict[str, _Record] = {}

    def changed(self, node: str) -> None:
        """The member's registration changed: write it at the next sync."""
        self._records.setdefault(node, _Record()).dirty = True

    def forget(self, node: str) -> None:
        self._records.pop(node, None)

    async def sync(self, members: Iterable[Member]) -> None:
        """Write or refresh every connected member that is stale or due."""
        due = self._clock() - self._ttl / 3
        todo = []
        for member in list(members):
            record = self._records.setdefault(member.node, _Record())
            if member.connected and (record.dirty or record.refreshed_at <= due):
                todo.append(member)
        for start in range(0, len(todo), self._batch):
            errors = [e for e in await asyncio.gather(*(self._write(m) for m in todo[start:start + self._batch])) if e]
            if errors:
                log.warning("store: %d of %d members not written (will retry): %s", len(todo) - start,
                            len(todo), errors[0])
                return  # the store is away: the rest waits for the next pass

    async def _write(self, member: Member) -> str:
        """Refresh the member's lease, or (re)write it under a lease when stale or lost; the error or ""."""

        record = self._records.setdefault(member.node, _Record())
        try:
            if not record.dirty and record.lease:
                try:
                    await self._store.refresh_lease(record.lease)
                    record.refreshed_at = self._clock()
                    return ""
                except LeaseNotFound:
                    record.lease = 0
            value = member.registration().SerializeToString()
            for last in (False, True):  # a lease that ran out while the node was away: take a new one, once
                if not record.lease:
                    record.lease = await self._store.grant_lease(self._ttl)
                try:
                    await self._store.put(member_key(member.node), value, lease=record.lease)
                    break
                except LeaseNotFound:
                    record.lease = 0
                    if last:
                        raise
            record.dirty = False
            record.refreshed_at = self._clock()
            return ""
        except FerryError as exc:
            record.dirty = True
            return f"member {member.node}: {exc}"
