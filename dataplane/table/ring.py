"""A consistent-hash ring of replicas, with the bounded-load rule (no replica over c x the mean load) applied to it.

**Ring.** Each replica has ``vnodes`` points (default 128) at
``blake2b(replica_id || "#" || i)`` on a 64-bit circle. :meth:`Ring.walk`
yields the replicas met clockwise from a key's point, each once: a key's
*home* is the first, and it goes on to the next ones only when the home will
not take it. Adding or removing a replica moves only the keys of its arcs.
Built once per membership (:mod:`dataplane.table.pool`).

**Bound.** Consistent hashing with bounded loads keeps every replica under
``c`` times its share of the load (default ``c`` = 1.25): a key whose home is
full goes on along its walk, so a popular key overflows to the next
replicas. Placing each request on the first replica under the bound *at that
moment* moves a different set of requests at every fluctuation; with a few
dozen requests per replica, loads swing by 20 % from second to second, and
every move costs the moved conversation its prefix cache. So the bound is
applied to keys instead: :func:`key_shares` gives each replica the share of
its keys it keeps::

    share_r = min(1, c * capacity_r / sum(capacity) * sum(load) / load_r)

with ``load`` the smoothed queued + running of each replica
(:func:`dataplane.table.pool.smoothed_loads`), and a key takes replica *r* when
its own uniform draw :func:`key_draw` (a second hash of the key) is below
``share_r``. A replica over the bound thus sheds exactly its excess share of
keys, always the same keys, the same at every proxy (they apply the same
tables), and keeps the rest.

Cost: build O(n vnodes log(n vnodes)); a walk O(log(n vnodes)) to start and
O(1) amortised per replica yielded; shares O(n) per table.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterator, Sequence

DEFAULT_VNODES = 128
DEFAULT_LOAD_FACTOR = 1.25
_MIX = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


def point(text: str) -> int:
    """A 64-bit point on the ring for ``text``."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def key_draw(key: int) -> float:
    """A uniform number in [0, 1) drawn from ``key``, independent of its place on the ring."""
    x = (key * _MIX) & _MASK
    x ^= x >> 31
    x = (x * 0xBF58476D1CE4E5B9) & _MASK
    x ^= x >> 29
    return x / 2.0**64


class Ring:
    """Points of ``ids`` on the circle; :meth:`walk` yields indices into ``ids``."""

    def __init__(self, ids: Sequence[str], vnodes: int = DEFAULT_VNODES) -> None:
        if vnodes < 1:
            raise ValueError("vnodes must be positive")
        self.ids = tuple(ids)
        self.vnodes = vnodes
        marks = sorted((point(f"{rid}#{i}"), index) for index, rid in enumerate(self.ids) for i in range(vnodes))
        self._points = [p for p, _ in marks]
        self._owners = [o for _, o in marks]

    def __len__(self) -> int:
        return len(self.ids)

    def walk(self, key: int) -> Iterator[int]:
        """Indices of the replicas clockwise from ``key``, each once (home first)."""
        n = len(self.ids)
        if n == 0:
            return
        points, owners = self._points, self._owners
        size = len(points)
        start = bisect.bisect_left(points, key & _MASK)
        seen: set[int] = set()
        for step in range(size):
            owner = owners[(start + step) % size]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == n:
                    return

    def home(self, key: int) -> int:
        """Index of the first replica clockwise from ``key``."""
        return next(self.walk(key))


def key_shares(loads: Sequence[float], capacities: Sequence[float], factor: float) -> tuple[float, ...]:
    """Per replica, the share of its keys it keeps so that its load stays within ``factor`` x its share."""
    total_load, total_capacity = sum(loads), sum(capacities)
    if total_load <= 0 or total_capacity <= 0:
        return tuple(1.0 for _ in loads)
    # total_load / load >= 1 first: a tiny load must not underflow the product to a share of 0
    return tuple(min(1.0, factor * (total_load / load) * (cap / total_capacity)) if load > 0 else 1.0
                 for load, cap in zip(loads, capacities, strict=True))
