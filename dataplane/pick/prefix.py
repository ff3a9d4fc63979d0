"""Prefix keys: what a request's prompt prefix is routed by, and which prefixes are too hot to route by.

**Keys.** A prompt is cut into blocks of ``BLOCK_TOKENS`` tokens with chained
hashes (:func:`ferry.tokens.chain_hashes` of words, :func:`ferry.tokens.chain_ids`
of a tokenizer file's ids: equal hash at block *d* means the same first *d*
blocks). Tokens are the model's own when its catalog entry names a
``tokenizer`` file, so a block is 512 of the engine's tokens and so whole KV
blocks of any engine whose block size divides 512 (16 in vLLM, 512 in the
simulated replica, which hashes its blocks the same way): affinity follows
the engine's own cache; else they are whitespace words. :func:`prefix_keys` turns those hashes into one key
per depth of a ladder, shallowest first (default ``DEPTHS`` = 1, 2, 4, 8, 16
blocks, i.e. 512 to 8,192 tokens)::

    key_d = blake2b(tenant || 0x00 || h_d)        64 bits, for each d in depths with d <= len(hashes)

so a key names the tenant and the whole prefix of *d* blocks. The fleet
simulator calls the same function on a trace's block ids (chained too), so
simulated and real proxies derive keys alike. An explicit ``prefix_key`` from
the client gives one key, ``blake2b(tenant || 0x01 || prefix_key)``, instead
of the ladder. The proxy hashes only the blocks the deepest depth needs
(:func:`leading_hashes`: 16 blocks, whatever the prompt's size).

Why a ladder rather than one depth: the shallowest prefix that is *not* hot
is the useful key. A conversation's turns grow, so a deep key changes from
turn to turn while a shallow one stays (in the Mooncake trace every reuse
past block 0 is a run that includes block 1, so the depth-2 key finds all
of it); but a very shallow prefix (a system prompt: block 0 of every
Mooncake request) is shared by everyone and would pile all traffic on one
replica. So the request is routed by its first key that is not hot, and
the conversations under a popular prefix each go to a replica of their
own. A request whose keys are all hot (a prompt that is nothing but a
popular prefix, or a popular explicit ``prefix_key``) has no key: it is
spread over the pool, where a prefix that popular ends up cached everywhere
(:mod:`dataplane.pick.decide`, branch ``spread``).

**Hot prefixes.** :class:`HotKeys` is a small per-proxy sketch: decayed
counts of the keys the proxy routed by, at most ``capacity`` (default 256)
entries. Every ``window`` requests (default 1,024) all counts are halved and
keys whose count falls under 1 are dropped, so the map holds recent repeat
keys; a key not yet tracked is admitted only while there is room (a heavy
key recurs within a few requests of a window's start, when the halving has
just made room). A key is hot when its count exceeds ``share`` of the
decayed request count, and at least ``min_count`` (default 8): with
``share`` = c / replicas, a prefix hotter than one replica's bounded share.
Proxies see random shares of the same traffic, so they agree on what is hot
except near the threshold.

Cost: :func:`prefix_keys` one blake2b per depth (5); :meth:`HotKeys.observe`
O(keys) amortised, O(capacity) once per window; memory O(capacity).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from ferry.tokens import BLOCK_TOKENS, chain_hashes

DEPTHS = (1, 2, 4, 8, 16)


def leading_hashes(words: Sequence[str], depth: int, block_tokens: int = BLOCK_TOKENS) -> list[int]:
    """Chained hashes of the first ``depth`` blocks of a prompt's words (the last one may be partial)."""
    if isinstance(words, list):
        return chain_hashes(words, block_tokens, depth)
    return chain_hashes(list(words[:depth * block_tokens]), block_tokens)


def _digest(tenant: str, tag: bytes, body: bytes) -> int:
    h = hashlib.blake2b(tenant.encode(), digest_size=8)
    h.update(tag)
    h.update(body)
    return int.from_bytes(h.digest(), "big")


def prefix_keys(tenant: str, hashes: Sequence[int], depths: Sequence[int] = DEPTHS) -> tuple[int, ...]:
    """One key per depth of ``depths`` that ``hashes`` reaches, shallowest first; see the module docstring."""
    return tuple(_digest(tenant, b"\x00", (hashes[d - 1] & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "big"))
                 for d in depths if d <= len(hashes))


def explicit_key(tenant: str, prefix_key: str) -> int:
    """The key of a client's explicit ``prefix_key``."""
    return _digest(tenant, b"\x01", prefix_key.encode())


class HotKeys:
    """Decayed counts of recent keys; :meth:`hot` says which carry more than ``share`` of requests."""

    def __init__(self, *, capacity: int = 256, window: int = 1024, min_count: float = 8.0) -> None:
        if capacity < 1 or window < 1:
            raise ValueError("capacity and window must be positive")
        self.capacity = capacity
        self.window = window
        self.min_count = min_count
        self._counts: dict[int, float] = {}
        self._requests = 0.0  # decayed like the counts
        self._since = 0

    def __len__(self) -> int:
        return len(self._counts)

    def hot(self, key: int, share: float) -> bool:
        """Whether ``key`` carried more than ``share`` of the recent requests (and at least ``min_count``)."""
        count = self._counts.get(key, 0.0)
        return count >= self.min_count and count > share * self._requests

    def first_cool(self, keys: Sequence[int], share: float) -> int:
        """Index of the first key of ``keys`` that is not hot (``len(keys)`` when all are)."""
        for index, key in enumerate(keys):
            if not self.hot(key, share):
                return index
        return len(keys)

    def observe(self, keys: Sequence[int]) -> None:
        """Count one request routed by (or past) ``keys``."""
        counts = self._counts
        for key in keys:
            if key in counts:
                counts[key] += 1.0
            elif len(counts) < self.capacity:
                counts[key] = 1.0
        self._requests += 1.0
        self._since += 1
        if self._since >= self.window:
            self._since = 0
            self._requests /= 2.0
            self._counts = {k: c / 2.0 for k, c in counts.items() if c >= 2.0}
