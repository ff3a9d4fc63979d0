"""What changed between two versions of a region's table (``ferryctl table --diff V1 V2``): pure.

:func:`diff_tables` compares two snapshots model by model and replica by
replica (by id) and returns one :class:`admin_pb2.ReplicaChange` per
difference, sorted by model then replica id:

- ``added`` / ``removed``: the replica entered or left the table (drained,
  cordoned, not ready, its node dead or gone);
- ``changed``: a route field other than its load moved (version, address,
  node, KServe model name, batch slots, KV block size, context); ``detail``
  names each field ``old->new``;
- ``load``: only the pushed load moved (queued, running, free KV blocks);
  ``detail`` names each;
- ``model`` (replica id empty): a model entered or left the catalog, its
  default version changed, or its version weights (a rollout's canary share);
- ``tenant`` (model empty, the tenant's name as the id): a tenant of the
  pushed set was added, removed or changed (plan, tiers, limits; a new key is
  said, never shown), or the table started or stopped carrying the set;
- ``spill`` (model empty, the target region as the id): an interactive or
  batch spill weight moved, or a route appeared or went.

:func:`pick_versions` resolves the versions asked for against those kept
(``0`` for the newest, or for the one before ``to``) and raises ``NotFound``
naming the kept versions otherwise. Cost: O(replicas of both snapshots).
"""

from __future__ import annotations

from collections.abc import Sequence

from ferry.errors import NotFound
from ferry.v1 import admin_pb2, tables_pb2

ROUTE_FIELDS = ("version", "address", "http_address", "node", "kserve_model", "max_concurrency", "kv_block_tokens",
                "max_context_tokens", "engine")
LOAD_FIELDS = ("queued", "running", "kv_blocks_free")


def pick_versions(kept: Sequence[tables_pb2.TableSnapshot], region: str, from_version: int,
                  to_version: int) -> tuple[tables_pb2.TableSnapshot, tables_pb2.TableSnapshot]:
    """The two snapshots to compare, oldest first: ``to`` (0: newest) and ``from`` (0: the one before ``to``)."""
    by_version = {s.version: s for s in kept}
    versions = sorted(by_version)
    have = ", ".join(str(v) for v in versions) or "none"
    if not versions:
        raise NotFound("table of region", f"{region} (no version kept)")
    to = to_version or versions[-1]
    if to not in by_version:
        raise NotFound("table version", f"{to} of region {region}; kept: {have}")
    if from_version:
        if from_version not in by_version:
            raise NotFound("table version", f"{from_version} of region {region}; kept: {have}")
        start = from_version
    else:
        earlier = [v for v in versions if v < to]
        start = earlier[-1] if earlier else to
    return by_version[start], by_version[to]


def _fields(old: object, new: object, names: Sequence[str]) -> list[str]:
    return [f"{n} {getattr(old, n)}->{getattr(new, n)}" for n in names if getattr(old, n) != getattr(new, n)]


TENANT_FIELDS = ("plan", "requests_per_second", "tokens_per_second", "max_concurrency")


def _weights(route: tables_pb2.ModelRoute | None) -> str:
    return ", ".join(f"{w.version} {w.weight:g}" for w in route.version_weights) if route is not None else ""


def _tenants(old: tables_pb2.TableSnapshot, new: tables_pb2.TableSnapshot) -> list[admin_pb2.ReplicaChange]:
    changes = []
    if old.tenants_managed != new.tenants_managed:
        detail = "the table carries the tenant set" if new.tenants_managed else "the proxies' own tenants again"
        changes.append(admin_pb2.ReplicaChange(change="tenant", detail=detail))
    before = {t.name: t for t in old.tenants}
    after = {t.name: t for t in new.tenants}
    for name in sorted(before.keys() | after.keys()):
        a, b = before.get(name), after.get(name)
        if a is None or b is None:
            detail = f"added (plan {b.plan})" if b is not None else "removed"
        else:
            moved = _fields(a, b, TENANT_FIELDS)
            if list(a.tiers) != list(b.tiers):
                moved.append(f"tiers {','.join(a.tiers)}->{','.join(b.tiers)}")
            if a.api_key_sha256 != b.api_key_sha256:
                moved.append("a new key")
            if not moved:
                continue
            detail = ", ".join(moved)
        changes.append(admin_pb2.ReplicaChange(change="tenant", replica_id=name, detail=detail))
    return changes


def _spill(old: tables_pb2.TableSnapshot, new: tables_pb2.TableSnapshot) -> list[admin_pb2.ReplicaChange]:
    before = {s.region: (s.weight, s.batch_weight) for s in old.spill}
    after = {s.region: (s.weight, s.batch_weight) for s in new.spill}
    changes = []
    for region in sorted(before.keys() | after.keys()):
        a, b = before.get(region), after.get(region)
        if a == b:
            continue
        detail = ("route added" if a is None else "route removed" if b is None
                  else f"weight {a[0]:.3g}->{b[0]:.3g}, batch {a[1]:.3g}->{b[1]:.3g}")
        changes.append(admin_pb2.ReplicaChange(change="spill", replica_id=region, detail=detail))
    return changes


def diff_tables(old: tables_pb2.TableSnapshot, new: tables_pb2.TableSnapshot) -> list[admin_pb2.ReplicaChange]:
    """Every difference from ``old`` to ``new`` (see the module doc)."""
    changes: list[admin_pb2.ReplicaChange] = []
    old_models = {m.model: m for m in old.models}
    new_models = {m.model: m for m in new.models}
    for model in sorted(old_models.keys() | new_models.keys()):
        before, after = old_models.get(model), new_models.get(model)
        if before is None or after is None:
            what = "added to the catalog" if before is None else "removed from the catalog"
            changes.append(admin_pb2.ReplicaChange(model=model, change="model", detail=what))
        elif before.default_version != after.default_version:
            detail = f"default_version {before.default_version}->{after.default_version}"
            changes.append(admin_pb2.ReplicaChange(model=model, change="model", detail=detail))
        if before is not None and after is not None and _weights(before) != _weights(after):
            detail = f"version_weights {_weights(before) or 'none'}->{_weights(after) or 'none'}"
            changes.append(admin_pb2.ReplicaChange(model=model, change="model", detail=detail))
        routes_before = {r.replica_id: r for r in (before.replicas if before is not None else ())}
        routes_after = {r.replica_id: r for r in (after.replicas if after is not None else ())}
        for replica_id in sorted(routes_before.keys() | routes_after.keys()):
            a, b = routes_before.get(replica_id), routes_after.get(replica_id)
            if a is None and b is not None:
                changes.append(admin_pb2.ReplicaChange(model=model, replica_id=replica_id, change="added",
                                                       detail=f"node {b.node}"))
            elif b is None and a is not None:
                changes.append(admin_pb2.ReplicaChange(model=model, replica_id=replica_id, change="removed",
                                                       detail=f"node {a.node}"))
            elif a is not None and b is not None:
                moved = _fields(a, b, ROUTE_FIELDS)
                if moved:
                    changes.append(admin_pb2.ReplicaChange(model=model, replica_id=replica_id, change="changed",
                                                           detail=", ".join(moved)))
                load = _fields(a.load, b.load, LOAD_FIELDS)
                if load:
                    changes.append(admin_pb2.ReplicaChange(model=model, replica_id=replica_id, change="load",
                                                           detail=", ".join(load)))
    return changes + _tenants(old, new) + _spill(old, new)
