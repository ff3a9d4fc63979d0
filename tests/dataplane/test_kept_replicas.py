"""Replicas kept for interactive, table by table: the kept set, the pick's filter, the queues, the simulator, a proxy.

(dataplane.admission.avoid.kept_for_interactive and Placement.avoid, TierQueues
dispatch leaving the kept slots to interactive, the tier simulator, and a
proxy with fake replicas sending batch only to the replicas not kept.)
"""

from __future__ import annotations

import asyncio

import pytest

from agent.replica.engine import EngineParams
from dataplane.admission.avoid import Placement, kept_for_interactive
from dataplane.admission.queues import QueueParams, Ticket, TierQueues
from ferry.v1 import common_pb2
from tests.dataplane.conftest import PAID, Rig, request
from tests.dataplane.fakes import Behaviour
from tools.sim.tiers import Req, TierSim

EIGHT = {f"r{i}": 60 for i in range(8)}


@pytest.mark.parametrize(("replicas", "share", "count"), [
    (EIGHT, 0.0, 0),                                    # off
    (EIGHT, 0.5, 4),
    (EIGHT, 0.3, 2),                                    # rounded down
    (EIGHT, 1.0, 7),                                    # at least one left to the other tiers
    ({"r0": 4, "r1": 4, "r2": 4}, 0.5, 1),
    ({"r0": 4}, 0.9, 0),                                # one replica: nothing can be kept
    ({"r0": 4, "r1": 0, "r2": 4, "r3": 0}, 0.5, 1),     # replicas without slots do not count
    ({}, 0.5, 0),
], ids=["off", "half", "rounded-down", "one-left", "three", "single", "no-slots", "empty"])
def test_kept_set_size(replicas: dict[str, int], share: float, count: int) -> None:
    kept = kept_for_interactive(replicas, share)
    assert len(kept) == count and kept <= {r for r, n in replicas.items() if n > 0}


def test_kept_set_is_the_same_everywhere_and_moves_only_with_its_own_replicas() -> None:
    kept = kept_for_interactive(EIGHT, 0.5)
    assert kept == kept_for_interactive(dict(reversed(list(EIGHT.items()))), 0.5)  # order-free: every proxy agrees
    other = next(r for r in EIGHT if r not in kept)
    assert kept_for_interactive({r: n for r, n in EIGHT.items() if r != other}, 4 / 7) == kept
    gone = sorted(kept)[0]
    after = kept_for_interactive({r: n for r, n in EIGHT.items() if r != gone}, 4 / 7)
    assert len(after) == 4 and len(after - kept) == 1  # one replacement, the rest stay


@pytest.mark.parametrize(("interactive", "heavy", "expect"), [
    (False, {}, "kept"),                # a batch or standard request keeps off the kept replicas
    (True, {}, "none"),                 # interactive may go anywhere
    (False, {"noisy": 120}, "kept+shard"),  # another tenant: off the kept replicas and off the shard
    (True, {"noisy": 120}, "shard"),
], ids=["lower", "interactive", "lower-shard", "interactive-shard"])
def test_avoid_by_tier(interactive: bool, heavy: dict[str, int], expect: str) -> None:
    placement = Placement(interactive_share=0.5)
    placement.set_replicas(EIGHT)
    placement.note_heavy("standard", heavy)
    placement.replan(0.0)
    shard = placement.shards.shards.get("noisy", frozenset())
    assert not shard & placement.kept  # shards are cut from the replicas not kept
    assert len(shard) == (2 if heavy else 0)
    want = {"none": frozenset(), "kept": placement.kept, "shard": shard, "kept+shard": placement.kept | shard}[expect]
    assert placement.avoid("t0", {}, interactive=interactive) == want
    assert placement.avoid("noisy", {}, interactive=interactive) == (placement.shards.keep_off("noisy") | (
        frozenset() if interactive else placement.kept))  # the heavy tenant: off everything outside its shard


def _ticket(tier: str) -> Ticket:
    return Ticket(tenant="a", plan="paid", tier=tier, cost=10, deadline=1e9)


@pytest.mark.parametrize(("capacity", "share", "batch_runs", "interactive_runs"), [
    (16, 0.0, 16, 16),
    (16, 0.5, 8, 16),       # two of four replicas kept: batch runs on the other 8 slots
    (8, 0.5, 4, 8),         # this proxy dispatches half the fleet: half the kept slots too
    (16, 0.25, 12, 16),
], ids=["off", "half", "proxy-share", "one-replica"])
def test_lower_tiers_leave_the_kept_slots(capacity: int, share: float, batch_runs: int,
                                          interactive_runs: int) -> None:
    for tier, runs in (("batch", batch_runs), ("interactive", interactive_runs)):
        q = TierQueues(QueueParams(headroom_max_share=0.0, interactive_replica_share=share, max_queued=100,
                                   reserved={"interactive": 0.0, "standard": 0.0, "batch": 1.0}), capacity)
        q.set_replicas({f"r{i}": 4 for i in range(4)})
        for _ in range(20):
            q.offer(_ticket(tier), 0.0)
        assert len(q.dispatch(0.0)) == runs


def test_simulated_batch_stays_off_the_kept_replicas() -> None:
    reqs = [Req(rid=i, arrival=0.0, tier="batch", tenant="bulk", max_tokens=64) for i in range(200)]
    reqs += [Req(rid=1000 + i, arrival=0.5 + i * 0.01, tier="interactive", max_tokens=16) for i in range(100)]
    sim = TierSim(replicas=4, engine=EngineParams(max_running=16),
                  queues=QueueParams(interactive_replica_share=0.5))
    kept = {int(r) for r in sim.queues.placement.kept}
    placed: dict[str, set[int]] = {"batch": set(), "interactive": set()}
    send = sim._send

    def spy(rid: int, ticket: Ticket, now: float) -> None:
        send(rid, ticket, now)
        if rid in sim._where:
            placed[ticket.tier].add(sim._where[rid])

    sim._send = spy  # type: ignore[method-assign]
    sim.run(reqs, 60.0)
    assert len(kept) == 2
    assert placed["batch"] and not placed["batch"] & kept
    assert placed["interactive"] & kept
    assert all(o.done is not None for o in sim.outcomes.values())  # the backlog drains on the other replicas


async def test_proxy_sends_batch_only_to_replicas_not_kept() -> None:
    """Two replicas of two slots, half kept for interactive: four batch requests all go to the other one."""
    rig = Rig()
    try:
        await rig.start({rid: Behaviour(delay=0.2) for rid in ("r0", "r1")},
                        loads={rid: {"max_concurrency": 2} for rid in ("r0", "r1")},
                        settings={"interactive_replica_share": 0.5})
        assert rig.proxy is not None
        admission = rig.proxy.router.admission
        (kept,) = admission.models["m"].placement.kept
        assert admission.metrics.interactive_replicas.labels("m")._value.get() == 1
        batch = [rig.stub.Infer(request(prompt=f"batch {k}", tier=common_pb2.TIER_BATCH), metadata=PAID, timeout=20)
                 for k in range(4)]
        await asyncio.gather(*batch)
        assert rig.served()[kept] == 0  # two at a time on the other replica, never on the kept one
        await rig.stub.Infer(request(prompt="interactive"), metadata=PAID, timeout=20)
        assert sum(rig.served().values()) == 5
    finally:
        await rig.stop()


@pytest.mark.parametrize(("on_kept", "on_shared", "batch_runs"), [
    (0, 0, 8),      # the kept replicas idle: batch still only on the other 8 slots
    (6, 0, 8),      # interactive on the kept replicas takes none of the others' slots
    (6, 2, 6),      # two interactive on the other replicas take two of their slots
    (0, 3, 5),
], ids=["idle", "interactive-kept", "interactive-both", "interactive-shared"])
def test_batch_fills_exactly_the_slots_interactive_leaves_on_the_other_replicas(
        on_kept: int, on_shared: int, batch_runs: int) -> None:
    q = TierQueues(QueueParams(headroom_max_share=0.0, interactive_replica_share=0.5, max_queued=100,
                               reserved={"interactive": 0.0, "standard": 0.0, "batch": 1.0}), 16)
    q.set_replicas({f"r{i}": 4 for i in range(4)})
    kept = sorted(q.placement.kept)
    shared = sorted(set(q.placement.replicas) - q.placement.kept)
    for k in range(on_kept + on_shared):
        q.offer(_ticket("interactive"), 0.0)
        (started,) = q.dispatch(0.0)
        where = kept[k % 2] if k < on_kept else shared[k % 2]
        q.make_room(started, where, 1, 4)
    assert q.placement.on_kept == on_kept
    for _ in range(20):
        q.offer(_ticket("batch"), 0.0)
    assert len(q.dispatch(0.0)) == batch_runs


def test_requests_on_kept_replicas_are_counted_until_they_end_or_the_set_changes() -> None:
    placement = Placement(interactive_share=0.5)
    placement.set_replicas({f"r{i}": 4 for i in range(4)})
    (first, second) = sorted(placement.kept)
    other = next(r for r in placement.replicas if r not in placement.kept)
    placement.place("a", first, victim=False)
    placement.place("b", second, victim=False)
    placement.place("c", other, victim=True)
    assert placement.on_kept == 2
    placement.place("a", other, victim=False)  # placed again elsewhere (a retry): counted once, where it is
    assert placement.on_kept == 1
    placement.forget("b")
    assert placement.on_kept == 0
    placement.place("b", second, victim=False)
    placement.set_replicas({r: 4 for r in placement.replicas if r != second})  # b's replica left: counted again
    assert placement.on_kept == (2 if other in placement.kept else 0)  # a and c, if their replica is kept now
