"""The proxy's decision, whole: which region and replica serve one attempt of a request.

``decide(view, ask, local, rng, now) -> Decision(replica | None, branch, region, reason)``
is pure: no I/O, no clock (``now`` is an argument; the optional step timer
of ``local.steps`` only measures), the random generator injected. Steps 2 to
5 are a plan of plug-ins (``view.params.plan``, :mod:`dataplane.pick.plugin`,
composed from ``[proxy.pick]``): the filters by stage, the weighted scorers
(the cost P2C and placement compare), the picker (``prefix``, steps 3 to 5
below, in :mod:`dataplane.pick.pickers`; or ``p2c``); the default plan is
the decision described here. The router (:mod:`dataplane.router`) and the fleet simulator
(:mod:`tools.sim.policies`) both call it, through
:meth:`dataplane.pick.state.PickState.decide`, with the same state objects: what a
simulated run weighs is what a real pick weighs.

Inputs:

- ``view`` (:class:`View`): the table as applied, frozen, with the other
  regions' replicas (:func:`dataplane.regions.remote.remote_view`) and the
  decision's parameters; built once per table (:func:`make_view`).
- ``ask`` (:class:`Ask`): the request's routing (version, pool, prefix key,
  need; :meth:`dataplane.pick.state.PickState.prepare`), its tier, the replicas and
  nodes already tried, the tier queues' avoid set, and whether the region
  step applies (first attempt of a request that names no version).
- ``local`` (:class:`Local`): what this proxy knows now: its in-flight and
  prefill backlog per replica (:class:`dataplane.pick.p2c.LocalLoad`), the
  replicas ejected by outlier detection, the learned detour threshold, where
  it sent each prefix key lately (:class:`Placements`), and its local tier
  queue (read only when the table has spill routes).

Steps:

1. **Region** (first attempt only): the table's spill weights, or the local
   queue's wait against a target with room (:func:`dataplane.regions.choice.region_for`),
   may send an interactive request to another region: power of two choices
   there (:func:`dataplane.regions.remote.pick_remote`). Branch ``region``.
2. **Filters**, applied to replicas as they are met: *context* (prompt +
   max_tokens within the replica's limit; none has it: ``too_long``);
   *tried* (replicas that already failed this request: hard); then soft
   filters, dropped in this order when nothing else is left: *tried nodes*
   (a node that failed likely took its replicas with it), *avoid* (the tier
   queues' shards and full replicas, :mod:`dataplane.admission.avoid`), *ejected*
   (an ejected replica beats none). On the ring walk the replica-level
   checks also include *room* (free KV blocks for the request,
   :func:`dataplane.pick.p2c.fits`) and *fresh* telemetry (younger than
   ``stale_seconds``). A filtered replica is skipped where it is met: its
   keys go on to the next replica of their walk, and nobody else's affinity
   changes.
3. **Affinity.** A key this proxy placed lately (:class:`Placements`) goes
   back to that replica while it passes the filters: ``affinity`` (its
   conversation's cache is there; the load bound does not move it). Else the
   key's walk on the ring (:mod:`dataplane.table.ring`, at most ``walk_limit``
   replicas): the first replica that passes the filters and whose key share
   (the load bound) is above the key's draw. A key new to this proxy (the
   first turn of a conversation: nothing of it is cached anywhere) takes the
   least busy (prefill backlog, :class:`dataplane.pick.p2c.LocalLoad`, then
   the load score) of the first ``place_choices`` (4) such replicas, when
   the first's backlog is deeper than that one's by ``place_margin``
   prompt tokens (:class:`Local`; the picker's ``place_factor`` 3 x the
   learned advantage x the mean prompt): ``placed``; else the first (``affinity``). New
   conversations so balance the fleet, while the choice stays among a few
   replicas every proxy derives alike from the key. A known key
   whose remembered replica was filtered goes to the first: ``affinity``
   when it is the key's home, ``overflow`` when it is a later one. None
   within the walk: ``fallback`` to step 5.
4. **Detour** (prefill-aware; for a known key): if the chosen replica's
   prefill backlog exceeds the alternative's (the key's next replica on the
   walk, or a P2C draw among the others with a quarter-threshold less) by
   more than the ``detour`` threshold (what leaving the prefix's replica
   costs in prefill, learned by :class:`dataplane.pick.state.PickState`; None:
   never), the request goes there: ``detour``.
5. **Power of two choices** (:func:`dataplane.pick.p2c.pick`, score: queue,
   running, in-flight, KV use, staleness) among the replicas left: ``p2c``
   for a request without a key, ``spread`` for one whose keys are all hot,
   ``single`` when one is left, ``none`` when nothing is.

Cost: O(log(replicas x vnodes)) for the walk plus O(1) per replica met (at
most ``walk_limit``); O(1) for P2C; O(replicas) when a soft filter is
non-empty (to know whether anything else is left), when a detour is weighed,
or when the pool's replicas differ in context and the request is longer than
the smallest.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from dataplane.pick.p2c import Branch, Decision, LocalLoad, Need
from dataplane.pick.plugin import Notes, Plan, Steps, default_plan
from dataplane.regions.choice import (
    DEFAULT_HEADROOM,
    DEFAULT_QUEUE_MS,
    LocalQueue,
    RegionBranch,
    local_wait_ms,
    region_for,
)
from dataplane.regions.remote import EMPTY, RemoteView, pick_remote, remote_view
from dataplane.table.local import Table
from dataplane.table.pool import Pool, Replica, context_limit

__all__ = ["Ask", "Branch", "DecideParams", "Decision", "Local", "Placements", "Routing", "View", "decide",
           "make_view", "region"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DecideParams:
    """Knobs of :func:`decide`; see the module docstring (the ``[proxy]`` keys of the same names)."""

    walk_limit: int = 8
    place_choices: int = 4                   # ... than the least busy of its walk's first this many takers
    plan: Plan = dataclasses.field(default_factory=default_plan)  # filters, scorers, picker ([proxy.pick])
    region: str = ""                         # this proxy's region
    spill_queue_ms: float = DEFAULT_QUEUE_MS  # local wait beyond which the region step looks for room elsewhere
    spill_headroom: float = DEFAULT_HEADROOM
    capacity_share: float = 1.0               # this proxy's share of a region's slots


DEFAULT_DECIDE = DecideParams()


@dataclasses.dataclass(frozen=True, slots=True)
class View:
    """One applied table as the decision reads it: the table, the other regions, the parameters."""

    table: Table
    remote: RemoteView
    params: DecideParams


def make_view(table: Table, params: DecideParams = DEFAULT_DECIDE) -> View:
    """The :class:`View` of ``table`` (once per table applied)."""
    return View(table, remote_view(table) if table.spill else EMPTY, params)


@dataclasses.dataclass(frozen=True, slots=True)
class Routing:
    """What :meth:`dataplane.pick.state.PickState.prepare` found for a request: version, pool, prefix key, need."""

    version: str
    pool: Pool
    key: int | None   # None: no usable prefix key
    need: Need
    hot: bool = False  # no key because every key of the request is hot


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Ask:
    """One attempt of one request, as the decision needs it."""

    routing: Routing
    tier: str = "interactive"
    model: str = ""
    tried: frozenset[str] = frozenset()
    tried_nodes: frozenset[str] = frozenset()
    avoid: frozenset[str] = frozenset()
    region_step: bool = False


class Placements:
    """Where this proxy sent each prefix key lately: a bounded LRU map, key -> replica id.

    ``capacity`` keys (default 65,536, about 6 MB); the least recently used
    goes first. Written when a request is sent (:meth:`dataplane.pick.state.PickState.sent`),
    read by :func:`decide`.
    """

    def __init__(self, capacity: int = 65_536) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self._map: OrderedDict[int, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._map)

    def get(self, key: int) -> str | None:
        """The replica ``key`` was last sent to, if remembered."""
        return self._map.get(key)

    def put(self, key: int, replica_id: str) -> None:
        """Remember that ``key`` went to ``replica_id``."""
        if self.capacity == 0:
            return
        self._map[key] = replica_id
        self._map.move_to_end(key)
        if len(self._map) > self.capacity:
            self._map.popitem(last=False)


@dataclasses.dataclass(frozen=True, slots=True)
class Local:
    """This proxy's own knowledge at decision time (read, never written, by :func:`decide`)."""

    load: LocalLoad
    ejected: frozenset[str] = frozenset()
    detour: float | None = None
    placements: Placements | None = None
    queue: Callable[[], LocalQueue | None] | None = None
    choices: int = 0  # replicas of the walk a new key is placed among (0: the view's place_choices)
    place_margin: float = 0.0  # prompt tokens of backlog a new key's home may have over the least busy taker
    steps: Steps | None = None  # where each step's time goes (per-step metrics); None: not timed
    notes: Notes | None = None  # the raw per-scorer terms of the replicas weighed (the debug log); None: not kept


def decide(view: View, ask: Ask, local: Local, rng: random.Random, now: float) -> Decision:
    """The region and replica for one attempt; see the module docstring."""
    steps = local.steps
    began = time.perf_counter() if steps is not None else 0.0
    if ask.region_step:
        elsewhere = region(view, ask, local, rng, now)
        if steps is not None:
            stepped = time.perf_counter()
            steps.observe("region", Branch.REGION.value if elsewhere is not None else "local", stepped - began)
            began = stepped
        if elsewhere is not None:
            return elsewhere
    return _local(view.params, ask, local, rng, now - view.table.applied_at, began)


def region(view: View, ask: Ask, local: Local, rng: random.Random, now: float) -> Decision | None:
    """Step 1 alone: another region's replica, or None to stay (the router takes it before the tier queue)."""
    if not view.remote.targets:
        return None
    table_age = now - view.table.applied_at
    p, remote, model = view.params, view.remote, ask.model
    waiting = local.queue() if local.queue is not None else None
    choice = region_for(
        p.region, remote.targets, tier=ask.tier, u=rng.random(), usable=remote.usable(model),
        wait_ms=0.0 if waiting is None else local_wait_ms(waiting), threshold_ms=p.spill_queue_ms,
        rooms=lambda: remote.rooms(model, local.load, local.load.counted, headroom=p.spill_headroom,
                                   share=p.capacity_share))
    if choice.branch is RegionBranch.LOCAL:
        return None
    replica = pick_remote(remote.replicas.get((choice.region, model), ()), local.load, rng,
                          counted=local.load.counted, trust=local.load.trust, table_age=table_age)
    if replica is None:
        return None
    return Decision(replica, Branch.REGION, region=choice.region, rtt_ms=choice.rtt_ms)


def _local(params: DecideParams, ask: Ask, local: Local, rng: random.Random, table_age: float,
           began: float = 0.0) -> Decision:
    """Steps 2 to 5 in this region: the context limit and the plan's filters, then its picker."""
    routing = ask.routing
    pool, need = routing.pool, routing.need
    steps = local.steps
    if need.tokens > pool.max_context:
        what = (f"a prompt of {need.prompt_tokens} tokens leaves no room" if need.prompt_tokens >= pool.max_context
                else f"prompt + max_tokens = {need.tokens} tokens exceed")
        decision = Decision(None, Branch.TOO_LONG, reason=f"{what} in the largest context of the model's replicas "
                                                          f"({pool.max_context} tokens)")
        if steps is not None:
            steps.observe("filter", decision.branch.value, time.perf_counter() - began)
        return decision
    candidates: Sequence[Replica] = pool.replicas
    if need.tokens > pool.min_context:
        candidates = [r for r in candidates if need.tokens <= context_limit(r)]
    plan = params.plan
    off, off_nodes = plan.off(candidates, ask, local)
    if steps is None:
        return plan.picker.pick(params, ask, local, rng, table_age, candidates, off, off_nodes)
    filtered = time.perf_counter()
    decision = plan.picker.pick(params, ask, local, rng, table_age, candidates, off, off_nodes)
    done = time.perf_counter()
    steps.observe("filter", decision.branch.value, filtered - began)
    steps.observe("pick", decision.branch.value, done - filtered)
    return decision
