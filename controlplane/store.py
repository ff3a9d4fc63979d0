"""The store: where fleet membership and operator intent live (DESIGN.md, rule 3).

A narrow async key-value interface with leases and prefix watches, shaped so
that an etcd backend fits behind it unchanged; :mod:`controlplane.memstore` is
the embedded backend. Telemetry never goes to the store: it stays in the
control plane's memory.

Key layout, all under ``/ferry/``:

=================================  =========================================  ===========
key                                value                                      lease
=================================  =========================================  ===========
``/ferry/members/{node}``          ``fleet_pb2.Register`` (binary), the       grace of the
                                   node's registration with its replicas      agent stream
                                   as they are now
``/ferry/intent/drain/{replica}``  JSON ``{"requested_at": unix seconds}``:   none
                                   an operator asked to drain the replica
``/ferry/catalog/{model}``         reserved for the operator catalog; today   none
                                   it comes from the config file
=================================  =========================================  ===========

Semantics (those of etcd v3):

- Every write gets the next store revision; :meth:`Store.put` and
  :meth:`Store.delete` return it, and :meth:`Store.list` returns the revision
  its answer reflects.
- A key written with a lease is deleted when the lease expires (no refresh
  within its TTL) or is revoked; the deletion is seen by watches.
- A watch sees the changes made after :meth:`Store.watch` returns, in revision
  order. To keep a cache: watch first, then list, and skip events whose
  revision is at or below the listing's. A watch that falls behind its bound
  raises :class:`WatchLost`; the consumer lists again.
"""

from __future__ import annotations

import enum
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from ferry.errors import Unavailable

PREFIX = "/ferry/"
MEMBERS_PREFIX = PREFIX + "members/"
DRAIN_PREFIX = PREFIX + "intent/drain/"
CATALOG_PREFIX = PREFIX + "catalog/"


def member_key(node: str) -> str:
    """Key of a node's registration."""
    return MEMBERS_PREFIX + node


def drain_key(replica_id: str) -> str:
    """Key of the drain intent of a replica."""
    return DRAIN_PREFIX + replica_id


def drain_value(requested_at: float) -> bytes:
    """Value of a drain intent: when it was requested (unix seconds)."""
    return json.dumps({"requested_at": requested_at}).encode()


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One stored key: its value, the revision that last wrote it and its lease (0: none)."""

    key: str
    value: bytes
    revision: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Listing:
    """The keys under a prefix, sorted by key, as of store revision ``revision``."""

    items: tuple[KeyValue, ...]
    revision: int


class EventKind(enum.Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """A change of one key; ``value`` is empty for a deletion."""

    kind: EventKind
    key: str
    value: bytes
    revision: int


class WatchLost(Unavailable):
    """The watch fell behind or was closed by the store; list again and start a new watch."""


class LeaseNotFound(Unavailable):
    """The lease expired or was revoked (or never existed)."""

    def __init__(self, lease: int) -> None:
        super().__init__(f"lease {lease} not found (expired or revoked)")
        self.lease = lease


class Watch(Protocol):
    """The events under one prefix; iterate it, close it when done."""

    def __aiter__(self) -> AsyncIterator[WatchEvent]: ...

    async def close(self) -> None: ...


class Store(Protocol):
    """The narrow interface every backend implements. Errors: ``ferry.errors.Unavailable`` subclasses."""

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Write ``key``; returns the new revision. Raises LeaseNotFound for an unknown lease."""
        ...

    async def get(self, key: str) -> KeyValue | None: ...

    async def delete(self, key: str) -> int:
        """Delete ``key``; returns the revision of the deletion, or 0 when there was no such key."""
        ...

    async def list(self, prefix: str) -> Listing: ...

    async def grant_lease(self, ttl_seconds: float) -> int:
        """A new lease (a positive id) that expires ``ttl_seconds`` after its last refresh."""
        ...

    async def refresh_lease(self, lease: int) -> None:
        """Push the lease's expiry back by its TTL; raises LeaseNotFound when it is gone."""
        ...

    async def revoke_lease(self, lease: int) -> None:
        """End the lease now and delete its keys (no error when it is already gone)."""
        ...

    async def watch(self, prefix: str) -> Watch: ...

    async def close(self) -> None: ...
