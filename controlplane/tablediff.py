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
- ``model`` (replica id empty): a model entered or left the catalog, or its
  default version changed.

:func:`pick_versions` resolves the versions asked for against those kept
(``0`` for the newest, or for the one before ``to``) and raises ``NotFound``
naming the kept versions otherwise. Cost: O(replicas of both snapshots).
"""

from __future__ import annotations

from collections.abc import Sequence

from ferry.errors import NotFound
from ferry.v1 import admin_pb2, tables_pb2

ROUTE_FIELDS = ("version", "address", "node", "kserve_model", "max_concurrency", "kv_block_tokens",
                "max_context_tokens")
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
    return changes
