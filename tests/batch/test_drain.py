"""The queue's drain rate, the retry-after it gives, and the dispatcher's use of both."""

from __future__ import annotations

import pytest

from agent.batch.batcher import QueueFull
from agent.batch.dispatch import ModelContract, NodeDispatcher
from agent.batch.drain import DrainMeter, retry_after_s
from agent.batch.gpusched import SchedulerConfig


@pytest.mark.parametrize(
    ("origin", "events", "now", "rate"),
    [
        pytest.param(None, [], 5.0, 0.0, id="never-started"),
        pytest.param(0.0, [], 5.0, 0.0, id="nothing-completed"),
        pytest.param(0.0, [(0.5, 100), (1.0, 100)], 1.0, 200.0, id="young-meter-divides-by-its-age"),
        pytest.param(0.0, [(1.0, 100), (2.0, 100), (3.0, 100), (4.0, 100)], 4.0, 100.0, id="full-window"),
        pytest.param(0.0, [(1.0, 100), (2.0, 100)], 3.5, 50.0, id="old-batches-leave-the-window"),
        pytest.param(0.0, [(1.0, 100)], 10.0, 0.0, id="all-expired"),
    ],
)
def test_drain_meter_rate(origin: float | None, events: list[tuple[float, int]], now: float, rate: float) -> None:
    meter = DrainMeter(window_s=2.0)
    if origin is not None:
        meter.start(origin)
    for at, n in events:
        meter.record(at, n)
    assert meter.rate(now) == pytest.approx(rate)


def test_drain_meter_is_bounded() -> None:
    meter = DrainMeter(window_s=100.0, max_events=4)
    meter.start(0.0)
    for i in range(10):
        meter.record(float(i + 1), 10)
    assert meter.rate(10.0) == pytest.approx(40 / 10.0)  # only the last 4 batches are kept


@pytest.mark.parametrize(
    ("pending", "rate", "expected"),
    [
        pytest.param(1000, 2000.0, 0.5, id="backlog-over-rate"),
        pytest.param(5, 2000.0, 0.1, id="floored-at-one-batch"),
        pytest.param(10**6, 10.0, 30.0, id="capped"),
        pytest.param(10, 0.0, 30.0, id="no-drain-gives-the-cap"),
    ],
)
def test_retry_after(pending: int, rate: float, expected: float) -> None:
    assert retry_after_s(pending, rate, floor_s=0.1, cap_s=30.0) == pytest.approx(expected)


def full_node(gpus: int = 2) -> NodeDispatcher:
    contract = ModelContract(name="m", max_batch=10, max_wait_s=0.0, max_pending=40, batch_s=0.1)
    return NodeDispatcher([contract], SchedulerConfig(gpus=gpus))


def test_queue_full_before_any_completion_uses_the_capacity() -> None:
    node = full_node(gpus=2)  # capacity: 2 slots x 10 / 0.1 s = 200/s
    for _ in range(40):
        node.submit("m", tenant="t", plan="paid", now=0.0)
    with pytest.raises(QueueFull) as full:
        node.submit("m", tenant="t", plan="paid", now=0.0)
    assert full.value.retry_after == pytest.approx(40 / 200)
    assert node.retry_after("m", 0.0) == pytest.approx(0.2)


def test_queue_full_after_completions_uses_the_measured_rate() -> None:
    node = full_node(gpus=2)
    now = 0.0
    for _ in range(20):  # 2 s of one batch of 5 every 0.1 s: a measured 50/s, under the 200/s capacity
        for _ in range(5):
            node.submit("m", tenant="t", plan="paid", now=now)
        (d,) = node.pump(now)
        now += 0.1
        assert node.complete(d.batch_id, now) is d
    for _ in range(40):
        node.submit("m", tenant="t", plan="paid", now=now)
    with pytest.raises(QueueFull) as full:
        node.submit("m", tenant="t", plan="free", now=now)
    assert full.value.retry_after == pytest.approx(40 / 50)


def test_slots_and_running_follow_the_gpus() -> None:
    contracts = [ModelContract(name="small", max_batch=4, max_wait_s=0.0),
                 ModelContract(name="big", gpus_per_batch=4, max_batch=4, max_wait_s=0.0)]
    node = NodeDispatcher(contracts, SchedulerConfig(gpus=4))
    for _ in range(6):
        node.submit("small", tenant="t", plan="paid", now=0.0)
    assert [len(d.items) for d in node.pump(0.0)] == [4, 2]
    assert (node.running("small"), node.running("big"), node.slots("small"), node.slots("big")) == (6, 0, 4, 1)
    node.kill_gpu(3, 0.0)
    assert (node.slots("small"), node.slots("big")) == (3, 0)
