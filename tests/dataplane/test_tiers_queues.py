"""Tier queues, fair share and shedding order: table-driven (dataplane.admission.fairshare, queues, shedding)."""

from __future__ import annotations

from collections import Counter

import pytest

from dataplane.admission.fairshare import DeficitRoundRobin
from dataplane.admission.queues import QueueParams, Shed, Ticket, TierQueues
from dataplane.admission.shedding import DrainRate, retry_after, shed_reason


def _ticket(tier: str = "batch", tenant: str = "a", plan: str = "paid", cost: int = 100,
            deadline: float = 1e9) -> Ticket:
    return Ticket(tenant=tenant, plan=plan, tier=tier, cost=cost, deadline=deadline)


@pytest.mark.parametrize(("costs", "pops", "expect"), [
    ({"a": [100] * 6, "b": [100] * 6}, 6, {"a": 3, "b": 3}),
    ({"a": [1000] * 10, "b": [100] * 10}, 11, {"a": 1, "b": 10}),      # tokens, not requests, are shared
    ({"a": [100] * 60, "b": [100] * 5, "c": [100] * 5}, 15, {"a": 5, "b": 5, "c": 5}),  # the 60 % tenant
    ({"a": [100] * 3}, 5, {"a": 3}),
], ids=["equal", "weighted-by-tokens", "noisy-neighbour", "drains"])
def test_drr_shares_tokens_among_tenants(costs: dict[str, list[int]], pops: int, expect: dict[str, int]) -> None:
    drr: DeficitRoundRobin[tuple[str, int]] = DeficitRoundRobin(quantum=100)
    for tenant, items in costs.items():
        for i, cost in enumerate(items):
            drr.push(tenant, (tenant, i), cost)
    served = Counter(item[0] for item in (drr.pop() for _ in range(pops)) if item is not None)
    assert dict(served) == expect


def test_drr_remove_and_push_front() -> None:
    drr: DeficitRoundRobin[str] = DeficitRoundRobin(quantum=10)
    for item in ("x1", "x2", "x3"):
        drr.push("x", item, 10)
    drr.remove("x1")
    assert len(drr) == 2
    assert drr.pop() == "x2"
    drr.push_front("x", "x0", 10)
    assert [drr.pop(), drr.pop(), drr.pop()] == ["x0", "x3", None]


@pytest.mark.parametrize(("kw", "expect"), [
    (dict(depth=0, bound=10, rate=0.0, timeout=2.0, remaining=5.0, plan="paid"), None),
    (dict(depth=10, bound=10, rate=5.0, timeout=2.0, remaining=5.0, plan="paid"), "queue_full"),
    (dict(depth=5, bound=10, rate=5.0, timeout=2.0, remaining=5.0, plan="free"), "queue_full"),
    (dict(depth=4, bound=10, rate=1.0, timeout=2.0, remaining=5.0, plan="paid"), "wait"),
    (dict(depth=4, bound=10, rate=4.0, timeout=2.0, remaining=5.0, plan="paid"), None),
    (dict(depth=4, bound=10, rate=4.0, timeout=2.0, remaining=5.0, plan="free"), None),
    (dict(depth=4, bound=10, rate=3.0, timeout=2.0, remaining=5.0, plan="free"), "wait"),
    (dict(depth=4, bound=10, rate=4.0, timeout=2.0, remaining=0.5, plan="paid"), "deadline"),
], ids=["empty", "full", "free-half-full", "slow-drain", "fast-drain", "free-fast", "free-slow", "deadline"])
def test_shed_reason(kw: dict[str, object], expect: str | None) -> None:
    assert shed_reason(**kw) == expect  # type: ignore[arg-type]


@pytest.mark.parametrize(("depth", "rate", "timeout", "expect"), [
    (10, 5.0, 2.0, 2.0), (0, 5.0, 2.0, 0.1), (10, 0.0, 7.0, 7.0), (10_000, 1.0, 2.0, 60.0),
], ids=["drain", "floor", "no-rate", "ceiling"])
def test_retry_after_from_drain_rate(depth: int, rate: float, timeout: float, expect: float) -> None:
    assert retry_after(depth, rate, timeout) == expect


def test_drain_rate_decays() -> None:
    rate = DrainRate(tau=1.0)
    for i in range(100):
        rate.add(i * 0.01)
    assert 50 < rate.rate(1.0) < 80
    assert rate.rate(20.0) < 0.01


PARAMS = QueueParams(bounds={"interactive": 4, "standard": 4, "batch": 8},
                     timeouts={"interactive": 2.0, "standard": 5.0, "batch": 30.0}, max_queued=10, quantum=100)


def test_dispatch_order_interactive_then_standard_then_batch() -> None:
    q = TierQueues(PARAMS, capacity=3)
    for tier in ("batch", "standard", "interactive", "batch", "interactive"):
        q.offer(_ticket(tier), 0.0)
    started = q.dispatch(0.0)
    assert [t.tier for t in started] == ["interactive", "interactive", "standard"]
    q.finish(started[0])
    assert [t.tier for t in q.dispatch(0.1)] == ["batch"]


@pytest.mark.parametrize(("running", "waiting", "capacity", "expect_preempt"), [
    ({"batch": 10}, {}, 10, 0),                                   # idle reserve lent to batch
    ({"batch": 10}, {"interactive": 3}, 10, 3),                   # reclaim: 3 preempted
    ({"batch": 10}, {"interactive": 8}, 10, 8),                   # down to batch's reserve (2)
    ({"batch": 10}, {"interactive": 20}, 10, 8),                  # never below batch's reserve
    ({"batch": 6}, {"interactive": 3}, 10, 0),                    # headroom: no preemption
    ({"batch": 2, "interactive": 8}, {"interactive": 1}, 10, 0),  # batch at its reserve
], ids=["lend", "reclaim-3", "reclaim-8", "keep-reserve", "headroom", "at-reserve"])
def test_preemption_reclaims_lent_capacity(running: dict[str, int], waiting: dict[str, int], capacity: int,
                                           expect_preempt: int) -> None:
    q = TierQueues(QueueParams(max_queued=100, reserved={"interactive": 0.5, "standard": 0.3, "batch": 0.2}),
                   capacity=capacity)
    for tier, n in running.items():
        for _ in range(n):
            q.offer(_ticket(tier), 0.0)
    assert len(q.dispatch(0.0)) == sum(running.values())
    for tier, n in waiting.items():
        for _ in range(n):
            q.offer(_ticket(tier), 0.0)
    q.dispatch(0.0)
    victims = q.preemptions()
    assert len(victims) == expect_preempt
    assert all(v.tier == "batch" for v in victims)
    assert q.preemptions() == []  # asked once per victim
    for v in victims:
        q.requeue(v, 1.0)
    started = q.dispatch(1.0)
    assert [t.tier for t in started].count("interactive") == min(expect_preempt, waiting.get("interactive", 0))
    assert q.depth("batch") == expect_preempt  # requeued, not lost


def test_requeued_batch_goes_first_in_its_queue() -> None:
    q = TierQueues(QueueParams(max_queued=100), capacity=1)
    first = _ticket("batch", tenant="a")
    q.offer(first, 0.0)
    q.dispatch(0.0)
    q.offer(_ticket("batch", tenant="b"), 0.1)
    q.requeue(first, 0.2)
    assert q.dispatch(0.3) == [first]


@pytest.mark.parametrize(("queued", "newcomer", "evicted"), [
    ([("batch", "free"), ("batch", "paid")], ("interactive", "paid"), ("batch", "free")),
    ([("batch", "paid"), ("standard", "free")], ("interactive", "paid"), ("batch", "paid")),
    ([("standard", "free"), ("standard", "paid")], ("standard", "paid"), ("standard", "free")),
    ([("interactive", "paid"), ("interactive", "paid")], ("batch", "paid"), None),
    ([("batch", "paid"), ("batch", "paid")], ("batch", "free"), None),
], ids=["batch-free-first", "batch-before-standard", "free-before-paid", "no-lower-victim", "free-newcomer-shed"])
def test_shedding_order_when_full(queued: list[tuple[str, str]], newcomer: tuple[str, str],
                                  evicted: tuple[str, str] | None) -> None:
    q = TierQueues(QueueParams(max_queued=2), capacity=0)
    for tier, plan in queued:
        q.offer(_ticket(tier, plan=plan), 0.0)
    new = _ticket(newcomer[0], plan=newcomer[1])
    if evicted is None:
        with pytest.raises(Shed) as info:
            q.offer(new, 1.0)
        assert info.value.reason == "queue_full" and info.value.retry_after > 0
        return
    victims = q.offer(new, 1.0)
    assert [(v.tier, v.plan) for v in victims] == [evicted]
    assert q.queued() == 2


def test_tier_bound_sheds_with_retry_after_from_drain() -> None:
    q = TierQueues(PARAMS, capacity=1)
    for i in range(5):
        q.offer(_ticket("interactive"), i * 0.1)
        q.finish(q.dispatch(i * 0.1)[0])
    for _ in range(4):
        q.offer(_ticket("interactive"), 0.5)
    with pytest.raises(Shed) as info:
        q.offer(_ticket("interactive"), 0.5)
    assert info.value.tier == "interactive"
    assert 0.1 <= info.value.retry_after <= 2.0


@pytest.mark.parametrize(("running", "waiting", "expect"), [
    ({"standard": 10}, {"interactive": 3}, {"standard": 3}),
    ({"standard": 5, "batch": 5}, {"interactive": 4}, {"batch": 3, "standard": 1}),  # batch first, to its reserve
    ({"batch": 10}, {"standard": 2}, {"batch": 2}),
], ids=["standard-for-interactive", "batch-first", "batch-for-standard"])
def test_preemption_order_lowest_tier_first(running: dict[str, int], waiting: dict[str, int],
                                            expect: dict[str, int]) -> None:
    q = TierQueues(QueueParams(max_queued=100, reserved={"interactive": 0.5, "standard": 0.3, "batch": 0.2}),
                   capacity=10)
    for tier, n in running.items():
        for _ in range(n):
            q.offer(_ticket(tier), 0.0)
    q.dispatch(0.0)
    for tier, n in waiting.items():
        for _ in range(n):
            q.offer(_ticket(tier), 0.0)
    q.dispatch(0.0)
    assert Counter(v.tier for v in q.preemptions()) == expect


def test_streams_are_not_preempted() -> None:
    q = TierQueues(QueueParams(max_queued=100), capacity=2)
    streams = [_ticket("batch"), _ticket("batch")]
    for t in streams:
        t.preemptible = False
        q.offer(t, 0.0)
    q.dispatch(0.0)
    q.offer(_ticket("interactive"), 0.1)
    assert q.preemptions() == []


def test_a_tenant_holding_its_tier_gives_back_down_to_its_ceiling_when_another_waits() -> None:
    q = TierQueues(QueueParams(max_queued=100, headroom_max_share=0.0, shard_max_share=0.0), capacity=8)
    hog = [_ticket("batch", tenant="hog", plan="free") for _ in range(8)]
    for t in hog:
        q.offer(t, 0.0)
    assert q.dispatch(0.0) == hog  # alone in its tier, it may take every slot
    assert q.preemptions() == []
    late = [_ticket("batch", tenant="late", plan="paid") for _ in range(3)]
    for t in late:
        q.offer(t, 1.0)
    assert q.dispatch(1.0) == []  # no slot free
    victims = q.preemptions()
    # Ceilings over 8 slots: free (weight 1) ceil(8 x 1/5) = 2, paid (4) ceil(8 x 4/5) = 7: the late tenant's
    # 3 waiting requests fit under its ceiling, so 3 of the hog's newest give way.
    assert victims == hog[::-1][:3] and {v.cause for v in victims} == {"fair"}
    assert q.preemptions() == []  # under way: not chosen twice
    for v in victims:
        q.requeue(v, 1.1)
    assert q.dispatch(1.1) == late  # the requeued ones wait: their tenant is at its ceiling
    assert q.preemptions() == []  # the hog is above its ceiling (5 > 2), but nobody under theirs waits


def test_fair_preemption_is_off_with_tenant_ceilings_off() -> None:
    q = TierQueues(QueueParams(max_queued=100, headroom_max_share=0.0, tenant_ceiling=0.0), capacity=4)
    for _ in range(4):
        q.offer(_ticket("standard", tenant="hog"), 0.0)
    q.dispatch(0.0)
    q.offer(_ticket("standard", tenant="late"), 1.0)
    assert q.preemptions() == []
