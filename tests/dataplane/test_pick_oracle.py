"""The default composition of the pick decides exactly as the decision did before it was made of plug-ins.

The oracle below is a frozen copy of :func:`dataplane.pick.decide.decide`'s
local steps (context, filters, affinity, ring walk, placement, detour, P2C)
and of :mod:`dataplane.pick.p2c`'s pick and score as they stood before the
plug-ins (commit 27ad061); it lives only here. On random pools, loads,
placements, filters and keys, :func:`decide` with the plan composed from
the default ``[proxy.pick]`` (and with ``kv`` and ``staleness`` weights
drawn at random, against the oracle's ``kv_weight`` and ``stale_weight``)
must return the same replica, branch and reason, and leave the random
generator in the same state.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataplane.pick.decide import Ask, DecideParams, Local, Placements, Routing, View, decide
from dataplane.pick.p2c import Branch, Decision, LocalLoad, Need, fits
from dataplane.pick.plugin import compose
from dataplane.pick.settings import PickSettings
from dataplane.regions.remote import EMPTY
from dataplane.table.local import build_table
from dataplane.table.pool import Pool, Replica, context_limit, make_pool
from dataplane.table.ring import key_draw
from tests.dataplane.fakes import snapshot


@dataclasses.dataclass(frozen=True, slots=True)
class OracleScore:
    """The load score's weights as they stood (``ScoreParams``)."""

    kv_weight: float = 0.5
    stale_weight: float = 1.0
    fresh_seconds: float = 1.0
    stale_seconds: float = 6.0


@dataclasses.dataclass(frozen=True, slots=True)
class OracleParams:
    """The decision's parameters as they stood (``DecideParams``, the local steps' part)."""

    walk_limit: int = 8
    place_choices: int = 4
    score: OracleScore = OracleScore()


# ---- the frozen copy (do not edit: it is what the composition is checked against) -------------------------------

def _o_exclude(
    candidates: Sequence[Replica], excluded: Collection[str], avoid_nodes: Collection[str] = ()
) -> Sequence[Replica]:
    """Candidates not in ``excluded``, and off ``avoid_nodes`` while any such remain (same sequence when neither)."""
    if not excluded and not avoid_nodes:
        return candidates
    pool = [r for r in candidates if r.replica_id not in excluded]
    if avoid_nodes:
        elsewhere = [r for r in pool if r.node not in avoid_nodes]
        return elsewhere or pool
    return pool


def _o_draw(pool: Sequence[Replica], need: Need, rng: random.Random) -> tuple[Replica, ...]:
    """Two distinct replicas of ``pool`` (len >= 2), preferring those with KV room; one if only one has room."""
    i, j = rng.sample(range(len(pool)), 2)
    a, b = pool[i], pool[j]
    if fits(a, need) and fits(b, need):
        return a, b
    roomy = [r for r in pool if fits(r, need)]
    if not roomy:
        return a, b
    if len(roomy) == 1:
        return (roomy[0],)
    i, j = rng.sample(range(len(roomy)), 2)
    return roomy[i], roomy[j]


def _o_load(replica: Replica, counted: int = 0, trust: float = 1.0) -> float:
    """The pushed load of ``replica`` that is not this proxy's: ``max(queued + running - counted, 0) x trust``.

    ``counted``: this proxy's in-flight requests the push already includes
    (:meth:`LocalLoad.mark`); ``trust``: the share of the push
    that still stands at its age (:meth:`LocalLoad.trust`).
    The one copy of the formula: the score, the remote pick, the spill rooms
    and the picker's load share all read it.
    """
    return max(replica.queued + replica.running - counted, 0) * trust


def _o_occupancy(replica: Replica, inflight: int, counted: int = 0, trust: float = 1.0) -> float:
    """``(load + inflight) / max_concurrency``: the replica's slots taken, this proxy's ``inflight`` included."""
    return (_o_load(replica, counted, trust) + inflight) / replica.max_concurrency


def _o_score(replica: Replica, need: Need, inflight: int, age: float, params: OracleScore = OracleScore(),
          counted: int = 0, trust: float = 1.0) -> float:
    """The load score of ``replica`` for this request (lower is better); see the module docstring."""
    taken = _o_occupancy(replica, inflight, counted, trust)
    kv_use = 0.0
    if replica.kv_blocks_total > 0:
        left = replica.kv_blocks_free - need.blocks(replica.kv_block_tokens)
        kv_use = min(max(1.0 - left / replica.kv_blocks_total, 0.0), 1.0)
    span = params.stale_seconds - params.fresh_seconds
    staleness = min(max((age - params.fresh_seconds) / span, 0.0), 1.0)
    return taken + params.kv_weight * kv_use + params.stale_weight * staleness


def _o_better(a: Replica, b: Replica, cost: Callable[[Replica], float], rng: random.Random) -> Replica:
    """The lower-cost replica of the pair; ``rng`` settles an exact tie."""
    ca, cb = cost(a), cost(b)
    if ca == cb:
        return a if rng.random() < 0.5 else b
    return a if ca < cb else b


def _o_pick(
    candidates: Sequence[Replica],
    need: Need,
    inflight: Mapping[str, int],
    rng: random.Random,
    excluded: Collection[str] = (),
    *,
    avoid_nodes: Collection[str] = (),
    table_age: float = 0.0,
    params: OracleScore = OracleScore(),
    cost: Callable[[Replica], float] | None = None,
    counted: Mapping[str, int] | None = None,
    trust: Callable[[float], float] | None = None,
) -> Decision:
    """Choose a replica among ``candidates`` for a request needing ``need``; see the module docstring."""
    pool = _o_exclude(candidates, excluded, avoid_nodes)
    if not pool:
        reason = "every ready replica was already tried" if candidates else "no ready replica"
        return Decision(None, Branch.NONE, reason)
    if len(pool) == 1:
        return Decision(pool[0], Branch.SINGLE)
    pair = _o_draw(pool, need, rng)
    if len(pair) == 1:
        return Decision(pair[0], Branch.SINGLE)

    def default_cost(replica: Replica) -> float:
        age = replica.telemetry_age + table_age
        return _o_score(replica, need, inflight.get(replica.replica_id, 0), age, params,
                     counted.get(replica.replica_id, 0) if counted else 0, trust(age) if trust else 1.0)

    return Decision(_o_better(pair[0], pair[1], cost or default_cost, rng), Branch.P2C)


def _off(candidates: Sequence[Replica], ask: Ask, ejected: frozenset[str]) -> tuple[frozenset[str], frozenset[str]]:
    """(replica ids, nodes) to skip: tried always; the soft filters while something else is left."""
    tried, nodes = ask.tried, ask.tried_nodes
    layers = (ejected, ask.avoid)
    if not tried and not nodes and not ejected and not ask.avoid:
        return frozenset(), frozenset()
    # Drop the soft filters one by one (tried nodes, then avoid, then ejected) until a replica is left.
    for keep_nodes, keep in ((True, 2), (False, 2), (False, 1), (False, 0)):
        off = tried.union(*layers[:keep])
        if any(r.replica_id not in off and not (keep_nodes and r.node in nodes) for r in candidates):
            return off, nodes if keep_nodes else frozenset()
    return tried, frozenset()


def _walk(pool: Pool, need: Need, key: int, table_age: float, params: OracleParams,
          off: Collection[str], off_nodes: Collection[str]) -> Iterator[tuple[int, bool]]:
    """(index, is home) of the replicas of the key's walk that would take the request, in walk order."""
    draw = key_draw(key)
    stale = params.score.stale_seconds
    home = True
    for i in itertools.islice(pool.ring.walk(key), params.walk_limit):
        replica = pool.replicas[i]
        if need.tokens > context_limit(replica):
            continue  # the key's home is the first replica with the context
        if replica.replica_id in off or replica.node in off_nodes:
            home = False
            continue
        if draw < pool.shares[i] and fits(replica, need) and replica.telemetry_age + table_age < stale:
            yield i, home
        home = False


def _usable(replica: Replica, need: Need, table_age: float, params: OracleParams,
            off: Collection[str], off_nodes: Collection[str]) -> bool:
    """Whether a remembered replica still takes the key: filters, room and fresh telemetry."""
    return (replica.replica_id not in off and replica.node not in off_nodes
            and need.tokens <= context_limit(replica) and fits(replica, need)
            and replica.telemetry_age + table_age < params.score.stale_seconds)


def _detour(need: Need, chosen: Replica, second: Replica | None, candidates: Sequence[Replica],
            local: LocalLoad, rng: random.Random, threshold: float, off: Collection[str]) -> Replica | None:
    """Where to send the request instead of ``chosen`` when its prefill backlog is too deep, else None."""
    here = local.prefill(chosen.replica_id)
    drawn = _o_pick(candidates, need, local, rng, (chosen.replica_id, *off),
                 cost=lambda r: float(local.prefill(r.replica_id))).replica
    alt = second
    if alt is None or (drawn is not None and local.prefill(drawn.replica_id) + threshold / 4
                       < local.prefill(alt.replica_id)):
        alt = drawn
    if alt is None or here - local.prefill(alt.replica_id) <= threshold:
        return None
    return alt


def _local(params: OracleParams, ask: Ask, local: Local, rng: random.Random, table_age: float) -> Decision:
    """Steps 2 to 5 in this region."""
    routing = ask.routing
    pool, need, key = routing.pool, routing.need, routing.key
    if need.tokens > pool.max_context:
        what = (f"a prompt of {need.prompt_tokens} tokens leaves no room" if need.prompt_tokens >= pool.max_context
                else f"prompt + max_tokens = {need.tokens} tokens exceed")
        return Decision(None, Branch.TOO_LONG, reason=f"{what} in the largest context of the model's replicas "
                                                      f"({pool.max_context} tokens)")
    candidates: Sequence[Replica] = pool.replicas
    if need.tokens > pool.min_context:
        candidates = [r for r in candidates if need.tokens <= context_limit(r)]
    off, off_nodes = _off(candidates, ask, local.ejected)
    load = local.load
    if key is None or len(candidates) <= 1:
        decision = _o_pick(candidates, need, load, rng, off, avoid_nodes=off_nodes, table_age=table_age,
                        params=params.score, counted=load.counted, trust=load.trust)
        if routing.hot and decision.branch is Branch.P2C:
            return Decision(decision.replica, Branch.SPREAD)
        return decision
    known = local.placements.get(key) if local.placements is not None else None
    if known is not None:
        index = pool.index.get(known)
        if index is not None and _usable(pool.replicas[index], need, table_age, params, off, off_nodes):
            chosen = pool.replicas[index]
            alt = _detour_of(params, ask, local, rng, table_age, chosen, candidates, off, off_nodes)
            return Decision(alt, Branch.DETOUR) if alt is not None else Decision(chosen, Branch.AFFINITY)
    takers = _walk(pool, need, key, table_age, params, off, off_nodes)
    first = next(takers, None)
    if first is None:
        decision = _o_pick(candidates, need, load, rng, off, avoid_nodes=off_nodes, table_age=table_age,
                        params=params.score, counted=load.counted, trust=load.trust)
        if decision.replica is None:
            return Decision(None, Branch.NONE, reason=decision.reason or "every ready replica was already tried")
        return Decision(decision.replica, Branch.FALLBACK)
    chosen = pool.replicas[first[0]]
    if known is None:  # new to this proxy: the least busy of the walk's first takers
        margin = local.place_margin
        best = chosen
        for following in itertools.islice(takers, (local.choices or params.place_choices) - 1):
            other = pool.replicas[following[0]]
            if _busier(best, other, need, load, table_age, params.score):
                best = other
        if best is not chosen and (load.prefill(chosen.replica_id) - load.prefill(best.replica_id) > margin
                                   or margin <= 0):
            return Decision(best, Branch.PLACED)
        return Decision(chosen, Branch.AFFINITY if first[1] else Branch.OVERFLOW)
    alt = _detour_of(params, ask, local, rng, table_age, chosen, candidates, off, off_nodes)
    if alt is not None:
        return Decision(alt, Branch.DETOUR)
    return Decision(chosen, Branch.AFFINITY if first[1] else Branch.OVERFLOW)


def _busier(a: Replica, b: Replica, need: Need, load: LocalLoad, table_age: float, params: OracleScore) -> bool:
    """Whether ``a`` is busier than ``b`` for a new key: prefill backlog first, then the load score."""
    pa, pb = load.prefill(a.replica_id), load.prefill(b.replica_id)
    if pa != pb:
        return pa > pb
    return _score(a, need, load, table_age, params) > _score(b, need, load, table_age, params)


def _score(r: Replica, need: Need, load: LocalLoad, table_age: float, params: OracleScore) -> float:
    age = r.telemetry_age + table_age
    return _o_score(r, need, load.get(r.replica_id), age, params, load.counted.get(r.replica_id, 0), load.trust(age))


def _detour_of(params: OracleParams, ask: Ask, local: Local, rng: random.Random, table_age: float,
               chosen: Replica, candidates: Sequence[Replica], off: frozenset[str],
               off_nodes: frozenset[str]) -> Replica | None:
    """Step 4 for a known key at ``chosen``: the detour's replica, or None to stay."""
    threshold = local.detour
    if threshold is None or local.load.prefill(chosen.replica_id) <= threshold:
        return None
    routing = ask.routing
    assert routing.key is not None
    second: Replica | None = None
    for i, _home in _walk(routing.pool, routing.need, routing.key, table_age, params, off, off_nodes):
        if routing.pool.replicas[i].replica_id != chosen.replica_id:
            second = routing.pool.replicas[i]
            break
    return _detour(routing.need, chosen, second, candidates, local.load, rng, threshold, off)


# ---- random views ----------------------------------------------------------------------------------------------

_TABLE = build_table(snapshot(1, []), region="local", applied_at=0.0)


@st.composite
def cases(draw: st.DrawFn, keys: str = "any") -> tuple[OracleParams, DecideParams, Ask, Callable[[], Local],
                                                       float, int]:
    """A random view, ask and local state; ``keys``: ``any``, ``remembered`` (every key known, remembered and
    free to detour) or ``new`` (every key known and never placed)."""
    detours = keys == "remembered"
    n = draw(st.integers(1, 9))
    nodes = draw(st.integers(1, 4))
    replicas = []
    for i in range(n):
        total = draw(st.sampled_from([0, 100, 1000]))
        replicas.append(Replica(
            replica_id=f"r{i}", address=f"h:{i}", kserve_model="m", version="v1", node=f"n{i % nodes}",
            max_concurrency=draw(st.integers(1, 8)), kv_block_tokens=draw(st.sampled_from([0, 16])),
            max_context_tokens=draw(st.sampled_from([0, 2048, 4096, 8192])), queued=draw(st.integers(0, 12)),
            running=draw(st.integers(0, 8)), kv_blocks_free=draw(st.integers(0, total)) if total else 0,
            kv_blocks_total=total, telemetry_age=draw(st.sampled_from([0.0, 0.5, 2.0, 5.0, 9.0])),
            smoothed=draw(st.floats(0, 20))))
    pool = make_pool("m/v1", replicas, vnodes=draw(st.sampled_from([4, 16])),
                     load_factor=draw(st.sampled_from([1.1, 1.25, 2.0])), rings={})
    ids = [r.replica_id for r in replicas]
    some = st.frozensets(st.sampled_from(ids), max_size=n)
    prompt = draw(st.integers(0, 6000))
    need = Need(prompt + draw(st.integers(0, 3000)), prompt)
    key = draw(st.integers(0, 2**64 - 1) if keys != "any" else st.one_of(st.none(), st.integers(0, 2**64 - 1)))
    hot = key is None and draw(st.booleans())
    ask = Ask(routing=Routing("v1", pool, key, need, hot), tried=draw(some),
              tried_nodes=draw(st.frozensets(st.sampled_from([f"n{j}" for j in range(nodes)]), max_size=nodes)),
              avoid=draw(some))
    fresh = draw(st.sampled_from([0.0, 1.0, 2.0]))
    stale = fresh + draw(st.sampled_from([0.5, 5.0, 8.0]))
    kv_weight = draw(st.sampled_from([0.5, 0.0, 2.0, 0.3]))
    stale_weight = draw(st.sampled_from([1.0, 0.0, 0.7]))
    walk_limit = draw(st.integers(1, 10))
    place_choices = draw(st.integers(1, 5))
    oracle = OracleParams(walk_limit, place_choices, OracleScore(kv_weight, stale_weight, fresh, stale))
    plan = compose(PickSettings(telemetry_fresh_seconds=fresh, telemetry_stale_seconds=stale, pick={
        "scorers": [{"type": "load"}, {"type": "kv", "weight": kv_weight},
                    {"type": "staleness", "weight": stale_weight}]}))
    params = DecideParams(walk_limit=walk_limit, place_choices=place_choices, plan=plan)
    adds = draw(st.lists(st.tuples(st.sampled_from(ids), st.integers(0, 40_000)), max_size=12))
    marked = draw(st.integers(0, len(adds)))
    duration = draw(st.sampled_from([0.0, 3.0, 30.0]))
    remembered = (None if keys == "new" else draw(st.sampled_from(ids)) if detours
                  else draw(st.one_of(st.none(), st.sampled_from([*ids, "gone"]))))
    ejected = draw(some)
    detour = 0.0 if detours else draw(st.one_of(st.none(), st.sampled_from([0.0, 1000.0, 20_000.0])))
    choices = draw(st.integers(0, 4))
    margin = draw(st.sampled_from([0.0, 500.0, 10_000.0]))
    table_age = draw(st.sampled_from([0.0, 1.5, 4.0]))
    seed = draw(st.integers(0, 2**32))

    def local() -> Local:  # a fresh one per run: both decisions read equal state
        load = LocalLoad()
        for i, (rid, tokens) in enumerate(adds):
            if i == marked:
                load.mark()
            load.add(rid, tokens)
        if duration:
            load.observe(duration)
        placements = Placements()
        if key is not None and remembered is not None:
            placements.put(key, remembered)
        return Local(load, ejected, detour, placements, None, choices, margin)

    return oracle, params, ask, local, table_age, seed


def _said(d: Decision) -> tuple[str | None, Branch, str, str]:
    return d.replica.replica_id if d.replica is not None else None, d.branch, d.reason, d.region


def _same(a: Decision, b: Decision) -> bool:
    return _said(a) == _said(b)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_the_default_composition_decides_as_the_decision_did(case: tuple[Any, ...]) -> None:
    oracle, params, ask, local, table_age, seed = case
    before, after = random.Random(seed), random.Random(seed)
    expect = _local(oracle, ask, local(), before, table_age)
    got = decide(View(_TABLE, EMPTY, params), ask, local(), after, table_age)
    assert _same(got, expect), (got, expect)
    assert before.getstate() == after.getstate()  # the same draws, in the same order


def test_the_oracle_sees_every_branch_on_random_views() -> None:
    """The random views reach the branches the composition must match (a guard on the strategy itself).

    Hypothesis draws from the constants of the modules loaded, so its examples differ with the tests run
    before; detours and placements are rare on the general views (a few in 600), so they are also drawn
    where they can happen. Each branch is reached by many examples of the three.
    """
    seen: set[Branch] = set()
    for keys in ("any", "remembered", "new"):
        @settings(max_examples=500, deadline=None, database=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(cases(keys))
        def collect(case: tuple[Any, ...]) -> None:
            oracle, _params, ask, local, table_age, seed = case
            seen.add(_local(oracle, ask, local(), random.Random(seed), table_age).branch)

        collect()
    assert seen >= {Branch.AFFINITY, Branch.OVERFLOW, Branch.PLACED, Branch.DETOUR, Branch.P2C, Branch.SPREAD,
                    Branch.FALLBACK, Branch.SINGLE, Branch.NONE, Branch.TOO_LONG}
