"""An approximate prefix tree per replica, as a cache-aware router keeps one from the requests it routed.

The router never hears from the engines: it records each request's prompt
under the replica it sent it to and assumes the replica still holds it.
Prompts here are chains of block ids (equal id at depth *d* means an equal
prefix of *d* blocks), so the tree is kept as, per replica, an LRU set of
the block ids routed there, bounded by ``max_blocks`` per replica (the
tree's size limit), and a map from block id to the replicas holding it.

:meth:`ApproxTree.match` returns the replicas with the longest matched
prefix and its length in blocks. Cost: O(matched depth x holders) per match,
O(blocks) per insert, O(replicas x max_blocks) memory.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class ApproxTree:
    """Per-replica LRU sets of routed block ids; see the module docstring."""

    def __init__(self, replicas: int, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self._lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(replicas)]
        self._holders: dict[int, set[int]] = {}

    def size(self, replica: int) -> int:
        """Blocks the tree attributes to ``replica``."""
        return len(self._lru[replica])

    def match(self, ids: Sequence[int]) -> tuple[set[int], int]:
        """(replicas holding the longest prefix of ``ids``, its length in blocks); (empty, 0) on a miss."""
        best: set[int] = set()
        depth = 0
        for block in ids:
            holders = self._holders.get(block)
            if not holders:
                break
            narrowed = holders if depth == 0 else best & holders
            if not narrowed:
                break
            best, depth = set(narrowed), depth + 1
        return best, depth

    def insert(self, replica: int, ids: Sequence[int]) -> None:
        """Record that ``replica`` was sent the prompt ``ids``; evict its least recently used blocks."""
        lru = self._lru[replica]
        for block in reversed(ids):  # head last: the shared head is the last to go
            if block in lru:
                lru.move_to_end(block)
            else:
                lru[block] = None
                self._holders.setdefault(block, set()).add(replica)
        while len(lru) > self.max_blocks:
            old, _ = lru.popitem(last=False)
            holders = self._holders[old]
            holders.discard(replica)
            if not holders:
                del self._holders[old]
