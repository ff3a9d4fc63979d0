"""The table computation: fleet view + catalog + intent at ``now`` -> one table per region.

:func:`compute_tables` is pure (no I/O, no clock: ``now`` is passed in). For
each region (those of the members plus those named in ``regions``, e.g.
watched by a proxy) it lists every model of the catalog, sorted by name, each
with its routable replicas of that region, sorted by replica id. A replica is
routable when its member is live (:func:`controlplane.fleet.view.is_live`) and
not cordoned, its agent reports ``ready`` and no drain was requested. A model with no routable
replica is still listed, so a proxy answers UNAVAILABLE rather than NOT_FOUND.
A model's route also lists its versions with replicas warming there (live,
not cordoned, no drain requested; never routable), so a proxy can tell a
cold start from an unknown version (``dataplane.admission.coldstart``). A model with a
rollout (``rollouts``, :mod:`controlplane.rollout.plan`) gets the default version
and version weights :func:`controlplane.rollout.plan.route_weights` gives for the
versions routable in the region.

The catalog (:func:`catalog_models`) is the configured models plus every model
a registered replica serves; for the latter the default version is the greatest
version string among its replicas and the minimum GPU count the smallest
replica's (at least 1).

:class:`TableVersions` gives a region a new version only when its content
changed. Content is the snapshot without ``version``, ``nonce``,
``computed_at`` and each replica's ``telemetry_age_seconds``: ages move with
the clock alone, and counting them would give an idle fleet a new version at
every tick; an unchanged table keeps its earlier snapshot, whose ages are
those at its ``computed_at``. Versions start at a time-based value (unix ms x
1000) so that they grow across restarts; a region seen for the first time (or
again, after it was dropped for having neither nodes nor watchers) starts
above every version issued so far, and each change of its content adds one
(so a proxy's lag in versions is a count of changes). Proxies compare versions
only for equality. A follower control plane adopts the leader's snapshots as
they are (:meth:`TableVersions.adopt`); a control plane that becomes leader
rebases (:meth:`TableVersions.rebase`) above every version it saw and above
its own clock's start, so versions keep growing across a failover. It also
keeps the last ``history`` (8) versions of each region in memory (references
to the snapshots already built, nothing copied) for ``ferryctl table --diff``.

Incremental rows (:class:`RouteRows`): a replica's row (its
``ReplicaRoute``) depends on its member's node and region, its registration
(``ReplicaInfo``) and its last load (``ReplicaLoad``). The fleet view replaces
those objects on every change and never edits them in place
(:mod:`controlplane.fleet.view`), so a row built once is reused while the
replica's info and load are the very same objects (compared by identity, the
objects held by the cache so that their identity cannot be reused); only its
``telemetry_age_seconds`` is set again. A drain, a cordon or one replica's
telemetry rebuilds no other row: a computation costs a scan of identity
checks plus the rows that changed, and its result is the same as a full
computation's (a property test compares them over random sequences of
changes). The cache holds the rows of the last computation only (bounded by
the fleet). Pass one :class:`RouteRows` per caller to :func:`compute_tables`
(``rows=``); without it every row is built.

Cost: O(replicas + regions x models) per computation (with ``rows``: an
identity check per replica, a row built per replica whose info or load
changed), plus one serialization of each region's table to compare content.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from controlplane.fleet.view import READY, Member, is_live, load_of, replica_state
from controlplane.rollout.plan import Rollout, route_weights
from ferry.config import ModelConfig
from ferry.v1 import common_pb2, fleet_pb2, tables_pb2


def catalog_models(configured: Sequence[ModelConfig], members: Iterable[Member]) -> list[ModelConfig]:
    """The configured models plus those registered replicas serve, sorted by name."""
    known = {m.name: m for m in configured}
    versions: dict[str, set[str]] = {}
    gpus: dict[str, int] = {}
    for member in members:
        for info in member.replicas.values():
            if info.model in known:
                continue
            versions.setdefault(info.model, set()).add(info.version)
            gpus[info.model] = min(gpus.get(info.model, info.gpus or 1), info.gpus or 1)
    for name, seen in versions.items():
        known[name] = ModelConfig(name=name, default_version=max(seen), min_gpus=max(1, gpus[name]))
    return [known[name] for name in sorted(known)]


class RouteRows:
    """The table row of each replica as last built, reused while its inputs are the same objects.

    State: replica id -> (node, region, info, load, row). :meth:`row` returns the cached row or builds
    it; :meth:`keep_only` (called by :func:`compute_tables` after each pass) drops the rows the pass did
    not use, so the cache never holds more than the last computation's rows.
    """

    __slots__ = ("_rows", "_used", "built", "reused")

    def __init__(self) -> None:
        self._rows: dict[str, tuple[str, str, fleet_pb2.ReplicaInfo, common_pb2.ReplicaLoad | None,
                                    tables_pb2.ReplicaRoute]] = {}
        self._used: set[str] = set()
        self.built = 0  # rows built by the last computation
        self.reused = 0  # rows reused by the last computation

    def __len__(self) -> int:
        return len(self._rows)

    def begin(self) -> None:
        """Start a computation: counts reset, nothing used yet."""
        self._used = set()
        self.built = self.reused = 0

    def row(self, member: Member, replica_id: str, info: fleet_pb2.ReplicaInfo,
            now: float) -> tables_pb2.ReplicaRoute:
        """The row of ``replica_id`` of ``member`` at ``now``: the cached one when its inputs are unchanged."""
        load = member.loads.get(replica_id)
        self._used.add(replica_id)
        cached = self._rows.get(replica_id)
        if (cached is not None and cached[2] is info and cached[3] is load and cached[0] == member.node
                and cached[1] == member.region):
            route = cached[4]
            route.telemetry_age_seconds = max(0.0, now - member.load_at.get(replica_id, member.registered_at))
            self.reused += 1
            return route
        route = build_row(member, replica_id, info, now)
        self._rows[replica_id] = (member.node, member.region, info, load, route)
        self.built += 1
        return route

    def keep_only(self) -> None:
        """Drop the rows the last computation did not use."""
        if len(self._rows) > len(self._used):
            self._rows = {k: v for k, v in self._rows.items() if k in self._used}


def build_row(member: Member, replica_id: str, info: fleet_pb2.ReplicaInfo, now: float) -> tables_pb2.ReplicaRoute:
    """The table row of one routable replica at ``now``: its address and limits, its last load and the load's age."""
    load, age = load_of(member, replica_id, now)
    route = tables_pb2.ReplicaRoute(
        replica_id=replica_id, node=member.node, region=member.region, version=info.version,
        address=info.address, kserve_model=info.kserve_model or info.model,
        max_concurrency=info.max_concurrency, kv_block_tokens=info.kv_block_tokens,
        max_context_tokens=info.max_context_tokens, load=load, telemetry_age_seconds=age,
        inputs=info.inputs,  # which sampling parameters the version accepts (ferry.sampling)
        http_address=info.http_address, engine=info.engine,  # its OpenAI HTTP endpoint, when it serves one
    )
    route.load.replica_id = replica_id
    route.load.state = READY
    return route


def compute_tables(
    members: Iterable[Member],
    catalog: Sequence[ModelConfig],
    drains: AbstractSet[str],
    *,
    now: float,
    grace_seconds: float,
    regions: Iterable[str] = (),
    cordons: AbstractSet[str] = frozenset(),
    rollouts: Mapping[str, Rollout] | None = None,
    rows: RouteRows | None = None,
) -> dict[str, tables_pb2.TableSnapshot]:
    """Per region, the table content at ``now`` (``version``, ``nonce`` and ``computed_at`` unset).

    ``rows``: the caller's :class:`RouteRows`, reused across calls (rows of unchanged replicas are not
    built again); None builds every row. The result is the same either way.
    """
    members = list(members)
    if rows is not None:
        rows.begin()
    routes: dict[str, dict[str, list[tables_pb2.ReplicaRoute]]] = {}
    warming: dict[tuple[str, str], dict[str, int]] = {}  # (region, model) -> version -> replicas warming
    names = set(regions)
    for member in members:
        names.add(member.region)
        if not is_live(member, now, grace_seconds) or member.node in cordons:
            continue
        for replica_id, info in member.replicas.items():
            state = replica_state(member, replica_id, True)
            if replica_id in drains or state != READY:
                if replica_id not in drains and state == common_pb2.REPLICA_STATE_WARMING:
                    counts = warming.setdefault((member.region, info.model), {})
                    counts[info.version] = counts.get(info.version, 0) + 1
                continue
            route = rows.row(member, replica_id, info, now) if rows is not None else build_row(
                member, replica_id, info, now)
            routes.setdefault(member.region, {}).setdefault(info.model, []).append(route)
    models = catalog_models(catalog, members)
    tables: dict[str, tables_pb2.TableSnapshot] = {}
    for region in sorted(names):
        by_model = routes.get(region, {})
        snapshot = tables[region] = tables_pb2.TableSnapshot(region=region)
        for m in models:
            replicas: list[tables_pb2.ReplicaRoute] = by_model.get(m.name, [])
            replicas.sort(key=lambda r: r.replica_id)
            route = tables_pb2.ModelRoute(model=m.name, default_version=m.default_version, replicas=replicas)
            rollout = (rollouts or {}).get(m.name)
            if rollout is not None:
                route.default_version, weights = route_weights(rollout, {r.version for r in replicas})
                route.version_weights.extend(tables_pb2.VersionWeight(version=v, weight=w) for v, w in weights)
            for version, count in sorted(warming.get((region, m.name), {}).items()):
                route.warming.append(tables_pb2.WarmingVersion(version=version, replicas=count))
            snapshot.models.append(route)
    if rows is not None:
        rows.keep_only()
    return tables


def content_key(snapshot: tables_pb2.TableSnapshot) -> bytes:
    """The bytes two snapshots share exactly when their content is the same (see the module doc)."""
    bare = tables_pb2.TableSnapshot()
    bare.CopyFrom(snapshot)
    bare.version = 0
    bare.nonce = ""
    bare.computed_at = 0.0
    for model in bare.models:
        for replica in model.replicas:
            replica.telemetry_age_seconds = 0.0
    return bytes(bare.SerializeToString(deterministic=True))


def initial_version(unix_seconds: float) -> int:
    """The version counter's start: unix milliseconds x 1000."""
    return int(unix_seconds * 1000) * 1000


@dataclass(frozen=True, slots=True)
class Published:
    """A region's current table: the snapshot (nonce unset), its content key and routable replica ids."""

    snapshot: tables_pb2.TableSnapshot
    key: bytes
    replica_ids: frozenset[str]

    @property
    def version(self) -> int:
        return self.snapshot.version


class TableVersions:
    """The current versioned table of each region."""

    def __init__(self, start: int, *, history: int = 8) -> None:
        self._high = start
        self._current: dict[str, Published] = {}
        self._history: dict[str, deque[tables_pb2.TableSnapshot]] = {}
        self._keep = max(1, history)

    def history(self, region: str) -> list[tables_pb2.TableSnapshot]:
        """The last versions of ``region`` kept, oldest first."""
        return list(self._history.get(region, ()))

    def _remember(self, snapshot: tables_pb2.TableSnapshot) -> None:
        kept = self._history.setdefault(snapshot.region, deque(maxlen=self._keep))
        if kept and kept[-1].version >= snapshot.version:
            kept.clear()  # a new term rebased below what we kept: start again
        kept.append(snapshot)

    @property
    def high(self) -> int:
        """The highest version issued or adopted so far."""
        return self._high

    def get(self, region: str) -> Published | None:
        return self._current.get(region)

    def rebase(self, start: int) -> None:
        """Forget every table and issue versions above ``start`` from now on (a new leader's term)."""
        self._current.clear()
        self._high = max(self._high, start)

    def adopt(self, snapshot: tables_pb2.TableSnapshot) -> Published | None:
        """Take a table published by the leader as is (a follower); returns it, or None if already held."""
        old = self._current.get(snapshot.region)
        if old is not None and old.version == snapshot.version:
            return None
        stamped = tables_pb2.TableSnapshot()
        stamped.CopyFrom(snapshot)
        stamped.nonce = ""
        ids = frozenset(r.replica_id for m in stamped.models for r in m.replicas)
        self._current[snapshot.region] = published = Published(stamped, content_key(stamped), ids)
        self._high = max(self._high, snapshot.version)
        self._remember(stamped)
        return published

    def regions(self) -> list[str]:
        return sorted(self._current)

    def publish(self, tables: Mapping[str, tables_pb2.TableSnapshot], computed_at: float) -> list[Published]:
        """Take a computation's tables; returns the regions' tables that got a new version.

        Regions absent from ``tables`` are dropped.
        """
        for region in [r for r in self._current if r not in tables]:
            del self._current[region]
            self._history.pop(region, None)
        changed: list[Published] = []
        for region in sorted(tables):
            snapshot = tables[region]
            key = content_key(snapshot)
            old = self._current.get(region)
            if old is not None and old.key == key:
                continue
            version = old.version + 1 if old is not None else self._high + 1
            self._high = max(self._high, version)
            stamped = tables_pb2.TableSnapshot()
            stamped.CopyFrom(snapshot)
            stamped.version = version
            stamped.computed_at = computed_at
            ids = frozenset(r.replica_id for m in stamped.models for r in m.replicas)
            self._current[region] = published = Published(stamped, key, ids)
            self._remember(stamped)
            changed.append(published)
        return changed
