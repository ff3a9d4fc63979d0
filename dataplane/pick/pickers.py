"""The decision's built-in pickers (:mod:`dataplane.pick.plugin`): the strategy over the filtered replicas.

- ``prefix`` (default; steps 3 to 5 of :mod:`dataplane.pick.decide`): a key
  this proxy placed lately goes back to its replica (``affinity``); else the
  key's walk on the bounded-load ring, a new key placed on the least busy of
  its walk's first takers (``placed``), a later taker (``overflow``), a detour
  when the prefix's replica's prefill backlog is too deep (``detour``); no
  taker within the walk: P2C (``fallback``); no key: P2C (``p2c``, ``spread``
  when every key was hot, ``single``, ``none``).
- ``p2c``: power of two choices on the plan's cost alone, whatever the key
  (:func:`dataplane.pick.p2c.pick`; branches ``p2c``, ``single``, ``none``).

Both read the taker filters and the cost from the plan
(:meth:`dataplane.pick.plugin.Plan.takes`, :meth:`dataplane.pick.plugin.Plan.cost`).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar

from dataplane.pick.p2c import Branch, Decision, LocalLoad, Need, pick
from dataplane.pick.plugin import Args, Kind, Plan, register
from dataplane.table.pool import Pool, Replica, context_limit
from dataplane.table.ring import key_draw

if TYPE_CHECKING:
    from dataplane.pick.decide import Ask, DecideParams, Local


def _cost(plan: Plan, need: Need, local: Local, table_age: float) -> Callable[[Replica], float]:
    load, notes = local.load, local.notes
    return lambda r: plan.cost(r, need, load, r.telemetry_age + table_age, notes)


def _p2c(plan: Plan, ask: Ask, local: Local, rng: random.Random, table_age: float, candidates: Sequence[Replica],
         off: frozenset[str], off_nodes: frozenset[str]) -> Decision:
    """Power of two choices on the plan's cost (``spread`` for a request whose keys were all hot)."""
    routing = ask.routing
    decision = pick(candidates, routing.need, local.load, rng, off, avoid_nodes=off_nodes,
                    cost=_cost(plan, routing.need, local, table_age))
    if routing.hot and decision.branch is Branch.P2C:
        return Decision(decision.replica, Branch.SPREAD)
    return decision


@register
class P2C:
    """Power of two choices on the cost alone; see the module docstring."""

    kind: ClassVar[Kind] = "picker"
    type_name: ClassVar[str] = "p2c"
    consumes: ClassVar[tuple[str, ...]] = ("the scorers'",)

    @classmethod
    def build(cls, args: Args) -> P2C:
        return cls()

    def pick(self, params: DecideParams, ask: Ask, local: Local, rng: random.Random, table_age: float,
             candidates: Sequence[Replica], off: frozenset[str], off_nodes: frozenset[str]) -> Decision:
        return _p2c(params.plan, ask, local, rng, table_age, candidates, off, off_nodes)


@register
class Prefix:
    """Prefix affinity on the bounded-load ring, placement, detour, then P2C; see the module docstring."""

    kind: ClassVar[Kind] = "picker"
    type_name: ClassVar[str] = "prefix"
    consumes: ClassVar[tuple[str, ...]] = ("Replica.smoothed (the ring's key shares)", "proxy: placements",
                                           "proxy: prefill backlog per replica", "the scorers'")

    @classmethod
    def build(cls, args: Args) -> Prefix:
        return cls()

    def pick(self, params: DecideParams, ask: Ask, local: Local, rng: random.Random, table_age: float,
             candidates: Sequence[Replica], off: frozenset[str], off_nodes: frozenset[str]) -> Decision:
        plan = params.plan
        routing = ask.routing
        pool, need, key = routing.pool, routing.need, routing.key
        if key is None or len(candidates) <= 1:
            return _p2c(plan, ask, local, rng, table_age, candidates, off, off_nodes)
        load = local.load
        known = local.placements.get(key) if local.placements is not None else None
        if known is not None:
            index = pool.index.get(known)
            if index is not None and _usable(plan, pool.replicas[index], need, table_age, off, off_nodes):
                chosen = pool.replicas[index]
                alt = _detour_of(params, ask, local, rng, table_age, chosen, candidates, off, off_nodes)
                return Decision(alt, Branch.DETOUR) if alt is not None else Decision(chosen, Branch.AFFINITY)
        takers = _walk(plan, pool, need, key, table_age, params.walk_limit, off, off_nodes)
        first = next(takers, None)
        if first is None:
            decision = pick(candidates, need, load, rng, off, avoid_nodes=off_nodes,
                            cost=_cost(plan, need, local, table_age))
            if decision.replica is None:
                return Decision(None, Branch.NONE, reason=decision.reason or "every ready replica was already tried")
            return Decision(decision.replica, Branch.FALLBACK)
        chosen = pool.replicas[first[0]]
        if known is None:  # new to this proxy: the least busy of the walk's first takers
            margin = local.place_margin
            best = chosen
            cost = _cost(plan, need, local, table_age)
            for following in itertools.islice(takers, (local.choices or params.place_choices) - 1):
                other = pool.replicas[following[0]]
                if _busier(best, other, load, cost):
                    best = other
            if best is not chosen and (load.prefill(chosen.replica_id) - load.prefill(best.replica_id) > margin
                                       or margin <= 0):
                return Decision(best, Branch.PLACED)
            return Decision(chosen, Branch.AFFINITY if first[1] else Branch.OVERFLOW)
        alt = _detour_of(params, ask, local, rng, table_age, chosen, candidates, off, off_nodes)
        if alt is not None:
            return Decision(alt, Branch.DETOUR)
        return Decision(chosen, Branch.AFFINITY if first[1] else Branch.OVERFLOW)


def _walk(plan: Plan, pool: Pool, need: Need, key: int, table_age: float, walk_limit: int,
          off: Collection[str], off_nodes: Collection[str]) -> Iterator[tuple[int, bool]]:
    """(index, is home) of the replicas of the key's walk that would take the request, in walk order."""
    draw = key_draw(key)
    home = True
    for i in itertools.islice(pool.ring.walk(key), walk_limit):
        replica = pool.replicas[i]
        if need.tokens > context_limit(replica):
            continue  # the key's home is the first replica with the context
        if replica.replica_id in off or replica.node in off_nodes:
            home = False
            continue
        if draw < pool.shares[i] and plan.takes(replica, need, replica.telemetry_age + table_age):
            yield i, home
        home = False


def _usable(plan: Plan, replica: Replica, need: Need, table_age: float,
            off: Collection[str], off_nodes: Collection[str]) -> bool:
    """Whether a remembered replica still takes the key: filters, context and the taker filters."""
    return (replica.replica_id not in off and replica.node not in off_nodes
            and need.tokens <= context_limit(replica)
            and plan.takes(replica, need, replica.telemetry_age + table_age))


def _busier(a: Replica, b: Replica, load: LocalLoad, cost: Callable[[Replica], float]) -> bool:
    """Whether ``a`` is busier than ``b`` for a new key: prefill backlog first, then the cost."""
    pa, pb = load.prefill(a.replica_id), load.prefill(b.replica_id)
    if pa != pb:
        return pa > pb
    return cost(a) > cost(b)


def _detour(need: Need, chosen: Replica, second: Replica | None, candidates: Sequence[Replica],
            local: LocalLoad, rng: random.Random, threshold: float, off: Collection[str]) -> Replica | None:
    """Where to send the request instead of ``chosen`` when its prefill backlog is too deep, else None."""
    here = local.prefill(chosen.replica_id)
    drawn = pick(candidates, need, local, rng, (chosen.replica_id, *off),
                 cost=lambda r: float(local.prefill(r.replica_id))).replica
    alt = second
    if alt is None or (drawn is not None and local.prefill(drawn.replica_id) + threshold / 4
                       < local.prefill(alt.replica_id)):
        alt = drawn
    if alt is None or here - local.prefill(alt.replica_id) <= threshold:
        return None
    return alt


def _detour_of(params: DecideParams, ask: Ask, local: Local, rng: random.Random, table_age: float,
               chosen: Replica, candidates: Sequence[Replica], off: frozenset[str],
               off_nodes: frozenset[str]) -> Replica | None:
    """Step 4 for a known key at ``chosen``: the detour's replica, or None to stay."""
    threshold = local.detour
    if threshold is None or local.load.prefill(chosen.replica_id) <= threshold:
        return None
    routing = ask.routing
    assert routing.key is not None
    second: Replica | None = None
    for i, _home in _walk(params.plan, routing.pool, routing.need, routing.key, table_age, params.walk_limit,
                          off, off_nodes):
        if routing.pool.replicas[i].replica_id != chosen.replica_id:
            second = routing.pool.replicas[i]
            break
    return _detour(routing.need, chosen, second, candidates, local.load, rng, threshold, off)
