"""The proxy's local routing table: validated snapshots, pools precomputed once per table.

:func:`build_table` checks a ``TableSnapshot`` before anything uses it, and
raises :class:`TableRejected` with the first reason found: region differs
from the proxy's, version 0, empty or duplicate model names, empty or
duplicate replica ids (across the whole table), an ``address`` or
``http_address`` that is not ``host:port`` (either may be empty, not
both), a replica of another region, an empty replica version, a negative
or non-finite telemetry age, a version weight that is negative, not finite,
unnamed or repeated, ring parameters out of range (load factor not above 1,
more than ``MAX_VNODES`` points per replica), more models or
replicas than the proxy's bounds, a bad tenant list when ``tenants_managed``
(:func:`dataplane.table.tenants.parse_tenants`). A delta is first applied to
the snapshot held (:meth:`TableHolder.apply`), and the table it gives is
checked the same way. A rejected snapshot changes nothing:
:class:`TableHolder` keeps serving the last good table, and the watcher NACKs
with the reason.

Versions are opaque: any accepted snapshot replaces the current one, so a
control plane that restarts with a lower version is still followed.

Per table (never per request) it precomputes, for each model, a
:class:`dataplane.table.pool.Pool` per version and one for the default version:
the routable replicas as :class:`dataplane.table.pool.Replica` tuples, each with
its load smoothed over the tables applied (the previous table's smoothed
value blended in), the pool's ring (the previous table's, while the replica
ids are the same) and each replica's share of ring keys under the load
bound. A replica is routable when its load says ``ready`` (or says nothing:
the table lists routable replicas; telemetry-less ones are penalised as
stale). An empty ``default_version`` makes a request without a version use
every routable replica of the model.

Canary: a model's ``version_weights`` split the requests that name no
version; versions without a routable replica drop out of the split, and when
none is left (or the list is empty) the default version takes them all.
:meth:`Table.candidates` takes the split's uniform draw ``u`` from the
caller (from the request's prefix key, so a conversation stays on one
version, else from the rng). The ring parameters (load factor, points per
replica) come from the snapshot, or the proxy's :class:`TableParams` when unset.

Cold start: a model's ``warming`` versions (replicas warming, none routed
to) get an empty pool, so a request for one finds no replica rather than an
unknown version, and a :class:`dataplane.table.warming.Warming` entry whose start
carries over from the previous table (:func:`dataplane.table.warming.carry`); a
warming entry that names no version, or one twice, rejects the table.

The holder stamps each table with the monotonic time it was applied (clock
injected), so a replica's telemetry age at pick time is the pushed age plus
the time since the table was applied.

Cost: O(replicas) to build a table, plus O(replicas x vnodes log) for a
ring whose membership changed; O(1) lookups per request (O(versions) with a
canary split).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Callable, Mapping

from dataplane.table.pool import Pool, Replica, RingCache, make_pool, smoothed_loads
from dataplane.table.ring import DEFAULT_LOAD_FACTOR, DEFAULT_VNODES
from dataplane.table.tenants import MAX_TENANTS, TenantsRejected, parse_tenants
from dataplane.table.warming import Warming, carry
from ferry import sampling
from ferry.config import TIERS, TenantConfig
from ferry.errors import FerryError, NotFound
from ferry.grpcutil import split_address
from ferry.tabledelta import DeltaMismatch, apply_delta
from ferry.v1 import common_pb2, tables_pb2

ROUTABLE_STATES = (common_pb2.REPLICA_STATE_READY, common_pb2.REPLICA_STATE_UNSPECIFIED)
NO_TELEMETRY_AGE = 1e9  # a replica without load counts as infinitely stale
MAX_VNODES = 1024

__all__ = ["NO_TELEMETRY_AGE", "Pool", "Replica", "Table", "TableHolder", "TableParams", "TableRejected",
           "build_table"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TableParams:
    """A proxy's bounds on tables and its defaults for what a snapshot leaves unset."""

    max_models: int = 10_000
    max_replicas: int = 100_000
    load_factor: float = DEFAULT_LOAD_FACTOR  # the ring's c, unless the snapshot sets it
    vnodes: int = DEFAULT_VNODES              # ring points per replica, unless the snapshot sets it
    smoothing_seconds: float = 10.0           # time constant of the smoothed loads behind the key shares
    max_tenants: int = MAX_TENANTS            # tenants a table may carry (dataplane.table.tenants)


class TableRejected(FerryError):
    """A snapshot failed validation; ``reason`` goes into the NACK; ``resync``: a delta that did not fit (a gap)."""

    def __init__(self, version: int, reason: str, *, resync: bool = False) -> None:
        super().__init__(f"table version {version} rejected: {reason}")
        self.version = version
        self.reason = reason
        self.resync = resync


@dataclasses.dataclass(frozen=True, slots=True)
class ModelEntry:
    """A model's pools by version, the default pool, and the canary split (cumulative shares, versions)."""

    model: str
    default_version: str
    default: Pool
    by_version: Mapping[str, Pool]
    split: tuple[tuple[float, str], ...] = ()
    warming: Mapping[str, Warming] = dataclasses.field(default_factory=dict)  # versions warming (table.warming)
    # version -> the input tensors every routable replica of it declares ("" : the default pool's); which
    # sampling parameters it accepts (ferry.sampling)
    inputs: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=dict)


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
    load_factor: float = DEFAULT_LOAD_FACTOR
    vnodes: int = DEFAULT_VNODES
    spill: tuple[tables_pb2.SpillRoute, ...] = ()  # other regions to spill to (read by dataplane.regions.remote)
    tier_quotas: tuple[tables_pb2.TierQuota, ...] = ()  # reserved shares per tier (read by dataplane.admission.gate)
    tenants: tuple[TenantConfig, ...] | None = None  # the managed tenant set; None: the proxy's configured ones
    tenant_routes: tuple[tables_pb2.TenantRoute, ...] = ()  # what ``tenants`` was parsed from (reused when equal)
    http_only: frozenset[str] = frozenset()  # replicas with no KServe address (OpenAI HTTP only): not for the relay

    def inputs(self, model: str, version: str) -> frozenset[str]:
        """The input tensors every routable replica of ``model`` ``version`` declares (empty when unknown)."""
        entry = self.models.get(model)
        if entry is None:
            return frozenset()
        found = entry.inputs.get(version)
        return found if found is not None else entry.inputs.get("", frozenset())

    def candidates(self, model: str, version: str, u: float = 0.0) -> tuple[str, Pool]:
        """(the version served, its pool); ``u`` in [0, 1) draws the canary split when no version is named.

        Raises NotFound for an unknown model or version.
        """
        entry = self.models.get(model)
        if entry is None:
            raise NotFound("model", model)
        if not version:
            if entry.split:
                chosen = entry.split[min(bisect.bisect_right([c for c, _ in entry.split], u), len(entry.split) - 1)]
                return chosen[1], entry.by_version[chosen[1]]
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
    if not route.address and not route.http_address:
        raise _reject(snapshot, f"replica {rid!r}: neither address nor http_address")
    for name, value in (("address", route.address), ("http_address", route.http_address)):
        if not value:
            continue  # one of the two may be empty: a replica reached over OpenAI HTTP (or KServe) only
        try:
            _host, port = split_address(value)
        except ValueError:
            raise _reject(snapshot, f"replica {rid!r}: {name} {value!r} is not host:port") from None
        if not 0 < port < 65536:
            raise _reject(snapshot, f"replica {rid!r}: {name} port {port} out of range")
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
        http_address=route.http_address,
        engine=route.engine,
        max_concurrency=max(route.max_concurrency, 1),
        kv_block_tokens=route.kv_block_tokens,
        max_context_tokens=route.max_context_tokens,
        queued=load.queued,
        running=load.running,
        kv_blocks_free=min(load.kv_blocks_free, load.kv_blocks_total),
        kv_blocks_total=load.kv_blocks_total,
        telemetry_age=age if has_load else NO_TELEMETRY_AGE,
        telemetry=load if has_load else None,  # the applied table's row, never mutated: no copy
    )


def _ring_params(snapshot: tables_pb2.TableSnapshot, load_factor: float, vnodes: int) -> tuple[float, int]:
    ring = snapshot.ring
    factor = ring.load_factor or load_factor
    if not math.isfinite(factor) or factor <= 1.0:
        raise _reject(snapshot, f"ring load_factor {factor} must be a finite number above 1")
    points = ring.vnodes or vnodes
    if not 0 < points <= MAX_VNODES:
        raise _reject(snapshot, f"ring vnodes {points} out of range 1..{MAX_VNODES}")
    return factor, points


def _split(snapshot: tables_pb2.TableSnapshot, route: tables_pb2.ModelRoute,
           pools: Mapping[str, Pool]) -> tuple[tuple[float, str], ...]:
    """The canary split: cumulative shares over the weighted versions that have routable replicas."""
    weights: dict[str, float] = {}
    for w in route.version_weights:
        if not w.version:
            raise _reject(snapshot, f"model {route.model!r}: a version weight names no version")
        if w.version in weights:
            raise _reject(snapshot, f"model {route.model!r}: version {w.version!r} weighted twice")
        if not math.isfinite(w.weight) or w.weight < 0:
            raise _reject(snapshot, f"model {route.model!r}: weight {w.weight} of {w.version!r} is not >= 0")
        weights[w.version] = w.weight
    live = [(v, w) for v, w in weights.items() if w > 0 and v in pools and pools[v].replicas]
    total = sum(w for _, w in live)
    if total <= 0:
        return ()
    split, running = [], 0.0
    for v, w in live:
        running += w / total
        split.append((running, v))
    return tuple(split)


def _warming(snapshot: tables_pb2.TableSnapshot, route: tables_pb2.ModelRoute) -> dict[str, int]:
    """The model's warming versions (version -> replicas warming), each named once."""
    counts: dict[str, int] = {}
    for w in route.warming:
        if not w.version or w.version in counts:
            raise _reject(snapshot, f"model {route.model!r}: a warming entry names no version, or one twice")
        counts[w.version] = w.replicas
    return counts


def _rings_of(table: Table | None) -> RingCache:
    if table is None:
        return {}
    pools = [p for e in table.models.values() for p in (e.default, *e.by_version.values())]
    return {(p.ring.ids, p.ring.vnodes): p.ring for p in pools}


def build_table(
    snapshot: tables_pb2.TableSnapshot,
    *,
    region: str,
    applied_at: float,
    params: TableParams = TableParams(),
    previous: Table | None = None,
) -> Table:
    """Validate ``snapshot`` for a proxy of ``region`` and precompute its pools; raises TableRejected.

    ``previous`` (the table applied before) lends its rings and smoothed loads.
    """
    if snapshot.region != region:
        raise _reject(snapshot, f"region {snapshot.region!r} is not this proxy's region {region!r}")
    if snapshot.version == 0:
        raise _reject(snapshot, "version must be positive")
    if not math.isfinite(snapshot.computed_at):
        raise _reject(snapshot, "computed_at is not finite")
    if len(snapshot.models) > params.max_models:
        raise _reject(snapshot, f"{len(snapshot.models)} models, over the limit of {params.max_models}")
    total = sum(len(m.replicas) for m in snapshot.models)
    if total > params.max_replicas:
        raise _reject(snapshot, f"{total} replicas, over the limit of {params.max_replicas}")
    factor, points = _ring_params(snapshot, params.load_factor, params.vnodes)
    tenants, tenant_routes = _tenants(snapshot, params.max_tenants, previous)
    rings = _rings_of(previous)
    parsed = [[_replica(snapshot, route.model, r) for r in route.replicas] for route in snapshot.models]
    before = {r.replica_id: r.smoothed for e in previous.models.values() for pool in e.by_version.values()
              for r in pool} if previous else {}
    smoothed = smoothed_loads({r.replica_id: r.queued + r.running for rs in parsed for r in rs}, before,
                              applied_at - previous.applied_at if previous else 0.0, params.smoothing_seconds)
    seen: set[str] = set()
    models: dict[str, ModelEntry] = {}
    addresses: set[str] = set()
    http_only: set[str] = set()
    for route, parsed_replicas in zip(snapshot.models, parsed, strict=True):
        if not route.model:
            raise _reject(snapshot, "a model has an empty name")
        if route.model in models:
            raise _reject(snapshot, f"model {route.model!r} appears twice")
        by_version: dict[str, list[Replica]] = {}
        declared: dict[str, frozenset[str]] = {}  # version -> inputs all its routable replicas declare
        for replica_route, replica in zip(route.replicas, parsed_replicas, strict=True):
            replica = dataclasses.replace(replica, smoothed=smoothed[replica.replica_id])
            if replica.replica_id in seen:
                raise _reject(snapshot, f"replica id {replica.replica_id!r} appears twice")
            seen.add(replica.replica_id)
            routable = by_version.setdefault(replica.version, [])
            if replica_route.load.state in ROUTABLE_STATES:
                routable.append(replica)
                if replica.address:  # the KServe addresses (an OpenAI-HTTP-only replica has none)
                    addresses.add(replica.address)
                else:
                    http_only.add(replica.replica_id)
                names = frozenset(sampling.bounded(list(replica_route.inputs)))
                declared[replica.version] = declared.get(replica.version, names) & names
        if route.default_version:
            by_version.setdefault(route.default_version, [])
        earlier = previous.models.get(route.model) if previous is not None else None
        warming = carry(earlier.warming if earlier is not None else {}, _warming(snapshot, route), applied_at)
        for version in warming:
            by_version.setdefault(version, [])
        pools = {v: make_pool(f"{route.model}/{v}", rs, vnodes=points, load_factor=factor, rings=rings)
                 for v, rs in by_version.items()}
        default = (
            pools[route.default_version]
            if route.default_version
            else make_pool(f"{route.model}/*", [r for rs in by_version.values() for r in rs], vnodes=points,
                           load_factor=factor, rings=rings)
        )
        split = _split(snapshot, route, pools)
        everywhere = frozenset.intersection(*declared.values()) if declared else frozenset()
        inputs = {**declared, "": declared.get(route.default_version, frozenset()) if route.default_version
                  else everywhere}
        models[route.model] = ModelEntry(route.model, route.default_version, default, pools, split, warming, inputs)
    return Table(
        version=snapshot.version,
        nonce=snapshot.nonce,
        region=snapshot.region,
        computed_at=snapshot.computed_at,
        applied_at=applied_at,
        models=models,
        addresses=frozenset(addresses),
        http_only=frozenset(http_only),
        replicas=len(seen),
        load_factor=factor,
        vnodes=points,
        spill=tuple(snapshot.spill),
        tier_quotas=_tier_quotas(snapshot),
        tenants=tenants,
        tenant_routes=tenant_routes,
    )


def _tenants(snapshot: tables_pb2.TableSnapshot, max_tenants: int, previous: Table | None,
             ) -> tuple[tuple[TenantConfig, ...] | None, tuple[tables_pb2.TenantRoute, ...]]:
    """The managed tenant set (None without ``tenants_managed``) and its routes; a bad one rejects the table."""
    if not snapshot.tenants_managed:
        return None, ()
    before = (previous.tenant_routes, previous.tenants) if previous and previous.tenants is not None else None
    try:
        routes, tenants = parse_tenants(snapshot.tenants, max_tenants=max_tenants, previous=before)
    except TenantsRejected as exc:
        raise _reject(snapshot, exc.reason) from None
    return tenants, routes


def _tier_quotas(snapshot: tables_pb2.TableSnapshot) -> tuple[tables_pb2.TierQuota, ...]:
    """The snapshot's tier quotas, each a known tier once with a reserved share in [0, 1]."""
    seen: set[str] = set()
    for quota in snapshot.tier_quotas:
        if quota.tier not in TIERS or quota.tier in seen:
            raise _reject(snapshot, f"tier_quotas: unknown or repeated tier {quota.tier!r}")
        if not 0.0 <= quota.reserved_share <= 1.0:  # also rejects NaN
            raise _reject(snapshot, f"tier_quotas: reserved_share of {quota.tier} must be in [0, 1]")
        seen.add(quota.tier)
    return tuple(snapshot.tier_quotas)


class TableHolder:
    """Holds the last good table and the snapshot it was built from; applies full snapshots and deltas.

    A delta (a snapshot that carries ``delta``) is first applied to the snapshot held with
    :func:`ferry.tabledelta.apply_delta`; one that does not fit (another base version, unknown entries)
    raises TableRejected with ``resync`` set, and the watcher asks for the table in full. The table it
    gives is then validated and built like a full snapshot.

    ``on_applied`` callbacks run after each successful apply (for example to
    close the clients of replicas that left the table).
    """

    def __init__(
        self,
        region: str,
        *,
        clock: Callable[[], float],
        params: TableParams = TableParams(),
    ) -> None:
        self.region = region
        self._clock = clock
        self._params = params
        self._table: Table | None = None
        self._snapshot: tables_pb2.TableSnapshot | None = None  # what _table was built from (deltas apply to it)
        self._listeners: list[Callable[[Table], None]] = []

    @property
    def table(self) -> Table | None:
        """The current table, or None before the first one."""
        return self._table

    @property
    def version(self) -> int:
        """The version held (0 when none)."""
        return self._table.version if self._table else 0

    @property
    def snapshot(self) -> tables_pb2.TableSnapshot | None:
        """The whole snapshot of the table held (deltas applied), or None before the first one."""
        return self._snapshot

    def age(self) -> float:
        """Seconds since the current table was applied (inf when none)."""
        return self._clock() - self._table.applied_at if self._table else math.inf

    @property
    def params(self) -> TableParams:
        """The bounds and ring defaults tables are built with."""
        return self._params

    @params.setter
    def params(self, params: TableParams) -> None:
        """New ring defaults (a router config's ``load_factor``): from the next table applied."""
        self._params = params

    def on_applied(self, listener: Callable[[Table], None]) -> None:
        """Call ``listener(table)`` after every successful apply."""
        self._listeners.append(listener)

    def apply(self, snapshot: tables_pb2.TableSnapshot) -> Table:
        """Validate and install ``snapshot`` (a full one or a delta); on TableRejected the last good table stays."""
        if snapshot.HasField("delta"):
            if self._snapshot is None:
                raise TableRejected(snapshot.version, "a delta, and no table is held", resync=True)
            try:
                snapshot = apply_delta(self._snapshot, snapshot)
            except DeltaMismatch as exc:
                raise TableRejected(snapshot.version, exc.reason, resync=True) from None
        table = build_table(
            snapshot,
            region=self.region,
            applied_at=self._clock(),
            params=self._params,
            previous=self._table,
        )
        self._table = table
        self._snapshot = snapshot
        for listener in self._listeners:
            listener(table)
        return table
