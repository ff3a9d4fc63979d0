"""A live copy of the keys under one store prefix: watch, then list, then apply events in order.

:class:`Mirror` keeps ``items`` (key -> :class:`controlplane.store.base.KeyValue`)
equal to the store's keys under ``prefix`` as of ``revision``. :meth:`run`
watches first, then lists, then applies each later event in revision order
(events at or below the listing's revision are skipped): nothing is missed
and nothing applied twice. ``on_change(key, kv)`` is called for each key that
changed (``kv`` None for a deletion), including the differences a fresh
listing reveals after a lost watch, so a consumer sees deletions that
happened while the store was away.

When the watch is lost (it fell behind, or the store failed or went away),
the mirror keeps its items (consumers keep their last state), waits
``retry_seconds`` (0.2 s, doubled up to ``max_retry_seconds``, 2 s, while it
keeps failing), lists again and watches anew. :meth:`wait` lets a writer wait
until its own write is reflected. At most ``max_keys`` (100,000) keys are
kept; beyond that new keys are ignored and counted in ``overflow``.
Cost: O(1) per event, O(keys) per listing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from controlplane.store.base import EventKind, KeyValue, Store
from ferry.errors import FerryError, Unavailable

log = logging.getLogger(__name__)

OnChange = Callable[[str, KeyValue | None], None]


class Mirror:
    """The keys under ``prefix`` as of ``revision``; ``synced`` is set after the first listing."""

    def __init__(
        self,
        store: Store,
        prefix: str,
        *,
        on_change: OnChange | None = None,
        retry_seconds: float = 0.2,
        max_retry_seconds: float = 2.0,
        max_keys: int = 100_000,
    ) -> None:
        self._store = store
        self.prefix = prefix
        self._on_change = on_change
        self._retry = self._delay = retry_seconds
        self._max_retry = max_retry_seconds
        self._max_keys = max_keys
        self.items: dict[str, KeyValue] = {}
        self.revision = 0
        self.synced = asyncio.Event()
        self.following = False  # a watch is open and the listing applied
        self.overflow = 0
        self._advanced = asyncio.Event()

    def get(self, key: str) -> KeyValue | None:
        return self.items.get(key)

    def names(self) -> list[str]:
        """The keys without the prefix, sorted."""
        return sorted(k.removeprefix(self.prefix) for k in self.items)

    async def wait(self, revision: int, seconds: float) -> None:
        """Wait until the mirror reflects store ``revision``; ``Unavailable`` after ``seconds``."""
        try:
            async with asyncio.timeout(seconds):
                while self.revision < revision:
                    await self._advanced.wait()
        except TimeoutError as exc:
            raise Unavailable(f"the store did not echo revision {revision} within {seconds:g} s") from exc

    async def run(self) -> None:
        """Keep the mirror in step with the store until cancelled."""
        while True:
            try:
                await self._follow()
            except FerryError as exc:
                level = logging.WARNING if self._delay == self._retry else logging.DEBUG  # once per outage
                log.log(level, "watch of %s lost, listing again in %.1f s: %s", self.prefix, self._delay, exc)
            self.following = False
            await asyncio.sleep(self._delay)
            self._delay = min(self._delay * 2, self._max_retry)

    async def _follow(self) -> None:
        watch = await self._store.watch(self.prefix)
        try:
            listing = await self._store.list(self.prefix)
            fresh = {kv.key: kv for kv in listing.items}
            for key in [k for k in self.items if k not in fresh]:
                self._apply(key, None)
            for key, kv in fresh.items():
                old = self.items.get(key)
                if old is None or (old.value, old.revision) != (kv.value, kv.revision):
                    self._apply(key, kv)
            self._advance(max(self.revision, listing.revision))
            if self._delay != self._retry:
                log.info("watch of %s restored at revision %d", self.prefix, self.revision)
            self._delay = self._retry
            self.following = True
            self.synced.set()
            async for event in watch:
                if event.revision <= self.revision:
                    continue
                if event.kind is EventKind.PUT:
                    self._apply(event.key, KeyValue(event.key, event.value, event.revision))
                elif event.key in self.items:
                    self._apply(event.key, None)
                self._advance(event.revision)
        finally:
            await watch.close()

    def _apply(self, key: str, kv: KeyValue | None) -> None:
        if kv is None:
            self.items.pop(key, None)
        elif key in self.items or len(self.items) < self._max_keys:
            self.items[key] = kv
        else:
            self.overflow += 1
            return
        if self._on_change is not None:
            self._on_change(key, kv)

    def _advance(self, revision: int) -> None:
        self.revision = revision
        self._advanced.set()
        self._advanced = asyncio.Event()
