"""The node dispatcher: requeue at the head on GPU failure, no duplicate, no loss."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.batch.batcher import QueueFull
from agent.batch.dispatch import ModelContract, NodeDispatcher
from agent.batch.gpusched import SchedulerConfig
from ferry.errors import NoReplica, NotFound, ReplicaFailed


def node(gpus: int = 2, max_batch: int = 4, max_attempts: int = 3, gang: bool = False,
         max_pending: int = 100) -> NodeDispatcher:
    contracts = [ModelContract(name="small", max_batch=max_batch, max_wait_s=0.05, max_attempts=max_attempts,
                               max_pending=max_pending)]
    if gang:
        contracts.append(ModelContract(name="large", max_batch=max_batch, gpus_per_batch=gpus, max_wait_s=0.05,
                                       max_pending=max_pending))
    return NodeDispatcher(contracts, SchedulerConfig(gpus=gpus))


def submit(n: NodeDispatcher, count: int, now: float = 0.0, model: str = "small") -> list[int]:
    return [n.submit(model, tenant="t", plan="paid", now=now)[0] for _ in range(count)]


def test_a_killed_batch_goes_back_to_the_head_and_runs_once_more() -> None:
    n = node(gpus=2, max_batch=4)
    rids = submit(n, 8)
    first, second = n.pump(0.0)
    assert first.reason == "size" and first.gpus == (0,) and second.gpus == (1,)
    later = submit(n, 3, now=0.01)
    report = n.kill_gpu(0, 0.05)
    assert report.batch_id == first.batch_id and report.failed == ()
    assert report.requeued == tuple(i.rid for i in first.items)
    assert n.pump(0.05) == []  # GPU 0 dead, GPU 1 busy: the retry waits at the head
    assert n.complete(first.batch_id, 0.1) is None  # the dead GPU's late answer is dropped
    assert n.stats.stale_results == 1
    done = n.complete(second.batch_id, 0.1)
    assert done is not None and [i.rid for i in done.items] == rids[4:]
    (retry,) = n.pump(0.1)
    assert retry.reason == "retry" and retry.gpus == (1,)
    assert [i.rid for i in retry.items] == rids[:4]  # head of the queue, in order, before the 3 newer ones
    assert all(i.attempts == 1 for i in retry.items)
    assert n.pending("small") == len(later)


def test_a_request_fails_after_max_attempts() -> None:
    n = node(gpus=3, max_batch=2, max_attempts=2)
    rids = submit(n, 2)
    (d,) = n.pump(0.0)
    assert n.kill_gpu(d.gpus[0], 0.01).requeued == tuple(rids)
    (d2,) = n.pump(0.01)
    report = n.kill_gpu(d2.gpus[0], 0.02)
    assert report.requeued == ()
    assert [rid for rid, _ in report.failed] == rids
    assert all(isinstance(e, ReplicaFailed) and e.retryable for _, e in report.failed)


def test_losing_a_gpu_makes_the_gang_model_unavailable_and_fails_its_requests() -> None:
    n = node(gpus=2, gang=True)
    big = submit(n, 2, model="large")
    (d,) = n.pump(0.06)
    assert d.model == "large" and d.gpus == (0, 1)
    queued = submit(n, 1, now=0.07, model="large")
    report = n.kill_gpu(1, 0.08)
    assert report.unavailable == ("large",)
    assert sorted(rid for rid, _ in report.failed) == sorted(big + queued)
    assert all(isinstance(e, NoReplica) for _, e in report.failed)
    with pytest.raises(NoReplica):
        submit(n, 1, model="large")
    submit(n, 1, now=0.09)
    (small,) = n.pump(0.2)
    assert small.gpus == (0,)
    assert n.restore_gpu(1, 0.3)
    assert submit(n, 1, now=0.3, model="large")


def test_cancel_removes_pending_and_skips_requeue_of_in_flight() -> None:
    n = node(gpus=2, max_batch=2)
    a, b = submit(n, 2)
    (d,) = n.pump(0.0)
    c = submit(n, 1, now=0.01)[0]
    assert n.cancel(c) and n.pending("small") == 0
    assert n.cancel(a)
    report = n.kill_gpu(d.gpus[0], 0.02)
    assert report.requeued == (b,)
    assert not n.cancel(12345)


def test_refusals() -> None:
    n = node(max_batch=2, max_pending=2)
    with pytest.raises(NotFound):
        n.submit("nope", tenant="t", plan="paid", now=0.0)
    submit(n, 2)
    with pytest.raises(QueueFull):
        submit(n, 1)


def test_next_wake_is_the_batcher_timer() -> None:
    n = node()
    assert n.next_wake(0.0) is None
    submit(n, 1, now=0.0)
    assert n.next_wake(0.0) == pytest.approx(0.05)
    assert n.pump(0.049) == []
    (d,) = n.pump(0.05)
    assert d.reason == "time" and n.next_wake(0.05) is None


event = st.one_of(
    st.tuples(st.just("submit"), st.integers(0, 5), st.sampled_from(["small", "large"])),
    st.tuples(st.just("complete"), st.integers(0, 7), st.just("")),
    st.tuples(st.just("kill"), st.integers(0, 3), st.just("")),
    st.tuples(st.just("restore"), st.integers(0, 3), st.just("")),
    st.tuples(st.just("cancel"), st.integers(0, 40), st.just("")),
    st.tuples(st.just("tick"), st.integers(1, 80), st.just("")),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(event, max_size=80), st.integers(1, 4))
def test_every_accepted_request_ends_exactly_once(events: list[tuple[str, int, str]], max_attempts: int) -> None:
    n = node(gpus=4, max_batch=3, max_attempts=max_attempts, gang=True, max_pending=6)
    outcomes: dict[int, int] = {}
    cancelled: set[int] = set()
    now = 0.0

    def end(rid: int) -> None:
        outcomes[rid] += 1

    def answer(rid: int) -> None:
        if rid not in cancelled:  # the runtime drops the answer of a client that went away
            end(rid)

    for kind, arg, model in events:
        if kind == "submit":
            for _ in range(arg):
                try:
                    rid, evicted = n.submit(model, tenant=f"t{arg}", plan="free" if arg % 2 else "paid", now=now)
                except (QueueFull, NoReplica):
                    continue
                outcomes[rid] = 0
                if evicted is not None:
                    end(evicted)
        elif kind == "complete" and n.in_flight():
            bid = sorted(n.in_flight())[arg % len(n.in_flight())]
            done = n.complete(bid, now)
            assert done is not None
            for item in done.items:
                answer(item.rid)
        elif kind == "kill":
            for rid, _ in n.kill_gpu(arg, now).failed:
                end(rid)
        elif kind == "restore":
            n.restore_gpu(arg, now)
        elif kind == "cancel" and outcomes:
            rid = sorted(outcomes)[arg % len(outcomes)]
            if outcomes[rid] == 0 and n.cancel(rid):
                cancelled.add(rid)
                end(rid)  # the client went away: its one outcome
        elif kind == "tick":
            now += arg / 1000
        n.pump(now)
        assert n.scheduler.invariants() == []
    for gpu in range(4):
        n.restore_gpu(gpu, now)
    for _ in range(200):
        now += 0.1
        n.pump(now)
        for bid in sorted(n.in_flight()):
            done = n.complete(bid, now)
            assert done is not None
            for item in done.items:
                answer(item.rid)
        if not n.in_flight() and not n.pending("small") and not n.pending("large"):
            break
    assert [rid for rid, count in outcomes.items() if count == 0] == [], "lost"
    assert [rid for rid, count in outcomes.items() if count > 1] == [], "duplicated"
