"""Where requests wait at the proxy: bounded per-tier queues of one model, dispatch and preemption.

:class:`TierQueues` (one per model) holds, per tier, a
:class:`dataplane.admission.fairshare.DeficitRoundRobin` of tenants and counts what
runs. Pure: ``now`` is passed in; futures, tasks and metrics are the
caller's (:mod:`dataplane.admission.gate`).

- :meth:`TierQueues.offer` queues a :class:`Ticket` or refuses it with
  :class:`Shed` (an :class:`ferry.errors.Overloaded` with the retry-after
  from the tier's drain rate; :func:`dataplane.admission.shedding.shed_reason`). When
  the model's total bound ``max_queued`` is reached, a waiting request of a
  lower tier (free plan first, newest first) is evicted to make room, else
  the newcomer is refused. When a tier's own bound is reached, the newest
  request of the tenant with the most waiting gives way (when that tenant has
  more waiting than the newcomer's, on no better a plan): one tenant's
  backlog cannot push the others out. The expected wait behind the shedding
  counts the newcomer's tenant's backlog over its weighted share of the
  dispatches (its place under the fair share), not the whole queue.
- :meth:`TierQueues.dispatch` starts waiting requests while the model has
  headroom (running < ``capacity``, the replicas' concurrency targets),
  interactive first, then standard, then batch, each tier up to its
  allowance under :func:`ferry.quotas.compute_quotas` from the demand seen
  here (running + waiting per tier) and the reserved shares. Two bounds
  keep the lent capacity from hurting the latency of others:
  lower tiers leave :func:`ferry.quotas.interactive_headroom` slots free
  (the interactive dispatch rate x ``headroom_seconds``, at most
  ``headroom_max_share`` of the slots), so an interactive arrival starts at
  once rather than after a preemption; and inside a tier each tenant with
  work runs at most :func:`dataplane.admission.fairshare.tenant_ceilings` of the slots
  the tier could hold (``tenant_ceiling`` x its weighted share among the
  tenants with work; alone, all of them), the DRR passing over a tenant at
  its ceiling, so one tenant's traffic cannot fill the replicas the others
  share (their step time grows with what runs); each tenant's running
  requests per tier are counted by :class:`dataplane.admission.limits.TenantInflight`.
- :meth:`TierQueues.avoid`: where the pick should not send a request
  (:mod:`dataplane.admission.avoid`): a batch or standard request, the replicas
  kept for interactive (``interactive_replica_share``, whose slots the
  lower tiers also leave free); a tenant left at its ceiling with work
  waiting is confined to a shard of whole replicas and the others kept off
  it (:mod:`dataplane.admission.sharding`), so a tenant held to its share does not also
  slow every replica the others use; and no request goes to a replica this
  proxy has filled (an interactive one: beyond the batch and standard
  requests it could preempt there) while another has room.
- :meth:`TierQueues.make_room`: an interactive request the pick sent to a
  replica that is full (this proxy's in-flight count there above its
  concurrency target) preempts the newest lower-tier request on that same
  replica, so it does not wait there for one to finish.
- :meth:`TierQueues.preemptions` names the requests to preempt: batch, then
  standard, above their allowance while a higher tier waits with no headroom
  and room in its own allowance, newest first (least work lost). The caller cancels them on the replica and
  :meth:`TierQueues.requeue` puts them back at the head of their queue. A stream is preempted alike; its
  slot is freed at once (:meth:`TierQueues.park`: its client may not read again for a while) and it is
  requeued when its caller next asks for output, then continued from what it delivered.

Parameters (:class:`QueueParams`): per-tier bounds (interactive 256,
standard 512, batch 4,096), per-tier queue timeouts (2 s, 10 s, 60 s),
``max_queued`` 8,192 per model, ``free_share`` 0.5, DRR quantum 512 tokens
times the plan's weight (free 1, paid 4, enterprise 8), ``headroom_seconds``
0.2, ``headroom_max_share`` 0.1, ``tenant_ceiling`` 1.0 (0 turns it off),
``shard_max_share`` 0.5 (0 turns confinement off), ``shard_hold_seconds`` 1.0,
``interactive_replica_share`` 0 (no replica kept for interactive).

Cost: O(1) amortised per offer and finish; a dispatch round O(tenants with
work) for the ceilings; eviction scans at most 64 waiting entries;
preemption and make_room O(running of the lower tiers).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING

from dataplane.admission.avoid import Placement
from dataplane.admission.fairshare import DeficitRoundRobin, tenant_ceilings
from dataplane.admission.limits import TenantInflight
from dataplane.admission.sharding import MAX_SHARE, Shards
from dataplane.admission.shedding import PLAN_RANK, QUEUE_FULL, DrainRate, retry_after, shed_reason, victim_order
from ferry.config import TIERS
from ferry.errors import Overloaded
from ferry.quotas import DEFAULT_RESERVED, Quotas, allowance, compute_quotas, interactive_headroom

if TYPE_CHECKING:
    from dataplane.table.local import ModelEntry

_ids = itertools.count()
PLAN_WEIGHT = {"free": 1.0, "paid": 4.0, "enterprise": 8.0}  # DRR weights of the plans inside a tier


@dataclasses.dataclass(frozen=True, kw_only=True)
class QueueParams:
    """Bounds and timeouts of the tier queues; see the module docstring for the defaults."""

    bounds: Mapping[str, int] = dataclasses.field(
        default_factory=lambda: {"interactive": 256, "standard": 512, "batch": 4096})
    timeouts: Mapping[str, float] = dataclasses.field(
        default_factory=lambda: {"interactive": 2.0, "standard": 10.0, "batch": 60.0})
    max_queued: int = 8192
    free_share: float = 0.5
    quantum: int = 512
    reserved: Mapping[str, float] = dataclasses.field(default_factory=lambda: dict(DEFAULT_RESERVED))
    headroom_seconds: float = 0.2
    headroom_max_share: float = 0.1
    tenant_ceiling: float = 1.0
    shard_max_share: float = MAX_SHARE
    shard_hold_seconds: float = 1.0
    interactive_replica_share: float = 0.0


@dataclasses.dataclass(eq=False, kw_only=True)
class Ticket:
    """One request's place in the queues (hashed by identity)."""

    tenant: str
    plan: str
    tier: str
    cost: int
    deadline: float
    enqueued_at: float = 0.0
    state: str = "new"  # new | queued | running | preempting | parked | done
    preempted: int = 0
    preemptible: bool = True  # False: never preempted (a stream that has used up its continuations)
    cause: str = ""  # why it was last chosen to be preempted: reclaim | fair | room (the metric's reason)
    replica: str = ""  # where it was sent, once the pick chose (make_room)
    seq: int = dataclasses.field(default_factory=lambda: next(_ids))

    def __hash__(self) -> int:
        return self.seq


class Shed(Overloaded):
    """A request refused (or evicted) at admission; ``reason`` is the metric label."""

    def __init__(self, tier: str, reason: str, retry_after: float) -> None:
        super().__init__(f"{tier} queue: {reason.replace('_', ' ')}", retry_after)
        self.tier = tier
        self.reason = reason


class TierQueues:
    """The waiting and running requests of one model at one proxy; see the module docstring."""

    def __init__(self, params: QueueParams, capacity: int = 0) -> None:
        self.params = params
        self.capacity = capacity
        self.reserved = dict(params.reserved)
        self._queues = {t: DeficitRoundRobin[Ticket](quantum=params.quantum) for t in TIERS}
        self._order: dict[str, deque[Ticket]] = {t: deque() for t in TIERS}
        self._running: dict[str, dict[Ticket, None]] = {t: {} for t in TIERS}
        self.drain = {t: DrainRate() for t in TIERS}
        self._held = {t: TenantInflight() for t in TIERS}  # each tenant's running requests, per tier
        self._weights: dict[str, dict[str, float]] = {t: {} for t in TIERS}  # a running tenant's plan weight
        self.placement = Placement(params.shard_max_share, params.shard_hold_seconds,
                                   params.interactive_replica_share)
        self._quotas_key: tuple[object, ...] = ()
        self._quotas = compute_quotas(capacity, {}, self.reserved)

    def depth(self, tier: str) -> int:
        """Requests of ``tier`` waiting."""
        return len(self._queues[tier])

    def running(self, tier: str) -> int:
        """Requests of ``tier`` dispatched and not finished."""
        return len(self._running[tier])

    def queued(self) -> int:
        """Requests waiting in all tiers."""
        return sum(len(q) for q in self._queues.values())

    def quotas(self) -> Quotas:
        """The quotas for the demand seen now (running + waiting per tier); kept until the demand changes."""
        demand = tuple(self.running(t) + self.depth(t) for t in TIERS)
        key = (self.capacity, demand, tuple(self.reserved.get(t, 0.0) for t in TIERS))
        if key != self._quotas_key:
            self._quotas_key = key
            self._quotas = compute_quotas(self.capacity, dict(zip(TIERS, demand, strict=True)), self.reserved)
        return self._quotas

    def retry_after(self, tier: str, now: float) -> float:
        """Seconds until ``tier``'s queue should have room."""
        return retry_after(self.depth(tier), self.drain[tier].rate(now), self.params.timeouts[tier])

    def offer(self, ticket: Ticket, now: float) -> list[Ticket]:
        """Queue ``ticket``; returns the tickets evicted for it; raises Shed when refused (then nothing is evicted).

        In a full tier the tenant waiting most there (two more than the newcomer's) gives way; over the total
        bound the least entitled waiting ticket does. One eviction makes room either way: a newcomer that took
        an evicted ticket's place never grows the total, even above a bound lowered since they queued."""
        tier, params = ticket.tier, self.params
        queue = self._queues[tier]
        weight = PLAN_WEIGHT.get(ticket.plan, 1.0)
        ahead = math.ceil((queue.depth(ticket.tenant) + 1) / queue.share(ticket.tenant, weight))
        reason = shed_reason(depth=self.depth(tier), bound=params.bounds[tier], rate=self.drain[tier].rate(now),
                             timeout=params.timeouts[tier], remaining=ticket.deadline - now, plan=ticket.plan,
                             free_share=params.free_share, ahead=ahead)
        evicted: list[Ticket] = []
        if reason == QUEUE_FULL and self.depth(tier) >= params.bounds[tier]:  # the heaviest tenant gives way
            victim = self._heaviest(ticket)
            if victim is not None:
                self.cancel(victim)
                evicted.append(victim)
                reason = None
        if reason is None and not evicted and self.queued() >= params.max_queued:  # one out, one in: no growth
            victim = self._victim(ticket)
            if victim is None:
                reason = QUEUE_FULL
            else:
                self.cancel(victim)
                evicted.append(victim)
        if reason is not None:
            raise Shed(tier, reason, self.retry_after(tier, now))
        ticket.enqueued_at, ticket.state = now, "queued"
        self._queues[tier].push(ticket.tenant, ticket, ticket.cost, PLAN_WEIGHT.get(ticket.plan, 1.0))
        self._order[tier].append(ticket)
        return evicted

    def _heaviest(self, newcomer: Ticket) -> Ticket | None:
        """The newest request of the tenant with the most waiting in the tier, if it has more than the newcomer's."""
        queue = self._queues[newcomer.tier]
        mine = queue.depth(newcomer.tenant)
        order = self._order[newcomer.tier]
        tenants = {t.tenant for t in itertools.islice(reversed(order), 256) if t.state == "queued"}
        heavy = max(tenants, key=queue.depth, default=None)
        if heavy is None or heavy == newcomer.tenant or queue.depth(heavy) <= mine + 1:
            return None
        victim = queue.newest(heavy)
        if victim is None or PLAN_RANK.get(victim.plan, 1) > PLAN_RANK.get(newcomer.plan, 1):
            return None
        return victim

    def _victim(self, newcomer: Ticket) -> Ticket | None:
        mine = victim_order(newcomer.tier, newcomer.plan, newcomer.enqueued_at)
        for tier in reversed(TIERS):
            order = self._order[tier]
            while order and order[-1].state != "queued":
                order.pop()
            scan = [t for t in itertools.islice(reversed(order), 64) if t.state == "queued"]
            if scan:
                best = min(scan, key=lambda t: victim_order(t.tier, t.plan, t.enqueued_at))
                return best if victim_order(best.tier, best.plan, best.enqueued_at)[:2] < mine[:2] else None
        return None

    def cancel(self, ticket: Ticket) -> None:
        """Take a waiting ticket out (timeout, cancellation, eviction); no-op otherwise."""
        if ticket.state == "queued":
            self._queues[ticket.tier].remove(ticket)
            ticket.state = "done"

    def headroom(self, now: float) -> int:
        """Slots kept free for interactive arrivals (:func:`ferry.quotas.interactive_headroom`)."""
        return interactive_headroom(self.capacity, self.drain[TIERS[0]].rate(now), self.params.headroom_seconds,
                                    self.params.headroom_max_share)

    def ceilings(self, tier: str, room: int) -> dict[str, int]:
        """Each tenant's concurrency ceiling in ``tier``: a share of ``room`` (:func:`tenant_ceilings`)."""
        weights = {t: self._weights[tier][t] for t in self._held[tier].tenants()}
        weights.update(self._queues[tier].weights())
        return tenant_ceilings(room, weights, self.params.tenant_ceiling)

    def dispatch(self, now: float) -> list[Ticket]:
        """Start what fits now, highest tier first, each tier under its allowance, each tenant under its ceiling.

        Interactive may use every slot; lower tiers leave :meth:`headroom` free,
        and the slots of the replicas kept for interactive that interactive
        does not fill (:meth:`dataplane.admission.avoid.Placement.idle_kept_slots`).
        Tenants left at their ceiling with work waiting are heavy: the shards
        (:mod:`dataplane.admission.sharding`) are planned again when that set changes.
        """
        started: list[Ticket] = []
        total = sum(self.running(t) for t in TIERS)
        quotas = self.quotas()
        spare = max(self.headroom(now), self.placement.idle_kept_slots(self.capacity))
        for tier in TIERS:
            queue, running = self._queues[tier], self._running[tier]
            if not len(queue):
                self.placement.note_heavy(tier, {})
                continue
            limit = allowance(quotas, tier)
            top = self.capacity if tier == TIERS[0] else self.capacity - spare
            if total >= top or len(running) >= limit:
                continue
            room = top - sum(self.running(t) for t in TIERS[:TIERS.index(tier)])  # what this tier could hold
            fair = self.ceilings(tier, room)
            ceilings = {t: self.placement.shards.ceiling(t, c) for t, c in fair.items()}
            held = self._held[tier]
            blocked = {t for t, cap in ceilings.items() if 0 < held.count(t) >= cap}
            while len(queue) and total < top and len(running) < limit:
                ticket = queue.pop(blocked)
                if ticket is None:
                    break
                ticket.state = "running"
                running[ticket] = None
                self._hold(ticket, 1)
                if held.count(ticket.tenant) >= ceilings.get(ticket.tenant, limit):
                    blocked.add(ticket.tenant)
                self.drain[tier].add(now)
                started.append(ticket)
                total += 1
            bounded = self.params.tenant_ceiling > 0 and len(fair) > 1
            self.placement.note_heavy(tier, {t: fair[t] for t in blocked if bounded and queue.depth(t) > 0})
        for order in self._order.values():
            while order and order[0].state != "queued":
                order.popleft()
        self.placement.replan(now)
        return started

    @property
    def shards(self) -> Shards:
        """The heavy tenants' shards (:mod:`dataplane.admission.sharding`)."""
        return self.placement.shards

    def set_replicas(self, replicas: Mapping[str, int]) -> None:
        """The model's replicas (id -> concurrency target) the placement works over."""
        self.placement.set_replicas(replicas)

    def avoid(self, ticket: Ticket, inflight: Mapping[str, int]) -> frozenset[str]:
        """Replicas the pick should keep ``ticket`` off (:meth:`dataplane.admission.avoid.Placement.avoid`)."""
        return self.placement.avoid(ticket.tenant, inflight, interactive=ticket.tier == TIERS[0])

    def _place(self, ticket: Ticket, replica: str) -> None:
        """``ticket`` was sent to ``replica``: a running preemptible lower-tier one is a victim there."""
        ticket.replica = replica
        victim = ticket.tier != TIERS[0] and ticket.preemptible and ticket.state == "running"
        self.placement.place(ticket, replica, victim=victim)

    def _hold(self, ticket: Ticket, delta: int) -> None:
        """Count ``ticket`` in (+1) or out (-1) of its tenant's running requests in its tier."""
        held, weights = self._held[ticket.tier], self._weights[ticket.tier]
        if delta > 0:
            held.enter(ticket.tenant)
            weights.setdefault(ticket.tenant, PLAN_WEIGHT.get(ticket.plan, 1.0))
            return
        held.leave(ticket.tenant)
        if not held.count(ticket.tenant):
            weights.pop(ticket.tenant, None)

    def preemptions(self) -> list[Ticket]:
        """Running tickets to preempt now, batch first, then standard, newest first; counted until requeued.

        Two causes (:attr:`Ticket.cause`), only preemptible tickets
        (:attr:`Ticket.preemptible`), never a tier below its allowance:

        - ``reclaim``: what higher tiers can use: the requests waiting in a
          higher tier that its allowance would let run, less the free slots
          and the preemptions already under way;
        - ``fair``: inside a standard or batch tier, a tenant running above
          its ceiling (:meth:`ceilings`, as :meth:`dispatch` computes them)
          gives back its newest requests, down to its ceiling, while tenants
          under theirs wait in that tier with no slot free for them, so one
          tenant's long requests (streams above all) cannot hold the tier
          against the others.
        """
        waiting = [t for t in TIERS if self.depth(t)]
        if not waiting:  # nothing waits: the common case
            return []
        quotas = self.quotas()
        limits = {t: allowance(quotas, t) for t in TIERS}
        free = self.capacity - sum(self.running(t) for t in TIERS)
        pending = sum(1 for tier in TIERS for t in self._running[tier] if t.state == "preempting")
        victims: list[Ticket] = []
        for i in range(len(TIERS) - 1, 0, -1):
            tier = TIERS[i]
            need = sum(max(0, min(self.depth(t), limits[t] - self.running(t))) for t in TIERS[:i])
            need -= max(free, 0) + pending + len(victims)
            over = self.running(tier) - limits[tier]
            count = min(need, over)
            if count <= 0:
                continue
            chosen = [t for t in reversed(self._running[tier]) if t.state == "running" and t.preemptible][:count]
            for ticket in chosen:
                ticket.state, ticket.cause = "preempting", "reclaim"
                self.placement.forget(ticket)
            victims += chosen
        for tier in waiting:
            if tier != TIERS[0] and self.params.tenant_ceiling > 0:
                victims += self._fair(tier, limits[tier], free)
        return victims

    def _fair(self, tier: str, limit: int, free: int) -> list[Ticket]:
        """The ``fair`` victims of ``tier`` (:meth:`preemptions`)."""
        held, queue = self._held[tier], self._queues[tier]
        if len(self._weights[tier].keys() | queue.weights().keys()) <= 1:  # one tenant: nobody to be fair to
            return []
        room = self.capacity - sum(self.running(t) for t in TIERS[:TIERS.index(tier)])
        ceilings = {t: self.placement.shards.ceiling(t, c) for t, c in self.ceilings(tier, room).items()}
        need = sum(min(queue.depth(t), max(0, c - held.count(t))) for t, c in ceilings.items())
        need -= max(0, min(free, limit - self.running(tier)))  # what dispatch can start without a preemption
        need -= sum(1 for t in self._running[tier] if t.state == "preempting")
        if need <= 0:
            return []
        excess = {t: held.count(t) - c for t, c in ceilings.items() if held.count(t) > c}
        chosen: list[Ticket] = []
        for ticket in reversed(self._running[tier]):
            if len(chosen) >= need:
                break
            if excess.get(ticket.tenant, 0) > 0 and ticket.state == "running" and ticket.preemptible:
                excess[ticket.tenant] -= 1
                ticket.state, ticket.cause = "preempting", "fair"
                self.placement.forget(ticket)
                chosen.append(ticket)
        return chosen

    def make_room(self, ticket: Ticket, replica: str, inflight: int, slots: int) -> list[Ticket]:
        """Running tickets to preempt on ``replica`` so ``ticket``, just sent there, runs at once.

        The model-wide count had a free slot but the pick chose a replica
        that is full (``inflight``, this proxy's requests there including
        ``ticket``, above its concurrency target ``slots``): without room it
        would wait on the replica for a lower-tier request to finish. Only
        for interactive tickets; victims are the newest preemptible running
        tickets on that replica, batch before standard, never taking a tier
        below its reserved slots. Marked preempting, as :meth:`preemptions`.
        """
        self._place(ticket, replica)
        excess = inflight - slots
        if ticket.tier != TIERS[0] or excess <= 0 or slots <= 0:
            return []
        reserved = self.quotas().reserved
        victims: list[Ticket] = []
        for tier in reversed(TIERS[1:]):
            spare = self.running(tier) - reserved[tier]
            for held in reversed(self._running[tier]):
                if len(victims) >= excess or spare <= 0:
                    break
                if held.replica == replica and held.state == "running" and held.preemptible:
                    held.state, held.cause = "preempting", "room"
                    self.placement.forget(held)
                    victims.append(held)
                    spare -= 1
        return victims

    def finish(self, ticket: Ticket) -> None:
        """A dispatched ticket ended (either way)."""
        if ticket.state in ("running", "preempting") and self._running[ticket.tier].pop(ticket, 0) is None:
            self._hold(ticket, -1)
        self.placement.forget(ticket)
        ticket.state = "done"

    def park(self, ticket: Ticket) -> None:
        """A preempted stream leaves the running set at once (its slot is free) until :meth:`requeue`."""
        if ticket.state not in ("running", "preempting"):
            return
        if self._running[ticket.tier].pop(ticket, 0) is None:
            self._hold(ticket, -1)
        self.placement.forget(ticket)
        ticket.state, ticket.replica = "parked", ""

    def requeue(self, ticket: Ticket, now: float) -> None:
        """A preempted (or parked) ticket goes back to the head of its tier queue (never shed, never lost)."""
        if self._running[ticket.tier].pop(ticket, 0) is None:
            self._hold(ticket, -1)
        self.placement.forget(ticket)
        ticket.state, ticket.preempted, ticket.replica = "queued", ticket.preempted + 1, ""
        self._queues[ticket.tier].push_front(ticket.tenant, ticket, ticket.cost)
        self._order[ticket.tier].appendleft(ticket)
        ticket.enqueued_at = min(ticket.enqueued_at, now)


def targets(entry: ModelEntry | None) -> dict[str, int]:
    """Each replica's concurrency target in a model's table entry, every version (None: no such model, none)."""
    if entry is None:
        return {}
    return {r.replica_id: r.max_concurrency for pool in entry.by_version.values() for r in pool}


def sized(queues: TierQueues | None, params: QueueParams, replicas: Mapping[str, int],
          capacity_share: float) -> TierQueues:
    """One model's tier queues sized from its replicas' concurrency targets (:func:`targets` of its table entry).

    Capacity = the sum of the targets x ``capacity_share``, rounded down; each replica's target goes to the
    queues' placement. ``queues`` None: new queues with ``params``. The one sizing rule, shared by
    :class:`dataplane.admission.gate.Admission` (the proxy's and the fleet simulator's) and the tier and regions
    simulators (:mod:`tools.sim.tiers`, :mod:`tools.sim.regions`).
    """
    capacity = int(sum(replicas.values()) * capacity_share)
    if queues is None:
        queues = TierQueues(params, capacity)
    queues.capacity = capacity
    queues.set_replicas(replicas)
    return queues
