"""Noisy-neighbour placement, table by table: shards of whole replicas, keep-off sets, the tier queues, the pick.

(dataplane.admission.sharding.plan and Shards, TierQueues heavy tenants and confined
ceilings, route's soft ``avoid`` filter, the tier simulator, and a proxy with
fake replicas keeping a heavy tenant on its shard and the others off it.)
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter

import grpc
import pytest

from agent.replica.engine import EngineParams
from dataplane.admission.avoid import Placement
from dataplane.admission.queues import QueueParams, Ticket, TierQueues
from dataplane.admission.sharding import NONE, plan, rendezvous
from dataplane.pick.decide import Ask, Local, Routing, decide, make_view
from dataplane.pick.p2c import Branch, LocalLoad, Need
from dataplane.table.local import build_table
from dataplane.table.pool import Pool
from ferry.v1 import common_pb2, inference_pb2
from tests.dataplane.conftest import KEYS, PAID, Rig, request
from tests.dataplane.fakes import Behaviour, parse, snapshot
from tests.dataplane.fakes import route as fake_route
from tools.sim.tiers import Req, TierSim

EIGHT = {f"r{i}": 60 for i in range(8)}


@pytest.mark.parametrize(("heavy", "replicas", "max_share", "sizes"), [
    ({}, EIGHT, 0.5, {}),                                       # nobody heavy: nothing confined
    ({"noisy": 96}, EIGHT, 0.5, {"noisy": 1}),                  # a fifth of 480: one whole replica, rounded down
    ({"noisy": 130}, EIGHT, 0.5, {"noisy": 2}),
    ({"small": 50}, EIGHT, 0.5, {}),                            # under one replica: its ceiling already bounds it
    ({"big": 400}, EIGHT, 0.5, {"big": 4}),                     # at most half the replicas
    ({"a": 120, "b": 120, "c": 120}, EIGHT, 0.5, {"a": 2, "b": 2}),  # the budget runs out in order
    ({"a": 130, "b": 60}, EIGHT, 0.5, {"a": 2, "b": 1}),
    ({"noisy": 96}, EIGHT, 0.0, {}),                            # off
    ({"noisy": 96}, {}, 0.5, {}),                               # no replicas
    ({"noisy": 100}, {"r0": 40, "r1": 40, "r2": 80, "r3": 80}, 0.5, None),  # sizes differ: slots fit under 100
], ids=["none", "one-replica", "two-replicas", "under-one", "budget", "budget-order", "two-tenants", "off",
        "no-replicas", "mixed-sizes"])
def test_plan(heavy: dict[str, int], replicas: dict[str, int], max_share: float, sizes: dict[str, int] | None) -> None:
    shards = plan(heavy, replicas, max_share)
    if sizes is not None:
        assert {t: len(s) for t, s in shards.shards.items()} == sizes
    for tenant, shard in shards.shards.items():
        assert 0 < shards.slots[tenant] == sum(replicas[r] for r in shard) <= heavy[tenant]
        assert shards.ceiling(tenant, heavy[tenant]) == shards.slots[tenant]
    taken = [r for shard in shards.shards.values() for r in shard]
    assert len(taken) == len(set(taken))  # disjoint
    assert len(taken) <= max_share * len(replicas)


def test_keep_off_sets() -> None:
    shards = plan({"noisy": 130}, EIGHT)
    mine = shards.shards["noisy"]
    assert shards.keep_off("noisy") == frozenset(EIGHT) - mine  # the heavy tenant stays on its shard
    assert shards.keep_off("t0") == mine                        # the others stay off it
    assert shards.ceiling("t0", 96) == 96 and shards.ceiling("noisy", 130) == 120
    assert NONE.keep_off("anyone") == frozenset() and NONE.ceiling("anyone", 7) == 7


def test_rendezvous_moves_a_shard_only_when_its_own_replica_goes() -> None:
    ids = [f"r{i}" for i in range(16)]
    order = rendezvous("noisy", ids)
    assert sorted(order) == sorted(ids) and rendezvous("noisy", list(reversed(ids))) == order
    before = plan({"noisy": 120}, dict.fromkeys(ids, 60)).shards["noisy"]
    gone = next(r for r in ids if r not in before)
    after = plan({"noisy": 120}, {r: 60 for r in ids if r != gone}).shards["noisy"]
    assert after == before
    lost = sorted(before)[0]
    moved = plan({"noisy": 120}, {r: 60 for r in ids if r != lost}).shards["noisy"]
    assert len(moved & before) == 1 and lost not in moved


def _ticket(tenant: str, tier: str = "standard") -> Ticket:
    return Ticket(tenant=tenant, plan="paid", tier=tier, cost=100, deadline=1e9)


@pytest.mark.parametrize(("waiting", "kw", "confined"), [
    ({"noisy": 60, "t0": 2}, {}, {"noisy": 1}),              # ceiling 0.25 x 32 / 2 = 4: one replica of 4
    ({"noisy": 60}, {}, {}),                                  # alone in its tier: not a neighbour problem
    ({"noisy": 60, "t0": 2}, {"tenant_ceiling": 0.0}, {}),    # no ceilings, no heavy tenants
    ({"noisy": 60, "t0": 2}, {"shard_max_share": 0.0}, {}),   # confinement off
    ({"noisy": 3, "t0": 2}, {}, {}),                          # within its share: nothing waits above it
], ids=["heavy", "alone", "no-ceiling", "off", "within-share"])
def test_tier_queues_confine_heavy_tenants(waiting: dict[str, int], kw: dict[str, float],
                                          confined: dict[str, int]) -> None:
    q = TierQueues(QueueParams(max_queued=1000, quantum=100, tenant_ceiling=kw.get("tenant_ceiling", 0.25),
                               shard_max_share=kw.get("shard_max_share", 0.5)), capacity=32)
    q.set_replicas({f"r{i}": 4 for i in range(8)})
    for tenant, n in waiting.items():
        for _ in range(n):
            q.offer(_ticket(tenant), 0.0)
    q.dispatch(0.0)
    assert {t: len(s) for t, s in q.shards.shards.items()} == confined
    if confined:
        # the light tenant keeps off the shard, the heavy one off everything else
        assert q.placement.shards.keep_off("t0") == q.shards.shards["noisy"]
        assert len(q.placement.shards.keep_off("noisy")) == 7


def test_confined_ceiling_and_hold() -> None:
    q = TierQueues(QueueParams(max_queued=1000, quantum=100, tenant_ceiling=1.0, shard_hold_seconds=1.0),
                   capacity=24)
    q.set_replicas({f"r{i}": 4 for i in range(6)})
    for _ in range(40):
        q.offer(_ticket("noisy"), 0.0)
    light = [_ticket("t0") for _ in range(2)]
    for t in light:
        q.offer(t, 0.0)
    started = q.dispatch(0.0)
    assert Counter(t.tenant for t in started) == {"noisy": 12, "t0": 2}  # fair share of 24 between two
    assert q.shards.slots == {"noisy": 12}                                # three whole replicas of 4
    for t in started:
        q.finish(t)
    again = q.dispatch(0.5)
    assert Counter(t.tenant for t in again) == {"noisy": 12}  # t0 is gone: noisy alone, but held to its shard
    assert q.shards.slots == {"noisy": 12}                    # still heavy within the hold
    for t in again:
        q.finish(t)
    for t in q.dispatch(2.0):  # alone in its tier for more than the hold: released
        q.finish(t)
    assert q.shards is NONE


def test_shard_moves_when_its_replica_leaves_the_table() -> None:
    q = TierQueues(QueueParams(max_queued=1000, quantum=100, tenant_ceiling=0.25), capacity=32)
    replicas = {f"r{i}": 4 for i in range(8)}
    q.set_replicas(replicas)
    for tenant, n in (("noisy", 60), ("t0", 2)):
        for _ in range(n):
            q.offer(_ticket(tenant), 0.0)
    q.dispatch(0.0)
    (gone,) = q.shards.shards["noisy"]
    q.set_replicas({r: n for r, n in replicas.items() if r != gone})  # the table no longer lists it
    q.dispatch(0.1)
    (now,) = q.shards.shards["noisy"]
    assert now != gone and now in replicas
    assert gone not in q.placement.shards.keep_off("noisy")  # nor kept: it is not a candidate any more


_VIEW = make_view(build_table(snapshot(1, []), region="local", applied_at=0.0))


def _pool(n: int) -> Pool:
    snap = snapshot(1, [fake_route(f"r{i}", f"127.0.0.1:{1000 + i}", max_concurrency=4) for i in range(n)])
    return build_table(snap, region="local", applied_at=0.0).models["m"].default


@pytest.mark.parametrize(("key", "avoid", "allowed", "excluded"), [
    (None, {"r0", "r1", "r2"}, {"r3"}, set()),                # P2C among what is left
    (None, {"r0"}, {"r1", "r2", "r3"}, set()),
    (12345, {"r0", "r1", "r2"}, {"r3"}, set()),               # the ring walk skips avoided replicas
    (None, {"r0", "r1", "r2", "r3"}, {"r0", "r1", "r2", "r3"}, set()),  # nothing left: the filter is ignored
    (None, {"r1", "r2", "r3"}, {"r1", "r2", "r3"}, {"r0"}),  # its shard failed: the retry goes outside it
    (12345, {"r0", "r1"}, {"r2"}, {"r3"}),                  # a retry: what is left and not tried
], ids=["p2c-one-left", "p2c", "ring", "all-avoided", "shard-failed", "retry"])
def test_route_keeps_off_avoided_replicas(key: int | None, avoid: set[str], allowed: set[str],
                                          excluded: set[str]) -> None:
    pool = _pool(4)
    rng = random.Random(3)
    chosen = set()
    for k in range(200):
        ask = Ask(routing=Routing("v1", pool, None if key is None else key + k, Need(10, 5)),
                  avoid=frozenset(avoid), tried=frozenset(excluded))
        decision = decide(_VIEW, ask, Local(LocalLoad()), rng, 0.0)
        assert decision.replica is not None and decision.branch is not Branch.NONE
        chosen.add(decision.replica.replica_id)
    assert chosen <= allowed


def test_simulated_noisy_tenant_stays_on_its_shard() -> None:
    reqs = [Req(rid=i, arrival=i * 0.01, tier="standard", tenant=f"t{i % 4}", max_tokens=32) for i in range(400)]
    reqs += [Req(rid=1000 + i, arrival=i * 0.002, tier="standard", tenant="noisy", max_tokens=32)
             for i in range(2000)]
    sim = TierSim(replicas=8, engine=EngineParams(max_running=16), queues=QueueParams())
    placed: dict[str, Counter[int]] = {"noisy": Counter(), "others": Counter()}
    send = sim._send

    def spy(rid: int, ticket: Ticket, now: float) -> None:
        send(rid, ticket, now)
        where = sim._where.get(rid)
        if where is not None and 0.5 < now < 4.0:  # after the first dispatches, while the others send
            placed["noisy" if ticket.tenant == "noisy" else "others"][where] += 1

    sim._send = spy  # type: ignore[method-assign]
    sim.run(reqs, 30.0)
    assert len(placed["noisy"]) == 1                      # a fifth of 128 slots: one replica of 16
    assert not set(placed["noisy"]) & set(placed["others"])  # the others never share it
    assert all(o.ttft is not None for o in sim.outcomes.values() if o.req.tenant != "noisy")
    assert sim.queues.shards is NONE  # alone once the others stop: released after the hold, free to spread


async def test_proxy_keeps_a_heavy_tenant_on_its_shard_and_the_others_off_it(
        caplog: pytest.LogCaptureFixture) -> None:
    """Four fake replicas of two slots; the free tenant floods, the paid one keeps sending."""
    caplog.set_level(logging.INFO, logger="ferry.proxy")
    rig = Rig()
    behaviours = {f"r{i}": Behaviour(delay=0.15) for i in range(4)}
    try:
        await rig.start(behaviours, loads={rid: {"max_concurrency": 2} for rid in behaviours})
        assert rig.proxy is not None
        queues = rig.proxy.router.admission.models["m"]

        async def send(key: str, prompt: str) -> None:
            req = inference_pb2.InferRequest(model="m", prompt=prompt, max_tokens=4, tier=common_pb2.TIER_STANDARD)
            await rig.stub.Infer(req, metadata=(("x-api-key", key),), timeout=20)

        first = asyncio.ensure_future(send(KEYS["paid"], "acme-0"))
        await asyncio.sleep(0.02)
        flood = [asyncio.ensure_future(send(KEYS["free"], f"hobby-{k}")) for k in range(10)]
        for _ in range(100):
            if queues.shards.shards:
                break
            await asyncio.sleep(0.01)
        assert set(queues.shards.shards) == {"hobby"}  # free weighs 1 against paid 4: 2 of 8 slots, one replica
        (shard,) = queues.shards.shards["hobby"]
        metrics = rig.proxy.router.admission.metrics
        assert metrics.confined.labels("m")._value.get() == 1
        assert metrics.confined_replicas.labels("m")._value.get() == 1
        assert any('"event": "tenant_confined"' in r.message and f'"hobby": ["{shard}"]' in r.message
                   for r in caplog.records)
        # Every request the proxy has sent so far must have reached its replica before the mark (a signal,
        # not a sleep): one sent just before the shards were planned would otherwise count as a later one.
        def sent() -> float:
            return sum(rig.proxy.metrics.value("proxy_picks_total", model="m", branch=b.value) for b in Branch)

        for _ in range(500):
            if sum(len(r.requests) for r in rig.replicas.values()) >= sent():
                break
            await asyncio.sleep(0.01)
        marked = {rid: len(r.requests) for rid, r in rig.replicas.items()}
        later = [asyncio.ensure_future(send(KEYS["paid"], f"acme-{k}")) for k in range(1, 7)]
        await asyncio.gather(first, *later)  # the paid tenant is always answered
        shed = [r for r in await asyncio.gather(*flood, return_exceptions=True) if r is not None]
        assert all(isinstance(e, grpc.aio.AioRpcError) and e.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                   for e in shed)  # the flood may be shed by its expected wait, never lost
        seen: dict[str, set[str]] = {"hobby": set(), "acme": set()}
        for rid, replica in rig.replicas.items():
            for request in replica.requests[marked[rid]:]:
                seen[parse(request)[0].split("-")[0]].add(rid)
        assert seen["hobby"] == {shard}       # the flood's later requests all went to its shard
        assert seen["acme"] and shard not in seen["acme"]  # the paid tenant was kept off it
    finally:
        await rig.stop()



async def test_proxy_keeps_interactive_off_a_replica_it_cannot_make_room_on() -> None:
    """Two replicas of one slot: a second interactive stream on the same prefix goes to the other replica.

    The prefix ring sends both to the prefix's home; the home is full of an
    interactive stream (nothing to preempt), so the pick walks on.
    """
    rig = Rig()
    try:
        await rig.start({rid: Behaviour(kind="stall") for rid in ("r0", "r1")},
                        loads={rid: {"max_concurrency": 1} for rid in ("r0", "r1")})
        prompt = " ".join(f"word{k}" for k in range(200))
        calls = []
        for _ in range(2):
            call = rig.stub.InferStream(request(prompt=prompt), metadata=PAID, timeout=10)
            await call.read()  # its first chunk: it runs, and holds the replica's one slot
            calls.append(call)
        assert rig.served() == {"r0": 1, "r1": 1}
        for call in calls:
            call.cancel()
    finally:
        await rig.stop()


@pytest.mark.parametrize(("inflight", "off", "expect"), [
    ({"r0": 4, "r1": 4}, set(), {"r0", "r1"}),          # r2 has room: go there, preempt nothing
    ({"r0": 4, "r1": 4}, {"r2"}, {"r1"}),               # kept off r2: r0 makes room (two victims there)
    ({"r0": 4, "r1": 4, "r2": 4}, set(), {"r1", "r2"}),  # every replica full: only r0 can make room
    ({"r0": 4, "r1": 3}, {"r2"}, {"r0"}),               # room on r1
], ids=["room-elsewhere", "room-kept-off", "all-full", "room-allowed"])
def test_interactive_preempts_only_when_every_replica_it_may_use_is_full(
        inflight: dict[str, int], off: set[str], expect: set[str]) -> None:
    placement = Placement()
    placement.set_replicas({"r0": 4, "r1": 4, "r2": 4})
    for k in range(2):
        placement.place(("batch", k), "r0", victim=True)
    assert placement.crowded(inflight, preempt=True, off=frozenset(off)) == frozenset(expect)
    assert placement.crowded(inflight, off=frozenset(off)) == frozenset(r for r, n in inflight.items() if n >= 4)


async def test_proxy_preempts_once_for_an_interactive_arrival_when_the_model_is_full() -> None:
    """Two replicas of two slots full of batch: an interactive request preempts one batch request, not two.

    The queues preempt the newest batch request (on one replica) to free a
    slot; the interactive request's prefix home is the other replica, full of
    batch it could also preempt. It must take the freed slot instead.
    """
    rig = Rig()
    try:
        await rig.start({rid: Behaviour(kind="hang") for rid in ("r0", "r1")},
                        loads={rid: {"max_concurrency": 2} for rid in ("r0", "r1")})
        assert rig.proxy is not None
        metrics = rig.proxy.router.admission.metrics

        def send(tier: int, prompt: str, prefix: str = "") -> asyncio.Future[object]:
            req = request(prompt=prompt, tier=tier, prefix_key=prefix)
            return asyncio.ensure_future(rig.stub.Infer(req, metadata=PAID, timeout=20))

        async def arrival(before: dict[str, int]) -> str:
            for _ in range(200):
                now = rig.served()
                moved = [rid for rid in now if now[rid] > before[rid]]
                if moved:
                    return moved[0]
                await asyncio.sleep(0.01)
            raise AssertionError("no replica received the request")

        homes: dict[str, str] = {}
        for k in range(8):  # each prefix's home on the ring, one request at a time on an idle fleet
            before = rig.served()
            call = send(common_pb2.TIER_INTERACTIVE, f"probe {k}", prefix=f"p{k}")
            homes[f"p{k}"] = await arrival(before)
            call.cancel()
            await asyncio.sleep(0.05)
        batch: list[asyncio.Future[object]] = []
        for k in range(4):
            before = rig.served()
            batch.append(send(common_pb2.TIER_BATCH, f"batch {k}"))
            newest = await arrival(before)
        other = "r1" if newest == "r0" else "r0"
        prefix = next(p for p, home in homes.items() if home == other)
        before = rig.served()
        interactive = send(common_pb2.TIER_INTERACTIVE, "interactive", prefix=prefix)
        assert await arrival(before) == newest  # the slot the preemption freed, not its home
        await asyncio.sleep(0.1)
        assert metrics.preempted.labels("m", "reclaim")._value.get() == 1
        assert metrics.preempted.labels("m", "room")._value.get() == 0
        for call in (*batch, interactive):
            call.cancel()
        await asyncio.gather(*batch, interactive, return_exceptions=True)
    finally:
        await rig.stop()
