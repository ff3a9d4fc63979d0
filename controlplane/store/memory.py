"""The embedded store: :class:`controlplane.store.base.Store` in one process's memory.

A dict of keys, one revision counter, leases with deadlines on an injected
monotonic clock, and watches fed through bounded queues. Leases expire lazily:
every call first deletes the keys of expired leases (cost O(expired keys);
finding them is O(leases), fine for thousands of nodes). The control plane
refreshes its leases every tick, so expiry is seen within a tick.

Bounds and outcomes:

- ``max_keys`` (default 100,000): a put of a new key beyond it raises
  ``ferry.errors.Overloaded``;
- ``max_watches`` (64): a further watch raises ``Overloaded``;
- ``watch_queue`` (4,096 events): a watch whose consumer falls that far behind
  is dropped and its iterator raises :class:`controlplane.store.base.WatchLost`.

:meth:`MemoryStore.put_if` compares and writes within one call, with no
await in between: atomic for every task of the process.

Nothing survives the process: this backend is for one control plane on one
machine (``ferry up``) and for tests.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from controlplane.store.base import (
    EventKind,
    KeyValue,
    LeaseNotFound,
    Listing,
    StoreHealth,
    WatchEvent,
    WatchLost,
    check_writes,
)
from ferry.errors import FerryError, Overloaded


@dataclass
class _Lease:
    """One lease of the embedded store: its TTL, when it expires, and the keys it holds."""

    ttl: float
    deadline: float
    keys: set[str] = field(default_factory=set)


class MemoryWatch:
    """Events under one prefix, from a bounded queue; ``None`` in the queue means lost."""

    def __init__(self, store: MemoryStore, prefix: str, limit: int) -> None:
        self._store = store
        self.prefix = prefix
        self._queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue(maxsize=limit + 1)
        self._limit = limit
        self.lost = False

    def offer(self, event: WatchEvent) -> None:
        if self.lost:
            return
        if self._queue.qsize() >= self._limit:
            self.lost = True
            self._queue.put_nowait(None)  # the one slot kept free for this
            self._store.forget_watch(self)
            return
        self._queue.put_nowait(event)

    async def __aiter__(self) -> AsyncIterator[WatchEvent]:
        while True:
            event = await self._queue.get()
            if event is None:
                raise WatchLost(f"watch of {self.prefix!r} fell behind by {self._limit} events or was closed")
            yield event

    async def close(self) -> None:
        self._store.forget_watch(self)
        if not self.lost:
            self.lost = True
            self._queue.put_nowait(None)


class MemoryStore:
    """The in-memory backend; ``clock`` is monotonic seconds (injected in tests)."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 100_000,
        max_watches: int = 64,
        watch_queue: int = 4096,
    ) -> None:
        self._clock = clock
        self._max_keys = max_keys
        self._max_watches = max_watches
        self._watch_queue = watch_queue
        self._data: dict[str, KeyValue] = {}
        self._leases: dict[int, _Lease] = {}
        self._lease_ids = itertools.count(1)
        self._revision = 0
        self._watches: list[MemoryWatch] = []

    @property
    def revision(self) -> int:
        return self._revision

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        self._expire()
        if lease and lease not in self._leases:
            raise LeaseNotFound(lease)
        old = self._data.get(key)
        if old is None and len(self._data) >= self._max_keys:
            raise Overloaded(f"store holds {self._max_keys} keys", retry_after=1.0)
        if old is not None and old.lease and old.lease != lease:
            self._leases[old.lease].keys.discard(key)
        if lease:
            self._leases[lease].keys.add(key)
        self._revision += 1
        self._data[key] = KeyValue(key, value, self._revision, lease)
        self._emit(WatchEvent(EventKind.PUT, key, value, self._revision))
        return self._revision

    async def put_if(self, key: str, value: bytes, *, revision: int, lease: int = 0) -> int:
        self._expire()
        old = self._data.get(key)
        if (old.revision if old is not None else 0) != revision:
            return 0
        return await self.put(key, value, lease=lease)

    async def put_all_if(self, writes: Sequence[tuple[str, bytes, int]], *, lease: int = 0) -> int:
        check_writes(writes)
        self._expire()
        if lease and lease not in self._leases:
            raise LeaseNotFound(lease)
        for key, _, revision in writes:
            old = self._data.get(key)
            if (old.revision if old is not None else 0) != revision:
                return 0
        if len(self._data) + sum(key not in self._data for key, _, _ in writes) > self._max_keys:
            raise Overloaded(f"store holds {self._max_keys} keys", retry_after=1.0)
        for key, value, _ in writes:  # no await between the checks and the last write: atomic on this loop
            written = await self.put(key, value, lease=lease)
        return written

    async def get(self, key: str) -> KeyValue | None:
        self._expire()
        return self._data.get(key)

    async def delete(self, key: str) -> int:
        self._expire()
        return self._delete(key)

    async def list(self, prefix: str) -> Listing:
        self._expire()
        items = tuple(kv for key, kv in sorted(self._data.items()) if key.startswith(prefix))
        return Listing(items, self._revision)

    async def grant_lease(self, ttl_seconds: float) -> int:
        self._expire()
        if ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be > 0")
        lease = next(self._lease_ids)
        self._leases[lease] = _Lease(ttl_seconds, self._clock() + ttl_seconds)
        return lease

    async def refresh_lease(self, lease: int) -> None:
        self._expire()
        held = self._leases.get(lease)
        if held is None:
            raise LeaseNotFound(lease)
        held.deadline = self._clock() + held.ttl

    async def refresh_leases(self, leases: Sequence[int]) -> Sequence[FerryError | None]:
        outcomes: list[FerryError | None] = []
        for lease in leases:
            try:
                await self.refresh_lease(lease)
                outcomes.append(None)
            except FerryError as exc:
                outcomes.append(exc)
        return outcomes

    def lease_confirmed(self, lease: int) -> float:
        held = self._leases.get(lease)
        return held.deadline - held.ttl if held is not None else float("-inf")

    async def revoke_lease(self, lease: int) -> None:
        self._expire()
        self._end_lease(lease)

    async def watch(self, prefix: str) -> MemoryWatch:
        self._expire()
        if len(self._watches) >= self._max_watches:
            raise Overloaded(f"store serves {self._max_watches} watches", retry_after=1.0)
        watch = MemoryWatch(self, prefix, self._watch_queue)
        self._watches.append(watch)
        return watch

    def health(self) -> StoreHealth:
        return StoreHealth(backend="memory", endpoint="", ok=True, last_ok=self._clock())

    async def close(self) -> None:
        for watch in list(self._watches):
            await watch.close()

    def forget_watch(self, watch: MemoryWatch) -> None:
        if watch in self._watches:
            self._watches.remove(watch)

    def _delete(self, key: str) -> int:
        old = self._data.pop(key, None)
        if old is None:
            return 0
        if old.lease and old.lease in self._leases:
            self._leases[old.lease].keys.discard(key)
        self._revision += 1
        self._emit(WatchEvent(EventKind.DELETE, key, b"", self._revision))
        return self._revision

    def _end_lease(self, lease: int) -> None:
        held = self._leases.pop(lease, None)
        if held is not None:
            for key in sorted(held.keys):
                self._delete(key)

    def _expire(self) -> None:
        now = self._clock()
        for lease in [lease for lease, held in self._leases.items() if held.deadline <= now]:
            self._end_lease(lease)

    def _emit(self, event: WatchEvent) -> None:
        for watch in list(self._watches):
            if event.key.startswith(watch.prefix):
                watch.offer(event)
