"""Operator intent (drain requested per replica): owned by the store, cached here.

The cache is fed only by the store: :meth:`IntentCache.run` watches
``/ferry/intent/drain/``, then lists it, and applies each later event in
revision order (watch first, then list, skip events at or below the listing's
revision: nothing is missed and nothing applied twice). A write made here, or by
another control plane on the same store, reaches the cache the same way;
:meth:`IntentCache.wait` lets the writer wait until its own write is applied,
so a drain takes effect in the tables before the Admin call returns.

When the watch is lost (it fell behind, or the store failed), the cache lists
again and watches anew after ``retry_seconds`` (0.2 s, doubled up to 2 s while
it keeps failing); meanwhile it keeps the intent it had (the tables keep being
computed from it). ``on_change`` is called after each change of the set.
Cost: O(1) per event, O(drains) per listing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from controlplane.store import DRAIN_PREFIX, EventKind, Store, drain_key, drain_value
from ferry.errors import FerryError, Unavailable

log = logging.getLogger(__name__)


class IntentCache:
    """The set of replica ids whose drain was requested, as of ``revision``."""

    def __init__(self, store: Store, *, on_change: Callable[[], None], retry_seconds: float = 0.2) -> None:
        self._store = store
        self._on_change = on_change
        self._retry = self._delay = retry_seconds
        self.drains: set[str] = set()
        self.revision = 0
        self.synced = asyncio.Event()
        self._advanced = asyncio.Event()

    async def request_drain(self, replica_id: str, requested_at: float) -> int:
        """Write the drain intent to the store; returns the revision to :meth:`wait` for."""
        return await self._store.put(drain_key(replica_id), drain_value(requested_at))

    async def cancel_drain(self, replica_id: str) -> int:
        return await self._store.delete(drain_key(replica_id))

    async def wait(self, revision: int, seconds: float) -> None:
        """Wait until the cache reflects store ``revision``; ``Unavailable`` after ``seconds``."""
        try:
            async with asyncio.timeout(seconds):
                while self.revision < revision:
                    event = self._advanced
                    await event.wait()
        except TimeoutError as exc:
            raise Unavailable(f"the store did not echo revision {revision} within {seconds:g} s") from exc

    async def run(self) -> None:
        """Keep the cache in step with the store until cancelled."""
        while True:
            try:
                await self._follow()
            except FerryError as exc:
                log.warning("intent watch lost, listing again in %.1f s: %s", self._delay, exc)
            await asyncio.sleep(self._delay)
            self._delay = min(self._delay * 2, 2.0)

    async def _follow(self) -> None:
        watch = await self._store.watch(DRAIN_PREFIX)
        try:
            listing = await self._store.list(DRAIN_PREFIX)
            drains = {kv.key.removeprefix(DRAIN_PREFIX) for kv in listing.items}
            changed, self.drains = drains != self.drains, drains
            self._advance(max(self.revision, listing.revision), changed)
            self._delay = self._retry
            self.synced.set()
            async for event in watch:
                if event.revision <= self.revision:
                    continue
                replica_id = event.key.removeprefix(DRAIN_PREFIX)
                before = replica_id in self.drains
                if event.kind is EventKind.PUT:
                    self.drains.add(replica_id)
                else:
                    self.drains.discard(replica_id)
                self._advance(event.revision, before != (replica_id in self.drains))
        finally:
            await watch.close()

    def _advance(self, revision: int, changed: bool) -> None:
        self.revision = revision
        self._advanced.set()
        self._advanced = asyncio.Event()
        if changed:
            self._on_change()
