"""The store: where fleet membership, operator intent and leadership live (docs/design.md, rule 3).

A narrow async key-value interface with leases, prefix watches and one
conditional write, shaped on etcd v3: :mod:`controlplane.store.memory` is the
embedded backend (one process), :mod:`controlplane.store.etcd` the etcd one.
Telemetry never goes to the store, and neither do the tables it feeds: both
stay in the control planes' memory and travel between them over gRPC
(docs/store.md says why).

Key layout, all under ``/ferry/``:

====================================  ============================================  =====================
key                                   value                                         lease
====================================  ============================================  =====================
``members/{node}``                    ``fleet_pb2.Register`` (binary): the node's   the node's, TTL
                                      registration with its replicas as they are    ``grace_seconds``,
                                      now                                           kept while its agent
                                                                                    stream is open
``intent/drain/{replica}``            JSON ``{"requested_at"}``: drain requested     none
``intent/alloc/{node}``               JSON allocation record of the node's GPUs     none
                                      (:mod:`controlplane.allocation.records`), written
                                      only by :meth:`Store.put_if`
``intent/cordon/{node}``              JSON ``{"requested_at"}``: node cordoned       none
``intent/pending/{request}``          JSON allocation request waiting for a node    none
                                      (:mod:`controlplane.services.allocator`)
``intent/tenant/{name}``              JSON tenant record (plan, tiers, limits, the  none
                                      key's sha256 only; :mod:`controlplane.tenants.records`)
``intent/tenants``                    JSON ``{"since", "source"}``: the store holds  none
                                      the tenant set (seeded or written by ferryctl)
``intent/rollout/{model}``            JSON rollout record ``{"model", "stable",``   none
                                      ``"canary", "weight", "state",
                                      "updated_at"}`` (:mod:`controlplane.rollout.plan`),
                                      written only by :meth:`Store.put_if`
``intent/tier/{tier}``,               reserved for tier quota and spill settings    none
``intent/spill/{from}/{to}``          (same JSON-per-key convention)
``controlplanes/{id}``                JSON ``{"id", "address", "since", "lease"}``  the control plane's,
                                                                                    TTL
                                                                                    ``leader_lease_seconds``
``election/leader``                   JSON ``{"id", "address", "since",``           the leader's control-
                                      ``"lease"}``: created only by                 plane lease
                                      ``put_if(revision=0)``
``tables/{region}``                   JSON head of the published table              none
                                      ``{"version", "leader", "computed_at",
                                      "replicas"}``: the body is pushed, not stored
``catalog/{model}``                   reserved for the operator catalog             none
``claims/node/{node}``,               JSON ``{"node", "control_plane", "hosts"}``:  the member's (the
``claims/replica/{id}``,              who owns the name, id or address              claimant's lease)
``claims/address/{address}``          (:mod:`controlplane.fleet.claims`), created
                                      only by :meth:`Store.put_if`
====================================  ============================================  =====================

Semantics (those of etcd v3):

- Every write gets the next store revision; :meth:`Store.put`,
  :meth:`Store.put_if` and :meth:`Store.delete` return it, and
  :meth:`Store.list` returns the revision its answer reflects.
- :meth:`Store.put_if` is the one atomic read-modify-write: it writes only when
  the key was last written at ``revision`` (0: when it does not exist), in one
  transaction; leader election and GPU allocation are built on it.
  :meth:`Store.put_all_if` is the same for up to ``MAX_TXN_WRITES`` keys at
  once (a registration's claims: one transaction, not one per key).
- A key written with a lease is deleted when the lease expires (no refresh
  within its TTL) or is revoked; the deletion is seen by watches.
- A watch sees the changes made after :meth:`Store.watch` returns, in revision
  order. To keep a cache: watch first, then list, and skip events whose
  revision is at or below the listing's (:class:`controlplane.store.mirror.Mirror`).
  A watch that falls behind its bound raises :class:`WatchLost`; list again.
- :meth:`Store.health` says, without I/O, whether the last calls succeeded:
  the verdict that etcd is unreachable comes from etcd not answering, never
  from the caller's own loop being too busy to read the answer in time
  (:mod:`controlplane.store.loopclock`).
- Leases outlive a busy caller: the etcd backend refreshes them on a thread
  of its own, in the caller's stead while its loop is stalled, and
  :meth:`Store.lease_confirmed` says when a refresh was last answered.
"""

from __future__ import annotations

import enum
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from ferry.errors import FerryError, Unavailable

PREFIX = "/ferry/"
MEMBERS_PREFIX = PREFIX + "members/"
INTENT_PREFIX = PREFIX + "intent/"
DRAIN_PREFIX = INTENT_PREFIX + "drain/"
ALLOC_PREFIX = INTENT_PREFIX + "alloc/"
CORDON_PREFIX = INTENT_PREFIX + "cordon/"
PENDING_PREFIX = INTENT_PREFIX + "pending/"
ROLLOUT_PREFIX = INTENT_PREFIX + "rollout/"
CONTROLPLANES_PREFIX = PREFIX + "controlplanes/"
ELECTION_PREFIX = PREFIX + "election/"
ELECTION_KEY = ELECTION_PREFIX + "leader"
TABLES_PREFIX = PREFIX + "tables/"
CATALOG_PREFIX = PREFIX + "catalog/"
CLAIMS_PREFIX = PREFIX + "claims/"
MAX_TXN_WRITES = 64  # writes in one put_all_if (etcd's --max-txn-ops is 128 by default: a compare and a put each)


def check_writes(writes: Sequence[tuple[str, bytes, int]]) -> None:
    """ValueError naming the bound when ``writes`` is empty or longer than ``MAX_TXN_WRITES``, or repeats a key."""
    if not 0 < len(writes) <= MAX_TXN_WRITES:
        raise ValueError(f"writes: 1 to {MAX_TXN_WRITES} in one transaction, got {len(writes)}")
    if len({key for key, _, _ in writes}) != len(writes):
        raise ValueError("writes: a key appears twice")


def member_key(node: str) -> str:
    """Key of a node's registration."""
    return MEMBERS_PREFIX + node


def drain_key(replica_id: str) -> str:
    """Key of the drain intent of a replica."""
    return DRAIN_PREFIX + replica_id


def drain_value(requested_at: float) -> bytes:
    """Value of a drain intent: when it was requested (unix seconds)."""
    return json.dumps({"requested_at": requested_at}).encode()


def alloc_key(node: str) -> str:
    """Key of the GPU allocation record of a node."""
    return ALLOC_PREFIX + node


def cordon_key(node: str) -> str:
    """Key of the cordon intent of a node (its value: :func:`drain_value`)."""
    return CORDON_PREFIX + node


def pending_key(request_id: str) -> str:
    """Key of an allocation request that waits for a node."""
    return PENDING_PREFIX + request_id


def rollout_key(model: str) -> str:
    """Key of the version rollout of a model."""
    return ROLLOUT_PREFIX + model


def controlplane_key(cp_id: str) -> str:
    """Key of a running control plane (under its lease)."""
    return CONTROLPLANES_PREFIX + cp_id


def table_key(region: str) -> str:
    """Key of the head of a region's published table."""
    return TABLES_PREFIX + region


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
    """What happened to a watched key: put or deleted."""

    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """A change of one key; ``value`` is empty for a deletion."""

    kind: EventKind
    key: str
    value: bytes
    revision: int


@dataclass(frozen=True, slots=True)
class StoreHealth:
    """What the last calls to a backend said: ``ok``, the last error, when a call last succeeded."""

    backend: str  # "memory" | "etcd"
    endpoint: str  # host:port of etcd, "" for memory
    ok: bool
    error: str = ""
    last_ok: float = 0.0  # monotonic seconds of the last successful call (0: never)


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

    async def put_if(self, key: str, value: bytes, *, revision: int, lease: int = 0) -> int:
        """Write ``key`` only if its last write was at ``revision`` (0: it is absent), atomically.

        Returns the new revision, or 0 when the condition failed (nothing written).
        """
        ...

    async def put_all_if(self, writes: Sequence[tuple[str, bytes, int]], *, lease: int = 0) -> int:
        """Write every ``(key, value, revision)`` only if each key was last written at its ``revision``
        (0: absent), all in one transaction: all are written or none.

        Returns the new revision, or 0 when a condition failed (nothing written). At most
        ``MAX_TXN_WRITES`` (64) writes (ValueError beyond: etcd bounds a transaction's operations).
        """
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

    async def refresh_leases(self, leases: Sequence[int]) -> Sequence[FerryError | None]:
        """Refresh every one of ``leases`` at once; for each, None or its error (``LeaseNotFound``,
        ``Unavailable``), in order. One call for many: a backend that refreshes on a thread of its own
        hands them over once, not once per lease."""
        ...

    async def revoke_lease(self, lease: int) -> None:
        """End the lease now and delete its keys (no error when it is already gone)."""
        ...

    def lease_confirmed(self, lease: int) -> float:
        """When (monotonic seconds, the store's clock) the last refresh of ``lease`` the store answered was sent.

        The caller's own refreshes count, and those a backend sent in its stead while its loop was
        stalled (:mod:`controlplane.store.etcdkeeper`): the store cannot expire the lease before this
        time plus its TTL. ``-inf`` when none is known. No I/O.
        """
        ...

    async def watch(self, prefix: str) -> Watch: ...

    def health(self) -> StoreHealth:
        """The backend's health as its last calls showed it (no I/O)."""
        ...

    async def close(self) -> None: ...
