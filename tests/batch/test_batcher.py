"""The size-or-time flush rule, the fill order, the bounded queue and the retry lane."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.batch.batcher import Batcher, BatcherConfig, QueueFull, Waiting
from ferry.errors import ConfigError, InvalidArgument


def batcher(max_batch: int = 4, max_wait_s: float = 0.05, max_pending: int = 100) -> Batcher:
    return Batcher(BatcherConfig(max_batch=max_batch, max_wait_s=max_wait_s, max_pending=max_pending), model="m")


def fill(b: Batcher, arrivals: list[float], *, tenant: str = "a", plan: str = "paid", first: int = 1) -> None:
    for i, t in enumerate(arrivals):
        b.push(Waiting(first + i, tenant, plan, t))


@pytest.mark.parametrize(
    ("arrivals", "now", "due"),
    [
        pytest.param([], 10.0, None, id="empty"),
        pytest.param([0.0], 0.049, None, id="one-young"),
        pytest.param([0.0], 0.05, "time", id="oldest-reaches-max-wait"),
        pytest.param([0.0, 0.01, 0.02], 0.04, None, id="under-size-and-time"),
        pytest.param([0.0, 0.01, 0.02, 0.03], 0.031, "size", id="size"),
        pytest.param([0.0, 0.01, 0.02, 0.03, 0.04], 0.2, "size", id="both-size-wins"),
        pytest.param([0.0, 0.01], 0.3, "time", id="long-overdue"),
    ],
)
def test_flush_rule(arrivals: list[float], now: float, due: str | None) -> None:
    b = batcher()
    fill(b, arrivals)
    assert b.due(now) == due


def test_deadline_is_oldest_plus_max_wait_and_matches_due() -> None:
    b = batcher(max_wait_s=0.1)
    assert b.deadline() is None
    fill(b, [0.3, 0.35])
    deadline = b.deadline()
    assert deadline == pytest.approx(0.4)
    assert deadline is not None and b.due(deadline) == "time" and b.due(deadline - 1e-9) is None


def test_take_is_at_most_max_batch_and_the_rest_waits() -> None:
    b = batcher(max_batch=4)
    fill(b, [0.0] * 6)
    assert [w.rid for w in b.take()] == [1, 2, 3, 4]
    assert len(b) == 2 and b.due(0.0) is None


@pytest.mark.parametrize(
    ("pushes", "expected"),
    [
        pytest.param([("a", "free"), ("b", "paid"), ("c", "free"), ("d", "paid")], ["b", "d", "a", "c"],
                     id="paid-before-free"),
        pytest.param([("f", "free"), ("p", "paid"), ("e", "enterprise")], ["e", "p", "f"], id="enterprise-first"),
        pytest.param([("a", "paid")] * 3 + [("b", "paid")] * 2 + [("c", "paid")], ["a", "b", "c", "a", "b", "a"],
                     id="round-robin-across-tenants"),
        pytest.param([("a", "free"), ("a", "free"), ("b", "free"), ("x", "paid"), ("x", "paid")],
                     ["x", "x", "a", "b", "a"], id="paid-then-round-robin-in-free"),
    ],
)
def test_fill_order(pushes: list[tuple[str, str]], expected: list[str]) -> None:
    b = batcher(max_batch=100)
    for i, (tenant, plan) in enumerate(pushes):
        b.push(Waiting(i, tenant, plan, 0.0))
    assert [w.tenant for w in b.take()] == expected


def test_the_tenant_turn_carries_over_between_batches() -> None:
    b = batcher(max_batch=3)
    for i, tenant in enumerate("aaaabbbbcc"):
        b.push(Waiting(i, tenant, "paid", 0.0))
    assert [w.tenant for w in b.take()] == ["a", "b", "c"]
    assert [w.tenant for w in b.take()] == ["a", "b", "c"]
    assert [w.tenant for w in b.take()] == ["a", "b", "a"]


def test_requeue_puts_a_failed_batch_at_the_head_in_order() -> None:
    b = batcher(max_batch=4)
    fill(b, [0.0, 0.0, 0.0, 0.0, 0.01, 0.02])
    first = b.take()
    fill(b, [0.03], tenant="z", plan="enterprise", first=50)
    b.requeue(first)
    assert b.due(0.03) == "retry"
    again = b.take()
    assert [w.rid for w in again] == [1, 2, 3, 4]
    assert all(w.attempts == 1 for w in again)
    assert [w.rid for w in b.take()] == [50, 5, 6]


def test_full_queue_refuses_with_queue_full() -> None:
    b = batcher(max_batch=2, max_pending=2)
    fill(b, [0.0, 0.0])
    with pytest.raises(QueueFull) as exc:
        b.push(Waiting(9, "a", "paid", 0.0))
    assert exc.value.limit == 2 and exc.value.retry_after > 0


def test_paid_evicts_the_newest_free_request_of_the_busiest_free_tenant() -> None:
    b = batcher(max_batch=3, max_pending=3)
    b.push(Waiting(1, "f1", "free", 0.0))
    b.push(Waiting(2, "f2", "free", 0.0))
    b.push(Waiting(3, "f2", "free", 0.0))
    evicted = b.push(Waiting(4, "p", "paid", 0.0))
    assert evicted is not None and evicted.rid == 3
    assert 3 not in b and len(b) == 3
    with pytest.raises(QueueFull):
        b.push(Waiting(5, "f3", "free", 0.0))


def test_requeued_requests_do_not_count_against_the_bound() -> None:
    b = batcher(max_batch=2, max_pending=2)
    fill(b, [0.0, 0.0])
    taken = b.take()
    fill(b, [0.0, 0.0], first=3)
    b.requeue(taken)
    assert len(b) == 4


def test_remove_and_drain() -> None:
    b = batcher(max_batch=10)
    fill(b, [0.0, 0.1, 0.2])
    assert b.remove(1) and not b.remove(1)
    assert b.oldest_arrival() == pytest.approx(0.1)
    assert sorted(w.rid for w in b.drain()) == [2, 3]
    assert len(b) == 0 and b.oldest_arrival() is None


def test_unknown_plan_and_bad_config() -> None:
    with pytest.raises(InvalidArgument):
        batcher().push(Waiting(1, "a", "gold", 0.0))
    with pytest.raises(ConfigError):
        BatcherConfig(max_batch=10, max_pending=5)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 3), st.sampled_from(["free", "paid", "enterprise"])),
        st.tuples(st.just("take"), st.just(0), st.just("")),
        st.tuples(st.just("requeue"), st.just(0), st.just("")),
        st.tuples(st.just("remove"), st.integers(0, 60), st.just("")),
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_every_request_leaves_exactly_once(steps: list[tuple[str, int, str]]) -> None:
    b = batcher(max_batch=5, max_pending=8)
    pending: set[int] = set()
    out: list[int] = []
    last: list[Waiting] = []
    refused: set[int] = set()
    rid = 0
    for now, (op, arg, plan) in enumerate(steps):
        if op == "push":
            rid += 1
            try:
                evicted = b.push(Waiting(rid, f"t{arg}", plan, float(now)))
            except QueueFull:
                refused.add(rid)
                continue
            pending.add(rid)
            if evicted is not None:
                pending.remove(evicted.rid)
                out.append(evicted.rid)
        elif op == "take":
            last = b.take()
            assert len(last) <= 5
            for w in last:
                pending.remove(w.rid)
                out.append(w.rid)
        elif op == "requeue" and last:
            b.requeue(last)
            for w in last:
                out.remove(w.rid)
                pending.add(w.rid)
            last = []
        elif op == "remove" and b.remove(arg):
            pending.remove(arg)
            out.append(arg)
        assert len(b) == len(pending)
        assert all(r in b for r in pending)
    out += [w.rid for w in b.drain()]
    assert sorted(out) == sorted(set(range(1, rid + 1)) - refused)  # each once: no loss, no duplicate
