"""The pick: filters, score, power of two choices; branches asserted."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from dataplane.pick.p2c import Branch, Need, ScoreParams, draw, exclude, pick, score
from dataplane.table.local import Replica

NEED = Need(tokens=160)  # 10 blocks of 16 tokens


def rep(rid: str, **kw: Any) -> Replica:
    base: dict[str, Any] = {"address": "127.0.0.1:1", "kserve_model": "m", "version": "v1", "max_concurrency": 4,
                            "kv_block_tokens": 16, "kv_blocks_free": 100, "kv_blocks_total": 100}
    return Replica(replica_id=rid, **{**base, **kw})


IDLE = rep("idle")
BUSY = rep("busy", queued=1, running=1)  # occupancy 0.5

CASES = [
    # id, candidates, inflight, excluded, table_age, expected replica, branch
    ("idle-beats-busy", [IDLE, BUSY], {}, (), 0.0, "idle", Branch.P2C),
    ("busy-first-in-list", [BUSY, IDLE], {}, (), 0.0, "idle", Branch.P2C),
    ("kv-insufficient-avoided", [rep("tight", kv_blocks_free=5), BUSY], {}, (), 0.0, "busy", Branch.SINGLE),
    ("kv-exact-fit-ok", [rep("exact", kv_blocks_free=10), BUSY], {}, (), 0.0, "exact", Branch.P2C),
    ("kv-none-fits-keeps-all", [rep("a", kv_blocks_free=1, running=3), rep("b", kv_blocks_free=2)], {}, (), 0.0,
     "b", Branch.P2C),
    ("kv-unknown-counts-as-fit", [rep("nokv", kv_blocks_total=0, kv_blocks_free=0), BUSY], {}, (), 0.0, "nokv",
     Branch.P2C),
    ("stale-telemetry-penalised", [rep("stale", telemetry_age=10.0), BUSY], {}, (), 0.0, "busy", Branch.P2C),
    ("fresh-enough-not-penalised", [rep("recent", telemetry_age=0.9), BUSY], {}, (), 0.0, "recent", Branch.P2C),
    ("local-inflight-counted", [IDLE, BUSY], {"idle": 3}, (), 0.0, "busy", Branch.P2C),
    ("local-inflight-other-replica", [IDLE, BUSY], {"busy": 3}, (), 0.0, "idle", Branch.P2C),
    ("excluded-replica-skipped", [IDLE, BUSY], {}, ("idle",), 0.0, "busy", Branch.SINGLE),
    ("single-candidate", [BUSY], {}, (), 0.0, "busy", Branch.SINGLE),
    ("none-without-candidates", [], {}, (), 0.0, None, Branch.NONE),
    ("none-when-all-excluded", [IDLE, BUSY], {}, ("idle", "busy"), 0.0, None, Branch.NONE),
]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize(("candidates", "inflight", "excluded", "table_age", "expect", "branch"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_pick_table(candidates, inflight, excluded, table_age, expect, branch, seed: int) -> None:
    decision = pick(candidates, NEED, inflight, random.Random(seed), excluded, table_age=table_age)
    assert decision.branch is branch
    assert (decision.replica.replica_id if decision.replica else None) == expect
    if expect is None:
        assert decision.reason


AVOID = [
    # id, candidates, excluded, avoid_nodes, expected, branch
    ("retry-goes-to-another-node", [rep("a", node="n1"), rep("b", node="n1"), rep("c", node="n2", running=3)],
     {"a"}, {"n1"}, "c", Branch.SINGLE),
    ("retry-same-node-when-no-other", [rep("a", node="n1"), rep("b", node="n1")], {"a"}, {"n1"}, "b", Branch.SINGLE),
    ("other-nodes-still-compared", [rep("a", node="n1"), rep("b", node="n2", running=3), rep("c", node="n3")],
     {"a"}, {"n1"}, "c", Branch.P2C),
]


@pytest.mark.parametrize(("candidates", "excluded", "avoid", "expect", "branch"), [a[1:] for a in AVOID],
                         ids=[a[0] for a in AVOID])
def test_retry_avoids_the_failed_node(candidates, excluded, avoid, expect: str, branch: Branch) -> None:
    for seed in range(4):
        decision = pick(candidates, NEED, {}, random.Random(seed), excluded, avoid_nodes=avoid)
        assert decision.replica is not None and decision.replica.replica_id == expect
        assert decision.branch is branch


def test_time_since_the_table_was_applied_ages_its_telemetry() -> None:
    # Pushed 0.9 s old: fresh at apply time; one second later it is 1.9 s old and costs 0.18,
    # more than the 0.1 occupancy of a replica whose telemetry was fresh when pushed.
    old = rep("old", telemetry_age=0.9)
    light = rep("light", max_concurrency=10, running=1)
    rng = random.Random(1)
    assert pick([old, light], NEED, {}, rng, table_age=0.0).replica == old
    assert pick([old, light], NEED, {}, rng, table_age=1.0).replica == light


SCORES = [
    # id, replica, inflight, age, expected score (defaults: kv 0.5, stale 1.0, fresh 1 s, stale 6 s)
    ("empty", rep("a", kv_blocks_total=0), 0, 0.0, 0.0),
    ("occupancy", rep("a", queued=2, running=4, kv_blocks_total=0), 2, 0.0, 2.0),
    ("kv-use-after-request", rep("a", kv_blocks_free=50), 0, 0.0, 0.5 * 0.6),
    ("kv-clamped-at-one", rep("a", kv_blocks_free=5), 0, 0.0, 0.5),
    ("staleness-half", rep("a", kv_blocks_total=0), 0, 3.5, 0.5),
    ("staleness-capped", rep("a", kv_blocks_total=0), 0, 100.0, 1.0),
]


@pytest.mark.parametrize(("replica", "inflight", "age", "expect"), [s[1:] for s in SCORES], ids=[s[0] for s in SCORES])
def test_score_formula(replica: Replica, inflight: int, age: float, expect: float) -> None:
    assert score(replica, NEED, inflight, age, ScoreParams()) == pytest.approx(expect)


def test_ties_are_broken_by_the_rng_not_list_order() -> None:
    twins = [rep("a"), rep("b")]
    firsts = {pick(twins, NEED, {}, random.Random(seed)).replica.replica_id for seed in range(16)}
    reversed_firsts = {pick(twins[::-1], NEED, {}, random.Random(seed)).replica.replica_id for seed in range(16)}
    assert firsts == {"a", "b"} == reversed_firsts


DRAWS = [
    ("all-roomy", ["r", "r", "r"], 2, {"a", "b", "c"}),
    ("one-roomy", ["t", "r", "t"], 1, {"b"}),
    ("two-roomy", ["t", "r", "t", "r"], 2, {"b", "d"}),
    ("none-roomy", ["t", "t", "t"], 2, {"a", "b", "c"}),
]


@pytest.mark.parametrize(("kinds", "size", "allowed"), [d[1:] for d in DRAWS], ids=[d[0] for d in DRAWS])
def test_draw_prefers_replicas_with_room(kinds: list[str], size: int, allowed: set[str]) -> None:
    pool = [rep("abcd"[i], kv_blocks_free=3 if k == "t" else 100) for i, k in enumerate(kinds)]
    for seed in range(8):
        pair = draw(pool, NEED, random.Random(seed))
        assert len(pair) == size and {r.replica_id for r in pair} <= allowed
        assert len({r.replica_id for r in pair}) == size


def test_exclude_returns_the_same_sequence_when_nothing_is_excluded() -> None:
    pool = (IDLE, BUSY)
    assert exclude(pool, ()) is pool and exclude(pool, {"idle"}) == [BUSY]


def herd(count_local: bool, picks: int = 32) -> list[Counter[str]]:
    """Four proxies, one table (one idle-looking replica, three half busy), each sending ``picks`` without replies."""
    table = [rep("idle"), rep("b1", running=2), rep("b2", running=2), rep("b3", running=2)]
    results = []
    for proxy in range(4):
        rng, inflight, got = random.Random(100 + proxy), Counter[str](), Counter[str]()
        for _ in range(picks):
            decision = pick(table, NEED, inflight if count_local else {}, rng)
            assert decision.replica is not None and decision.branch is Branch.P2C
            inflight[decision.replica.replica_id] += 1
            got[decision.replica.replica_id] += 1
        results.append(got)
    return results


def test_proxies_sharing_a_table_spread_instead_of_herding() -> None:
    # Balanced: 6 pushed + 32 local spread so every replica ends near (6 + 32) / 4 = 9.5 in flight.
    for got in herd(count_local=True):
        assert got["idle"] <= 11, got
        assert all(got[r] >= 6 for r in ("b1", "b2", "b3")), got


def test_without_local_inflight_the_idle_replica_takes_too_much() -> None:
    # The contrast that shows the test above can fail: pushed telemetry alone herds onto "idle".
    assert sum(got["idle"] for got in herd(count_local=False)) > 4 * 11
