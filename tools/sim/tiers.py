"""Tier scenarios in virtual time: real engines behind one proxy running Ferry's admission code.

What runs unchanged: :class:`agent.replica.engine.Engine` replicas and the proxy's
:class:`dataplane.admission.queues.TierQueues` (bounded per-tier queues, DRR fair
share, quotas with lending and reclaim, shedding with retry-after,
preemption of batch). The proxy sends a dispatched request to the replica
with the fewest requests it has outstanding there (the pick's local term),
off the replicas :meth:`dataplane.admission.queues.TierQueues.avoid` names (a heavy
tenant's shard, or everything outside it; replicas it has filled, for
interactive beyond what it could preempt there);
a preempted batch request is cancelled on its engine and requeued at the
head of its queue, and so is one on a full replica an interactive request
was sent to (:meth:`dataplane.admission.queues.TierQueues.make_room`, as the proxy
does after its pick). Each replica admits at most its concurrency target, the
capacity the queues are sized from.

Events, in time order: arrival (offer; a refusal is an answer with its
retry-after), step end (first tokens give TTFT = arrival to the end of the
prefill step; finished requests free their slot, then dispatch), queue
timeout (a request still waiting at min(tier timeout, deadline) is refused:
never a silent wait past the deadline), deadline (a request still running at
its deadline ends DEADLINE_EXCEEDED, as the forward's deadline makes it, and
is cancelled on its replica), and a sample every ``sample_seconds``
(running and waiting per tier). Deterministic: no randomness here.

Cost: O(events log events), events dominated by engine steps.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

from agent.replica.engine import Engine, EngineParams, EngineRequest, SubmitOutcome
from dataplane.admission.queues import QueueParams, Shed, Ticket, sized
from ferry.config import TIERS

_ARRIVE, _STEP, _TIMEOUT, _SAMPLE, _DEADLINE = 0, 1, 2, 3, 4


@dataclasses.dataclass(frozen=True, kw_only=True)
class Req:
    """One simulated request."""

    rid: int
    arrival: float
    tier: str
    tenant: str = "t0"
    plan: str = "paid"
    prompt_tokens: int = 256
    max_tokens: int = 64
    deadline: float = 30.0  # seconds after arrival


@dataclasses.dataclass(kw_only=True)
class Outcome:
    """What happened to one request."""

    req: Req
    ttft: float | None = None
    done: float | None = None
    shed: str = ""
    retry_after: float = 0.0
    answered_at: float | None = None
    preempted: int = 0
    expired: bool = False  # DEADLINE_EXCEEDED: still running at its deadline, cancelled on the replica


@dataclasses.dataclass(frozen=True)
class Sample:
    """Running and waiting requests per tier at one instant."""

    at: float
    running: dict[str, int]
    waiting: dict[str, int]
    batch_quota: int


class TierSim:
    """One proxy in front of ``replicas`` engines; see the module docstring."""

    def __init__(self, *, replicas: int, engine: EngineParams, queues: QueueParams, sample_seconds: float = 0.1,
                 admission: bool = True) -> None:
        self.engines = [Engine(engine) for _ in range(replicas)]
        self.slots = engine.max_running
        self.queues = sized(None, queues, {str(i): engine.max_running for i in range(replicas)}, 1.0)
        self.admission = admission
        self.sample_seconds = sample_seconds
        self._events: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self._outstanding = [0] * replicas
        self._where: dict[int, int] = {}
        self._tickets: dict[int, Ticket] = {}
        self._by_ticket: dict[Ticket, int] = {}
        self.outcomes: dict[int, Outcome] = {}
        self.samples: list[Sample] = []
        self.preempted = 0

    def _push(self, when: float, kind: int, arg: int) -> None:
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, kind, arg))

    def run(self, requests: Sequence[Req], until: float) -> TierSim:
        """Run the requests; stop at ``until`` (virtual seconds)."""
        reqs = {r.rid: r for r in requests}
        for r in requests:
            self._push(r.arrival, _ARRIVE, r.rid)
        self._push(0.0, _SAMPLE, 0)
        while self._events:
            now, _, kind, arg = heapq.heappop(self._events)
            if now > until:
                break
            if kind == _ARRIVE:
                self._arrive(reqs[arg], now)
            elif kind == _STEP:
                self._finish(arg, now)
            elif kind == _TIMEOUT:
                self._timeout(arg, now)
            elif kind == _DEADLINE:
                self._expire(arg, now)
            else:
                self._sample(now)
                self._push(now + self.sample_seconds, _SAMPLE, 0)
        return self

    def _arrive(self, req: Req, now: float) -> None:
        out = self.outcomes[req.rid] = Outcome(req=req)
        ticket = Ticket(tenant=req.tenant, plan=req.plan, tier=req.tier, cost=req.prompt_tokens + req.max_tokens,
                        deadline=now + req.deadline)
        try:
            evicted = self.queues.offer(ticket, now)
        except Shed as shed:
            out.shed, out.retry_after, out.answered_at = shed.reason, shed.retry_after, now
            return
        for victim in evicted:
            self._refuse(self._by_ticket[victim], "evicted", now)
        self._tickets[req.rid], self._by_ticket[ticket] = ticket, req.rid
        timeout = min(self.queues.params.timeouts[req.tier], req.deadline)
        self._push(now + timeout, _TIMEOUT, req.rid)
        self._push(now + req.deadline, _DEADLINE, req.rid)
        self._dispatch(now)

    def _refuse(self, rid: int, reason: str, now: float) -> None:
        out = self.outcomes[rid]
        ticket = self._tickets.pop(rid)
        self._by_ticket.pop(ticket, None)
        out.shed, out.answered_at = reason, now
        out.retry_after = self.queues.retry_after(ticket.tier, now)

    def _timeout(self, rid: int, now: float) -> None:
        ticket = self._tickets.get(rid)
        if ticket is not None and ticket.state == "queued":
            self.queues.cancel(ticket)
            self._refuse(rid, "timeout", now)

    def _expire(self, rid: int, now: float) -> None:
        """The deadline passed while running: the forward ends DEADLINE_EXCEEDED and cancels the replica's work."""
        ticket = self._tickets.get(rid)
        if ticket is None or ticket.state not in ("running", "preempting"):
            return
        i = self._where.pop(rid, None)
        if i is not None:
            self.engines[i].cancel(str(rid))
            self._outstanding[i] -= 1
        self._tickets.pop(rid)
        self._by_ticket.pop(ticket, None)
        self.queues.finish(ticket)
        out = self.outcomes[rid]
        out.expired, out.answered_at = True, now
        self._dispatch(now)

    def _dispatch(self, now: float) -> None:
        for _ in range(2):
            for ticket in self.queues.dispatch(now):
                self._send(self._by_ticket[ticket], ticket, now)
            victims = self.queues.preemptions()
            if not victims:
                return
            for ticket in victims:
                self._preempt(ticket, now)

    def _preempt(self, ticket: Ticket, now: float) -> None:
        """Cancel ``ticket``'s request on its engine and requeue it at the head of its queue."""
        rid = self._by_ticket[ticket]
        i = self._where.pop(rid)
        self.engines[i].cancel(str(rid))
        self._outstanding[i] -= 1
        self.queues.requeue(ticket, now)
        self.outcomes[rid].preempted += 1
        self.preempted += 1

    def _send(self, rid: int, ticket: Ticket, now: float) -> None:
        out = self.outcomes[rid]
        off = self.queues.avoid(ticket, {str(k): n for k, n in enumerate(self._outstanding)})
        allowed = [k for k in range(len(self.engines)) if str(k) not in off] or range(len(self.engines))
        i = min(allowed, key=lambda k: self._outstanding[k])
        engine = self.engines[i]
        got = engine.submit(EngineRequest(request_id=str(rid), prompt_tokens=out.req.prompt_tokens,
                                          max_tokens=out.req.max_tokens), now)
        if got is not SubmitOutcome.QUEUED:
            self.queues.finish(ticket)
            self._refuse(rid, str(got), now)
            return
        self._where[rid] = i
        self._outstanding[i] += 1
        for victim in self.queues.make_room(ticket, str(i), self._outstanding[i], self.slots):
            self._preempt(victim, now)
        if not engine.step_in_flight:
            self._start(i, now)

    def _start(self, i: int, now: float) -> None:
        duration = self.engines[i].start_step(now)
        if duration is not None:
            self._push(now + duration, _STEP, i)

    def _finish(self, i: int, now: float) -> None:
        result = self.engines[i].finish_step(now)
        for rid_s in result.first:
            rid = int(rid_s)
            out = self.outcomes[rid]
            if out.ttft is None:
                out.ttft = now - out.req.arrival
        freed = False
        for fin in result.finished:
            rid = int(fin.request_id)
            if self._where.pop(rid, None) is None:
                continue
            self._outstanding[i] -= 1
            out = self.outcomes[rid]
            out.done = out.answered_at = now
            ticket = self._tickets.pop(rid)
            self._by_ticket.pop(ticket, None)
            self.queues.finish(ticket)
            freed = True
        if freed:
            self._dispatch(now)
        if not self.engines[i].step_in_flight:
            self._start(i, now)

    def _sample(self, now: float) -> None:
        q = self.queues
        self.samples.append(Sample(now, {t: q.running(t) for t in TIERS}, {t: q.depth(t) for t in TIERS},
                                   q.quotas().quota["batch"]))
