"""Cold start: the pure sizing and decision table by table, the table's warming versions, and the proxy's answers."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import grpc
import pytest

from dataplane.admission.coldstart import expected_ready, find, wait_seconds
from dataplane.table.local import TableRejected, build_table
from dataplane.table.warming import Warming, carry
from ferry.v1 import common_pb2, tables_pb2
from tests.dataplane.conftest import PAID, request
from tests.dataplane.fakes import Behaviour, route, snapshot

# -- the pure parts

CARRY = [
    # id, previous, current (version -> replicas), now, expected
    ("new", {}, {"v2": 2}, 10.0, {"v2": Warming(2, 10.0)}),
    ("kept-start", {"v2": Warming(1, 4.0)}, {"v2": 3}, 10.0, {"v2": Warming(3, 4.0)}),
    ("gone", {"v2": Warming(1, 4.0)}, {}, 10.0, {}),
    ("back-again-restarts", {"v3": Warming(1, 4.0)}, {"v2": 1}, 10.0, {"v2": Warming(1, 10.0)}),
]


@pytest.mark.parametrize(("previous", "current", "now", "expected"), [c[1:] for c in CARRY],
                         ids=[c[0] for c in CARRY])
def test_carry(previous: dict[str, Warming], current: dict[str, int], now: float,
               expected: dict[str, Warming]) -> None:
    assert carry(previous, current, now) == expected


EXPECTED = [
    # id, warming since, now, warm-up, floor, seconds expected
    ("just-started", 100.0, 100.0, 30.0, 1.0, 30.0),
    ("half-way", 100.0, 115.0, 30.0, 1.0, 15.0),
    ("overdue-gets-the-floor", 100.0, 200.0, 30.0, 1.0, 1.0),
    ("clock-behind", 100.0, 90.0, 30.0, 1.0, 30.0),
    ("infinite-warmup", 100.0, 100.0, math.inf, 2.0, 2.0),
]


@pytest.mark.parametrize(("since", "now", "warmup", "floor", "seconds"), [c[1:] for c in EXPECTED],
                         ids=[c[0] for c in EXPECTED])
def test_expected_ready(since: float, now: float, warmup: float, floor: float, seconds: float) -> None:
    assert expected_ready(Warming(1, since), now, warmup_seconds=warmup, floor=floor) == pytest.approx(seconds)


WAITS = [
    # id, expected warm-up left, tier queue timeout, deadline left, seconds to wait (0: refuse)
    ("interactive-refuses", 30.0, 2.0, 300.0, 0.0),
    ("standard-refuses-a-long-warmup", 30.0, 10.0, 300.0, 0.0),
    ("standard-waits-a-short-one", 5.0, 10.0, 300.0, 10.0),
    ("batch-waits", 30.0, 60.0, 300.0, 60.0),
    ("deadline-bounds-the-wait", 30.0, 60.0, 40.0, 39.95),
    ("deadline-too-short", 30.0, 60.0, 20.0, 0.0),
    ("deadline-passed", 1.0, 60.0, 0.0, 0.0),
    ("no-queue", 1.0, 0.0, 300.0, 0.0),
]


@pytest.mark.parametrize(("expected", "timeout", "deadline", "wait"), [c[1:] for c in WAITS],
                         ids=[c[0] for c in WAITS])
def test_wait_seconds(expected: float, timeout: float, deadline: float, wait: float) -> None:
    assert wait_seconds(expected, queue_timeout=timeout, deadline_left=deadline, margin=0.05) == pytest.approx(wait)


def test_find_names_the_version_or_the_longest_warming() -> None:
    warming = {"v2": Warming(1, 5.0), "v3": Warming(2, 3.0)}
    assert find(warming, "v2") == Warming(1, 5.0)
    assert find(warming, "v4") is None
    assert find(warming, "") == Warming(2, 3.0)
    assert find({}, "") is None


# -- the table


def warming_snapshot(version: int, routes: list[Any], *, warming: dict[str, int], default_version: str = "v1") -> Any:
    snap = snapshot(version, routes, default_version=default_version, extra_models=("empty",))
    for v, n in warming.items():
        snap.models[0].warming.append(tables_pb2.WarmingVersion(version=v, replicas=n))
    return snap


def test_a_warming_version_gets_an_empty_pool_and_keeps_its_start() -> None:
    first = build_table(warming_snapshot(1, [route("r1", "10.0.0.1:1")], warming={"v2": 2}), region="local",
                        applied_at=100.0)
    version, pool = first.candidates("m", "v2")
    assert version == "v2" and not pool.replicas
    assert first.models["m"].warming == {"v2": Warming(2, 100.0)}
    second = build_table(warming_snapshot(2, [route("r1", "10.0.0.1:1")], warming={"v2": 1}), region="local",
                         applied_at=105.0, previous=first)
    assert second.models["m"].warming == {"v2": Warming(1, 100.0)}
    with pytest.raises(Exception, match="version 'm:v3' not found"):
        second.candidates("m", "v3")


@pytest.mark.parametrize("warming", [[""], ["v2", "v2"]], ids=["unnamed", "twice"])
def test_a_bad_warming_entry_rejects_the_table(warming: list[str]) -> None:
    snap = snapshot(1, [route("r1", "10.0.0.1:1")])
    for v in warming:
        snap.models[0].warming.append(tables_pb2.WarmingVersion(version=v, replicas=1))
    with pytest.raises(TableRejected, match="warming entry"):
        build_table(snap, region="local", applied_at=1.0)


# -- the proxy


async def push_and_apply(r: Any, snap: Any) -> None:
    r.cp.push(snap)
    while True:
        ack = await r.cp.next_ack()
        if ack.version == snap.version:
            assert ack.applied, ack.error
            return


async def test_a_warming_version_is_refused_with_a_retry_after_naming_it(rig) -> None:
    r = await rig({"r1": Behaviour()}, settings={"coldstart_warmup_seconds": 20.0})
    await push_and_apply(r, warming_snapshot(2, [route(r.replicas["r1"])], warming={"v2": 1}))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await r.stub.Infer(request(version="v2"), metadata=PAID, timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "'v2' is warming up" in (info.value.details() or "")
    retry = float(dict(info.value.trailing_metadata())["retry-after"])
    assert 19.0 <= retry <= 20.0
    assert r.served() == {"r1": 0}  # nothing went to the ready v1 replica instead
    reply = await r.stub.Infer(request(), metadata=PAID, timeout=5)  # naming no version: v1 serves
    assert reply.model_version == "v1"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await r.stub.Infer(request(version="v9"), metadata=PAID, timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_model_whose_default_version_warms_is_refused_too(rig) -> None:
    r = await rig({"r1": Behaviour()}, settings={"coldstart_warmup_seconds": 20.0})
    await push_and_apply(r, warming_snapshot(2, [route(r.replicas["r1"])], warming={"v2": 1},
                                             default_version="v2"))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await r.stub.InferStream(request(), metadata=PAID, timeout=5).read()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "'v2' is warming up" in (info.value.details() or "")
    assert "retry-after" in dict(info.value.trailing_metadata())


@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "stream"])
async def test_a_batch_request_waits_for_the_warming_version(rig, streaming: bool) -> None:
    r = await rig({"r1": Behaviour(), "r2": Behaviour()}, settings={"coldstart_warmup_seconds": 5.0})
    r1, r2 = r.replicas["r1"], r.replicas["r2"]
    await push_and_apply(r, warming_snapshot(2, [route(r1)], warming={"v2": 1}))
    call = request(version="v2", tier=common_pb2.TIER_BATCH)
    if streaming:
        async def run() -> Any:
            return [c async for c in r.stub.InferStream(call, metadata=PAID, timeout=10)][-1].summary
        pending = asyncio.ensure_future(run())
    else:
        pending = asyncio.ensure_future(r.stub.Infer(call, metadata=PAID, timeout=10))
    await asyncio.sleep(0.2)
    assert not pending.done() and r.served() == {"r1": 0, "r2": 0}  # waiting, not sent to v1
    await push_and_apply(r, warming_snapshot(3, [route(r1), route(r2, version="v2", node="n2")], warming={}))
    reply = await asyncio.wait_for(pending, 5)
    assert (reply.replica_id, reply.model_version) == ("r2", "v2")


async def test_a_wait_that_runs_out_ends_unavailable_with_a_retry_after(rig) -> None:
    settings = {"coldstart_warmup_seconds": 0.2, "retry_after_seconds": 0.1, "queue_timeouts": (2.0, 10.0, 0.3)}
    r = await rig({"r1": Behaviour()}, settings=settings)
    await push_and_apply(r, warming_snapshot(2, [route(r.replicas["r1"])], warming={"v2": 1}))
    started = asyncio.get_running_loop().time()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await r.stub.Infer(request(version="v2", tier=common_pb2.TIER_BATCH), metadata=PAID, timeout=5)
    assert 0.25 <= asyncio.get_running_loop().time() - started < 3.0
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "'v2' is warming up" in (info.value.details() or "")
    assert float(dict(info.value.trailing_metadata())["retry-after"]) == 0.1  # the floor: overdue
