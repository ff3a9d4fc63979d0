"""The admit step and its asyncio wait at the proxy, over the tier queues of :mod:`dataplane.admission.queues`.

:class:`Admission` keeps one :class:`dataplane.admission.queues.TierQueues` per model,
sized from each applied table (capacity = the sum of the routable replicas'
concurrency targets x ``capacity_share``, the share of the fleet this proxy
dispatches; default 1.0 for one proxy), with the reserved shares of the
table's ``tier_quotas`` (set by the control plane; the proxy's
``tier_reserved`` setting until a table carries them). Per request:

1. :meth:`Admission.acquire` offers the ticket (:meth:`Admission.offer`: a
   refusal raises :class:`dataplane.admission.queues.Shed`: RESOURCE_EXHAUSTED
   with ``retry-after``), then waits until :meth:`TierQueues.dispatch` starts
   it, at most :meth:`Admission.wait_limit`: the tier's queue timeout and never
   past the request's deadline less 50 ms (then :meth:`Admission.expire` refuses
   it with reason ``timeout`` and a retry-after: no request waits past its
   deadline without an answer). The waiting is the caller's: an asyncio future
   here; the fleet simulator (:class:`tools.sim.policies.Ferry`) drives the same
   object in virtual time, starting what :meth:`Admission.offer`,
   :meth:`Admission.release` and :meth:`Admission.apply` return and expiring a
   wait at its limit;
2. :meth:`Admission.preemptible` runs the forward of a unary batch or
   standard request as a task that a preemption cancels (the replica call is cancelled); the
   ticket goes back to the head of its queue and the caller waits again
   (:class:`Preempted`), so the request is neither lost nor answered twice;
   :meth:`Admission.watch` makes a running lower-tier stream preemptible: a
   preemption frees its slot at once (:meth:`TierQueues.park`) and cancels
   its upstream call (:class:`StreamPreemption`), and the router requeues it
   (:meth:`Admission.resume`) when its client next reads, then continues it
   from what it delivered, so a stream whose client reads slowly, or not at
   all, holds no slot a higher tier is waiting for;
3. :meth:`Admission.placed` (called once the pick chose a replica) preempts
   a lower-tier request on that replica when an interactive request was
   sent to it while it is full (:meth:`TierQueues.make_room`);
4. :meth:`Admission.release` ends it and dispatches what now fits.

A model whose table lists no concurrency (capacity 0) bypasses the queues,
so the pick answers for it as before. Metrics (:class:`TierMetrics`):
``ferry_proxy_queue_depth{model,tier}``, ``ferry_proxy_queue_wait_seconds``,
``ferry_proxy_admitted_total``, ``ferry_proxy_shed_total{model,tier,reason}``,
``ferry_proxy_preempted_total{model,reason}`` (``reclaim``: the model was full
and a higher tier waited; ``fair``: a tenant above its ceiling in its tier
while others waited there; ``room``: an interactive request was sent to a
replica full of this proxy's requests), ``ferry_proxy_tier_quota`` and
``ferry_proxy_tier_lent`` (slots, per model and tier),
``ferry_proxy_tier_reclaimed_total`` (slots of a tier's reserve it took back
as its demand rose: the sum of the falls of ``_tier_lent``); per tier and tenant
(the first ``tenant_labels`` tenants by name, the others as ``_other``:
:class:`ferry.metrics.BoundedLabel`), ``ferry_proxy_tenant_queued_total``
(requests that entered a tier queue), ``_admitted_total``,
``_queue_wait_seconds_total`` (summed: over ``_admitted_total`` the mean
wait), ``_shed_total{reason}`` and ``_preempted_total``;
``ferry_proxy_interactive_replicas{model}`` (replicas kept for interactive work);
``ferry_proxy_confined_tenants{model}`` and ``ferry_proxy_confined_replicas{model}``
(heavy tenants held to shards of their own, :mod:`dataplane.admission.sharding`, and the
replicas those shards hold). A change of the shards logs ``tenant_confined``
(model, each confined tenant with its replicas; none: released).

Cost: O(1) per request besides the queue operations; one extra task per batch forward.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import NamedTuple, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dataplane.admission.queues import QueueParams, Shed, Ticket, TierQueues, sized, targets
from dataplane.admission.sharding import NONE, Shards
from dataplane.admission.shedding import EVICTED, TIMEOUT
from dataplane.regions.choice import LocalQueue, local_queue
from dataplane.table.local import Table
from ferry.config import TIERS
from ferry.errors import FerryError
from ferry.logs import event
from ferry.metrics import LATENCY_BUCKETS, BoundedLabel, name

R = TypeVar("R")
log = logging.getLogger("ferry.proxy")
ANSWER_MARGIN = 0.05  # seconds before the deadline a waiting request is refused, so the answer arrives in time


class Offered(NamedTuple):
    """What an offer did (:meth:`Admission.offer`): the tickets started now (the offered one among them when it runs
    at once) and those it evicted from their queues (refused)."""

    started: list[Ticket]
    evicted: list[Ticket]


class Preempted(FerryError):
    """A batch request was preempted and requeued; the caller waits for dispatch again."""


class _Preempt(asyncio.Event):
    """Set to preempt a running ticket; ``reason`` labels the metric: ``reclaim``, ``fair`` or ``room``."""

    reason = "reclaim"

    def fire(self, reason: str) -> bool:
        """Preempt the unary call: its task is cancelled and requeued by :meth:`Admission.preemptible`; False."""
        self.reason = reason
        self.set()
        return False


class StreamPreemption:
    """A running stream's preemption (:meth:`Admission.watch`).

    :meth:`fire` parks the ticket (its slot freed at once) and cancels the
    stream's upstream call through the canceller the forwarder bound
    (:meth:`bind`; bound after a fire, it cancels at once). The router sees
    the cancelled call, requeues the ticket and continues the stream.
    """

    def __init__(self, park: Callable[[str], None]) -> None:
        self.reason = ""  # set once fired: reclaim | room
        self._park = park
        self._cancel: Callable[[], object] | None = None

    @property
    def fired(self) -> bool:
        """Whether the stream was preempted."""
        return bool(self.reason)

    def bind(self, cancel: Callable[[], object] | None) -> None:
        """The current upstream call's canceller (None once it ended)."""
        self._cancel = cancel
        if cancel is not None and self.fired:
            cancel()

    def fire(self, reason: str) -> bool:
        """Preempt the stream: park its ticket, cancel its call; True (its slot is free now)."""
        if self.fired:
            return False
        self.reason = reason
        self._park(reason)
        if self._cancel is not None:
            self._cancel()
        return True


class TierMetrics:
    """The admission metrics; see the module docstring."""

    def __init__(self, registry: CollectorRegistry, tenant_labels: int = 100) -> None:
        self.tenant = BoundedLabel(tenant_labels)
        per_tenant = ["tier", "tenant"]
        self.tenant_queued = Counter(name("proxy_tenant_queued_total"), "Requests that entered a tier queue.",
                                     per_tenant, registry=registry)
        self.tenant_admitted = Counter(name("proxy_tenant_admitted_total"), "Requests dispatched from the queues.",
                                       per_tenant, registry=registry)
        self.tenant_wait = Counter(name("proxy_tenant_queue_wait_seconds_total"),
                                   "Seconds dispatched requests waited in the queues, summed.", per_tenant,
                                   registry=registry)
        self.tenant_shed = Counter(name("proxy_tenant_shed_total"), "Requests refused or evicted at admission.",
                                   [*per_tenant, "reason"], registry=registry)
        self.tenant_preempted = Counter(name("proxy_tenant_preempted_total"), "Requests preempted and requeued.",
                                        per_tenant, registry=registry)
        self.depth = Gauge(name("proxy_queue_depth"), "Requests waiting at the proxy.", ["model", "tier"],
                           registry=registry)
        self.wait = Histogram(name("proxy_queue_wait_seconds"), "Time from arrival to dispatch.", ["model", "tier"],
                              buckets=LATENCY_BUCKETS, registry=registry)
        self.admitted = Counter(name("proxy_admitted_total"), "Requests dispatched from the tier queues.",
                                ["model", "tier"], registry=registry)
        self.shed = Counter(name("proxy_shed_total"), "Requests refused or evicted at admission, by reason.",
                            ["model", "tier", "reason"], registry=registry)
        self.preempted = Counter(name("proxy_preempted_total"),
                                 "Batch and standard requests preempted and requeued, by reason (reclaim, room).",
                                 ["model", "reason"], registry=registry)
        self.quota = Gauge(name("proxy_tier_quota"), "Slots a tier may run now.", ["model", "tier"],
                           registry=registry)
        self.lent = Gauge(name("proxy_tier_lent"), "Reserved slots of a tier lent to others.", ["model", "tier"],
                          registry=registry)
        self.reclaimed = Counter(name("proxy_tier_reclaimed_total"),
                                 "Reserved slots a tier took back from the tiers it lent them to.", ["model", "tier"],
                                 registry=registry)
        self.confined = Gauge(name("proxy_confined_tenants"), "Heavy tenants held to shards of their own.",
                              ["model"], registry=registry)
        self.confined_replicas = Gauge(name("proxy_confined_replicas"), "Replicas held by heavy tenants' shards.",
                                       ["model"], registry=registry)
        self.interactive_replicas = Gauge(name("proxy_interactive_replicas"),
                                          "Replicas kept for interactive work ([proxy] interactive_replica_share).",
                                          ["model"], registry=registry)


class Admission:
    """Tier queues of every model of one proxy; see the module docstring."""

    def __init__(self, params: QueueParams, *, clock: Callable[[], float], registry: CollectorRegistry,
                 capacity_share: float = 1.0, tenant_labels: int = 100) -> None:
        self.params = params
        self._clock = clock
        self.capacity_share = capacity_share
        self.metrics = TierMetrics(registry, tenant_labels)
        self.models: dict[str, TierQueues] = {}
        self._waiters: dict[Ticket, asyncio.Future[None]] = {}
        self._preempt: dict[Ticket, _Preempt | StreamPreemption] = {}
        self._started: dict[Ticket, float] = {}
        self._shards: dict[str, Shards] = {}  # per model, the shards last reported
        self._shown: dict[str, tuple[tuple[int, int, int], ...]] = {}  # per model, the gauges' last values
        self._tier_gauges: dict[str, tuple[tuple[Gauge, Gauge, Gauge], ...]] = {}  # per model and tier, the children

    def apply(self, table: Table) -> list[Ticket]:
        """Size each model's queues from ``table``'s routable replicas; take its reserved shares when it has them.
        The tickets started by a capacity that grew."""
        if table.tier_quotas:
            reserved = {q.tier: q.reserved_share for q in table.tier_quotas}
            self.params = dataclasses.replace(self.params, reserved={t: reserved.get(t, 0.0) for t in TIERS})
            for held in self.models.values():
                held.reserved = dict(self.params.reserved)
        started: list[Ticket] = []
        for model, entry in table.models.items():
            queues = self.models[model] = sized(self.models.get(model), self.params, targets(entry),
                                                         self.capacity_share)
            self.metrics.interactive_replicas.labels(model).set(len(queues.placement.kept))
            started += self._pump(model)
        return started

    def reconfigure(self, params: QueueParams, capacity_share: float, table: Table | None) -> None:
        """New bounds, timeouts, headroom, tenant ceiling and capacity share (a router config), every queue kept.

        What sizes a structure stays as it was (the DRR quantum, the shards and kept replicas); the reserved
        shares stay the table's. Each model's capacity is sized again from ``table``; waiting tickets keep
        their place and are dispatched by the new capacity.
        """
        self.params = dataclasses.replace(
            params, reserved=self.params.reserved, quantum=self.params.quantum,
            shard_max_share=self.params.shard_max_share, shard_hold_seconds=self.params.shard_hold_seconds,
            interactive_replica_share=self.params.interactive_replica_share)
        self.capacity_share = capacity_share
        for queues in self.models.values():
            queues.params = self.params
        if table is not None:
            self.apply(table)

    def active(self, model: str) -> bool:
        """Whether requests of ``model`` go through the queues (its capacity is known)."""
        queues = self.models.get(model)
        return queues is not None and queues.capacity > 0

    def avoid(self, model: str, ticket: Ticket, inflight: Mapping[str, int]) -> frozenset[str]:
        """Replicas the pick should keep ``ticket`` off (:meth:`TierQueues.avoid`; ``inflight``: this proxy's)."""
        queues = self.models.get(model)
        return queues.avoid(ticket, inflight) if queues is not None else frozenset()

    def local_queue(self, model: str) -> LocalQueue | None:
        """What a new interactive request of ``model`` would find here (the spill on queue's input), if queued."""
        queues = self.models.get(model)
        if queues is None or queues.capacity <= 0:
            return None
        return local_queue(queues, self._clock())

    def offer(self, model: str, ticket: Ticket) -> Offered:
        """Queue a new ``ticket`` and dispatch what fits; raises :class:`Shed` when refused. The tickets it evicts
        are refused (their waits end with :class:`Shed`, reason ``evicted``)."""
        queues = self.models[model]
        now = self._clock()
        try:
            evicted = queues.offer(ticket, now)
        except Shed as shed:
            self._shed(model, ticket, shed.reason)
            raise
        self.metrics.tenant_queued.labels(ticket.tier, self.metrics.tenant(ticket.tenant)).inc()
        for victim in evicted:
            self._shed(model, victim, EVICTED)
            self._started.pop(victim, None)
            waiter = self._waiters.get(victim)
            if waiter is not None and not waiter.done():
                waiter.set_exception(Shed(victim.tier, EVICTED, queues.retry_after(victim.tier, now)))
        self._started[ticket] = now
        return Offered(self._pump(model), evicted)

    def wait_limit(self, ticket: Ticket) -> float:
        """Seconds ``ticket`` may wait for dispatch from now: its tier's queue timeout, never past its deadline less
        :data:`ANSWER_MARGIN` (at least 0)."""
        return max(min(self.params.timeouts[ticket.tier], ticket.deadline - self._clock() - ANSWER_MARGIN), 0.0)

    def expire(self, model: str, ticket: Ticket) -> bool:
        """``ticket``'s wait is over (:meth:`wait_limit`): if still queued, out of its queue and counted shed with
        reason ``timeout``; whether it was."""
        if ticket.state != "queued":
            return False
        self.models[model].cancel(ticket)
        self._started.pop(ticket, None)
        self._shed(model, ticket, TIMEOUT)
        self._gauges(model)
        return True

    async def acquire(self, model: str, ticket: Ticket) -> None:
        """Wait until ``ticket`` is dispatched (:meth:`offer` when new, then at most :meth:`wait_limit`); raises
        Shed when refused, evicted or timed out."""
        queues = self.models[model]
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = future
        try:
            if ticket.state == "new":
                self.offer(model, ticket)
            else:
                self._pump(model)
            if ticket.state != "running":
                await asyncio.wait((future,), timeout=self.wait_limit(ticket))
            if ticket.state != "running":
                if future.done() and future.exception() is not None:
                    raise future.exception()  # type: ignore[misc]
                if not self.expire(model, ticket):  # no longer queued, yet not started: still a refusal
                    self._shed(model, ticket, TIMEOUT)
                raise Shed(ticket.tier, TIMEOUT, queues.retry_after(ticket.tier, self._clock()))
        except asyncio.CancelledError:
            queues.cancel(ticket)
            raise
        finally:
            self._waiters.pop(ticket, None)
            self._gauges(model)

    async def preemptible(self, model: str, ticket: Ticket, call: Callable[[], Awaitable[R]]) -> R:
        """Run ``call()``; a lower-tier unary ticket may be preempted: cancelled, requeued, :class:`Preempted`."""
        if ticket.tier == TIERS[0] or not ticket.preemptible:
            return await call()
        event = self._preempt[ticket] = _Preempt()
        task = asyncio.ensure_future(call())
        signal = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait((task, signal), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            signal.cancel()
            self._preempt.pop(ticket, None)
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, FerryError):
            await task
        self.models[model].requeue(ticket, self._clock())
        self.metrics.preempted.labels(model, event.reason).inc()
        self.metrics.tenant_preempted.labels(ticket.tier, self.metrics.tenant(ticket.tenant)).inc()
        raise Preempted(f"{ticket.tier} request preempted on model {model!r}; requeued")

    def watch(self, model: str, ticket: Ticket) -> StreamPreemption | None:
        """Make a running lower-tier stream preemptible until :meth:`unwatch` (None: it never is)."""
        if ticket.tier == TIERS[0] or not ticket.preemptible or model not in self.models:
            return None
        preemption = self._preempt[ticket] = StreamPreemption(lambda reason: self._park(model, ticket, reason))
        return preemption

    def unwatch(self, ticket: Ticket) -> None:
        """The stream's forward ended: it is no longer preemptible."""
        self._preempt.pop(ticket, None)

    async def resume(self, model: str, ticket: Ticket) -> None:
        """A parked stream asks for output again: back at the head of its queue, wait for dispatch (:meth:`acquire`)."""
        self.models[model].requeue(ticket, self._clock())
        await self.acquire(model, ticket)

    def _park(self, model: str, ticket: Ticket, reason: str) -> None:
        """A stream was preempted: its slot is free now (:meth:`TierQueues.park`)."""
        self.models[model].park(ticket)
        self._preempt.pop(ticket, None)
        self.metrics.preempted.labels(model, reason).inc()
        self.metrics.tenant_preempted.labels(ticket.tier, self.metrics.tenant(ticket.tenant)).inc()

    def placed(self, model: str, ticket: Ticket, replica: str, inflight: int, slots: int) -> None:
        """``ticket`` was sent to ``replica`` (``inflight`` of ours there, ``slots`` its target): make room there."""
        queues = self.models.get(model)
        if queues is None:
            return
        freed = False
        for victim in queues.make_room(ticket, replica, inflight, slots):
            event = self._preempt.get(victim)
            if event is not None:
                freed = event.fire(victim.cause) or freed
            else:
                victim.state = "running"
        if freed:
            self._pump(model)

    def release(self, model: str, ticket: Ticket) -> list[Ticket]:
        """``ticket`` ended (answered, failed or cancelled): free its slot and dispatch; the tickets started."""
        queues = self.models.get(model)
        if queues is None:
            return []
        queues.cancel(ticket)
        queues.finish(ticket)
        self._started.pop(ticket, None)
        return self._pump(model)

    def _pump(self, model: str) -> list[Ticket]:
        """Dispatch what fits, then preempt what a higher tier needs; again while a preempted stream freed a slot.
        The tickets started (their waits end)."""
        queues = self.models[model]
        started: list[Ticket] = []
        freed, rounds = True, max(queues.capacity, 0) + 1  # each round parks at least one running stream
        while freed and rounds:
            rounds -= 1
            now = self._clock()
            for ticket in queues.dispatch(now):
                started.append(ticket)
                waited = now - self._started.get(ticket, now)
                self.metrics.admitted.labels(model, ticket.tier).inc()
                self.metrics.wait.labels(model, ticket.tier).observe(waited)
                tenant = self.metrics.tenant(ticket.tenant)
                self.metrics.tenant_admitted.labels(ticket.tier, tenant).inc()
                self.metrics.tenant_wait.labels(ticket.tier, tenant).inc(max(waited, 0.0))
                waiter = self._waiters.get(ticket)
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
            freed = False
            for ticket in queues.preemptions():
                event = self._preempt.get(ticket)
                if event is not None:
                    freed = event.fire(ticket.cause) or freed
                else:
                    ticket.state = "running"  # not preemptible (not yet forwarding): let it run
        self._gauges(model)
        return started

    def _shed(self, model: str, ticket: Ticket, reason: str) -> None:
        self.metrics.shed.labels(model, ticket.tier, reason).inc()
        self.metrics.tenant_shed.labels(ticket.tier, self.metrics.tenant(ticket.tenant), reason).inc()

    def _gauges(self, model: str) -> None:
        queues = self.models[model]
        if queues.shards is not self._shards.get(model, NONE):
            self._shards[model] = shards = queues.shards
            self.metrics.confined.labels(model).set(len(shards.shards))
            self.metrics.confined_replicas.labels(model).set(len(shards.taken))
            event(log, "tenant_confined", model=model,
                  tenants={t: sorted(r) for t, r in sorted(shards.shards.items())})
        quotas = queues.quotas()
        shown = tuple((queues.depth(t), quotas.quota[t], quotas.lent[t]) for t in TIERS)
        before = self._shown.get(model)
        if shown == before:  # per request: set the gauges only when a value moved
            return
        self._shown[model] = shown
        gauges = self._tier_gauges.get(model)
        if gauges is None:  # each child looked up once: labels() is most of a gauge's cost
            gauges = self._tier_gauges[model] = tuple(
                (self.metrics.depth.labels(model, t), self.metrics.quota.labels(model, t),
                 self.metrics.lent.labels(model, t)) for t in TIERS)
        for i, (tier, values, children) in enumerate(zip(TIERS, shown, gauges, strict=True)):
            old = before[i] if before is not None else (-1, -1, -1)
            for value, was, child in zip(values, old, children, strict=True):
                if value != was:
                    child.set(value)
            if before is not None and values[2] < old[2]:  # its demand rose: lent reserve taken back
                self.metrics.reclaimed.labels(model, tier).inc(old[2] - values[2])
