"""Leader election among control planes that share a store, with leadership fenced by lease time.

Each control plane holds one lease of TTL ``ttl_seconds`` (``leader_lease_seconds``,
3 s), refreshed every third of it, under which it writes
``/ferry/controlplanes/{id}``. To lead, it creates ``/ferry/election/leader``
(``{"id", "address", "since", "lease"}``) with that lease in one transaction
that succeeds only if the key is absent (``put_if(revision=0)``, i.e. etcd's
``create_revision == 0``), then watches the key: when the leader's lease ends
(it stopped, died, or lost etcd for a TTL) etcd deletes the key, every
follower sees the deletion and campaigns again; one wins. A stopping leader
revokes its lease, so the others take over at once.

Fencing: a leader counts itself leader only until ``sent + ttl * 5/6``, where
``sent`` is when it sent its last refresh that etcd answered; etcd cannot
expire the lease before ``sent + ttl``, so no other control plane can win
while this one still publishes. ``sent`` is the later of this loop's own last
refresh and the store's :meth:`controlplane.store.base.Store.lease_confirmed`
(the etcd backend refreshes the lease in this loop's stead while the loop is
stalled by a long computation: after the stall the leader is still
confirmed, with no flicker of leadership). When the store is unreachable for that long
the leader stops computing tables (proxies keep serving the last one); when a
refresh succeeds again on the same lease the key is still its own and it
resumes, in the same ``term``. A lost lease (``LeaseNotFound``) means a new
lease and a new campaign; each win increments ``term``. A control plane
restarted on the same address finds the key held by its previous run: that
run is dead (this one holds its port), so it revokes that lease and
campaigns at once instead of waiting out the TTL.

The clock is injected; :meth:`step` is one pass (refresh, write membership,
campaign) that :meth:`run` repeats every ``ttl / 3`` and at once when the
election key changes. ``on_change()`` is called whenever the role or the
leader may have changed. Cost: one keep-alive per ``ttl / 3``; one
transaction per campaign; two watches (election, control planes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from controlplane.store.base import (
    CONTROLPLANES_PREFIX,
    ELECTION_KEY,
    ELECTION_PREFIX,
    KeyValue,
    LeaseNotFound,
    Store,
    controlplane_key,
)
from controlplane.store.mirror import Mirror
from controlplane.tasks import cancel_and_wait
from ferry.errors import FerryError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PlaneInfo:
    """A control plane as written in the store (its membership key, or the election key)."""

    id: str
    address: str
    since: float = 0.0  # unix seconds: when it started, or won
    lease: int = 0

    def encode(self) -> bytes:
        return json.dumps({"id": self.id, "address": self.address, "since": self.since, "lease": self.lease},
                          sort_keys=True).encode()

    @classmethod
    def decode(cls, value: bytes) -> PlaneInfo | None:
        try:
            data = json.loads(value)
            return cls(str(data["id"]), str(data["address"]), float(data.get("since", 0.0)), int(data.get("lease", 0)))
        except (ValueError, KeyError, TypeError):
            return None


class Election:
    """This control plane's part in the election; ``is_leader()`` is what the table loop asks."""

    def __init__(
        self,
        store: Store,
        *,
        cp_id: str,
        address: str,
        ttl_seconds: float,
        clock: Callable[[], float],
        wall: Callable[[], float],
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self._store = store
        self.id = cp_id
        self.address = address
        self.ttl = ttl_seconds
        self._clock = clock
        self._wall = wall
        self._on_change = on_change
        self.lease = 0
        self.term = 0
        self._holds = False
        self._confirmed_until = float("-inf")
        self._last_sent = float("-inf")
        self._member_written = False
        self._wake = asyncio.Event()
        self.stepped = asyncio.Event()  # set after the first pass
        self.leader: PlaneInfo | None = None
        self.keys = Mirror(store, ELECTION_PREFIX, on_change=self._mirrored)
        self.planes = Mirror(store, CONTROLPLANES_PREFIX)

    def is_leader(self) -> bool:
        """Whether this control plane may publish now: it holds the key and its lease is confirmed."""
        return self._holds and self._clock() < self._confirmed()

    def _confirmed(self) -> float:
        """Until when the lease is confirmed: our last answered refresh, or one the store sent for us."""
        if not self.lease:
            return self._confirmed_until
        return max(self._confirmed_until, self._store.lease_confirmed(self.lease) + self.ttl * 5 / 6)

    def role(self) -> str:
        if self.is_leader():
            return "leader"
        if self._holds:
            return "leader-unconfirmed"
        return "follower" if self.leader is not None else "candidate"

    def members(self) -> list[PlaneInfo]:
        """The control planes whose membership key is in the store (as mirrored), sorted by id."""
        infos = [PlaneInfo.decode(kv.value) for kv in self.planes.items.values()]
        return sorted((i for i in infos if i is not None), key=lambda i: i.id)

    async def run(self) -> None:
        """Mirror the keys and keep campaigning until cancelled."""
        tasks = [asyncio.create_task(self.keys.run()), asyncio.create_task(self.planes.run())]
        try:
            while True:
                self._wake.clear()
                await self.step()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.ttl / 3):
                        await self._wake.wait()
        finally:
            await cancel_and_wait(tasks, logger=log)

    async def step(self) -> None:
        """One pass: hold a lease, write membership, campaign if the key is free."""
        was = (self.is_leader(), self.leader)
        for _attempt in range(2):  # a lost lease: take a new one and go again, once
            try:
                await self._pass()
                break
            except LeaseNotFound:
                log.warning("control plane %s: its lease is gone; taking a new one", self.id)
                self._lose_lease()
            except FerryError as exc:
                log.debug("election step failed: %s", exc)
                break
        self.stepped.set()
        if was != (self.is_leader(), self.leader):
            self._on_change()

    async def _pass(self) -> None:
        await self._hold_lease()
        if not self._member_written:
            info = PlaneInfo(self.id, self.address, self._wall(), self.lease)
            await self._store.put(controlplane_key(self.id), info.encode(), lease=self.lease)
            self._member_written = True
        current = self.keys.get(ELECTION_KEY) if self.keys.following else await self._store.get(ELECTION_KEY)
        if current is not None and self._earlier_self(current):
            old = PlaneInfo.decode(current.value)
            assert old is not None
            log.info("control plane %s: the election key is held by its previous run (lease %d): revoking it",
                     self.id, old.lease)
            await self._store.revoke_lease(old.lease)
            current = await self._store.get(ELECTION_KEY)
        if current is None:
            await self._campaign()
        else:
            self._key_changed(ELECTION_KEY, current)

    def _earlier_self(self, kv: KeyValue) -> bool:
        """The key names this id and address under another lease: a run of ours that is dead (we hold its port)."""
        info = PlaneInfo.decode(kv.value)
        return info is not None and (info.id, info.address) == (self.id, self.address) and info.lease != self.lease

    async def _hold_lease(self) -> None:
        if not self.lease:
            sent = self._clock()
            self.lease = await self._store.grant_lease(self.ttl)
            self._member_written = False
            self._confirm(sent)
        elif self._clock() - self._last_sent >= self.ttl / 3:
            sent = self._clock()
            await self._store.refresh_lease(self.lease)
            self._confirm(sent)

    def _confirm(self, sent: float) -> None:
        self._last_sent = sent
        self._confirmed_until = sent + self.ttl * 5 / 6

    async def _campaign(self) -> None:
        info = PlaneInfo(self.id, self.address, self._wall(), self.lease)
        if await self._store.put_if(ELECTION_KEY, info.encode(), revision=0, lease=self.lease):
            self.term += 1
            self._holds = True
            self.leader = info
            log.info("control plane %s is the leader (term %d)", self.id, self.term)
        else:
            current = await self._store.get(ELECTION_KEY)
            if current is not None:
                self._key_changed(ELECTION_KEY, current)

    def _mirrored(self, key: str, kv: KeyValue | None) -> None:
        if self._key_changed(key, kv):
            self._on_change()

    def _key_changed(self, key: str, kv: KeyValue | None) -> bool:
        """Take the election key as now stored; True when the leader or our hold changed."""
        if key != ELECTION_KEY:
            return False
        before = (self._holds, self.leader)
        info = PlaneInfo.decode(kv.value) if kv is not None else None
        self.leader = info
        self._holds = info is not None and info.id == self.id and info.lease == self.lease and self.lease != 0
        if kv is None:
            self._wake.set()  # the key is free: campaign now
        return before != (self._holds, self.leader)

    def _lose_lease(self) -> None:
        self.lease = 0
        self._holds = False
        self._confirmed_until = float("-inf")
        self._member_written = False

    async def resign(self) -> None:
        """Revoke the lease: the election key (if ours) and the membership key go at once."""
        lease, self.lease = self.lease, 0
        self._holds = False
        if lease:
            with contextlib.suppress(FerryError):
                await self._store.revoke_lease(lease)
