"""Idempotency keys: (tenant, key) joins the same request in flight or returns its recent result.

:class:`Idempotency` maps (tenant, idempotency key) to an entry holding a
digest of the request body (the serialized request without its key) and a
future of the response. Algorithm:

- no entry (or an expired one): the caller runs the request; its result
  (the response message) is kept for ``ttl`` seconds (default 300 s); an
  error is not kept (the entry goes, so a retry runs again) but reaches
  every caller that joined;
- an entry with the same digest: join it (await the same future) while in
  flight, or get the kept response at once;
- an entry with another digest: :class:`ferry.errors.InvalidArgument`
  naming ``idempotency_key``.

Bounded: at most ``max_entries`` (default 10,000); when full, the oldest
finished entry goes first (insertion order), and when every entry is still
in flight the request runs without an entry. Keys include the tenant, so a
result never crosses tenants. Clock injected (``clock``).

Cost: O(1) per request plus one SHA-256 of the request bytes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from google.protobuf.message import Message

from ferry.errors import InvalidArgument

R = TypeVar("R")


def body_digest(request: Message, key_field: str = "idempotency_key") -> bytes:
    """SHA-256 of ``request`` serialized deterministically without its idempotency key."""
    copy = type(request)()
    copy.CopyFrom(request)
    copy.ClearField(key_field)
    return hashlib.sha256(copy.SerializeToString(deterministic=True)).digest()


@dataclasses.dataclass(slots=True)
class _Entry(Generic[R]):
    """One idempotency key's request: its body digest, the future of its answer, and when the answer expires."""

    digest: bytes
    future: asyncio.Future[R]
    expires: float = float("inf")


class Idempotency(Generic[R]):
    """The proxy's recent and in-flight requests by (tenant, key); see the module docstring."""

    def __init__(self, *, clock: Callable[[], float], max_entries: int = 10_000, ttl: float = 300.0) -> None:
        self._clock = clock
        self.max_entries = max_entries
        self.ttl = ttl
        self._entries: OrderedDict[tuple[str, str], _Entry[R]] = OrderedDict()
        self.joined = 0
        self.replayed = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _evict(self, now: float) -> bool:
        """Make room for one entry; False when every entry is in flight."""
        for key, entry in list(self._entries.items()):
            if len(self._entries) < self.max_entries and entry.expires > now:
                return True
            if entry.future.done():
                del self._entries[key]
        return len(self._entries) < self.max_entries

    async def run(self, tenant: str, key: str, digest: bytes, call: Callable[[], Awaitable[R]]) -> R:
        """The response for (tenant, key): joined, replayed, or from ``call()``."""
        now = self._clock()
        ident = (tenant, key)
        entry = self._entries.get(ident)
        if entry is not None and entry.future.done() and entry.expires <= now:
            del self._entries[ident]
            entry = None
        if entry is not None:
            if entry.digest != digest:
                raise InvalidArgument("idempotency_key", "reused with a different request body")
            if entry.future.done():
                self.replayed += 1
            else:
                self.joined += 1
            return await asyncio.shield(entry.future)
        if not self._evict(now):
            return await call()
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        entry = self._entries[ident] = _Entry(digest, future)
        try:
            result = await call()
        except BaseException as exc:
            self._entries.pop(ident, None)
            if not future.done():
                future.set_exception(exc if isinstance(exc, Exception) else asyncio.CancelledError())
                future.exception()  # retrieved: no "never retrieved" warning when nobody joined
            raise
        future.set_result(result)
        entry.expires = self._clock() + self.ttl
        return result
