"""The local table: snapshot validation, precomputed candidates, the holder keeps the last good table."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from dataplane.table.local import NO_TELEMETRY_AGE, TableHolder, TableParams, TableRejected, build_table
from ferry.v1 import common_pb2, tables_pb2
from tests.dataplane.fakes import route, snapshot


def mutate(fn: Callable[[Any], None]) -> Any:
    snap = snapshot(5, [route("r1", "10.0.0.1:8001"), route("r2", "10.0.0.2:8001")])
    fn(snap)
    return snap


def _dup_model(s: Any) -> None:
    s.models.add().CopyFrom(tables_pb2.ModelRoute(model="m"))


def _dup_across_models(s: Any) -> None:
    s.models.add().CopyFrom(tables_pb2.ModelRoute(model="other", replicas=[route("r1", "10.0.0.9:1")]))


BAD = [
    ("other-region", lambda s: setattr(s, "region", "eu"), "region 'eu'"),
    ("version-zero", lambda s: setattr(s, "version", 0), "version must be positive"),
    ("computed-at-nan", lambda s: setattr(s, "computed_at", math.nan), "computed_at"),
    ("empty-model-name", lambda s: setattr(s.models[0], "model", ""), "empty name"),
    ("duplicate-model", _dup_model, "model 'm' appears twice"),
    ("duplicate-replica-id", lambda s: setattr(s.models[0].replicas[1], "replica_id", "r1"), "'r1' appears twice"),
    ("duplicate-replica-id-across-models", _dup_across_models, "'r1' appears twice"),
    ("empty-replica-id", lambda s: setattr(s.models[0].replicas[0], "replica_id", ""), "empty replica_id"),
    ("address-without-port", lambda s: setattr(s.models[0].replicas[0], "address", "10.0.0.1"), "host:port"),
    ("address-port-not-a-number", lambda s: setattr(s.models[0].replicas[0], "address", "h:x"), "host:port"),
    ("address-port-zero", lambda s: setattr(s.models[0].replicas[0], "address", "h:0"), "out of range"),
    ("address-port-too-big", lambda s: setattr(s.models[0].replicas[0], "address", "h:70000"), "out of range"),
    ("no-address-at-all", lambda s: setattr(s.models[0].replicas[0], "address", ""), "neither address nor"),
    ("http-address-without-port", lambda s: setattr(s.models[0].replicas[0], "http_address", "h"),
     "http_address 'h' is not host:port"),
    ("http-address-port-zero", lambda s: setattr(s.models[0].replicas[0], "http_address", "h:0"), "out of range"),
    ("replica-of-other-region", lambda s: setattr(s.models[0].replicas[0], "region", "eu"), "region 'eu'"),
    ("replica-without-version", lambda s: setattr(s.models[0].replicas[0], "version", ""), "empty version"),
    ("negative-telemetry-age", lambda s: setattr(s.models[0].replicas[0], "telemetry_age_seconds", -1.0), "age"),
    ("infinite-telemetry-age", lambda s: setattr(s.models[0].replicas[0], "telemetry_age_seconds", math.inf), "age"),
    ("load-factor-not-above-one", lambda s: setattr(s.ring, "load_factor", 1.0), "load_factor"),
    ("load-factor-nan", lambda s: setattr(s.ring, "load_factor", math.nan), "load_factor"),
    ("too-many-vnodes", lambda s: setattr(s.ring, "vnodes", 5000), "vnodes"),
    ("weight-without-version", lambda s: s.models[0].version_weights.add(weight=1.0), "names no version"),
    ("negative-weight", lambda s: s.models[0].version_weights.add(version="v1", weight=-1.0), "not >= 0"),
    ("weight-twice", lambda s: s.models[0].version_weights.extend(
        [tables_pb2.VersionWeight(version="v1", weight=1.0)] * 2), "weighted twice"),
]


@pytest.mark.parametrize(("change", "reason"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_snapshot_rejected_with_reason(change: Callable[[Any], None], reason: str) -> None:
    with pytest.raises(TableRejected) as info:
        build_table(mutate(change), region="local", applied_at=0.0)
    assert reason in info.value.reason


BOUNDS = [
    ("too-many-models", {"max_models": 0}, "models, over the limit"),
    ("too-many-replicas", {"max_replicas": 1}, "replicas, over the limit"),
]


@pytest.mark.parametrize(("bounds", "reason"), [b[1:] for b in BOUNDS], ids=[b[0] for b in BOUNDS])
def test_table_size_is_bounded(bounds: dict[str, int], reason: str) -> None:
    with pytest.raises(TableRejected, match=reason):
        build_table(mutate(lambda s: None), region="local", applied_at=0.0, params=TableParams(**bounds))


def test_http_address_and_engine_reach_the_replica_and_an_http_only_replica_is_routable() -> None:
    http_only = route("r1", "10.0.0.1:1")
    http_only.address, http_only.http_address, http_only.engine = "", "10.0.0.1:8000", "vllm"
    both = route("r2", "10.0.0.2:9000")
    both.http_address, both.engine = "10.0.0.2:8000", "simulated"
    table = build_table(snapshot(3, [http_only, both, route("r3", "10.0.0.3:9000")]), region="local", applied_at=0.0)
    _, pool = table.candidates("m", "v1")
    assert [(r.replica_id, r.address, r.http_address, r.engine) for r in pool] == [
        ("r1", "", "10.0.0.1:8000", "vllm"), ("r2", "10.0.0.2:9000", "10.0.0.2:8000", "simulated"),
        ("r3", "10.0.0.3:9000", "", "")]
    assert table.addresses == {"10.0.0.2:9000", "10.0.0.3:9000"}  # the KServe addresses only


def test_candidates_precomputed_per_version() -> None:
    draining = route("r3", "10.0.0.3:1", state=common_pb2.REPLICA_STATE_DRAINING)
    snap = snapshot(2, [route("r1", "10.0.0.1:1"), route("r2", "10.0.0.2:1", version="v2"), draining])
    table = build_table(snap, region="local", applied_at=0.0)
    assert [r.replica_id for r in table.candidates("m", "")[1]] == ["r1"]
    assert [r.replica_id for r in table.candidates("m", "v2")[1]] == ["r2"]
    assert table.addresses == {"10.0.0.1:1", "10.0.0.2:1"}  # the draining replica is not routable
    assert table.replicas == 3
    assert table.candidates("m", "v1")[1] is table.candidates("m", "")[1]  # the same tuple, no per-request work


def test_empty_default_version_serves_every_version() -> None:
    snap = snapshot(2, [route("r1", "h:1"), route("r2", "h:2", version="v2")], default_version="")
    table = build_table(snap, region="local", applied_at=0.0)
    assert {r.replica_id for r in table.candidates("m", "")[1]} == {"r1", "r2"}


def test_replica_without_load_counts_as_stale() -> None:
    bare = tables_pb2.ReplicaRoute(replica_id="r1", version="v1", address="h:1")
    table = build_table(snapshot(1, [bare]), region="local", applied_at=0.0)
    (replica,) = table.candidates("m", "")[1]
    assert replica.telemetry_age == NO_TELEMETRY_AGE and replica.max_concurrency == 1
    assert replica.telemetry is None


def test_the_rows_whole_load_reaches_the_replica_for_scorers() -> None:
    row = route("r1", "h:1", queued=2)
    row.load.gpu_utilization = 0.82  # a signal the pick has no field for: a scorer reads it here
    (replica,) = build_table(snapshot(1, [row]), region="local", applied_at=0.0).candidates("m", "")[1]
    assert replica.telemetry.gpu_utilization == pytest.approx(0.82) and replica.telemetry.queued == 2


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_holder_keeps_last_good_table_and_stamps_apply_time() -> None:
    clock = Clock()
    holder = TableHolder("local", clock=clock)
    seen: list[int] = []
    holder.on_applied(lambda t: seen.append(t.version))
    assert holder.table is None and holder.version == 0 and holder.age() == math.inf
    holder.apply(snapshot(1, [route("r1", "h:1")]))
    clock.now = 103.5
    assert holder.age() == pytest.approx(3.5)
    with pytest.raises(TableRejected):
        holder.apply(snapshot(2, [route("r1", "h:1"), route("r1", "h:2")]))
    assert holder.version == 1 and seen == [1]
    assert holder.table is not None and holder.table.applied_at == 100.0
    holder.apply(snapshot(0 + 3, [route("r2", "h:2")]))
    assert holder.version == 3 and seen == [1, 3] and holder.age() == 0.0


def test_lower_version_is_followed() -> None:
    # Versions are opaque: a restarted control plane may start lower; the proxy follows it.
    holder = TableHolder("local", clock=Clock())
    holder.apply(snapshot(9, [route("r1", "h:1")]))
    holder.apply(snapshot(4, [route("r2", "h:2")]))
    assert holder.version == 4


def _canary(weights: list[tuple[str, float]], versions: tuple[str, ...] = ("v1", "v2")) -> Any:
    routes = [route(f"r-{v}", f"h:{i + 1}", version=v) for i, v in enumerate(versions)]
    snap = snapshot(3, routes)
    snap.models[0].version_weights.extend(tables_pb2.VersionWeight(version=v, weight=w) for v, w in weights)
    return build_table(snap, region="local", applied_at=0.0)


CANARY = [
    # id, weights, draws u -> expected versions
    ("no-weights-default-only", [], [0.0, 0.5, 0.99], ["v1", "v1", "v1"]),
    ("ninety-ten", [("v1", 9.0), ("v2", 1.0)], [0.0, 0.89, 0.9, 0.99], ["v1", "v1", "v2", "v2"]),
    ("all-canary", [("v2", 1.0)], [0.0, 0.99], ["v2", "v2"]),
    ("weighted-version-without-replicas-drops-out", [("v1", 1.0), ("v3", 9.0)], [0.0, 0.99], ["v1", "v1"]),
    ("zero-weights-mean-default", [("v1", 0.0), ("v2", 0.0)], [0.5], ["v1"]),
]


@pytest.mark.parametrize(("weights", "draws", "expect"), [c[1:] for c in CANARY], ids=[c[0] for c in CANARY])
def test_canary_split_by_version_weights(weights, draws: list[float], expect: list[str]) -> None:
    table = _canary(weights)
    got = [table.candidates("m", "", u)[0] for u in draws]
    assert got == expect
    for version, u in zip(got, draws, strict=True):
        assert {r.version for r in table.candidates("m", "", u)[1]} == {version}


def test_named_version_ignores_the_split() -> None:
    table = _canary([("v2", 1.0)])
    assert table.candidates("m", "v1", 0.5)[0] == "v1"


def test_ring_is_reused_while_membership_holds_and_rebuilt_when_it_changes() -> None:
    first = build_table(snapshot(1, [route("r1", "h:1"), route("r2", "h:2")]), region="local", applied_at=0.0)
    same = build_table(snapshot(2, [route("r1", "h:1", running=3), route("r2", "h:2")]), region="local",
                       applied_at=1.0, previous=first)
    grown = build_table(snapshot(3, [route("r1", "h:1"), route("r2", "h:2"), route("r3", "h:3")]), region="local",
                        applied_at=2.0, previous=same)
    ring = first.candidates("m", "")[1].ring
    assert same.candidates("m", "")[1].ring is ring
    assert grown.candidates("m", "")[1].ring is not ring and len(grown.candidates("m", "")[1].ring) == 3


def test_loads_are_smoothed_across_tables() -> None:
    params = TableParams(smoothing_seconds=10.0)
    first = build_table(snapshot(1, [route("r1", "h:1", running=0)]), region="local", applied_at=0.0, params=params)
    later = build_table(snapshot(2, [route("r1", "h:1", running=10)]), region="local", applied_at=10.0,
                        params=params, previous=first)
    fresh = build_table(snapshot(2, [route("r1", "h:1", running=10)]), region="local", applied_at=10.0,
                        params=params)
    assert later.candidates("m", "")[1][0].smoothed == pytest.approx(10 * (1 - math.exp(-1)))
    assert fresh.candidates("m", "")[1][0].smoothed == 10


def test_ring_parameters_come_from_the_snapshot_else_the_proxy() -> None:
    snap = snapshot(1, [route("r1", "h:1")])
    assert build_table(snap, region="local", applied_at=0.0, params=TableParams(load_factor=1.5)).load_factor == 1.5
    snap.ring.load_factor, snap.ring.vnodes = 2.0, 16
    table = build_table(snap, region="local", applied_at=0.0, params=TableParams(load_factor=1.5))
    assert (table.load_factor, table.vnodes) == (2.0, 16)
