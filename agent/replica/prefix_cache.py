"""An LRU prefix cache of chained prompt-block hashes, as an LLM engine keeps its reusable KV blocks.

Algorithm: an ordered map of block hash -> None with least recently used
first. A lookup walks a prompt's chained block hashes
(:func:`ferry.tokens.block_hashes`) from the first and stops at the first
miss: since each hash is chained to the one before, the hits are exactly the
prompt's leading blocks that some earlier prompt shared. Hits are touched.
An insert touches or adds every block of a prompt, tail first, so that a
prompt's leading blocks, the ones most often shared, are the last to be
evicted (evicting a head block would orphan its whole chain).

Parameters: ``capacity`` blocks (0 disables the cache). Cost: O(blocks of the
prompt) per lookup or insert, O(capacity) memory.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    """LRU set of block hashes; :meth:`lookup` counts a prompt's leading cached blocks."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._blocks

    def lookup(self, hashes: Sequence[int]) -> int:
        """Number of leading blocks of ``hashes`` in the cache; touches them (head last)."""
        hits = 0
        for h in hashes:
            if h not in self._blocks:
                break
            hits += 1
        for h in reversed(hashes[:hits]):
            self._blocks.move_to_end(h)
        return hits

    def insert(self, hashes: Sequence[int]) -> None:
        """Add or touch every block of a prompt, tail first; evict the least recently used beyond capacity."""
        if self.capacity == 0:
            return
        for h in reversed(hashes):
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
