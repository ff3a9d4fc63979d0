"""What the proxies must be told to go from one version of a region's table to the next: pure.

:func:`table_delta` compares two snapshots of one region and returns the
``TableSnapshot`` that carries a ``TableDelta`` (tables.proto): the new
version, region and ``computed_at``, and ``delta.base_version`` the old
version. It is a merge walk over the keyed lists, which the computation keeps
in key order (models by name, replicas by id, spill routes by region, tenants
by name):

- a model, replica, spill route or tenant present only in the new table is
  added whole; present only in the old one, removed by key;
- a replica whose route fields other than ``load`` and
  ``telemetry_age_seconds`` moved is sent whole; one whose load moved (with or
  without its age) as a ``LoadUpdate`` (replica id, load, age);
- a replica whose telemetry age alone moved is covered by its node's
  ``NodeAge``: the first such replica of the node (in walk order) names the
  age, and every replica of the node the delta names nowhere else whose new
  age differs from it gets a ``LoadUpdate`` (replicas of one node share the
  age of the node's last telemetry, so there are none in practice);
- a model's own fields (default version, version weights, warming), a spill
  route's own fields, the ring, the tier quotas and ``tenants_managed`` are
  sent whole when they moved.

Applying the result to the old table with
:func:`ferry.tabledelta.apply_delta` gives the new one exactly (the
property test in ``tests/controlplane/test_delta.py``). When a keyed list of
either table is not in strict key order, or the regions differ, it returns
None: such a table goes in full.

Cost: O(replicas of both tables): one message comparison in C per replica
(0.3 µs), a copy and a second one when its age moved (about 1 µs more), the
route fields compared only when its load or route moved; nothing is
serialized here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any, TypeVar

from ferry.tabledelta import MODEL_FIELDS, ROUTER_FIELDS, SPILL_FIELDS, copy_fields, router_part
from ferry.v1 import tables_pb2

ROUTE_FIELDS = tuple(f.name for f in tables_pb2.ReplicaRoute.DESCRIPTOR.fields
                     if f.name not in ("replica_id", "load", "telemetry_age_seconds"))
# The top-level fields of a table this module carries (a test checks that the proto has no other).
TABLE_FIELDS = ("version", "nonce", "region", "computed_at", "models", "ring", "tier_quotas", "spill", "tenants",
                "tenants_managed", "delta", *ROUTER_FIELDS)

M = TypeVar("M")


class _Unsorted(Exception):
    """A keyed list out of strict key order: the table goes in full."""


class _Fields:
    """A comparison of some fields of one message type: one ``attrgetter`` (values compared in a tuple) plus
    the presence of its singular message fields."""

    def __init__(self, descriptor: Any, names: Sequence[str]) -> None:
        self.values = attrgetter(*names) if len(names) > 1 else (lambda m: (getattr(m, names[0]),))
        singular = [n for n in names if descriptor.fields_by_name[n].message_type is not None
                    and not descriptor.fields_by_name[n].is_repeated]
        self.singular = tuple(singular)

    def same(self, a: Any, b: Any) -> bool:
        """Whether those fields of ``a`` and ``b`` are equal (presence of message fields included)."""
        if self.values(a) != self.values(b):
            return False
        return not self.singular or all(a.HasField(n) == b.HasField(n) for n in self.singular)


ROUTE = _Fields(tables_pb2.ReplicaRoute.DESCRIPTOR, ROUTE_FIELDS)
MODEL = _Fields(tables_pb2.ModelRoute.DESCRIPTOR, MODEL_FIELDS)
SPILL = _Fields(tables_pb2.SpillRoute.DESCRIPTOR, SPILL_FIELDS)


def _header(message: Any, names: Sequence[str], key: str, value: str) -> Any:
    """A copy of ``message`` with only ``key`` and the fields ``names`` (its keyed list left empty)."""
    out = type(message)()
    setattr(out, key, value)
    copy_fields(message, out, names)
    return out


def _sorted(keys: list[str]) -> bool:
    """Strictly increasing (sorted and without repeats; checked in C)."""
    return keys == sorted(keys) and len(set(keys)) == len(keys)


def _walk(old: Sequence[M], new: Sequence[M], key: Callable[[M], str]) -> list[tuple[M | None, M | None]]:
    """Pairs (old, new) matched by key, in key order; raises _Unsorted when a list is not strictly sorted."""
    old_keys = [key(m) for m in old]
    new_keys = [key(m) for m in new]
    if not (_sorted(old_keys) and _sorted(new_keys)):
        raise _Unsorted
    if old_keys == new_keys:
        return list(zip(old, new, strict=True))
    old_by = dict(zip(old_keys, old, strict=True))
    new_by = dict(zip(new_keys, new, strict=True))
    return [(old_by.get(k), new_by.get(k)) for k in sorted(old_by.keys() | new_by.keys())]


class _Ages:
    """Replicas whose telemetry age alone moved, and the unchanged ones, per node (see the module doc)."""

    def __init__(self) -> None:
        self.moved: dict[str, list[tuple[tables_pb2.ModelDelta, tables_pb2.ReplicaRoute]]] = {}
        self.kept: dict[str, list[tuple[tables_pb2.ModelDelta, tables_pb2.ReplicaRoute]]] = {}

    def settle(self, delta: tables_pb2.TableDelta) -> None:
        """One NodeAge per node with moved ages; a LoadUpdate for each replica of it that would differ."""
        for node, moved in self.moved.items():
            age = moved[0][1].telemetry_age_seconds
            delta.ages.append(tables_pb2.NodeAge(node=node, telemetry_age_seconds=age))
            for changes, route in moved + self.kept.get(node, []):
                if route.telemetry_age_seconds != age:
                    changes.loads.append(_load_update(route))


def _load_update(route: tables_pb2.ReplicaRoute) -> tables_pb2.LoadUpdate:
    update = tables_pb2.LoadUpdate(replica_id=route.replica_id, telemetry_age_seconds=route.telemetry_age_seconds)
    if route.HasField("load"):
        update.load.CopyFrom(route.load)
    return update


def _model_delta(old: tables_pb2.ModelRoute | None, new: tables_pb2.ModelRoute, ages: _Ages) -> tables_pb2.ModelDelta:
    """The changes of one model (every replica when it is new); ages alone are left to ``ages``."""
    changes = tables_pb2.ModelDelta(model=new.model)
    if old is None or not MODEL.same(old, new):
        changes.route.CopyFrom(_header(new, MODEL_FIELDS, "model", new.model))
    aged = tables_pb2.ReplicaRoute()  # the old route with the new age: equal to the new one when the age alone moved
    for a, b in _walk(old.replicas if old is not None else (), new.replicas, lambda r: r.replica_id):
        if b is None:
            assert a is not None
            changes.removed_replicas.append(a.replica_id)
        elif a is None:
            changes.replicas.append(b)
        elif a == b:
            ages.kept.setdefault(b.node, []).append((changes, b))
        else:
            aged.CopyFrom(a)
            aged.telemetry_age_seconds = b.telemetry_age_seconds
            if aged == b:
                ages.moved.setdefault(b.node, []).append((changes, b))
            elif ROUTE.same(a, b):
                changes.loads.append(_load_update(b))  # the load moved (and maybe the age)
            else:
                changes.replicas.append(b)
    return changes


def _models(old: Sequence[tables_pb2.ModelRoute], new: Sequence[tables_pb2.ModelRoute], ages: _Ages,
            removed: list[str]) -> list[tables_pb2.ModelDelta]:
    """The deltas of the models of ``new`` (standalone, some empty until the ages settle); ``removed`` gets the rest."""
    changed = []
    for a, b in _walk(old, new, lambda m: m.model):
        if b is None:
            assert a is not None
            removed.append(a.model)
        else:
            changed.append(_model_delta(a, b, ages))
    return changed


def _carrying(models: list[tables_pb2.ModelDelta]) -> list[tables_pb2.ModelDelta]:
    """The model deltas that carry something."""
    return [m for m in models if m.HasField("route") or m.replicas or m.removed_replicas or m.loads]


def table_delta(old: tables_pb2.TableSnapshot, new: tables_pb2.TableSnapshot) -> tables_pb2.TableSnapshot | None:
    """The delta from ``old`` to ``new`` (see the module doc); None when ``new`` must go in full."""
    if old.region != new.region:
        return None
    out = tables_pb2.TableSnapshot(version=new.version, region=new.region, computed_at=new.computed_at)
    delta = out.delta
    delta.base_version = old.version
    ages = _Ages()
    removed: list[str] = []
    spills: list[tuple[tables_pb2.SpillDelta, list[str], list[tables_pb2.ModelDelta]]] = []
    try:
        models = _models(old.models, new.models, ages, removed)
        for a, b in _walk(old.spill, new.spill, lambda s: s.region):
            if b is None:
                assert a is not None
                delta.removed_spill.append(a.region)
                continue
            spill = tables_pb2.SpillDelta(region=b.region)
            if a is None or not SPILL.same(a, b):
                spill.route.CopyFrom(_header(b, SPILL_FIELDS, "region", b.region))
            gone: list[str] = []
            spills.append((spill, gone, _models(a.models if a is not None else (), b.models, ages, gone)))
        for ta, tb in _walk(old.tenants, new.tenants, lambda t: t.name):
            if tb is None:
                assert ta is not None
                delta.removed_tenants.append(ta.name)
            elif ta is None or ta != tb:
                delta.tenants.append(tb)
    except _Unsorted:
        return None
    ages.settle(delta)  # may add load updates to the model deltas: they are copied into the delta after it
    delta.models.extend(_carrying(models))
    delta.removed_models.extend(removed)
    for spill, gone, spill_models in spills:
        spill.models.extend(_carrying(spill_models))
        spill.removed_models.extend(gone)
        if spill.HasField("route") or spill.models or spill.removed_models:
            delta.spill.append(spill)
    if old.HasField("ring") != new.HasField("ring") or old.ring != new.ring:
        delta.ring_changed = True
        if new.HasField("ring"):
            delta.ring.CopyFrom(new.ring)
    if list(old.tier_quotas) != list(new.tier_quotas):
        delta.tier_quotas_changed = True
        delta.tier_quotas.extend(new.tier_quotas)
    if old.tenants_managed != new.tenants_managed:
        delta.tenants_managed = new.tenants_managed
    if router_part(old) != router_part(new):  # the router configs (small): whole when any of them moved
        delta.router_changed = True
        copy_fields(new, delta, ROUTER_FIELDS)
    return out
