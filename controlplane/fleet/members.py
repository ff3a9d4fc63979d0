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

Claims (:mod:`controlplane.fleet.claims`): the member's lease also holds its
claim keys (its node name, each replica id and address). :meth:`claim` takes
them before a registration or a telemetry change is applied (refused with
``AlreadyExists`` naming the field when a live owner anywhere holds one), and
the claims a registration lacks are written in one conditional transaction
(:meth:`controlplane.store.base.Store.put_all_if`, ``MAX_TXN_WRITES`` keys at a
time) rather than one per key: a node of 8 replicas takes 17 claims; each
write of a member (:meth:`sync`) takes the ones it lacks (after a lost
lease: all of them again; one now held by someone else is logged as
``claim_lost``) and deletes the ones of replicas the member no longer has.
A record's lease, value and claims change under its lock only, so a claim
and a write never take two leases for one member.

At most ``claim_concurrency`` (16) claims talk to the store at once; the
others wait their turn (within the caller's timeout). A burst of
registrations (a fleet starting, or its agents reconnecting after a failover)
otherwise runs every node's conditional writes interleaved: each takes longer
than the registration's timeout, all are refused and retried together, and
the fleet does not come up (measured with ``python -m tools.bench.controlplane``
on a loaded 2-core machine: 124 of 625 nodes registered in 300 s, 11,839
registrations retried). Bounded, the first claims finish in time and the
rest wait or are refused and come back after their agents' backoff.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from controlplane.fleet.claims import NODE, Claim, Holder, host_of, refusal, register_claims, served_at
from controlplane.fleet.view import Member
from controlplane.store.base import MAX_TXN_WRITES, LeaseNotFound, Store, member_key
from ferry.errors import AlreadyExists, FerryError
from ferry.logs import event

log = logging.getLogger(__name__)


@dataclass
class _Record:
    """One member's store side: its lease, when it was last refreshed, and whether its value needs writing."""

    lease: int = 0
    refreshed_at: float = float("-inf")
    dirty: bool = True  # the stored value is stale (or was never written)
    claimed: dict[str, int] = field(default_factory=dict)  # claim key -> revision written under ``lease``
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class MemberLeases:
    """The store side of each member: its lease and whether its value needs writing."""

    def __init__(self, store: Store, *, clock: Callable[[], float], ttl_seconds: float, batch: int = 64,
                 control_plane: str = "", dead: Callable[[str], bool] = lambda node: False,
                 claim_concurrency: int = 16) -> None:
        if claim_concurrency < 1:
            raise ValueError("claim_concurrency must be >= 1")
        self._store = store
        self._claiming = asyncio.Semaphore(claim_concurrency)
        self._cp = control_plane
        self._dead = dead  # whether this control plane sees a node dead (its claims may be taken)
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
        """Refresh the due leases of the connected members, then write the stale ones ``batch`` at a time,
        refreshing the leases that fell due after each batch (a long pass of writes, as after a burst of
        registrations, does not leave the others' leases to run out)."""
        connected = [m for m in members if m.connected]
        todo, error = await self._refresh_due(connected)
        queued = {m.node for m in todo}
        while todo and not error:
            batch, todo = todo[:self._batch], todo[self._batch:]
            errors = [e for e in await asyncio.gather(*(self._write(m) for m in batch)) if e]
            if errors:
                log.warning("store: %d of %d members not written (will retry): %s", len(errors) + len(todo),
                            len(queued), errors[0])
                return  # the store is away: the rest waits for the next pass
            more, error = await self._refresh_due(connected)
            todo += [m for m in more if m.node not in queued]
            queued.update(m.node for m in more)
        if error:
            log.warning("store: member leases not refreshed (will retry): %s", error)

    def _due(self, record: _Record, now: float) -> bool:
        """Whether the record's lease wants a refresh: a third of the TTL since its grant or last refresh."""
        return record.refreshed_at <= now - self._ttl / 3

    async def _refresh_due(self, members: list[Member]) -> tuple[list[Member], str]:
        """Refresh, in one store call (:meth:`Store.refresh_leases`), every lease due (a third of the TTL
        since its grant or last answered refresh) whose record no write holds; the members to write (changed,
        or their lease lost) and the first store error ("" when none)."""
        sent = self._clock()
        refresh: list[tuple[_Record, Member, int]] = []
        todo = []
        for member in members:
            record = self._records.setdefault(member.node, _Record())
            if record.lease and self._due(record, sent) and not record.lock.locked():
                refresh.append((record, member, record.lease))
            if record.dirty or not record.lease:
                todo.append(member)
        if not refresh:
            return todo, ""
        outcomes = await self._store.refresh_leases([lease for _, _, lease in refresh])
        error = ""
        for (record, member, lease), outcome in zip(refresh, outcomes, strict=True):
            if record.lease != lease:  # a claim took a new lease meanwhile
                continue
            if outcome is None:
                record.refreshed_at = sent
            elif isinstance(outcome, LeaseNotFound):  # ran out: written again under a new lease
                record.lease = 0
                if not record.dirty:  # not yet to be written
                    record.dirty = True
                    todo.append(member)
            else:
                error = error or f"member {member.node}: {outcome}"
        return todo, error

    async def claim(self, node: str, claims: Sequence[Claim], hosts: frozenset[str]) -> None:
        """Take ``claims`` for ``node`` under its lease, or raise AlreadyExists naming the first one held.

        Nothing is written when one is refused. A claim lost to a race (the conditional put fails)
        is read again and refused. Store errors (``Unavailable``) propagate: ownership cannot be
        checked while the store is away.
        """
        record = self._records.setdefault(node, _Record())
        async with self._claiming, record.lock:
            if any(c.kind == NODE for c in claims):  # a registration: every claim read and written again, so
                record.claimed.clear()  # none is trusted that another control plane took meanwhile
            for last in (False, True):
                if not record.lease:
                    granted = self._clock()
                    record.lease = await self._store.grant_lease(self._ttl)
                    record.refreshed_at = granted  # its TTL runs from here: the next refresh is due from it
                    record.claimed.clear()
                    record.dirty = True  # the member's value and other claims go under the new lease
                try:
                    await self._take(record, node, claims, hosts)
                    return
                except LeaseNotFound:
                    record.lease = 0
                    if last:
                        raise

    async def _take(self, record: _Record, node: str, claims: Sequence[Claim], hosts: frozenset[str]) -> None:
        first: dict[str, Claim] = {}
        for c in claims:
            first.setdefault(c.key, c)  # a key claimed twice (replicas sharing an address): its first field
        todo = [c for c in first.values() if c.key not in record.claimed]
        found = await asyncio.gather(*(self._store.get(c.key) for c in todo))
        for c, kv in zip(todo, found, strict=True):
            reason = refusal(c, None if kv is None else Holder.decode(kv.value), node=node,
                             control_plane=self._cp, hosts=hosts, dead=self._dead)
            if reason:
                raise AlreadyExists(c.field, reason)
        value = Holder(node, self._cp, tuple(sorted(hosts))).encode()
        pairs = list(zip(todo, found, strict=True))
        for start in range(0, len(pairs), MAX_TXN_WRITES):  # one transaction per chunk, not one per claim
            chunk = pairs[start:start + MAX_TXN_WRITES]
            writes = [(c.key, value, 0 if kv is None else kv.revision) for c, kv in chunk]
            revision = await self._store.put_all_if(writes, lease=record.lease)
            if not revision:  # one was taken meanwhile: refuse naming it
                now = await asyncio.gather(*(self._store.get(c.key) for c, _ in chunk))
                for (c, kv), current in zip(chunk, now, strict=True):
                    if (current.revision if current is not None else 0) != (kv.revision if kv is not None else 0):
                        reason = refusal(c, None if current is None else Holder.decode(current.value), node=node,
                                         control_plane=self._cp, hosts=hosts, dead=self._dead)
                        raise AlreadyExists(c.field, reason or "claimed by another registration meanwhile")
                raise AlreadyExists(chunk[0][0].field, "claimed by another registration meanwhile")
            for c, _ in chunk:
                record.claimed[c.key] = revision

    async def _reconcile(self, record: _Record, member: Member) -> None:
        """Take the member's claims it lacks (logging those held by others); delete those it no longer needs."""
        reg = member.registration()
        claims = register_claims(reg)
        wanted = {c.key for c in claims}
        for key in [k for k in record.claimed if k not in wanted]:
            kv = await self._store.get(key)
            if kv is not None and Holder.decode(kv.value).node == member.node:
                await self._store.delete(key)
            record.claimed.pop(key, None)
        hosts = frozenset(host_of(served_at(info)) for info in reg.replicas)
        missing = [c for c in claims if c.key not in record.claimed]
        if not missing:
            return
        try:  # all at once (one transaction); when one is held elsewhere, one by one to name each
            await self._take(record, member.node, missing, hosts)
            return
        except AlreadyExists:
            pass
        for c in missing:
            if c.key in record.claimed:
                continue
            try:
                await self._take(record, member.node, [c], hosts)
            except AlreadyExists as exc:
                event(log, "claim_lost", logging.WARNING, node=member.node, field=exc.field, detail=exc.reason)

    async def _write(self, member: Member) -> str:
        """(Re)write the member and its claims (changed, or its lease lost), its lease refreshed first when due;
        the error or ""."""

        record = self._records.setdefault(member.node, _Record())
        async with record.lock:
            return await self._write_locked(record, member)

    async def _write_locked(self, record: _Record, member: Member) -> str:
        try:
            sent = self._clock()
            if record.lease and self._due(record, sent):  # a put does not extend the lease: refreshed first
                try:
                    await self._store.refresh_lease(record.lease)
                    record.refreshed_at = sent
                except LeaseNotFound:
                    record.lease = 0
            value = member.registration().SerializeToString()
            for last in (False, True):  # a lease that ran out while the node was away: take a new one, once
                if not record.lease:
                    granted = self._clock()
                    record.lease = await self._store.grant_lease(self._ttl)
                    record.refreshed_at = granted
                    record.claimed.clear()
                try:
                    await self._store.put(member_key(member.node), value, lease=record.lease)
                    break
                except LeaseNotFound:
                    record.lease = 0
                    if last:
                        raise
            await self._reconcile(record, member)
            record.dirty = False  # refreshed_at stays the lease's grant or last refresh: a put does not extend it
            return ""
        except FerryError as exc:
            record.dirty = True
            return f"member {member.node}: {exc}"
