"""The attempt loop, once: decide, send, record, retry: what the proxy, the endpoint picker and the simulator drive.

A request admitted (:meth:`AttemptLoop.admitted`: the retry budget's
denominator) is tried until an attempt answers or none may follow. Each
attempt: :meth:`AttemptLoop.decide` builds the decision's :class:`Ask` (the
request's routing and tier; the replicas already tried and those it may not go
to, the nodes of the replicas that failed; the avoid set of the admission
gate's tier queues for its ticket) and calls
:meth:`dataplane.pick.state.PickState.decide` (with the gate's local queue for the
region step); :meth:`AttemptLoop.send` counts the attempt, records it sent
(in-flight load, prefill backlog, placements) and tells the gate where it went
(an interactive request sent to a full replica makes room there); the result
goes back as :meth:`AttemptLoop.answered` (outlier detector, how long a local
request lasts) or :meth:`AttemptLoop.failed` (outlier detector; a refused
connection takes the replica out of the pick), and :meth:`AttemptLoop.done`
gives the load back. After a failure, :meth:`AttemptLoop.retry` says whether
another attempt follows: the retry rule
(:func:`dataplane.failover.recover.retry_reason`: retryable, tier, attempts
left) and then the retry budget (:meth:`dataplane.failover.recover.Failover.may_retry`).
A stream cut after output is continued through the same
:class:`dataplane.failover.recover.Failover` (:attr:`AttemptLoop.failover`).

The loop holds no I/O. What it reads and tells is injected: the clock, the
admission gate (:class:`Gate`: :class:`dataplane.admission.gate.Admission` at
the proxy and in the fleet simulator, where virtual time drives it) and the records
(:class:`Records`: the proxy's metrics through :class:`MetricRecords`, nothing in
the simulator). The forward itself is the driver's: the proxy's relay
(:meth:`dataplane.router.Router.infer`, ``stream``), the endpoint picker's
hand-off to Envoy (``Router.hand_off``, ``served``, ``handed_back``) and the
simulator's engines (:class:`tools.sim.policies.Ferry`) each forward their own
way and call the loop at the same points. A request's attempt state is
anything with the fields of :class:`Tried` (the router's ``RequestState``,
the simulator's :class:`Tries`).

Cost: O(replicas tried) per decision besides the decision itself.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from dataplane.admission.queues import Ticket
from dataplane.failover.recover import Counts, Failover, retry_reason
from dataplane.failover.settings import RetrySettings
from dataplane.forward.failures import unreached
from dataplane.metrics import ProxyMetrics
from dataplane.pick.decide import Ask, View
from dataplane.pick.p2c import Branch, Decision
from dataplane.pick.state import Attempt, PickState, Routing
from dataplane.regions.choice import LocalQueue
from dataplane.table.local import Replica
from ferry.errors import FerryError


class Gate(Protocol):
    """The admission gate as the loop reads and tells it (:class:`dataplane.admission.gate.Admission`)."""

    def avoid(self, model: str, ticket: Ticket, inflight: Mapping[str, int]) -> frozenset[str]:
        """Replicas the pick should keep ``ticket`` off."""

    def local_queue(self, model: str) -> LocalQueue | None:
        """What a new interactive request of ``model`` would find queued here (the region step reads it)."""

    def placed(self, model: str, ticket: Ticket, replica: str, inflight: int, slots: int) -> None:
        """``ticket`` was sent to ``replica`` (``inflight`` of this proxy's there, ``slots`` its target)."""


class Records(Counts, Protocol):
    """What the loop records: decisions and retries (and, through :class:`Failover`, the budget and cuts)."""

    def picked(self, model: str, branch: str, telemetry_age: float | None) -> None:
        """A decision of ``branch``; ``telemetry_age``: the chosen replica's telemetry age (None: no replica)."""

    def retried(self, model: str, reason: str) -> None:
        """A retry allowed, for ``reason`` (the retry rule's label)."""


class Tried(Protocol):
    """A request's attempt state as the loop reads and counts it."""

    routing: Routing | None
    model_label: str
    tier_label: str
    ticket: Ticket | None
    exclude: frozenset[str]
    attempts: int


@dataclasses.dataclass(slots=True)
class Tries:
    """A request's attempt state where no router keeps one (the simulator)."""

    routing: Routing | None
    model_label: str
    tier_label: str
    ticket: Ticket | None = None
    exclude: frozenset[str] = frozenset()
    attempts: int = 0


class NoRecords:
    """Records nothing (the simulator)."""

    def picked(self, model: str, branch: str, telemetry_age: float | None) -> None:
        pass

    def retried(self, model: str, reason: str) -> None:
        pass

    def budget_exhausted(self, model: str) -> None:
        pass

    def continued(self, model: str, outcome: str) -> None:
        pass


class MetricRecords:
    """The proxy's records: ``ferry_proxy_picks_total``, ``_telemetry_age_seconds``, ``_retries_total``,
    ``_retry_budget_exhausted_total`` and ``_stream_continuations_total`` (:class:`dataplane.metrics.ProxyMetrics`)."""

    def __init__(self, metrics: ProxyMetrics) -> None:
        self._metrics = metrics

    def picked(self, model: str, branch: str, telemetry_age: float | None) -> None:
        self._metrics.picks.labels(model, branch).inc()
        if telemetry_age is not None:
            self._metrics.telemetry_age.observe(telemetry_age)

    def retried(self, model: str, reason: str) -> None:
        self._metrics.retries.labels(model, reason).inc()

    def budget_exhausted(self, model: str) -> None:
        self._metrics.retry_budget_exhausted.labels(model).inc()

    def continued(self, model: str, outcome: str) -> None:
        self._metrics.continuations.labels(model, outcome).inc()


class AttemptLoop:
    """One proxy's attempt loop over its :class:`PickState`; see the module docstring."""

    def __init__(self, picker: PickState, retries: RetrySettings, *, clock: Callable[[], float], gate: Gate,
                 records: Records | None = None, simulate_region_rtt: bool = False) -> None:
        self.picker = picker
        self.gate = gate
        self.records: Records = records if records is not None else NoRecords()
        self._retries = retries
        self._clock = clock
        self.failover = Failover(retries, self.records, picker.budget, clock=clock,  # retry budget, continuation
                                 simulate_region_rtt=simulate_region_rtt)

    def reconfigure(self, retries: RetrySettings) -> None:
        """New retry settings (a router config): attempts and tiers from the next failure."""
        self._retries = retries
        self.failover.reconfigure(retries)

    def admitted(self) -> None:
        """A request was admitted: counted in the retry budget's window."""
        self.failover.note_request()

    def ask(self, request: Tried, failed: Sequence[Replica]) -> Ask:
        """The next attempt as the decision reads it: routing, tier, tried replicas and nodes, avoid set."""
        assert request.routing is not None
        model, ticket = request.model_label, request.ticket
        return Ask(routing=request.routing, tier=request.tier_label, model=model,
                   tried=frozenset(r.replica_id for r in failed) | request.exclude,
                   tried_nodes=frozenset(r.node for r in failed if r.node),
                   avoid=self.gate.avoid(model, ticket, self.picker.local) if ticket is not None else frozenset())

    def decide(self, request: Tried, view: View, failed: Sequence[Replica], *, applied_at: float = 0.0) -> Decision:
        """The decision for the next attempt, off the replicas (and nodes) in ``failed``; recorded with the chosen
        replica's telemetry age (its age in the table plus the table's, applied at ``applied_at``)."""
        now = self._clock()
        decision = self.decide_at(request, view, failed, now)
        replica = decision.replica
        self.records.picked(request.model_label, decision.branch.value,
                            replica.telemetry_age + now - applied_at if replica is not None else None)
        return decision

    def decide_at(self, request: Tried, view: View, failed: Sequence[Replica], now: float) -> Decision:
        """The decision alone, unrecorded (a handed-off request's fallbacks are ranked with it)."""
        return self.picker.decide(view, self.ask(request, failed), now,
                                  queue=functools.partial(self.gate.local_queue, request.model_label))

    def region(self, request: Tried, view: View) -> Decision | None:
        """The decision's region step alone, before the tier queue: another region's replica, or None."""
        return self.picker.region(view, self.ask(request, ()), self._clock(),
                                  queue=functools.partial(self.gate.local_queue, request.model_label))

    def send(self, request: Tried, decision: Decision, *, streamed: bool, now: float | None = None) -> Attempt:
        """The attempt to ``decision``'s replica, counted and recorded as sent at ``now`` (default: the clock); the
        gate told where a queued request went (not when another region serves it)."""
        replica = decision.replica
        assert replica is not None and request.routing is not None
        request.attempts += 1
        sent_at = self._clock() if now is None else now
        attempt = self.picker.sent(replica.replica_id, request.routing, decision.branch, sent_at, streamed=streamed,
                                   queued=replica.queued)
        if request.ticket is not None and not decision.region:  # an interactive request sent to a full replica
            self.gate.placed(request.model_label, request.ticket, replica.replica_id,  # makes room there
                             self.picker.local.get(replica.replica_id), replica.max_concurrency)
        return attempt

    def moved(self, request: Tried, attempt: Attempt, replica: Replica, *, unreached: bool) -> Attempt:
        """A handed-off request's forwarder answered from the fallback ``replica``: the new attempt counted and
        recorded; ``unreached``: ``attempt``'s replica came before it and never answered (taken off the pick as
        unreachable, its load given back)."""
        now = self._clock()
        if unreached:
            self.picker.failed(attempt, now=now, unreached=True)
            self.picker.done(attempt)
        assert request.routing is not None
        request.attempts += 1
        return self.picker.sent(replica.replica_id, request.routing, Branch.FALLBACK, now, streamed=True,
                                queued=replica.queued)

    def answered(self, attempt: Attempt, *, completion_tokens: int, cached_tokens: int = 0, local: bool = True,
                 now: float | None = None) -> None:
        """``attempt`` answered in full: fed to the outlier detector; a ``local`` one (not another region's) is how
        long a local request lasts, the age at which pushed loads go stale."""
        now = self._clock() if now is None else now
        self.picker.answered(attempt, now=now, completion_tokens=completion_tokens, cached_tokens=cached_tokens)
        if local:
            self.picker.local.observe(now - attempt.sent_at)

    def failed(self, attempt: Attempt, error: FerryError | None = None) -> None:
        """``attempt`` failed: fed to the outlier detector; a refused connection takes the replica out of the pick at
        once (:mod:`dataplane.pick.unreachable`)."""
        self.picker.failed(attempt, now=self._clock(), unreached=error is not None and unreached(error))

    def first(self, attempt: Attempt, now: float | None = None) -> None:
        """``attempt``'s first token came back (the outlier detector's prefill sample, the prefill backlog)."""
        self.picker.first(attempt, self._clock() if now is None else now)

    def progress(self, attempt: Attempt, tokens: int, now: float | None = None) -> bool:
        """``attempt`` has ``tokens`` output tokens (the decode sample, once enough came); whether to tell more."""
        self.picker.progress(attempt, tokens, self._clock() if now is None else now)
        return not attempt.decode_sampled

    def done(self, attempt: Attempt, cached_tokens: int | None = None) -> None:
        """``attempt`` is over: its in-flight load given back."""
        self.picker.done(attempt, cached_tokens)

    def retry(self, request: Tried, error: FerryError) -> bool:
        """Whether another attempt follows ``error``: the retry rule, then the budget (each refusal counted)."""
        reason = retry_reason(error, tier=request.tier_label, attempts=request.attempts,
                              max_attempts=self._retries.max_attempts, retry_tiers=self._retries.retry_tiers)
        if reason is None or not self.failover.may_retry(error, request.model_label):
            return False
        self.records.retried(request.model_label, reason)
        return True
