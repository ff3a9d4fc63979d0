"""The proxy's pick, composed: filters, the prefix ring under its load bound, a prefill-aware spill, else P2C.

``route(pool, need, key, local, rng, ...) -> Decision(replica | None, branch)``
is pure (no I/O, no clock: ages are passed in; rng injected). ``key`` is the
request's prefix key (:mod:`dataplane.prefix`), or None.

1. **Filters**, predicates applied to replicas as they are met, so that the
   common path stays O(1):

   - *context*: ``need.tokens`` (prompt + max_tokens) within the replica's
     context limit; when no replica of the pool has it: ``too_long``;
   - *room*: the replica reports the free KV blocks the request needs
     (:func:`dataplane.pick.fits`), so a long-context request is not sent
     where it would queue behind a full cache;
   - *fresh*: its telemetry (pushed age + time since the table was applied)
     is younger than ``stale_seconds``: a replica gone quiet gets no
     affinity traffic on the strength of an old, idle-looking report;
   - *avoid*: replicas the tier queues keep this request off (a heavy
     tenant's shard, or everything outside it: :mod:`dataplane.sharding`;
     replicas this proxy has filled, for interactive beyond what it could
     preempt there: :mod:`dataplane.placement`), unless that leaves none
     besides the replicas already tried.

2. **Ring** (:mod:`dataplane.ring`): along the key's walk (at most
   ``walk_limit`` replicas, default 8), the first replica that passes the
   filters and whose key share (the load bound, per table) is above the
   key's draw takes the request: ``affinity`` when it is the key's home (the
   first replica of the walk with the context), ``overflow`` when it is a
   later one. None within the walk: ``fallback`` to step 4.

3. **Spill** (prefill-aware; time to first token is set by the prefills a
   request queues behind): the proxy knows the prompt tokens it sent to each
   replica that have not produced a first token (:class:`LocalLoad`). The
   alternative is the key's next replica on the walk (which takes what
   spills, so a conversation's spills find its prefix there), unless a P2C
   draw among the others has less backlog by more than a quarter of the
   threshold. If the chosen replica's backlog exceeds the alternative's by
   more than ``spill`` tokens, the request goes there: ``spill``. The
   threshold stands for what leaving the prefix's replica costs in prefill
   (:class:`dataplane.picker.Picker` sets it from the cache hits replicas
   report); None: never spill.

4. **Power of two choices** (:func:`dataplane.pick.pick`, score: queue,
   running, in-flight, KV use, staleness) among the replicas with the
   context: ``p2c`` for a request without a key, ``spread`` for one whose
   keys are all hot (``hot``: a popular prefix goes to every replica);
   ``single`` when one is left. Retries (``excluded`` replicas,
   ``avoid_nodes``) go straight here.

Cost: O(log(replicas x vnodes)) for the walk plus O(1) per replica met (at
most ``walk_limit``); O(1) for P2C. O(replicas) when a spill is weighed (the
alternative's draw leaves the chosen replica out), on a retry, or when
replicas of the pool differ in context and the request is longer than the
smallest.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Collection, Iterator, Sequence

from dataplane.pick import DEFAULT_PARAMS, Branch, Decision, Need, ScoreParams, fits, pick
from dataplane.policy import LocalLoad
from dataplane.pool import Pool, Replica, context_limit
from dataplane.ring import key_draw


@dataclasses.dataclass(frozen=True, slots=True)
class RouteParams:
    """Knobs of :func:`route`; see the module docstring."""

    walk_limit: int = 8
    score: ScoreParams = DEFAULT_PARAMS


DEFAULT_ROUTE = RouteParams()


def _takers(pool: Pool, need: Need, key: int, table_age: float, params: RouteParams,
            avoid: Collection[str] = ()) -> Iterator[tuple[int, bool]]:
    """(index, is home) of the replicas of the key's walk that would take the request, in walk order."""
    draw = key_draw(key)
    stale = params.score.stale_seconds
    home = True
    for i in itertools.islice(pool.ring.walk(key), params.walk_limit):
        replica = pool.replicas[i]
        if need.tokens > context_limit(replica) or replica.replica_id in avoid:
            continue
        if draw < pool.shares[i] and fits(replica, need) and replica.telemetry_age + table_age < stale:
            yield i, home
        home = False


def _spill(need: Need, chosen: Replica, second: Replica | None, candidates: Sequence[Replica],
           local: LocalLoad, rng: random.Random, threshold: float) -> Replica | None:
    """Where to send the request instead of ``chosen`` when its prefill backlog is too deep, else None."""
    here = local.prefill(chosen.replica_id)
    drawn = pick(candidates, need, local, rng, (chosen.replica_id,),
                 cost=lambda r: float(local.prefill(r.replica_id))).replica
    alt = second
    if alt is None or (drawn is not None and local.prefill(drawn.replica_id) + threshold / 4
                       < local.prefill(alt.replica_id)):
        alt = drawn
    if alt is None or here - local.prefill(alt.replica_id) <= threshold:
        return None
    return alt


def route(
    pool: Pool,
    need: Need,
    key: int | None,
    local: LocalLoad,
    rng: random.Random,
    *,
    spill: float | None = None,
    hot: bool = False,
    table_age: float = 0.0,
    excluded: Collection[str] = (),
    avoid_nodes: Collection[str] = (),
    avoid: Collection[str] = (),
    params: RouteParams = DEFAULT_ROUTE,
) -> Decision:
    """Choose a replica of ``pool`` for a request needing ``need``; see the module docstring."""
    if need.tokens > pool.max_context:
        return Decision(None, Branch.TOO_LONG, f"{need.tokens} tokens exceed the largest context "
                                               f"of the model's replicas ({pool.max_context})")
    candidates: Sequence[Replica] = pool.replicas
    if need.tokens > pool.min_context:
        candidates = [r for r in candidates if need.tokens <= context_limit(r)]
    if avoid:  # soft: replicas already tried count as gone, so a retry still finds one
        kept = [r for r in candidates if r.replica_id not in avoid and r.replica_id not in excluded]
        candidates, avoid = (kept, avoid) if kept else (candidates, ())
    if excluded or avoid_nodes or key is None or len(candidates) <= 1:
        decision = pick(candidates, need, local, rng, excluded, avoid_nodes=avoid_nodes, table_age=table_age,
                        params=params.score, counted=local.counted, trust=local.trust)
        if hot and decision.branch is Branch.P2C:
            return Decision(decision.replica, Branch.SPREAD)
        return decision
    takers = _takers(pool, need, key, table_age, params, avoid)
    first = next(takers, None)
    if first is None:
        decision = pick(candidates, need, local, rng, table_age=table_age, params=params.score,
                        counted=local.counted, trust=local.trust)
        return Decision(decision.replica, Branch.FALLBACK if decision.replica else decision.branch, decision.reason)
    chosen = pool.replicas[first[0]]
    if spill is not None and local.prefill(chosen.replica_id) > spill:
        following = next(takers, None)
        second = pool.replicas[following[0]] if following else None
        alt = _spill(need, chosen, second, candidates, local, rng, spill)
        if alt is not None:
            return Decision(alt, Branch.SPILL)
    return Decision(chosen, Branch.AFFINITY if first[1] else Branch.OVERFLOW)
