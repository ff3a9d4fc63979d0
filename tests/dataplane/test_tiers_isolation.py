"""Isolation levers of the tier queues, table by table: interactive headroom, tenant ceilings, DRR skipping.

(ferry.quotas.interactive_headroom, dataplane.admission.fairshare.tenant_ceilings,
DeficitRoundRobin.pop with blocked tenants, TierQueues.dispatch using both.)
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry

from agent.replica.engine import EngineParams
from dataplane.admission.fairshare import DeficitRoundRobin, tenant_ceilings
from dataplane.admission.gate import Admission, Preempted
from dataplane.admission.queues import QueueParams, Ticket, TierQueues
from dataplane.config import ProxySettings
from ferry.errors import ConfigError
from ferry.quotas import interactive_headroom
from tools.sim.tiers import Req, TierSim


@pytest.mark.parametrize(("capacity", "rate", "seconds", "max_share", "expect"), [
    (480, 116.0, 0.2, 0.1, 24),   # the isolation scenario: 116 interactive/s need 24 slots over 0.2 s
    (480, 1000.0, 0.2, 0.1, 48),  # bounded by 10 % of the slots
    (480, 0.0, 0.2, 0.1, 0),      # no interactive traffic: nothing held back
    (16, 18.0, 0.2, 0.1, 1),      # a small fleet: floor(0.1 x 16) = 1
    (8, 18.0, 0.2, 0.1, 0),       # too small to hold a slot back
    (480, 116.0, 0.2, 0.0, 0),    # switched off
    (0, 116.0, 0.2, 0.1, 0),      # no capacity
], ids=["sized-from-rate", "capped", "idle", "small-fleet", "tiny-fleet", "off", "empty"])
def test_interactive_headroom(capacity: int, rate: float, seconds: float, max_share: float, expect: int) -> None:
    assert interactive_headroom(capacity, rate, seconds, max_share) == expect


@pytest.mark.parametrize(("limit", "weights", "factor", "expect"), [
    (480, {"noisy": 1.0, "t0": 1.0, "t1": 1.0, "t2": 1.0, "t3": 1.0}, 1.0,
     {"noisy": 96, "t0": 96, "t1": 96, "t2": 96, "t3": 96}),           # five equal tenants: a fifth each
    (100, {"paid": 4.0, "free": 1.0}, 1.0, {"paid": 80, "free": 20}),   # plan weights
    (100, {"a": 1.0, "b": 1.0}, 1.5, {"a": 75, "b": 75}),              # factor above the share: some lending
    (100, {"alone": 1.0}, 1.0, {"alone": 100}),                         # alone: the whole tier
    (100, {"a": 1.0, "b": 1.0}, 0.0, {"a": 100, "b": 100}),            # off
    (3, {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0}, 1.0, {"a": 1, "b": 1, "c": 1, "d": 1}),  # at least one
    (0, {}, 1.0, {}),
], ids=["five-equal", "plans", "factor", "alone", "off", "at-least-one", "empty"])
def test_tenant_ceilings(limit: int, weights: dict[str, float], factor: float, expect: dict[str, int]) -> None:
    assert tenant_ceilings(limit, weights, factor) == expect


@pytest.mark.parametrize(("items", "blocked", "pops", "expect"), [
    ({"a": 4, "b": 4}, {"a"}, 3, ["b", "b", "b"]),                     # a blocked: b served
    ({"a": 4, "b": 4}, {"a", "b"}, 2, []),                             # everyone blocked: nothing
    ({"a": 2, "b": 2, "c": 2}, {"b"}, 5, ["c", "a", "a", "c"]),        # b skipped, keeps its items
    ({"a": 3}, set(), 4, ["a", "a", "a"]),
], ids=["one-blocked", "all-blocked", "middle-blocked", "none-blocked"])
def test_drr_passes_over_blocked_tenants(items: dict[str, int], blocked: set[str], pops: int,
                                         expect: list[str]) -> None:
    drr: DeficitRoundRobin[tuple[str, int]] = DeficitRoundRobin(quantum=100)
    for tenant, n in items.items():
        for i in range(n):
            drr.push(tenant, (tenant, i), 100)
    served = [item[0] for item in (drr.pop(blocked) for _ in range(pops)) if item is not None]
    assert served == expect
    assert len(drr) == sum(items.values()) - len(served)


def test_drr_blocked_tenant_does_not_bank_credit() -> None:
    drr: DeficitRoundRobin[str] = DeficitRoundRobin(quantum=100)
    for i in range(10):
        drr.push("a", f"a{i}", 100)
        drr.push("b", f"b{i}", 100)
    for _ in range(6):
        assert (drr.pop({"a"}) or "")[0] == "b"
    served = Counter((drr.pop() or "?")[0] for _ in range(6))
    assert served == {"a": 4, "b": 2}  # a's share plus its one unspent entry quantum, not the rounds it was blocked


def _ticket(tier: str, tenant: str = "a", plan: str = "paid") -> Ticket:
    return Ticket(tenant=tenant, plan=plan, tier=tier, cost=100, deadline=1e9)


def _interactive_rate(q: TierQueues, per_second: int) -> None:
    """Make the queues observe ``per_second`` interactive dispatches per second (drain rate at steady state)."""
    for i in range(per_second * 20):
        q.drain["interactive"].add(i / per_second)


@pytest.mark.parametrize(("rate", "batch_started", "interactive_started"), [
    (0, 100, 0),     # no interactive traffic: batch takes every slot
    (50, 90, 10),    # 50/s x 0.2 s = 10 slots kept free for interactive, which may use them
    (500, 90, 10),   # capped at 10 % of the slots
], ids=["idle", "sized", "capped"])
def test_batch_leaves_headroom_interactive_uses_it(rate: int, batch_started: int, interactive_started: int) -> None:
    q = TierQueues(QueueParams(max_queued=1000), capacity=100)
    _interactive_rate(q, rate)
    now = 20.0 if rate else 0.0
    for _ in range(200):
        q.offer(_ticket("batch", tenant="bulk"), now)
    assert len(q.dispatch(now)) == batch_started
    for _ in range(interactive_started):
        q.offer(_ticket("interactive"), now)
    assert len(q.dispatch(now)) == interactive_started
    assert q.preemptions() == []  # the held slots served interactive without a preemption


@pytest.mark.parametrize(("waiting", "ceiling", "expect"), [
    ({"noisy": 60, "t0": 3, "t1": 3}, 1.0, {"noisy": 4, "t0": 3, "t1": 3}),   # noisy held to a third of 12
    ({"noisy": 60}, 1.0, {"noisy": 12}),                                      # alone: uses everything
    ({"noisy": 60, "t0": 3, "t1": 3}, 0.0, None),                             # off: DRR order only
], ids=["capped", "alone", "off"])
def test_tenant_ceiling_at_dispatch(waiting: dict[str, int], ceiling: float, expect: dict[str, int] | None) -> None:
    q = TierQueues(QueueParams(max_queued=1000, tenant_ceiling=ceiling, quantum=100), capacity=12)
    for tenant, n in waiting.items():
        for _ in range(n):
            q.offer(_ticket("standard", tenant=tenant), 0.0)
    started = Counter(t.tenant for t in q.dispatch(0.0))
    if expect is None:
        assert sum(started.values()) == 12
        return
    assert dict(started) == expect


def test_tenant_ceiling_follows_finishes_and_requeues() -> None:
    q = TierQueues(QueueParams(max_queued=1000, quantum=100), capacity=4)
    for tenant in ("a", "a", "a", "a", "b"):
        q.offer(_ticket("batch", tenant=tenant), 0.0)
    first = q.dispatch(0.0)
    assert Counter(t.tenant for t in first) == {"a": 2, "b": 1}  # ceil(4 / 2) each; one slot idle
    b = next(t for t in first if t.tenant == "b")
    q.finish(b)  # b gone: a alone, so it may take the rest
    assert Counter(t.tenant for t in q.dispatch(0.1)) == {"a": 2}
    a = next(t for t in first if t.tenant == "a")
    a.state = "preempting"
    q.requeue(a, 0.2)
    assert [t.tenant for t in q.dispatch(0.3)] == ["a"]


@pytest.mark.parametrize(("tier", "placed", "inflight", "slots", "expect"), [
    ("interactive", {"r0": 4, "r1": 3}, 5, 4, ["r0"]),           # r0 full: its newest batch request makes room
    ("interactive", {"r0": 4, "r1": 3}, 4, 4, []),               # room there already
    ("interactive", {"r0": 0, "r1": 7}, 5, 4, []),               # nothing of a lower tier on r0
    ("standard", {"r0": 4, "r1": 3}, 5, 4, []),                  # only interactive makes room
    ("interactive", {"r0": 4, "r1": 3}, 7, 4, ["r0", "r0", "r0"]),  # three over: three victims
], ids=["full-replica", "room", "no-victim-there", "not-interactive", "several"])
def test_make_room_on_the_replica_the_pick_chose(tier: str, placed: dict[str, int], inflight: int, slots: int,
                                                 expect: list[str]) -> None:
    q = TierQueues(QueueParams(max_queued=100, reserved={"interactive": 0.7, "standard": 0.2, "batch": 0.1},
                               headroom_max_share=0.0), capacity=10)
    for replica, n in placed.items():
        for _ in range(n):
            q.offer(_ticket("batch", tenant="bulk"), 0.0)
            (t,) = q.dispatch(0.0)
            q.make_room(t, replica, 1, 8)  # batch is only placed, never makes room
    newcomer = _ticket(tier)
    q.offer(newcomer, 0.1)
    q.dispatch(0.1)
    victims = q.make_room(newcomer, "r0", inflight, slots)
    assert [v.replica for v in victims] == expect
    assert all(v.tier == "batch" and v.state == "preempting" for v in victims)
    assert q.preemptions() == []  # not named twice
    for v in victims:
        q.requeue(v, 0.2)
        assert v.replica == "" and v.state == "queued"


@pytest.mark.parametrize(("batch", "streams", "inflight", "preempted", "finished", "expect"), [
    ({"r0": 2}, {}, {"r0": 4, "r1": 4}, 0, 0, {"r1"}),          # r1 full of interactive; r0 can make room
    ({"r0": 2}, {}, {"r0": 4, "r1": 3}, 0, 0, {"r0"}),          # room on r1: go there, preempt nothing
    ({"r0": 2}, {}, {"r0": 4}, 0, 0, {"r0"}),                   # r1 has nothing in flight: room
    ({"r0": 2}, {}, {"r0": 6, "r1": 4}, 0, 0, {"r0", "r1"}),    # 6 - 2 victims: still full
    ({"r0": 2}, {}, {"r0": 4, "r1": 4}, 1, 0, {"r1"}),          # one victim taken: 4 - 1 < 4
    ({"r0": 2}, {}, {"r0": 4, "r1": 4}, 2, 0, {"r0", "r1"}),    # both taken: nothing left to preempt
    ({"r0": 2}, {}, {"r0": 4, "r1": 4}, 0, 2, {"r0", "r1"}),    # finished: no longer victims
    ({}, {"r0": 2}, {"r0": 4, "r1": 4}, 0, 0, {"r0", "r1"}),    # not preemptible (out of continuations)
    ({"r0": 2}, {}, {}, 0, 0, set()),                           # nothing in flight
], ids=["interactive-full", "room-elsewhere", "room-idle", "over-victims", "one-taken", "all-taken", "finished",
        "streams", "empty"])
def test_crowded_replicas_for_the_pick(batch: dict[str, int], streams: dict[str, int],
                                                  inflight: dict[str, int], preempted: int, finished: int,
                                                  expect: set[str]) -> None:
    q = TierQueues(QueueParams(max_queued=100, headroom_max_share=0.0, shard_max_share=0.0), capacity=8)
    q.set_replicas({"r0": 4, "r1": 4})
    placed: list[Ticket] = []
    for replica, n in [*batch.items(), *streams.items()]:
        for _ in range(n):
            t = _ticket("batch", tenant="bulk")
            t.preemptible = replica not in streams
            q.offer(t, 0.0)
            (started,) = q.dispatch(0.0)
            q.make_room(started, replica, 1, 4)
            placed.append(started)
    if preempted:  # an interactive request placed on r0 over its slots takes victims there
        newcomer = _ticket("interactive")
        q.offer(newcomer, 0.1)
        q.dispatch(0.1)
        assert len(q.make_room(newcomer, "r0", 4 + preempted, 4)) == preempted
    for t in placed[:finished]:
        q.finish(t)
    assert q.placement.crowded(inflight, preempt=True) == q.avoid(_ticket("interactive"), inflight) == frozenset(expect)
    full = {r for r, n in inflight.items() if n >= 4}  # a lower tier can preempt nothing: full is full
    assert q.placement.crowded(inflight) == q.avoid(_ticket("batch"), inflight) == frozenset(full)


def test_make_room_keeps_the_lower_tier_reserve() -> None:
    q = TierQueues(QueueParams(max_queued=100, reserved={"interactive": 0.5, "standard": 0.3, "batch": 0.2},
                               headroom_max_share=0.0), capacity=10)
    for _ in range(2):  # batch at its reserve (2 of 10 slots)
        q.offer(_ticket("batch"), 0.0)
        (t,) = q.dispatch(0.0)
        q.make_room(t, "r0", 1, 4)
    newcomer = _ticket("interactive")
    q.offer(newcomer, 0.1)
    q.dispatch(0.1)
    assert q.make_room(newcomer, "r0", 5, 4) == []


async def test_admission_placed_preempts_on_that_replica_and_requeues() -> None:
    adm = Admission(QueueParams(headroom_max_share=0.0, reserved={"interactive": 0.5, "standard": 0.0,
                                                                   "batch": 0.5}),
                    clock=lambda: 0.0, registry=CollectorRegistry())
    adm.models["chat"] = TierQueues(adm.params, 4)
    gate = asyncio.Event()
    calls: list[str] = []

    async def forward(name: str) -> str:
        calls.append(name)
        await gate.wait()
        return name

    async def run(ticket: Ticket, name: str, replica: str, inflight: int) -> str:
        while True:
            await adm.acquire("chat", ticket)
            adm.placed("chat", ticket, replica, inflight, 2)
            try:
                return await adm.preemptible("chat", ticket, lambda: forward(name))
            except Preempted:
                continue

    batch = [_ticket("batch", tenant="bulk") for _ in range(3)]
    tasks = [asyncio.ensure_future(run(t, f"b{k}", "r0" if k < 2 else "r1", 1 + k % 2)) for k, t in enumerate(batch)]
    await asyncio.sleep(0.01)
    inter = _ticket("interactive")
    ti = asyncio.ensure_future(run(inter, "i", "r0", 3))  # r0 holds two batch requests: full
    await asyncio.sleep(0.01)
    assert batch[1].preempted == 1 and batch[0].preempted == 0 and batch[2].preempted == 0
    gate.set()
    assert await ti == "i"
    adm.release("chat", inter)
    for task, ticket in zip(tasks, batch, strict=True):
        await asyncio.wait_for(task, 1)
        adm.release("chat", ticket)
    assert calls.count("b1") == 2 and calls.count("b0") == 1


def _noisy_p99(ceiling: float, with_noisy: bool) -> float:
    reqs = [Req(rid=i, arrival=i * 0.02, tier="standard", tenant=f"t{i % 4}", max_tokens=32) for i in range(400)]
    if with_noisy:
        reqs += [Req(rid=1000 + i, arrival=i * 0.004, tier="standard", tenant="noisy", max_tokens=32)
                 for i in range(2000)]
    sim = TierSim(replicas=2, engine=EngineParams(max_running=16), queues=QueueParams(tenant_ceiling=ceiling))
    sim.run(reqs, 60.0)
    ttfts = sorted(o.ttft for o in sim.outcomes.values() if o.req.tenant != "noisy" and o.ttft is not None)
    assert len(ttfts) == 400  # the others are all served
    return ttfts[int(0.99 * len(ttfts)) - 1]


@pytest.mark.parametrize(("ceiling", "max_ratio"), [(1.0, 1.5), (0.0, None)], ids=["ceiling", "off"])
def test_noisy_tenant_in_the_simulator(ceiling: float, max_ratio: float | None) -> None:
    ratio = _noisy_p99(ceiling, True) / _noisy_p99(ceiling, False)
    if max_ratio is None:
        assert ratio > 5.0  # without the ceiling the others slow with the noisy tenant's load
    else:
        assert ratio <= max_ratio


@pytest.mark.parametrize(("kw", "field"), [
    ({"tenant_ceiling": -1.0}, "proxy.tenant_ceiling"),
    ({"interactive_headroom_max_share": 1.5}, "proxy.interactive_headroom_max_share"),
    ({"interactive_headroom_seconds": float("nan")}, "proxy.interactive_headroom_seconds"),
    ({"tenant_shard_max_share": 1.5}, "proxy.tenant_shard_max_share"),
    ({"tenant_shard_hold_seconds": -1.0}, "proxy.tenant_shard_hold_seconds"),
    ({"interactive_replica_share": 1.5}, "proxy.interactive_replica_share"),
    ({"interactive_replica_share": -0.1}, "proxy.interactive_replica_share"),
    ({"tenant_ceiling": 0.0, "interactive_headroom_seconds": 0.5, "tenant_shard_max_share": 0.25,
      "tenant_shard_hold_seconds": 3.0, "interactive_replica_share": 0.5}, None),
], ids=["negative-ceiling", "share-above-one", "nan-seconds", "shard-share-above-one", "negative-hold",
        "kept-share-above-one", "kept-share-negative", "valid"])
def test_settings_carry_the_isolation_parameters(kw: dict[str, float], field: str | None) -> None:
    if field is not None:
        with pytest.raises(ConfigError) as info:
            ProxySettings.from_section(kw)
        assert field in str(info.value)
        return
    params = ProxySettings.from_section(kw).queues.queue_params()
    assert (params.tenant_ceiling, params.headroom_seconds, params.headroom_max_share) == (0.0, 0.5, 0.1)
    assert (params.shard_max_share, params.shard_hold_seconds) == (0.25, 3.0)
    assert params.interactive_replica_share == 0.5
