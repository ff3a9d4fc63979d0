"""A table delta applied to the table it starts from: one pure function shared by both planes.

:func:`apply_delta` takes the ``TableSnapshot`` a proxy holds (``base``) and a
``TableSnapshot`` that carries a ``TableDelta`` (``update``, tables.proto) and
returns the new table: ``update``'s version, nonce and ``computed_at``, with
the delta's changes made to ``base`` in one merge walk per keyed list (models
by name, replicas by replica id, spill routes by region, tenants by name; an
added entry goes to its place in key order):

1. models (and each spill route's models): a removed one leaves; a changed
   one takes its ``route``'s own fields when set, its replicas merged with the
   added or changed routes less the removed ids, then each ``LoadUpdate``
   (load and telemetry age); a new model needs ``route``;
2. telemetry ages: every replica of a node named in ``ages`` that neither a
   route nor a load update of the delta names takes the node's age (own
   models and spill routes alike);
3. spill routes (own fields, models as in 1), tenants (whole, by name), and
   the ring, tier quotas and ``tenants_managed`` when the delta says they
   changed; the router part (``router_configs``, ``router_assignments``,
   ``router_default``) whole when ``router_changed``, else the base's.

The proxy applies it before validating the table (``dataplane.table.local``),
the control plane computes it (``controlplane.tables.delta``), the tests and
``tools.bench.store`` check with it that deltas and full snapshots give the
same tables. :class:`DeltaMismatch` (the proxy asks for a resync) when the
base is not ``delta.base_version``, the regions differ, or the delta names a
model, replica, spill route or tenant the base does not hold (to remove, to
update a load, a model without its route) or an added list out of key order.

Cost: one copy of ``base`` in C, the replica ids of each changed model read
once (O(replicas) attribute reads), O(log) per replica the delta names, and
one age write per replica on a node of ``ages``: about 5 ms for a drain in a
5,000-replica table whose ages all moved, where parsing the whole table
takes 0.7 ms (what the delta saves is the bytes on the wire and their
serialization per proxy, not parsing).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from itertools import pairwise
from typing import Any, TypeVar

from ferry.errors import FerryError
from ferry.v1 import tables_pb2

MODEL_FIELDS = tuple(f.name for f in tables_pb2.ModelRoute.DESCRIPTOR.fields if f.name not in ("model", "replicas"))
SPILL_FIELDS = tuple(f.name for f in tables_pb2.SpillRoute.DESCRIPTOR.fields if f.name not in ("region", "models"))
ROUTER_FIELDS = ("router_configs", "router_assignments", "router_default")  # a table's and a delta's router part

M = TypeVar("M")


class DeltaMismatch(FerryError):
    """A delta that does not fit the table held; ``reason`` goes into the resync's Ack."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"delta does not fit the table held: {reason}")
        self.reason = reason


def copy_fields(source: Any, target: Any, names: Iterable[str]) -> None:
    """Copy the fields ``names`` of ``source`` into ``target`` (same type; message presence kept)."""
    for name in names:
        field = source.DESCRIPTOR.fields_by_name[name]
        if field.is_repeated:
            getattr(target, name).extend(getattr(source, name))
        elif field.message_type is not None:
            if source.HasField(name):
                getattr(target, name).CopyFrom(getattr(source, name))
        else:
            setattr(target, name, getattr(source, name))


def _merge(base: Sequence[M], added: Sequence[M], removed: Sequence[str], key: Callable[[M], str],
           what: str) -> list[M]:
    """``base`` with ``added`` put in (replacing the same key) and ``removed`` taken out, in key order."""
    gone = set(removed)
    if gone:
        missing = gone - {key(m) for m in base}
        if missing:
            raise DeltaMismatch(f"{what} {sorted(missing)[0]!r} to remove is not in the table held")
    out: list[M] = []
    i = 0
    last = None
    for item in added:
        k = key(item)
        if last is not None and k <= last:
            raise DeltaMismatch(f"{what} {k!r}: added entries out of key order")
        last = k
        while i < len(base) and key(base[i]) < k:
            if key(base[i]) not in gone:
                out.append(base[i])
            i += 1
        if i < len(base) and key(base[i]) == k:
            i += 1  # replaced
        out.append(item)
    out.extend(m for m in base[i:] if key(m) not in gone)
    return out


def _sorted(keys: list[str]) -> bool:
    return all(x < y for x, y in pairwise(keys))


def _find(ids: list[str], rid: str) -> int:
    """The index of ``rid`` in the sorted ``ids``, or -1."""
    i = bisect_left(ids, rid)
    return i if i < len(ids) and ids[i] == rid else -1


def _model(base: tables_pb2.ModelRoute | None, change: tables_pb2.ModelDelta | None, name: str,
           out: tables_pb2.ModelRoute, named: set[str]) -> None:
    """Fill ``out`` with ``base`` changed by ``change``; ``named`` gets the replica ids the change names.

    The base is copied whole (in C), then changed in place: removals and insertions at their index in
    the sorted replica ids, routes and loads replaced there.
    """
    out.model = name
    if base is not None:
        out.MergeFrom(base)
    if change is None:
        return
    if change.HasField("route"):
        if change.route.replicas:
            raise DeltaMismatch(f"model {name!r}: a delta's route carries replicas")
        for field in MODEL_FIELDS:
            out.ClearField(field)
        copy_fields(change.route, out, MODEL_FIELDS)
    elif base is None:
        raise DeltaMismatch(f"model {name!r} is not in the table held and the delta has no route for it")
    if not (change.replicas or change.removed_replicas or change.loads):
        return
    replicas = out.replicas
    ids = [r.replica_id for r in replicas]
    if not _sorted(ids):
        raise DeltaMismatch(f"model {name!r}: the replicas held are not in replica_id order")
    gone = []
    for rid in change.removed_replicas:
        i = _find(ids, rid)
        if i < 0:
            raise DeltaMismatch(f"model {name!r}: replica {rid!r} to remove is not in the table held")
        gone.append(i)
    for i in sorted(set(gone), reverse=True):
        del replicas[i]
        del ids[i]
    last = ""
    for route in change.replicas:
        rid = route.replica_id
        if last and rid <= last:
            raise DeltaMismatch(f"model {name!r}: replica {rid!r}: added entries out of key order")
        last = rid
        i = bisect_left(ids, rid)
        if i < len(ids) and ids[i] == rid:
            replicas[i].CopyFrom(route)
        else:
            replicas.insert(i, route)
            ids.insert(i, rid)
        named.add(rid)
    for update in change.loads:
        i = _find(ids, update.replica_id)
        if i < 0:
            raise DeltaMismatch(f"model {name!r}: load of replica {update.replica_id!r}, not in the table held")
        held = replicas[i]
        if update.HasField("load"):
            held.load.CopyFrom(update.load)
        else:
            held.ClearField("load")
        held.telemetry_age_seconds = update.telemetry_age_seconds
        named.add(update.replica_id)


def _models(base: Sequence[tables_pb2.ModelRoute], changes: Sequence[tables_pb2.ModelDelta], removed: Sequence[str],
            out: Any, named: set[str], what: str) -> None:
    """The models of ``base`` changed by ``changes`` less ``removed``, appended to ``out`` in name order."""
    by_name = {m.model: m for m in base}
    change_of: dict[str, tables_pb2.ModelDelta] = {}
    for change in changes:
        if change.model in change_of:
            raise DeltaMismatch(f"{what}model {change.model!r} changed twice")
        change_of[change.model] = change
    placeholders = [tables_pb2.ModelRoute(model=c.model) for c in changes]
    for route in _merge(base, placeholders, removed, lambda m: m.model, f"{what}model"):
        name = route.model
        _model(by_name.get(name), change_of.get(name), name, out.add(), named)


def _ages(routes: Iterable[tables_pb2.ModelRoute], ages: dict[str, float], named: set[str]) -> None:
    """Every replica of a node of ``ages`` not in ``named`` takes the node's age."""
    for route in routes:
        for replica in route.replicas:
            age = ages.get(replica.node)
            if age is not None and (not named or replica.replica_id not in named):
                replica.telemetry_age_seconds = age


def apply_delta(base: tables_pb2.TableSnapshot, update: tables_pb2.TableSnapshot) -> tables_pb2.TableSnapshot:
    """The table ``update``'s delta makes of ``base`` (see the module doc); raises DeltaMismatch."""
    delta = update.delta
    if delta.base_version != base.version:
        raise DeltaMismatch(f"a delta from version {delta.base_version}, the table held is version {base.version}")
    if update.region != base.region:
        raise DeltaMismatch(f"a delta of region {update.region!r}, the table held is of {base.region!r}")
    out = tables_pb2.TableSnapshot(version=update.version, nonce=update.nonce, region=update.region,
                                   computed_at=update.computed_at)
    named: set[str] = set()
    _models(base.models, delta.models, delta.removed_models, out.models, named, "")
    spill_of: dict[str, tables_pb2.SpillDelta] = {}
    for change in delta.spill:
        if change.region in spill_of:
            raise DeltaMismatch(f"spill route {change.region!r} changed twice")
        spill_of[change.region] = change
    base_spill = {s.region: s for s in base.spill}
    placeholders = [tables_pb2.SpillRoute(region=c.region) for c in delta.spill]
    for route in _merge(base.spill, placeholders, delta.removed_spill, lambda s: s.region, "spill route"):
        region = route.region
        held, change = base_spill.get(region), spill_of.get(region)
        target = out.spill.add(region=region)
        if change is None:
            assert held is not None
            target.MergeFrom(held)
            continue
        if change.HasField("route"):
            if change.route.models:
                raise DeltaMismatch(f"spill route {region!r}: a delta's route carries models")
            copy_fields(change.route, target, SPILL_FIELDS)
        elif held is None:
            raise DeltaMismatch(f"spill route {region!r} is not in the table held and the delta has no route for it")
        else:
            copy_fields(held, target, SPILL_FIELDS)
        _models(held.models if held is not None else (), change.models, change.removed_models, target.models,
                named, f"spill route {region!r}: ")
    if delta.ages:
        ages = {a.node: a.telemetry_age_seconds for a in delta.ages}
        _ages(out.models, ages, named)
        for spill in out.spill:
            _ages(spill.models, ages, named)
    if delta.ring_changed:
        if delta.HasField("ring"):
            out.ring.CopyFrom(delta.ring)
    elif base.HasField("ring"):
        out.ring.CopyFrom(base.ring)
    out.tier_quotas.extend(delta.tier_quotas if delta.tier_quotas_changed else base.tier_quotas)
    out.tenants.extend(_merge(base.tenants, delta.tenants, delta.removed_tenants, lambda t: t.name, "tenant"))
    out.tenants_managed = delta.tenants_managed if delta.HasField("tenants_managed") else base.tenants_managed
    copy_fields(delta if delta.router_changed else base, out, ROUTER_FIELDS)
    return out


def router_part(table: tables_pb2.TableSnapshot | tables_pb2.TableDelta) -> tuple[Any, ...]:
    """The router configs, assignments and default of a table (or a delta), comparable with ``==``."""
    return (list(table.router_configs), list(table.router_assignments), table.router_default)
