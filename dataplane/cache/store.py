"""The response cache: answers by (tenant, exact payload), bounded in entries and bytes, with a TTL.

:class:`ResponseCache` maps a key (the SHA-256 of the tenant and the exact
payload: model, version, prompt, every sampling parameter, max_tokens;
:func:`dataplane.cache.path.payload_digest`) to an :class:`Answer`. Rules:

- **per tenant**: the tenant is part of the key, and :meth:`ResponseCache.get`
  also compares the entry's tenant, model and version with the caller's, so
  even a digest collision never gives one tenant another's answer;
- **TTL**: an entry is served for ``ttl`` seconds after it was stored, then
  dropped when met;
- **version**: the version is part of the key, and
  :meth:`ResponseCache.invalidate` drops a model's entries of versions no
  longer in the table (the table's versions of the model, given by the
  caller), so a replaced version's answers go at once;
- **bounds**: at most ``max_entries`` entries and ``max_bytes`` bytes
  (an entry's size: its texts in UTF-8, plus :data:`ENTRY_OVERHEAD` and
  :data:`PIECE_OVERHEAD` per streamed piece); an entry larger than
  ``max_bytes / 8`` is not stored; when full, the oldest entries go first
  (insertion order, which is also expiry order since the TTL is one);
- **streams**: an answer stored from a stream keeps its pieces as they were
  delivered, so a replay has the same chunking; one stored from a unary
  call has none and serves unary calls only.

Pure: the caller passes the time. Cost: O(1) per get and put (amortised);
per table applied, O(models with entries) to find a version gone, then
O(entries) to drop its answers (only when a kept version left the table).
"""

from __future__ import annotations

import dataclasses
from collections import Counter, OrderedDict
from collections.abc import Collection

ENTRY_OVERHEAD = 256  # bytes counted per entry beyond its texts (key, object headers)
PIECE_OVERHEAD = 64   # bytes counted per streamed piece beyond its text


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """A cached answer: what the replica said, and how long it took it (what a hit saves)."""

    tenant: str
    model: str
    version: str
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    service_seconds: float
    pieces: tuple[tuple[str, int], ...] | None = None  # (text, tokens) as streamed; None: stored from a unary call

    @property
    def size(self) -> int:
        """Bytes counted against the cache's bound."""
        size = ENTRY_OVERHEAD + len(self.text.encode())
        if self.pieces is not None:
            size += sum(len(text.encode()) + PIECE_OVERHEAD for text, _ in self.pieces)
        return size


@dataclasses.dataclass(slots=True)
class _Entry:
    """One stored answer, when it expires, and its size in bytes."""

    answer: Answer
    expires: float
    size: int


class ResponseCache:
    """Answers by (tenant, payload) digest; see the module docstring."""

    def __init__(self, *, max_entries: int, max_bytes: int, ttl: float) -> None:
        if max_entries <= 0 or max_bytes <= 0 or not ttl > 0:
            raise ValueError("max_entries, max_bytes and ttl must be positive")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl = ttl
        self.bytes = 0
        self.evicted = 0  # entries dropped by the bounds before their TTL (cumulative)
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._versions: dict[str, Counter[str]] = {}  # model -> entries per version (what a table check reads)

    def __len__(self) -> int:
        return len(self._entries)

    def _drop(self, key: bytes) -> None:
        entry = self._entries.pop(key)
        self.bytes -= entry.size
        versions = self._versions[entry.answer.model]
        versions[entry.answer.version] -= 1
        if versions[entry.answer.version] <= 0:
            del versions[entry.answer.version]
            if not versions:
                del self._versions[entry.answer.model]

    def get(self, key: bytes, *, tenant: str, model: str, version: str, now: float,
            stream: bool = False) -> Answer | None:
        """The answer stored under ``key`` for this tenant, model and version, if live (and streamed, for
        ``stream``); None otherwise."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= now:
            self._drop(key)
            return None
        answer = entry.answer
        if answer.tenant != tenant or answer.model != model or answer.version != version:
            return None
        if stream and answer.pieces is None:
            return None
        return answer

    def put(self, key: bytes, answer: Answer, now: float) -> bool:
        """Store ``answer`` under ``key`` for ``ttl`` seconds (replacing what was there); False when too large."""
        size = answer.size
        if size > self.max_bytes // 8:
            return False
        if key in self._entries:
            self._drop(key)
        entries = self._entries
        while entries and (len(entries) >= self.max_entries or self.bytes + size > self.max_bytes):
            oldest, entry = next(iter(entries.items()))
            if entry.expires > now:
                self.evicted += 1
            self._drop(oldest)
        entries[key] = _Entry(answer, now + self.ttl, size)
        self.bytes += size
        self._versions.setdefault(answer.model, Counter())[answer.version] += 1
        return True

    def invalidate(self, model: str, versions: Collection[str]) -> int:
        """Drop ``model``'s entries whose version is not in ``versions``; returns how many went (O(1) when every
        version kept is still there, else O(entries))."""
        kept = self._versions.get(model)
        if kept is None or all(version in versions for version in kept):
            return 0
        stale = [k for k, e in self._entries.items() if e.answer.model == model and e.answer.version not in versions]
        for key in stale:
            self._drop(key)
        return len(stale)

    def models(self) -> set[str]:
        """The models with entries."""
        return set(self._versions)
