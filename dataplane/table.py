"""The proxy's local routing table: validated snapshots, candidates precomputed once per table.

:func:`build_table` checks a ``TableSnapshot`` before anything uses it, and
raises :class:`TableRejected` with the first reason found: region differs
from the proxy's, version 0, empty or duplicate model names, empty or
duplicate replica ids (across the whole table), an address that is not
``host:port``, a replica of another region, an empty replica version, a
negative or non-finite telemetry age, more models or replicas than the
proxy's bounds. A rejected snapshot changes nothing: :class:`TableHolder`
keeps serving the last good table, and the watcher NACKs with the reason.

Versions are opaque: any accepted snapshot replaces the current one, so a
control plane that restarts with a lower version is still followed.

Per table (never per request) it precomputes, for each model, the routable
replicas of each version and of the default version, as tuples of
:class:`Replica` (plain frozen data that :mod:`dataplane.pick` scores).
A replica is routable when its load says ``ready`` (or says nothing: the
table lists routable replicas; telemetry-less ones are penalised as stale).
An empty ``default_version`` makes a request without a version use every
routable replica of the model.

The holder stamps each table with the monotonic time it was applied (clock
injected), so a replica's telemetry age at pick time is the pushed age plus
the time since the table was applied.

Cost: O(replicas) to build a table; O(1) lookups per request.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

from ferry.errors import FerryError, NotFound
from ferry.grpcutil import split_address
from ferry.v1 import common_pb2, tables_pb2

ROUTABLE_STATES = (common_pb2.REPLICA_STATE_READY, common_pb2.REPLICA_STATE_UNSPECIFIED)
NO_TELEMETRY_AGE = 1e9  # a replica without load counts as infinitely stale


class TableRejected(FerryError):
    """A snapshot failed validation; ``reason`` goes into the NACK."""

    def __init__(self, version: int, reason: str) -> None:
        super().__init__(f"table version {version} rejected: {reason}")
        self.version = version
        self.reason = reason


@dataclasses.dataclass(frozen=True, slots=True)
class Replica:
    """One routable replica as the pick sees it: identity, capacity and pushed load."""

    replica_id: str
    address: str
    kserve_model: str
    version: str
    node: str = ""
    max_concurrency: int = 1
    kv_block_tokens: int = 0
    max_context_tokens: int = 0
    queued: int = 0
    running: int = 0
    kv_blocks_free: int = 0
    kv_blocks_total: int = 0
    telemetry_age: float = 0.0  # seconds, when the table was computed


@dataclasses.dataclass(frozen=True, slots=True)
class ModelEntry:
    """A model's routable replicas by version, and every version the table names."""

    model: str
    default_version: str
    default: tuple[Replica, ...]
    by_version: Mapping[str, tuple[Replica, ...]]


@dataclasses.dataclass(frozen=True, slots=True)
class Table:
    """An applied snapshot: immutable, shared by every request that started under it."""

    version: int
    nonce: str
    region: str
    computed_at: float
    applied_at: float  # monotonic seconds
    models: Mapping[str, ModelEntry]
    addresses: frozenset[str]
    replicas: int

    def candidates(self, model: str, version: str) -> tuple[str, tuple[Replica, ...]]:
        """(the version served, its routable replicas); raises NotFound for an unknown model or version."""
        entry = self.models.get(model)
        if entry is None:
            raise NotFound("model", model)
        if not version:
            return entry.default_version, entry.default
        found = entry.by_version.get(version)
        if found is None:
            raise NotFound("version", f"{model}:{version}")
        return version, found


def _reject(snapshot: tables_pb2.TableSnapshot, reason: str) -> TableRejected:
    return TableRejected(snapshot.version, reason)


def _replica(snapshot: tables_pb2.TableSnapshot, model: str, route: tables_pb2.ReplicaRoute) -> Replica:
    rid = route.replica_id
    if not rid:
        raise _reject(snapshot, f"model {model!r}: a replica has an empty replica_id")
    try:
        _host, port = split_address(route.address)
    except ValueError:
        raise _reject(snapshot, f"replica {rid!r}: address {route.address!r} is not host:port") from None
    if not 0 < port < 65536:
        raise _reject(snapshot, f"replica {rid!r}: port {port} out of range")
    if route.region and route.region != snapshot.region:
        raise _reject(snapshot, f"replica {rid!r}: region {route.region!r} in a table of {snapshot.region!r}")
    if not route.version:
        raise _reject(snapshot, f"replica {rid!r}: empty version")
    age = route.telemetry_age_seconds
    if not math.isfinite(age) or age < 0:
        raise _reject(snapshot, f"replica {rid!r}: telemetry_age_seconds {age} is not a finite age")
    load = route.load
    has_load = route.HasField("load")
    return Replica(
        replica_id=rid,
        address=route.address,
        kserve_model=route.kserve_model or model,
        version=route.version,
        node=route.node,
        max_concurrency=max(route.max_concurrency, 1),
        kv_block_tokens=route.kv_block_tokens,
        max_context_tokens=route.max_context_tokens,
        queued=load.queued,
        running=load.running,
        kv_blocks_free=min(load.kv_blocks_free, load.kv_blocks_total),
        kv_blocks_total=load.kv_blocks_total,
        telemetry_age=age if has_load else NO_TELEMETRY_AGE,
    )


def build_table(
    snapshot: tables_pb2.TableSnapshot,
    *,
    region: str,
    applied_at: float,
    max_models: int = 10_000,
    max_replicas: int = 100_000,
) -> Table:
    """Validate ``snapshot`` for a proxy of ``region`` and precompute its candidates; raises TableRejected."""
    if snapshot.region != region:
        raise _reject(snapshot, f"region {snapshot.region!r} is not this proxy's region {region!r}")
    if snapshot.version == 0:
        raise _reject(snapshot, "version must be positive")
    if not math.isfinite(snapshot.computed_at):
        raise _reject(snapshot, "computed_at is not finite")
    if len(snapshot.models) > max_models:
        raise _reject(snapshot, f"{len(snapshot.models)} models, over the limit of {max_models}")
    total = sum(len(m.replicas) for m in snapshot.models)
    if total > max_replicas:
        raise _reject(snapshot, f"{total} replicas, over the limit of {max_replicas}")
    seen: set[str] = set()
    models: dict[str, ModelEntry] = {}
    addresses: set[str] = set()
    for route in snapshot.models:
        if not route.model:
            raise _reject(snapshot, "a model has an empty name")
        if route.model in models:
            raise _reject(snapshot, f"model {route.model!r} appears twice")
        by_version: dict[str, list[Replica]] = {}
        for replica_route in route.replicas:
            replica = _replica(snapshot, route.model, replica_route)
            if replica.replica_id in seen:
                raise _reject(snapshot, f"replica id {replica.replica_id!r} appears twice")
            seen.add(replica.replica_id)
            routable = by_version.setdefault(replica.version, [])
            if replica_route.load.state in ROUTABLE_STATES:
                routable.append(replica)
                addresses.add(replica.address)
        if route.default_version:
            by_version.setdefault(route.default_version, [])
        frozen = {v: tuple(rs) for v, rs in by_version.items()}
        default = (
            frozen[route.default_version]
            if route.default_version
            else tuple(r for rs in frozen.values() for r in rs)
        )
        models[route.model] = ModelEntry(route.model, route.default_version, default, frozen)
    return Table(
        version=snapshot.version,
        nonce=snapshot.nonce,
        region=snapshot.region,
        computed_at=snapshot.computed_at,
        applied_at=applied_at,
        models=models,
        addresses=frozenset(addresses),
        replicas=len(seen),
    )


class TableHolder:
    """Holds the last good table; applies snapshots through :func:`build_table`.

    ``on_applied`` callbacks run after each successful apply (for example to
    close the clients of replicas that left the table).
    """

    def __init__(
        self,
        region: str,
        *,
        clock: Callable[[], float],
        max_models: int = 10_000,
        max_replicas: int = 100_000,
    ) -> None:
        self.region = region
        self._clock = clock
        self._max_models = max_models
        self._max_replicas = max_replicas
        self._table: Table | None = None
        self._listeners: list[Callable[[Table], None]] = []

    @property
    def table(self) -> Table | None:
        """The current table, or None before the first one."""
        return self._table

    @property
    def version(self) -> int:
        """The version held (0 when none)."""
        return self._table.version if self._table else 0

    def age(self) -> float:
        """Seconds since the current table was applied (inf when none)."""
        return self._clock() - self._table.applied_at if self._table else math.inf

    def on_applied(self, listener: Callable[[Table], None]) -> None:
        """Call ``listener(table)`` after every successful apply."""
        self._listeners.append(listener)

    def apply(self, snapshot: tables_pb2.TableSnapshot) -> Table:
        """Validate and install ``snapshot``; on TableRejected the last good table stays."""
        table = build_table(
            snapshot,
            region=self.region,
            applied_at=self._clock(),
            max_models=self._max_models,
            max_replicas=self._max_replicas,
        )
        self._table = table
        for listener in self._listeners:
            listener(table)
        return table
