"""The whole decision: every branch on a table of cases, filters on the ring walk, placements, the region step."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import grpc
import pytest

import dataplane.pick.state
from dataplane.pick.decide import Ask, DecideParams, Local, Placements, Routing, View, decide, make_view
from dataplane.pick.p2c import Branch, Decision, LocalLoad, Need
from dataplane.pick.prefix import HotKeys
from dataplane.pick.state import PickState
from dataplane.table.local import build_table
from dataplane.table.pool import Pool, Replica, make_pool
from dataplane.table.ring import key_draw
from ferry.v1 import tables_pb2
from tests.dataplane.conftest import PAID, request
from tests.dataplane.fakes import Behaviour, snapshot
from tests.dataplane.fakes import route as route_pb
from tools.sim.fleet import Fleet, FleetConfig
from tools.sim.policies import POLICIES
from tools.sim.workload import SimRequest

NEED = Need(tokens=1600, prompt_tokens=1000)  # 100 blocks of 16 tokens
N = 6


def rep(i: int, **kw: Any) -> Replica:
    base: dict[str, Any] = {"address": f"10.0.0.{i}:1", "kserve_model": "m", "version": "v1", "max_concurrency": 8,
                            "kv_block_tokens": 16, "kv_blocks_free": 1000, "kv_blocks_total": 1000,
                            "max_context_tokens": 8192, "smoothed": 10.0}
    return Replica(replica_id=f"r{i}", **{**base, **kw})


def pool_of(replicas: list[Replica]) -> Pool:
    return make_pool("m/v1", replicas, vnodes=32, load_factor=1.25, rings={})


_VIEW = make_view(build_table(snapshot(1, []), region="local", applied_at=0.0))


def route(pool: Pool, need: Need, key: int | None, local: LocalLoad, rng: random.Random, *,
          detour: float | None = None, known: bool = True, ejected: frozenset[str] = frozenset(),
          tried: frozenset[str] = frozenset(), tried_nodes: frozenset[str] = frozenset(),
          avoid: frozenset[str] = frozenset(), placements: Placements | None = None, hot: bool = False) -> Decision:
    """:func:`decide` in this region for ``pool`` (a key is remembered at its home when ``known``)."""
    if placements is None:
        placements = Placements()
        if key is not None and known and pool.replicas:
            placements.put(key, pool.replicas[next(pool.ring.walk(key))].replica_id)
    ask = Ask(routing=Routing("v1", pool, key, need, hot), tried=tried, tried_nodes=tried_nodes, avoid=avoid)
    return decide(_VIEW, ask, Local(local, ejected, detour, placements, place_margin=(detour or 0.0) / 4), rng, 0.0)


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
    # id, changes, key, known (remembered at its home), detour threshold, expected walk position, branch
    ("home-takes-its-key", [], KEY, True, None, 0, Branch.AFFINITY),
    ("new-key-takes-its-home", [], KEY, False, None, 0, Branch.AFFINITY),
    ("remembered-home-stays-over-the-bound", [at(0, smoothed=100.0)], KEY, True, None, 0, Branch.AFFINITY),
    ("new-key-over-the-bound-sheds", [at(0, smoothed=100.0)], KEY, False, None, 1, Branch.OVERFLOW),
    ("home-without-kv-room", [at(0, kv_blocks_free=50)], KEY, True, None, 1, Branch.OVERFLOW),
    ("home-telemetry-stale", [at(0, telemetry_age=10.0)], KEY, True, None, 1, Branch.OVERFLOW),
    ("home-too-short-context-next-is-home", [at(0, max_context_tokens=1000)], KEY, False, None, 1, Branch.AFFINITY),
    ("deep-backlog-detours-to-the-second", [backlog(0, 50_000)], KEY, True, 10_000.0, 1, Branch.DETOUR),
    ("backlog-under-threshold-stays", [backlog(0, 5_000)], KEY, True, 10_000.0, 0, Branch.AFFINITY),
    ("no-detour-without-threshold", [backlog(0, 50_000)], KEY, True, None, 0, Branch.AFFINITY),
    ("new-key-placed-on-the-less-busy-second", [backlog(0, 50_000)], KEY, False, 10_000.0, 1, Branch.PLACED),
    ("new-key-stays-home-within-the-margin", [backlog(0, 2_000)], KEY, False, 10_000.0, 0, Branch.AFFINITY),
    ("no-key-goes-to-p2c", [], None, False, None, "any", Branch.P2C),
]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize(("changes", "key", "known", "detour", "expect", "branch"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_decide_table(changes: list[Change], key: int | None, known: bool, detour: float | None, expect: Any,
                      branch: Branch, seed: int) -> None:
    replicas, local = [rep(i) for i in range(N)], LocalLoad()
    for change in changes:
        change(replicas, local)
    decision = route(pool_of(replicas), NEED, key, local, random.Random(seed), detour=detour, known=known)
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
def test_decide_edges(replicas: list[Replica], expect: str | None, branch: Branch) -> None:
    decision = route(pool_of(replicas), NEED, KEY, LocalLoad(), random.Random(1))
    assert decision.branch is branch
    got = decision.replica.replica_id if decision.replica else None
    assert got == expect or (expect == "any" and got is not None)
    if expect is None:
        assert decision.reason


FILTERS = [
    # id, what the filters hold, expected walk position, branch
    ("ejected-home-key-goes-to-the-next-of-its-walk", {"ejected": {HOME}}, 1, Branch.OVERFLOW),
    ("tried-home-retry-goes-to-the-next-of-its-walk", {"tried": {HOME}}, 1, Branch.OVERFLOW),
    ("avoided-home-goes-to-the-next-of-its-walk", {"avoid": {HOME}}, 1, Branch.OVERFLOW),
    ("another-replica-ejected-affinity-stays", {"ejected": {SECOND}}, 0, Branch.AFFINITY),
    ("every-other-replica-ejected-affinity-stays", {"ejected": set(range(N)) - {HOME}}, 0, Branch.AFFINITY),
    ("all-ejected-an-ejected-home-beats-none", {"ejected": set(range(N))}, 0, Branch.AFFINITY),
    ("all-avoided-but-tried-avoid-is-dropped", {"avoid": set(range(N)), "tried": {HOME}}, 1, Branch.OVERFLOW),
]


@pytest.mark.parametrize("known", [True, False], ids=["known-key", "new-key"])
@pytest.mark.parametrize(("filters", "expect", "branch"), [f[1:] for f in FILTERS], ids=[f[0] for f in FILTERS])
def test_filters_skip_replicas_on_the_walk(filters: dict[str, set[int]], expect: int, branch: Branch,
                                          known: bool) -> None:
    ids = {name: frozenset(f"r{i}" for i in members) for name, members in filters.items()}
    decision = route(pool_of([rep(i) for i in range(N)]), NEED, KEY, LocalLoad(), random.Random(1), known=known,
                     **ids)
    assert decision.branch is branch
    assert decision.replica is not None and decision.replica.replica_id == f"r{WALK[expect]}"


def test_one_ejected_replica_leaves_every_other_key_at_its_home() -> None:
    pool = pool_of([rep(i) for i in range(N)])
    keys = [key_with(0.0) + k for k in range(200)]
    homes = {k: pool.replicas[next(pool.ring.walk(k))].replica_id for k in keys}
    ejected = frozenset({"r0"})
    for k in keys:
        decision = route(pool, NEED, k, LocalLoad(), random.Random(1), ejected=ejected)
        assert decision.replica is not None
        if homes[k] != "r0":
            assert (decision.branch, decision.replica.replica_id) == (Branch.AFFINITY, homes[k])
        else:
            assert decision.branch is Branch.OVERFLOW and decision.replica.replica_id != "r0"


def test_a_tried_node_is_avoided_while_another_node_is_left() -> None:
    replicas = [rep(i, node="n0" if i in (HOME, SECOND) else f"n{i}") for i in range(N)]
    decision = route(pool_of(replicas), NEED, KEY, LocalLoad(), random.Random(1), tried=frozenset({f"r{HOME}"}),
                     tried_nodes=frozenset({"n0"}))
    assert decision.replica is not None and decision.replica.node != "n0"
    only = [rep(i, node="n0") for i in range(N)]
    decision = route(pool_of(only), NEED, KEY, LocalLoad(), random.Random(1), tried=frozenset({f"r{HOME}"}),
                     tried_nodes=frozenset({"n0"}))
    assert decision.replica is not None and decision.replica.replica_id == f"r{SECOND}"


def test_every_replica_tried_leaves_none() -> None:
    decision = route(pool_of([rep(i) for i in range(N)]), NEED, KEY, LocalLoad(), random.Random(1),
                     tried=frozenset(f"r{i}" for i in range(N)))
    assert decision.branch is Branch.NONE and decision.replica is None and "tried" in decision.reason


def test_detour_prefers_a_drawn_replica_when_the_second_is_busy_too() -> None:
    replicas, local = [rep(i) for i in range(N)], LocalLoad()
    backlog(0, 50_000)(replicas, local)
    backlog(1, 45_000)(replicas, local)
    decision = route(pool_of(replicas), NEED, KEY, local, random.Random(1), detour=10_000.0)
    assert decision.branch is Branch.DETOUR
    assert decision.replica is not None and decision.replica.replica_id not in {f"r{HOME}", f"r{SECOND}"}


def _table(n: int = N) -> Any:
    return build_table(snapshot(1, [route_pb(f"r{i}", f"10.0.0.{i}:1", node=f"n{i}", max_concurrency=8)
                                    for i in range(n)]), region="local", applied_at=0.0)


def serve(picker: PickState, table: Any, **request: Any) -> Any:
    """Route one request and see it through (first token, end), as the router does; its decision."""
    routing = picker.prepare(table, tenant="t", model="m", version="", max_tokens=10, **request)
    decision = picker.decide(picker.view_of(table), Ask(routing=routing, model="m"), 0.0)
    assert decision.replica is not None
    attempt = picker.sent(decision.replica.replica_id, routing, decision.branch)
    picker.first(attempt)
    picker.done(attempt, 0)
    return decision


def test_a_popular_prefix_spreads_over_the_conversations_under_it() -> None:
    # 300 conversations share their first block (a system prompt), each has its own second block.
    picker, table = PickState(random.Random(1)), _table()
    homes: Counter[str] = Counter()
    for conv in range(300):
        decision = serve(picker, table, prompt_tokens=1000, hashes=[7, 1000 + conv, 2000 + conv])
        homes[decision.replica.replica_id] += 1
    assert len(homes) == N and max(homes.values()) < 300 / N * 2, homes
    # One fixed key of the first block, never judged hot: the same traffic lands on one replica.
    fixed = PickState(random.Random(1), depths=(1,), hot=HotKeys(min_count=1e9))
    landed = {serve(fixed, table, prompt_tokens=1000, hashes=[7, 1000 + conv]).replica for conv in range(300)}
    assert len(landed) == 1


def test_a_hot_explicit_key_spreads_over_a_few_replicas_and_a_cool_one_stays() -> None:
    picker, table = PickState(random.Random(1)), _table(12)
    seen: Counter[str] = Counter()
    for i in range(400):
        decision = serve(picker, table, prompt_tokens=100, prefix_key="popular")
        if i >= 100:  # once the sketch has seen it carry every request
            assert decision.branch is Branch.SPREAD
            seen[decision.replica.replica_id] += 1
    assert len(seen) >= 6  # no longer one replica's: spread over the pool
    # A key that comes once in 20 requests is not hot: it keeps its one replica.
    cool, homes = PickState(random.Random(2)), set()
    for i in range(400):
        key = "rare" if i % 20 == 0 else f"other-{i}"
        decision = serve(cool, table, prompt_tokens=100, prefix_key=key)
        if key == "rare":
            assert decision.branch is Branch.AFFINITY
            homes.add(decision.replica.replica_id)
    assert len(homes) == 1


def _regions(weight: float) -> View:
    snap = snapshot(1, [route_pb(f"r{i}", f"10.0.0.{i}:1", node=f"n{i}") for i in range(3)])
    snap.spill.append(tables_pb2.SpillRoute(region="b", weight=weight, rtt_ms=40.0, models=[
        tables_pb2.ModelRoute(model="m", default_version="v1",
                              replicas=[route_pb("b1", "10.1.0.1:1", region="b", node="nb")])]))
    return make_view(build_table(snap, region="local", applied_at=0.0), DecideParams(region="local"))


@pytest.mark.parametrize(("weight", "tier", "region_step", "branch"), [
    (1.0, "interactive", True, Branch.REGION),
    (1.0, "interactive", False, Branch.AFFINITY),   # a retry, or a request that named its version: home
    (1.0, "standard", True, Branch.AFFINITY),       # the weights are for interactive work
    (0.0, "interactive", True, Branch.AFFINITY),
], ids=["spilled-by-weight", "no-region-step", "standard-stays", "weight-zero"])
def test_the_region_step(weight: float, tier: str, region_step: bool, branch: Branch) -> None:
    view = _regions(weight)
    pool = view.table.models["m"].default
    ask = Ask(routing=Routing("v1", pool, KEY, NEED), tier=tier, model="m", region_step=region_step)
    decision = decide(view, ask, Local(LocalLoad(), placements=Placements()), random.Random(1), 0.0)
    assert decision.branch is branch
    assert decision.replica is not None
    assert (decision.region, decision.replica.replica_id == "b1") == (("b", True) if branch is Branch.REGION
                                                                     else ("", False))


def test_placements_are_bounded_and_forget_the_least_recent() -> None:
    placements = Placements(capacity=2)
    placements.put(1, "a")
    placements.put(2, "b")
    placements.put(1, "c")
    placements.put(3, "d")
    assert (placements.get(1), placements.get(2), placements.get(3), len(placements)) == ("c", None, "d", 2)


async def test_the_proxy_and_the_simulator_call_the_same_decision(rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """One function decides for both: a spy on it sees a real proxy's request and a simulated run's."""
    calls: Counter[str] = Counter()
    real = dataplane.pick.state.decide

    def spy(view: View, ask: Ask, local: Local, rng: random.Random, now: float) -> Decision:
        calls[ask.model] += 1
        return real(view, ask, local, rng, now)

    monkeypatch.setattr(dataplane.pick.state, "decide", spy)
    r = await rig({"r1": Behaviour(), "r2": Behaviour()})
    await r.stub.Infer(request(), metadata=PAID, timeout=5)
    assert calls["m"] == 1
    Fleet(FleetConfig(replicas=2, proxies=1), POLICIES["ferry"],
          [SimRequest(i, i * 0.1, 600, 4, (7, 100 + i)) for i in range(5)]).run()
    assert calls["chat"] == 5


@pytest.mark.parametrize(("prompt_words", "max_tokens", "field", "words"), [
    (5_000, 5, "prompt", "a prompt of 5000 tokens leaves no room"),
    (100, 4_090, "max_tokens", "prompt + max_tokens = 4190 tokens exceed"),
], ids=["prompt-alone-too-long", "max-tokens-too-many"])
async def test_a_request_too_long_for_every_replica_names_the_field_at_fault(
        rig, prompt_words: int, max_tokens: int, field: str, words: str) -> None:
    r = await rig({"r1": Behaviour()})  # replicas of 4,096 tokens of context
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await r.stub.Infer(request(prompt=" ".join(["w"] * prompt_words), max_tokens=max_tokens), metadata=PAID,
                           timeout=5)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert field in caught.value.details() and words in caught.value.details()
    assert r.served()["r1"] == 0
