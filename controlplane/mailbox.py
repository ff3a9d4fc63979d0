"""A bounded mailbox between producers and one consumer task: offer, close, next.

Two policies, the ones the control plane's streams need:

- :meth:`Mailbox.fifo` (bounded first in, first out): at most ``capacity``
  items wait; :meth:`Mailbox.offer` refuses (returns False) beyond it, so the
  producer can tell its caller (an agent's commands: every one must be sent);
- :meth:`Mailbox.latest` (keep the latest per key): a newer item replaces the
  waiting one of the same key, and items leave in key order, so a slow
  consumer gets the latest of each key, never a backlog (table snapshots: one
  slot for a proxy's region, one slot per region for a follower). Memory is
  bounded by the number of keys.

Once closed (the first reason is kept) :meth:`Mailbox.next` returns None,
waiting items are dropped and offers are refused. Cost: O(1) per offer,
O(keys) per ``next`` under ``latest`` (the smallest key), O(1) under ``fifo``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Mailbox(Generic[T]):
    """Items waiting for one consumer, under one policy: bounded FIFO or keep-latest per key."""

    def __init__(self, *, capacity: int | None = None, key: Callable[[T], str] | None = None) -> None:
        if (capacity is None) == (key is None):
            raise ValueError("give capacity (fifo) or key (latest), not both")
        if capacity is not None and capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._key = key
        self._fifo: deque[T] = deque()
        self._latest: dict[str, T] = {}
        self._wake = asyncio.Event()
        self.closed_reason: str | None = None

    @classmethod
    def fifo(cls, capacity: int) -> Mailbox[T]:
        """First in, first out; at most ``capacity`` items wait."""
        return cls(capacity=capacity)

    @classmethod
    def latest(cls, key: Callable[[T], str] = lambda _: "") -> Mailbox[T]:
        """Keep the latest item of each ``key`` (default: one slot), delivered in key order."""
        return cls(key=key)

    @property
    def closed(self) -> bool:
        return self.closed_reason is not None

    def __len__(self) -> int:
        return len(self._fifo) if self._key is None else len(self._latest)

    def offer(self, item: T) -> bool:
        """Put ``item`` in; False (nothing kept) when closed or, under ``fifo``, full."""
        if self.closed_reason is not None:
            return False
        if self._key is None:
            assert self._capacity is not None
            if len(self._fifo) >= self._capacity:
                return False
            self._fifo.append(item)
        else:
            self._latest[self._key(item)] = item
        self._wake.set()
        return True

    def close(self, reason: str) -> None:
        """No more items: a waiting :meth:`next` returns None; the first reason is kept."""
        if self.closed_reason is None:
            self.closed_reason = reason
            self._fifo.clear()
            self._latest.clear()
        self._wake.set()

    def take(self) -> T | None:
        """The next item if one waits, else None (never waits)."""
        if self.closed_reason is not None:
            return None
        if self._key is None:
            return self._fifo.popleft() if self._fifo else None
        if not self._latest:
            return None
        return self._latest.pop(min(self._latest))

    async def next(self) -> T | None:
        """The next item, waiting for one; None once the mailbox is closed."""
        while self.closed_reason is None:
            item = self.take()
            if item is not None:
                return item
            self._wake.clear()
            await self._wake.wait()
        return None
