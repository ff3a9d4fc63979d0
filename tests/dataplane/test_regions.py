"""Region spill at the proxy: the table's spill routes send a share of interactive work to another region."""

from __future__ import annotations

import asyncio
import random

import pytest

from dataplane.regions.choice import SpillTarget
from dataplane.regions.remote import RemoteView, pick_remote, remote_view
from dataplane.table.local import build_table
from dataplane.table.pool import Replica
from ferry.v1 import common_pb2, tables_pb2
from tests.dataplane.conftest import PAID, request
from tests.dataplane.fakes import Behaviour, FakeReplica, route, snapshot

STANDARD = common_pb2.TIER_STANDARD
BATCH = common_pb2.TIER_BATCH


def _with_spill(version: int, local: list[FakeReplica], remote: FakeReplica, weight: float,
                batch_weight: float = 0.0, batch_only: bool = False) -> tables_pb2.TableSnapshot:
    snap = snapshot(version, [route(r) for r in local])
    snap.spill.append(tables_pb2.SpillRoute(region="b", weight=weight, rtt_ms=40.0, batch_weight=batch_weight,
                                            batch_only=batch_only, models=[
        tables_pb2.ModelRoute(model="m", default_version="v1", replicas=[route(remote, region="b", node="nb")])]))
    return snap


@pytest.mark.parametrize(("weight", "tier", "where"),
                         [(1.0, None, "b"), (0.0, None, "local"), (1.0, STANDARD, "local")],
                         ids=["all-spilled", "weight-zero", "standard-stays-home"])
async def test_interactive_work_spills_by_weight_and_is_marked(rig, weight: float, tier: int | None,
                                                               where: str) -> None:
    r = await rig({"r1": Behaviour()})
    remote = await FakeReplica("b1").start()
    try:
        r.cp.push(_with_spill(2, list(r.replicas.values()), remote, weight))
        assert (await r.cp.next_ack()).applied
        extra = {"tier": tier} if tier is not None else {}
        replies = [await r.stub.Infer(request(**extra), metadata=PAID, timeout=5) for _ in range(5)]
    finally:
        await remote.stop()
    assert {reply.region for reply in replies} == {where}
    assert {reply.replica_id for reply in replies} == ({"b1"} if where == "b" else {"r1"})
    assert r.proxy is not None
    assert r.proxy.metrics.value("proxy_spilled_total", **{"from": "local", "to": "b"}) == (5 if where == "b" else 0)


@pytest.mark.parametrize(("weight", "batch_weight", "batch_only", "tier", "where"),
                         [(0.0, 1.0, True, BATCH, "b"), (1.0, 1.0, True, None, "local"),
                          (0.0, 0.0, False, BATCH, "local"), (0.0, 1.0, False, STANDARD, "local")],
                         ids=["batch-goes", "batch-only-route-keeps-interactive", "batch-weight-zero",
                              "standard-stays"])
async def test_batch_work_spills_by_its_own_weight(rig, weight: float, batch_weight: float, batch_only: bool,
                                                   tier: int | None, where: str) -> None:
    r = await rig({"r1": Behaviour()})
    remote = await FakeReplica("b1").start()
    try:
        r.cp.push(_with_spill(2, list(r.replicas.values()), remote, weight, batch_weight, batch_only))
        assert (await r.cp.next_ack()).applied
        extra = {"tier": tier} if tier is not None else {}
        replies = [await r.stub.Infer(request(**extra), metadata=PAID, timeout=5) for _ in range(5)]
    finally:
        await remote.stop()
    assert {reply.region for reply in replies} == {where}


def test_remote_view_carries_the_batch_weights_and_zeroes_a_batch_only_routes_interactive_weight() -> None:
    snap = snapshot(1, [])
    snap.spill.append(tables_pb2.SpillRoute(region="c", weight=0.5, rtt_ms=200.0, batch_weight=0.3, batch_only=True))
    snap.spill.append(tables_pb2.SpillRoute(region="d", weight=0.1, rtt_ms=20.0, batch_weight=1.5))  # malformed
    view = remote_view(build_table(snap, region=snap.region, applied_at=0.0))
    assert view.targets == (SpillTarget("c", 0.0, 200.0, batch_weight=0.3, batch_only=True),)


@pytest.mark.parametrize(("loads", "excluded", "expected"),
                         [({"x": 0, "y": 50}, (), "x"), ({"x": 50, "y": 0}, (), "y"), ({"x": 0, "y": 0}, ("x",), "y"),
                          ({"x": 0, "y": 0}, ("x", "y"), None)],
                         ids=["x-idle", "y-idle", "x-excluded", "none-left"])
def test_pick_remote_takes_the_less_loaded_of_two(loads: dict[str, int], excluded: tuple[str, ...],
                                                  expected: str | None) -> None:
    replicas = tuple(Replica(replica_id=rid, address="127.0.0.1:1", kserve_model="m", version="v1",
                             max_concurrency=60, queued=q) for rid, q in loads.items())
    got = pick_remote(replicas, {}, random.Random(1), set(excluded))
    assert (got.replica_id if got else None) == expected


def test_rooms_count_the_targets_slots_less_the_others_load_and_this_proxys_in_flight() -> None:
    def replica(rid: str, running: int, queued: int = 0) -> Replica:
        return Replica(replica_id=rid, address="127.0.0.1:1", kserve_model="m", version="v1", max_concurrency=8,
                       running=running, queued=queued)

    view = RemoteView(targets=(SpillTarget("b", 0.2, 40.0),),
                      replicas={("b", "m"): (replica("b0", 8, 2), replica("b1", 4)), ("b", "other"): ()})
    # 16 slots; pushed 14, of which this proxy's 3 when the table came: others 11; in flight now 5.
    assert view.rooms("m", {"b0": 3, "b1": 2}, {"b0": 3}, headroom=1.0) == {"b": pytest.approx(16 - 11 - 5)}
    assert view.rooms("m", {}, {}, headroom=1.25) == {"b": pytest.approx(20 - 14)}
    assert view.rooms("other", {}, {}) == {} and view.usable("m") == frozenset({"b"})


async def test_a_request_that_would_queue_at_home_spills_on_queue_even_at_weight_zero(rig) -> None:
    r = await rig({"r1": Behaviour(delay=0.3)})
    remote = await FakeReplica("b1").start()
    try:
        snap = _with_spill(2, [], remote, 0.0)
        snap.models[0].replicas.append(route(r.replicas["r1"], max_concurrency=1))  # one slot at home
        r.cp.push(snap)
        assert (await r.cp.next_ack()).applied
        first = asyncio.ensure_future(r.stub.Infer(request(), metadata=PAID, timeout=5))
        await asyncio.sleep(0.05)  # it runs at home; the next ones would wait behind it
        others = [await r.stub.Infer(request(), metadata=PAID, timeout=5) for _ in range(3)]
        replies = [await first, *others]
    finally:
        await remote.stop()
    assert [reply.region for reply in replies] == ["local", "b", "b", "b"]
    assert r.proxy is not None
    assert r.proxy.metrics.value("proxy_spilled_total", **{"from": "local", "to": "b"}) == 3
