"""Table deltas: computed by the control plane, applied by the one shared function, equal to full snapshots."""

from __future__ import annotations

import asyncio
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.tables.delta import TABLE_FIELDS, table_delta
from controlplane.tables.feed import Feed, stamp
from ferry.tabledelta import DeltaMismatch, apply_delta
from ferry.v1 import common_pb2, tables_pb2

NODES = ("n1", "n2", "n3")
REPLICAS = tuple(f"r{i}" for i in range(8))
MODELS = ("alpha", "beta", "gamma")
AGES = (0.0, 0.5, 1.25, 7.0)


@st.composite
def replica(draw: Any, rid: str, node_age: dict[str, float]) -> tables_pb2.ReplicaRoute:
    node = draw(st.sampled_from(NODES))
    route = tables_pb2.ReplicaRoute(
        replica_id=rid, node=node, region="local", version=draw(st.sampled_from(("v1", "v2"))),
        address=draw(st.sampled_from(("10.0.0.1:9000", "10.0.0.2:9000"))),
        http_address=draw(st.sampled_from(("", "10.0.0.1:8000", "10.0.0.2:8000"))),
        max_concurrency=draw(st.sampled_from((8, 60))),
        inputs=draw(st.sampled_from(((), ("text",), ("text", "temperature")))),
        # replicas of a node mostly share the node's age (its last telemetry); now and then one differs
        telemetry_age_seconds=draw(st.sampled_from((node_age[node],) * 4 + AGES)),
    )
    if draw(st.integers(0, 5)):  # a load, mostly
        route.load.CopyFrom(common_pb2.ReplicaLoad(replica_id=rid, state=common_pb2.REPLICA_STATE_READY,
                                                   queued=draw(st.integers(0, 2)), running=draw(st.integers(0, 2))))
    return route


@st.composite
def model(draw: Any, name: str, node_age: dict[str, float], region_ids: list[str]) -> tables_pb2.ModelRoute:
    route = tables_pb2.ModelRoute(model=name, default_version=draw(st.sampled_from(("", "v1", "v2"))))
    for rid in sorted(draw(st.sets(st.sampled_from(region_ids)))):
        route.replicas.append(draw(replica(f"{name}-{rid}", node_age)))
    if draw(st.booleans()):
        route.version_weights.append(tables_pb2.VersionWeight(version="v2", weight=draw(st.sampled_from((0.1, 0.5)))))
    if draw(st.booleans()):
        route.warming.append(tables_pb2.WarmingVersion(version="v3", replicas=draw(st.integers(1, 2))))
    return route


@st.composite
def table(draw: Any, version: int) -> tables_pb2.TableSnapshot:
    node_age = {n: draw(st.sampled_from(AGES)) for n in NODES}
    snap = tables_pb2.TableSnapshot(version=version, region="local", computed_at=float(version))
    for name in sorted(draw(st.sets(st.sampled_from(MODELS)))):
        snap.models.append(draw(model(name, node_age, list(REPLICAS))))
    if draw(st.booleans()):
        snap.ring.CopyFrom(tables_pb2.RingParams(load_factor=draw(st.sampled_from((0.0, 1.25))), vnodes=40))
    for tier in draw(st.sampled_from(((), ("interactive", "standard", "batch")))):
        snap.tier_quotas.append(tables_pb2.TierQuota(tier=tier, reserved_share=draw(st.sampled_from((0.1, 0.7))),
                                                     quota_slots=draw(st.integers(0, 3))))
    for region in sorted(draw(st.sets(st.sampled_from(("east", "west"))))):
        spill = tables_pb2.SpillRoute(region=region, weight=draw(st.sampled_from((0.0, 0.2))), rtt_ms=20,
                                      batch_only=draw(st.booleans()))
        for name in sorted(draw(st.sets(st.sampled_from(MODELS), min_size=1))):
            spill.models.append(draw(model(name, node_age, [f"{region}-{r}" for r in REPLICAS[:3]])))
        snap.spill.append(spill)
    for name in sorted(draw(st.sets(st.sampled_from(("t1", "t2", "t3"))))):
        snap.tenants.append(tables_pb2.TenantRoute(name=name, api_key_sha256="a" * 64,
                                                   plan=draw(st.sampled_from(("free", "paid"))), tiers=["standard"]))
    snap.tenants_managed = draw(st.booleans())
    return snap


@st.composite
def histories(draw: Any) -> list[tables_pb2.TableSnapshot]:
    """A sequence of versions of one region's table, each drawn afresh from a small universe (so that
    replicas, models, spill routes and tenants come, go, change, or only move their loads or ages)."""
    count = draw(st.integers(2, 5))
    return [draw(table(version=100 + i)) for i in range(count)]


def wire(message: tables_pb2.TableSnapshot, nonce: str) -> tables_pb2.TableSnapshot:
    """The message as a proxy parses it: serialized once, the nonce appended to the bytes."""
    return tables_pb2.TableSnapshot.FromString(stamp(message.SerializeToString(), nonce))


@settings(max_examples=150, deadline=None)
@given(histories())
def test_deltas_from_a_base_give_the_full_snapshot_of_the_final_state(history: list[tables_pb2.TableSnapshot]) -> None:
    held = history[0]
    for i, (old, new) in enumerate(pairwise(history)):
        delta = table_delta(old, new)
        assert delta is not None
        assert delta.delta.base_version == old.version
        held = apply_delta(held, wire(delta, f"n{i}"))
    final = tables_pb2.TableSnapshot()
    final.CopyFrom(history[-1])
    final.nonce = f"n{len(history) - 2}"
    assert held == final
    assert held.SerializeToString(deterministic=True) == final.SerializeToString(deterministic=True)


@settings(max_examples=60, deadline=None)
@given(histories())
def test_the_feed_chains_deltas_over_skipped_versions_to_the_same_table(
        history: list[tables_pb2.TableSnapshot]) -> None:
    feed = Feed(keep=8)
    pushes = [feed.publish(s) for s in history]
    chain = feed.chain(history[0].version, pushes[-1], compute=True)
    if chain is None:  # the deltas weigh more than the table: it goes in full, and that is the same table
        assert tables_pb2.TableSnapshot.FromString(pushes[-1].full()) == history[-1]
        return
    held = history[0]
    for push in chain:  # as a watcher sends them: a delta no smaller than its table goes in full
        raw = push.delta()
        full = tables_pb2.TableSnapshot.FromString(push.full())
        held = apply_delta(held, tables_pb2.TableSnapshot.FromString(raw)) if raw is not None else full
    assert held == history[-1]


def _route(rid: str, node: str, age: float, queued: int = 0) -> tables_pb2.ReplicaRoute:
    return tables_pb2.ReplicaRoute(replica_id=rid, node=node, region="local", version="v1", address="10.0.0.1:1",
                                   load=common_pb2.ReplicaLoad(replica_id=rid, queued=queued),
                                   telemetry_age_seconds=age)


def _table(version: int, *routes: tables_pb2.ReplicaRoute) -> tables_pb2.TableSnapshot:
    return tables_pb2.TableSnapshot(version=version, region="local", computed_at=version,
                                    models=[tables_pb2.ModelRoute(model="m", replicas=list(routes))])


def test_telemetry_alone_travels_as_node_ages_and_load_updates() -> None:
    old = _table(1, *[_route(f"r{i}", f"n{i // 4}", 0.2) for i in range(8)])
    new = _table(2, *[_route(f"r{i}", f"n{i // 4}", 0.7, queued=3 if i == 5 else 0) for i in range(8)])
    delta = table_delta(old, new)
    assert delta is not None
    (changes,) = delta.delta.models
    assert not changes.replicas and not changes.removed_replicas and not changes.HasField("route")
    assert [(u.replica_id, u.load.queued) for u in changes.loads] == [("r5", 3)]
    assert sorted((a.node, a.telemetry_age_seconds) for a in delta.delta.ages) == [("n0", 0.7), ("n1", 0.7)]
    assert apply_delta(old, delta) == new


def test_a_drain_is_one_removed_replica() -> None:
    routes = [_route(f"r{i}", "n0", 0.2) for i in range(4)]
    old, new = _table(1, *routes), _table(2, *routes[:2], *routes[3:])
    delta = table_delta(old, new)
    assert delta is not None
    assert [(m.model, list(m.removed_replicas), len(m.replicas), len(m.loads)) for m in delta.delta.models] == [
        ("m", ["r2"], 0, 0)]
    assert not delta.delta.ages
    assert delta.ByteSize() < new.ByteSize() / 2


def test_a_table_out_of_key_order_goes_in_full() -> None:
    old = _table(1, _route("r1", "n0", 0.0), _route("r2", "n0", 0.0))
    assert table_delta(old, _table(2, _route("r2", "n0", 0.0), _route("r1", "n0", 0.0))) is None
    assert table_delta(old, tables_pb2.TableSnapshot(version=2, region="elsewhere")) is None


@pytest.mark.parametrize(("base_version", "delta", "reason"), [
    (1, tables_pb2.TableDelta(base_version=7), "from version 7, the table held is version 1"),
    (1, tables_pb2.TableDelta(base_version=1, models=[tables_pb2.ModelDelta(model="m", removed_replicas=["zz"])]),
     "replica 'zz' to remove"),
    (1, tables_pb2.TableDelta(base_version=1, models=[tables_pb2.ModelDelta(
        model="m", loads=[tables_pb2.LoadUpdate(replica_id="zz")])]), "load of replica 'zz'"),
    (1, tables_pb2.TableDelta(base_version=1, models=[tables_pb2.ModelDelta(model="new")]), "has no route"),
    (1, tables_pb2.TableDelta(base_version=1, removed_models=["gone"]), "model 'gone' to remove"),
    (1, tables_pb2.TableDelta(base_version=1, models=[tables_pb2.ModelDelta(
        model="m", replicas=[_route("r9", "n0", 0), _route("r8", "n0", 0)])]), "out of key order"),
])
def test_a_delta_that_does_not_fit_the_table_held_is_refused_naming_why(
        base_version: int, delta: tables_pb2.TableDelta, reason: str) -> None:
    base = _table(base_version, _route("r1", "n0", 0.0))
    with pytest.raises(DeltaMismatch) as info:
        apply_delta(base, tables_pb2.TableSnapshot(version=2, region="local", delta=delta))
    assert reason in info.value.reason


def test_every_field_of_a_table_is_carried_by_deltas() -> None:
    assert {f.name for f in tables_pb2.TableSnapshot.DESCRIPTOR.fields} == set(TABLE_FIELDS)


@pytest.mark.parametrize("nonce", ["", "1", "x" * 200, "é" * 100])
def test_a_nonce_appended_to_the_bytes_reads_as_the_nonce(nonce: str) -> None:
    body = _table(3, _route("r1", "n0", 0.5))
    got = tables_pb2.TableSnapshot.FromString(stamp(body.SerializeToString(), nonce))
    assert got.nonce == nonce
    got.nonce = ""
    assert got == body


async def test_watchers_share_one_delta_computation_off_the_event_loop() -> None:
    feed = Feed()
    feed.publish(_table(1, *[_route(f"r{i:02d}", "n0", 0.0) for i in range(20)]))
    push = feed.publish(_table(2, *[_route(f"r{i:02d}", "n0", 0.5) for i in range(19)]))
    first, second = await asyncio.gather(push.delta_async(), push.delta_async())
    assert first is not None and first is second is push.delta()
    got = apply_delta(_table(1, *[_route(f"r{i:02d}", "n0", 0.0) for i in range(20)]),
                      tables_pb2.TableSnapshot.FromString(first))
    assert got == push.snapshot


def test_the_feed_keeps_a_bounded_history_and_sends_in_full_beyond_it() -> None:
    feed = Feed(keep=3)
    pushes = [feed.publish(_table(v, *[_route(f"r{i:02d}", "n0", float(v)) for i in range(20)])) for v in range(1, 6)]
    assert feed.chain(5, pushes[-1]) == []
    assert feed.chain(3, pushes[-1]) is None  # version 4's delta was never needed: in full, not computed for one
    assert not pushes[3].delta_ready
    chain = feed.chain(3, pushes[-1], compute=True) or []
    assert [p.version for p in chain] == [4, 5]
    assert all(p.delta() is not None for p in chain)  # computed as they are sent, once
    assert [p.version for p in feed.chain(3, pushes[-1]) or []] == [4, 5]
    assert feed.chain(1, pushes[-1]) is None  # version 2 is no longer kept
    assert feed.chain(99, pushes[-1]) is None  # never held here
    assert feed.publish(pushes[-1].snapshot) is pushes[-1]  # the same version again: the same push
    feed.drop("local")
    assert feed.current("local") is None
