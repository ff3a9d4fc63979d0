"""The composed pick: every branch on a table of cases, the context filter, a popular prefix spreads."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from dataplane.pick import Branch, Need
from dataplane.picker import Picker
from dataplane.policy import LocalLoad
from dataplane.pool import Pool, Replica, make_pool
from dataplane.prefix import HotKeys
from dataplane.ring import key_draw
from dataplane.route import route
from dataplane.table import build_table
from tests.dataplane.fakes import route as route_pb
from tests.dataplane.fakes import snapshot

NEED = Need(tokens=1600, prompt_tokens=1000)  # 100 blocks of 16 tokens
N = 6


def rep(i: int, **kw: Any) -> Replica:
    base: dict[str, Any] = {"address": f"10.0.0.{i}:1", "kserve_model": "m", "version": "v1", "max_concurrency": 8,
                            "kv_block_tokens": 16, "kv_blocks_free": 1000, "kv_blocks_total": 1000,
                            "max_context_tokens": 8192, "smoothed": 10.0}
    return Replica(replica_id=f"r{i}", **{**base, **kw})


def pool_of(replicas: list[Replica]) -> Pool:
    return make_pool("m/v1", replicas, vnodes=32, load_factor=1.25, rings={})


def key_with(draw_above: float) -> int:
    """The first key (counting up) whose draw is above ``draw_above``."""
    return next(k for k in range(1, 10_000) if key_draw(k) > draw_above)


KEY = key_with(0.6)  # above the share an overloaded home keeps in the cases below
WALK = list(pool_of([rep(i) for i in range(N)]).ring.walk(KEY))
HOME, SECOND = WALK[0], WALK[1]

# Each case changes the replica at walk position 0 (home) or 1 and the proxy's local state.
Change = Callable[[list[Replica], LocalLoad], None]


def at(position: int, **kw: Any) -> Change:
    def change(replicas: list[Replica], local: LocalLoad) -> None:
        i = WALK[position]
        replicas[i] = dataclasses.replace(replicas[i], **kw)
    return change


def backlog(position: int, tokens: int) -> Change:
    def change(replicas: list[Replica], local: LocalLoad) -> None:
        local.add(replicas[WALK[position]].replica_id, tokens)
    return change


CASES = [
    # id, changes, key, spill threshold, expected walk position (None: no replica), branch
    ("home-takes-its-key", [], KEY, None, 0, Branch.AFFINITY),
    ("home-over-the-bound-sheds-the-key", [at(0, smoothed=100.0)], KEY, None, 1, Branch.OVERFLOW),
    ("home-without-kv-room", [at(0, kv_blocks_free=50)], KEY, None, 1, Branch.OVERFLOW),
    ("home-telemetry-stale", [at(0, telemetry_age=10.0)], KEY, None, 1, Branch.OVERFLOW),
    ("home-too-short-context-next-is-home", [at(0, max_context_tokens=1000)], KEY, None, 1, Branch.AFFINITY),
    ("deep-backlog-spills-to-the-second", [backlog(0, 50_000)], KEY, 10_000.0, 1, Branch.SPILL),
    ("backlog-under-threshold-stays", [backlog(0, 5_000)], KEY, 10_000.0, 0, Branch.AFFINITY),
    ("no-spill-without-threshold", [backlog(0, 50_000)], KEY, None, 0, Branch.AFFINITY),
    ("no-key-goes-to-p2c", [], None, None, "any", Branch.P2C),
]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize(("changes", "key", "spill", "expect", "branch"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_route_table(changes: list[Change], key: int | None, spill: float | None, expect: Any, branch: Branch,
                     seed: int) -> None:
    replicas, local = [rep(i) for i in range(N)], LocalLoad()
    for change in changes:
        change(replicas, local)
    decision = route(pool_of(replicas), NEED, key, local, random.Random(seed), spill=spill)
    assert decision.branch is branch
    assert decision.replica is not None
    if expect != "any":
        assert decision.replica.replica_id == f"r{WALK[expect]}"


EDGES = [
    # id, replicas, expected replica id or None, branch
    ("too-long-for-every-replica", [rep(i, max_context_tokens=1000) for i in range(N)], None, Branch.TOO_LONG),
    ("only-one-has-the-context", [rep(0, max_context_tokens=1000), rep(1), rep(2, max_context_tokens=1000)],
     "r1", Branch.SINGLE),
    ("one-replica", [rep(4)], "r4", Branch.SINGLE),
    ("no-replica", [], None, Branch.NONE),
    ("every-replica-stale-falls-back", [rep(i, telemetry_age=100.0) for i in range(N)], "any", Branch.FALLBACK),
]


@pytest.mark.parametrize(("replicas", "expect", "branch"), [e[1:] for e in EDGES], ids=[e[0] for e in EDGES])
def test_route_edges(replicas: list[Replica], expect: str | None, branch: Branch) -> None:
    decision = route(pool_of(replicas), NEED, KEY, LocalLoad(), random.Random(1))
    assert decision.branch is branch
    got = decision.replica.replica_id if decision.replica else None
    assert got == expect or (expect == "any" and got is not None)
    if expect is None:
        assert decision.reason


def test_retry_leaves_the_ring_for_p2c_off_the_failed_replica() -> None:
    decision = route(pool_of([rep(i) for i in range(N)]), NEED, KEY, LocalLoad(), random.Random(1),
                     excluded={f"r{HOME}"})
    assert decision.branch is Branch.P2C and decision.replica is not None
    assert decision.replica.replica_id != f"r{HOME}"


def test_spill_prefers_a_drawn_replica_when_the_second_is_busy_too() -> None:
    replicas, local = [rep(i) for i in range(N)], LocalLoad()
    backlog(0, 50_000)(replicas, local)
    backlog(1, 45_000)(replicas, local)
    decision = route(pool_of(replicas), NEED, KEY, local, random.Random(1), spill=10_000.0)
    assert decision.branch is Branch.SPILL
    assert decision.replica is not None and decision.replica.replica_id not in {f"r{HOME}", f"r{SECOND}"}


def _table(n: int = N) -> Any:
    return build_table(snapshot(1, [route_pb(f"r{i}", f"10.0.0.{i}:1", node=f"n{i}", max_concurrency=8)
                                    for i in range(n)]), region="local", applied_at=0.0)


def serve(picker: Picker, table: Any, **request: Any) -> Any:
    """Route one request and see it through (first token, end), as the router does; its decision."""
    routing = picker.prepare(table, tenant="t", model="m", version="", max_tokens=10, **request)
    decision = picker.choose(table, routing, 0.0)
    assert decision.replica is not None
    attempt = picker.sent(decision.replica.replica_id, routing, decision.branch)
    picker.first(attempt)
    picker.done(attempt, 0)
    return decision


def test_a_popular_prefix_spreads_over_the_conversations_under_it() -> None:
    # 300 conversations share their first block (a system prompt), each has its own second block.
    picker, table = Picker(random.Random(1)), _table()
    homes: Counter[str] = Counter()
    for conv in range(300):
        decision = serve(picker, table, prompt_tokens=1000, hashes=[7, 1000 + conv, 2000 + conv])
        homes[decision.replica.replica_id] += 1
    assert len(homes) == N and max(homes.values()) < 300 / N * 2, homes
    # One fixed key of the first block, never judged hot: the same traffic lands on one replica.
    fixed = Picker(random.Random(1), depths=(1,), hot=HotKeys(min_count=1e9))
    landed = {serve(fixed, table, prompt_tokens=1000, hashes=[7, 1000 + conv]).replica for conv in range(300)}
    assert len(landed) == 1


def test_a_hot_explicit_key_spreads_over_a_few_replicas_and_a_cool_one_stays() -> None:
    picker, table = Picker(random.Random(1)), _table(12)
    seen: Counter[str] = Counter()
    for i in range(400):
        decision = serve(picker, table, prompt_tokens=100, prefix_key="popular")
        if i >= 100:  # once the sketch has seen it carry every request
            assert decision.branch is Branch.SPREAD
            seen[decision.replica.replica_id] += 1
    assert len(seen) >= 6  # no longer one replica's: spread over the pool
    # A key that comes once in 20 requests is not hot: it keeps its one replica.
    cool, homes = Picker(random.Random(2)), set()
    for i in range(400):
        key = "rare" if i % 20 == 0 else f"other-{i}"
        decision = serve(cool, table, prompt_tokens=100, prefix_key=key)
        if key == "rare":
            assert decision.branch is Branch.AFFINITY
            homes.add(decision.replica.replica_id)
    assert len(homes) == 1
