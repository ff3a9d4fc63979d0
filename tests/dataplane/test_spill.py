"""The proxy's region choice: spill weights applied with one uniform draw per request."""

from __future__ import annotations

import math

import pytest

from dataplane.admission.queues import QueueParams, Ticket, TierQueues
from dataplane.regions.choice import (
    LocalQueue,
    RegionBranch,
    SpillTarget,
    choose_region,
    local_queue,
    local_wait_ms,
    region_for,
    room,
    spill_on_queue,
)

TARGETS = (SpillTarget("b", 0.3, 40.0), SpillTarget("c", 0.1, 200.0))
BOTH = ("b", "c")


@pytest.mark.parametrize(
    ("u", "tier", "usable", "region", "branch"),
    [
        (0.0, "interactive", BOTH, "b", RegionBranch.SPILLED),
        (0.29, "interactive", BOTH, "b", RegionBranch.SPILLED),
        (0.3, "interactive", BOTH, "c", RegionBranch.SPILLED),
        (0.39, "interactive", BOTH, "c", RegionBranch.SPILLED),
        (0.4, "interactive", BOTH, "a", RegionBranch.LOCAL),
        (0.0, "standard", BOTH, "a", RegionBranch.LOCAL),
        (0.0, "batch", BOTH, "a", RegionBranch.LOCAL),
        (0.0, "interactive", ("c",), "a", RegionBranch.LOCAL),  # b has no replica of the model: stay local
    ],
    ids=["b-low", "b-edge", "c-low", "c-edge", "local", "standard-stays", "batch-stays", "unusable-stays"],
)
def test_the_draw_picks_the_region_by_cumulative_weight(u: float, tier: str, usable: tuple[str, ...], region: str,
                                                        branch: RegionBranch) -> None:
    choice = choose_region("a", TARGETS, tier=tier, u=u, usable=usable)
    assert (choice.region, choice.branch) == (region, branch)
    assert choice.rtt_ms == {"a": 0.0, "b": 40.0, "c": 200.0}[region]


BATCH_TARGETS = (SpillTarget("b", 0.3, 40.0, batch_weight=0.2), SpillTarget("c", 0.0, 200.0, batch_weight=0.5,
                                                                           batch_only=True))


@pytest.mark.parametrize(
    ("u", "tier", "region"),
    [
        (0.1, "batch", "b"),  # batch draws on batch_weight: b 0..0.2
        (0.2, "batch", "c"),  # c 0.2..0.7, 200 ms away and batch only: batch goes there all the same
        (0.69, "batch", "c"),
        (0.7, "batch", "a"),  # past the sum: local
        (0.1, "interactive", "b"),  # interactive draws on weight, over the routes within its budget
        (0.35, "interactive", "a"),  # c's route is batch only: not counted for interactive
        (0.1, "standard", "a"),
    ],
    ids=["batch-b", "batch-c-low", "batch-c-edge", "batch-local", "interactive-b", "interactive-skips-batch-only",
         "standard-stays"],
)
def test_batch_draws_on_the_batch_weights_over_every_route(u: float, tier: str, region: str) -> None:
    assert choose_region("a", BATCH_TARGETS, tier=tier, u=u, usable=BOTH).region == region


def test_spill_on_queue_never_takes_a_batch_only_route() -> None:
    far = (SpillTarget("c", 0.0, 200.0, batch_only=True),)
    assert spill_on_queue(far, {"c": 50.0}, tier="interactive", wait_ms=5000.0, usable=("c",)) is None


def test_no_targets_means_local() -> None:
    assert choose_region("a", (), tier="interactive", u=0.0).branch is RegionBranch.LOCAL



@pytest.mark.parametrize(
    ("queue", "wait"),
    [
        (LocalQueue(waiting=0, running=3, capacity=4, rate=20.0), 0.0),  # a free slot: no wait
        (LocalQueue(waiting=0, running=4, capacity=4, rate=20.0), 50.0),  # next dispatch: 1 / 20 per second
        (LocalQueue(waiting=9, running=4, capacity=4, rate=20.0), 500.0),  # ten dispatches ahead
        (LocalQueue(waiting=2, running=4, capacity=4, rate=0.0), math.inf),  # nothing dispatched yet
        (LocalQueue(waiting=5, running=0, capacity=0, rate=0.0), 0.0),  # admission off for the model
    ],
    ids=["free-slot", "full", "queue", "no-rate", "admission-off"],
)
def test_the_local_wait_is_the_dispatches_ahead_over_the_dispatch_rate(queue: LocalQueue, wait: float) -> None:
    assert local_wait_ms(queue) == pytest.approx(wait)


def test_local_queue_reads_the_tier_queues() -> None:
    queues = TierQueues(QueueParams(), capacity=1)
    tickets = [Ticket(tenant="t", plan="paid", tier="interactive", cost=1, deadline=100.0) for _ in range(3)]
    for ticket in tickets:
        queues.offer(ticket, 0.0)
    queues.dispatch(0.0)
    got = local_queue(queues, 0.0)
    assert (got.waiting, got.running, got.capacity) == (2, 1, 1) and got.rate > 0


@pytest.mark.parametrize(
    ("slots", "others", "inflight", "headroom", "share", "expected"),
    [
        (16, 8.0, 2, 1.0, 1.0, 6.0),
        (16, 8.0, 2, 1.25, 1.0, 10.0),  # a quarter of the slots again may wait there
        (16, 8.0, 2, 1.0, 0.5, 2.0),  # one of two proxies: half of the room left
        (16, 20.0, 0, 1.0, 1.0, -4.0),  # already past its slots
    ],
    ids=["plain", "headroom", "share", "full"],
)
def test_room_is_the_slots_left_after_the_others_and_this_proxy(slots: int, others: float, inflight: int,
                                                                headroom: float, share: float,
                                                                expected: float) -> None:
    assert room(slots, others, inflight, headroom=headroom, share=share) == pytest.approx(expected)


QUEUED = (SpillTarget("b", 0.0, 40.0), SpillTarget("c", 0.0, 200.0))


@pytest.mark.parametrize(
    ("wait", "rooms", "tier", "region"),
    [
        (50.0, {"b": 5.0, "c": 5.0}, "interactive", None),  # under the 100 ms threshold
        (150.0, {"b": 5.0, "c": 5.0}, "interactive", "b"),  # nearest with room
        (150.0, {"b": 0.5, "c": 5.0}, "interactive", None),  # b full; c's 200 ms is slower than waiting
        (300.0, {"b": 0.5, "c": 5.0}, "interactive", "c"),  # b full; c faster than waiting 300 ms
        (300.0, {"b": 5.0}, "standard", None),  # only interactive spills
        (math.inf, {"b": 1.0}, "interactive", "b"),  # no dispatch rate yet, a slot of room
    ],
    ids=["short-wait", "nearest", "nearest-full", "farther-faster", "standard", "unknown-rate"],
)
def test_spill_on_queue_takes_the_nearest_target_faster_than_waiting_with_room(
        wait: float, rooms: dict[str, float], tier: str, region: str | None) -> None:
    got = spill_on_queue(QUEUED, rooms, tier=tier, wait_ms=wait, usable=BOTH)
    assert (got.region if got else None) == region
    assert got is None or got.branch is RegionBranch.QUEUE


@pytest.mark.parametrize(
    ("u", "wait", "rooms", "weighted_room", "region", "branch"),
    [
        (0.1, 0.0, {"b": 0.0}, False, "b", RegionBranch.SPILLED),  # the weights as planned
        (0.1, 0.0, {"b": 0.0}, True, "a", RegionBranch.LOCAL),  # checked against room: b has none
        (0.9, 150.0, {"b": 3.0}, False, "b", RegionBranch.QUEUE),  # drawn home, but the queue is long
        (0.9, 50.0, {"b": 3.0}, False, "a", RegionBranch.LOCAL),  # drawn home, short queue
    ],
    ids=["weighted", "weighted-no-room", "queue", "home"],
)
def test_region_for_draws_by_weight_then_spills_on_queue(u: float, wait: float, rooms: dict[str, float],
                                                         weighted_room: bool, region: str,
                                                         branch: RegionBranch) -> None:
    asked: list[int] = []

    def rooms_now() -> dict[str, float]:
        asked.append(1)
        return rooms

    got = region_for("a", (SpillTarget("b", 0.3, 40.0),), tier="interactive", u=u, usable=("b",), wait_ms=wait,
                     rooms=rooms_now, weighted_room=weighted_room)
    assert (got.region, got.branch) == (region, branch)
    assert len(asked) <= 1  # worked out at most once, and only when needed
    if u > 0.3 and wait <= 100.0:
        assert not asked
