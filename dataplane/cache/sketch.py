"""Was this exact payload seen within the window? A time-windowed set of 64-bit hashes with a cap.

:class:`SeenSet` keeps, for every payload hash seen in the last ``window``
seconds, the time it was last seen, in an insertion-ordered map whose order
is the order of last sight (a hash seen again moves to the end). Algorithm
per :meth:`SeenSet.observe`: drop from the front every hash last seen
``window`` or more seconds ago; the payload is a *duplicate* when its hash is
still present; record it as seen now; when the map holds ``capacity`` hashes,
the oldest goes first (counted in :attr:`SeenSet.evicted`).

Error, both one-sided and bounded:

- false duplicates only from a 64-bit collision between distinct payloads:
  at most ``capacity / 2**64`` per observation (under 4e-15 with the
  default 65,536), since a hash is compared with at most ``capacity`` others;
- missed duplicates only when the cap evicts a hash younger than the window:
  each eviction can hide at most one later duplicate, so the duplicates
  counted are at least the exact number less :attr:`SeenSet.evicted`
  (0 while fewer than ``capacity`` distinct payloads arrive per window).

Memory: at most ``capacity`` entries (about 100 bytes each in CPython, so
some 6.5 MB at 65,536), whatever the traffic. Cost: O(1) amortised per
observation. Pure: the caller passes the time (monotonic seconds).
"""

from __future__ import annotations

from collections import OrderedDict


class SeenSet:
    """Hashes seen within ``window`` seconds, at most ``capacity`` of them; see the module docstring."""

    __slots__ = ("_seen", "capacity", "evicted", "window")

    def __init__(self, *, window: float, capacity: int) -> None:
        if not window > 0:
            raise ValueError("window must be positive")
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self.window = window
        self.capacity = capacity
        self.evicted = 0  # hashes dropped by the cap before their window ended (cumulative)
        self._seen: OrderedDict[int, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def _expire(self, now: float) -> None:
        seen = self._seen
        horizon = now - self.window
        while seen:
            key, last = next(iter(seen.items()))
            if last > horizon:
                return
            del seen[key]

    def observe(self, key: int, now: float) -> bool:
        """Record ``key`` (a 64-bit hash) as seen at ``now``; True when it was seen within the window."""
        self._expire(now)
        seen = self._seen
        duplicate = seen.pop(key, None) is not None
        if len(seen) >= self.capacity:
            seen.popitem(last=False)
            self.evicted += 1
        seen[key] = now
        return duplicate
