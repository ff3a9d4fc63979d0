"""Pushed loads older than a request lasts: the pick neither counts its own requests twice nor chases stale imbalance.

Measured in ``ferry up`` before these: a region's replicas alternating between all of the proxy's requests and
none, push after push, because the pushed load (already counting the proxy's requests) was added to its in-flight
count; and two proxies sharing replicas both avoiding whichever one the last push showed busy.
"""

from __future__ import annotations

import random

import pytest

from dataplane.pick.p2c import LocalLoad, Need, pick, score
from dataplane.regions.remote import pick_remote
from dataplane.table.pool import Replica

NEED = Need(tokens=16)


def rep(rid: str, load: int, age: float = 0.0) -> Replica:
    return Replica(replica_id=rid, address="127.0.0.1:1", kserve_model="m", version="v1", max_concurrency=4,
                   running=min(load, 4), queued=max(0, load - 4), telemetry_age=age)


@pytest.mark.parametrize(
    ("load", "inflight", "counted", "trust", "expected"),
    [
        (4, 4, 0, 1.0, 2.0),  # the old sum: this proxy's four requests counted twice
        (4, 4, 4, 1.0, 1.0),  # the pushed four were this proxy's: counted once
        (6, 4, 4, 1.0, 1.5),  # two of someone else's on top
        (6, 4, 4, 0.5, 1.25),  # half of those still stand at the push's age
        (6, 1, 4, 0.0, 0.25),  # a push older than a request lasts: only the own count is current
        (2, 0, 4, 1.0, 0.0),  # counted more than was pushed: never below zero
    ],
    ids=["sum", "counted", "others", "half-trust", "no-trust", "clamped"],
)
def test_score_counts_the_pushed_load_once_and_as_far_as_it_still_stands(
        load: int, inflight: int, counted: int, trust: float, expected: float) -> None:
    assert score(rep("x", load), NEED, inflight, 0.0, counted=counted, trust=trust) == pytest.approx(expected)


def test_local_load_marks_what_a_table_counts_and_learns_how_long_requests_last() -> None:
    local = LocalLoad()
    assert local.trust(5.0) == 1.0  # nothing learned yet: trust the push
    local.add("x")
    local.add("x")
    local.mark()
    local.done("x")
    assert dict(local.counted) == {"x": 2} and local.get("x") == 1
    local.observe(0.2)
    assert local.duration == pytest.approx(0.2)
    local.observe(1.2)
    assert local.duration == pytest.approx(0.25)  # an exponential average, weight 0.05
    assert [local.trust(age) for age in (0.0, 0.125, 0.25, 1.0)] == pytest.approx([1.0, 0.5, 0.0, 0.0])


def test_a_stale_imbalance_does_not_herd_the_pick() -> None:
    # The push shows x full and y idle, but requests last 0.2 s and the push is 0.6 s old: they are gone.
    local = LocalLoad()
    local.observe(0.2)
    pool = [rep("x", 8, age=0.6), rep("y", 0, age=0.6)]
    rng = random.Random(1)
    for _ in range(8):
        chosen = pick(pool, NEED, local, rng, counted=local.counted, trust=local.trust).replica
        assert chosen is not None
        local.add(chosen.replica_id)
    assert (local.get("x"), local.get("y")) == (4, 4)


def test_the_remote_pick_weighs_the_pushed_load_the_same_way() -> None:
    pool = (rep("x", 8, age=0.6), rep("y", 0, age=0.6))
    rng = random.Random(1)
    inflight = {"x": 1, "y": 2}
    assert pick_remote(pool, inflight, rng).replica_id == "y"  # trusting the push: y looks idle
    got = pick_remote(pool, inflight, rng, trust=lambda age: 0.0)
    assert got is not None and got.replica_id == "x"  # the push is stale: x has fewer of this proxy's
    got = pick_remote(pool, {"x": 4}, rng, counted={"x": 4})
    assert got is not None and got.replica_id == "y"  # x's pushed eight: four of them this proxy's, four others
