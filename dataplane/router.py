"""The request path of the proxy: admit, then a loop of decide, forward, record.

Per request: :meth:`Router.begin` authenticates (:mod:`dataplane.intake.auth`),
validates (:mod:`dataplane.intake.validate`), checks the tier against the plan,
resolves the model, version and prefix keys in the current table
(:meth:`dataplane.pick.state.PickState.prepare`), and takes an in-flight slot
(:class:`dataplane.admission.limits.InflightLimit`), in that order, so the first
problem found is the one reported. When the table has spill routes, the
decision's region step runs once here: a request sent to another region
skips this region's tier queues. Then :meth:`Router.infer` or
:meth:`Router.stream` drive the attempt loop
(:class:`dataplane.attempt.AttemptLoop`, shared with the endpoint picker's
hand-off below and the simulator): **decide** (:func:`dataplane.pick.decide.decide`
through :meth:`dataplane.pick.state.PickState.decide`: filters, ejected replicas,
the tier queues' avoid set, tried replicas and nodes, the prefix ring, the
prefill detour, P2C), **forward** with the remaining deadline, **record**
(the proxy's in-flight load, prefill backlog and placements; the outlier
detector's feed). A failure before any output is retried when
:func:`dataplane.failover.recover.retry_reason` says so and the retry budget allows
(:meth:`dataplane.attempt.AttemptLoop.retry`); a stream cut after output is
continued on another replica (:mod:`dataplane.failover.continuation`) or ends
UNAVAILABLE saying how many tokens were delivered. A request whose version
has no ready replica but replicas warming waits for one, before the tier
queue, as long as its tier and deadline allow, or ends UNAVAILABLE with a
retry-after sized to the warm-up (:mod:`dataplane.admission.coldstart`,
:mod:`dataplane.admission.coldwait`). :meth:`Router.end` gives the slot back. Every
error is a :class:`ferry.errors.FerryError`; the servicer chooses the status.

Tokens are the model's own (:mod:`dataplane.intake.tokenwork`: the catalog's
``tokenizer`` file, else whitespace words): :meth:`Router.encode`, awaited
before :meth:`Router.begin`, encodes a large prompt in a worker thread;
``begin`` encodes anything not yet encoded inline. A completion whose
replica reports no token count is counted with the same tokenizer.

One listener on the table holder, :meth:`Router.apply_table`, updates the
decision's view and the tier queues when a table is applied.

State: the holder's current table (read once per request), the picker
(its decision state: :mod:`dataplane.pick.state`) and the attempt loop over
it (:attr:`Router.loop`); nothing else survives a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import random
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping

from dataplane.admission.coldwait import ColdStarts
from dataplane.admission.gate import Admission, Preempted
from dataplane.admission.limits import InflightLimit, TenantInflight
from dataplane.admission.queues import Ticket
from dataplane.admission.tenantlimits import TenantLimits
from dataplane.attempt import AttemptLoop, MetricRecords
from dataplane.cache.path import CachePath
from dataplane.config import ProxySettings
from dataplane.failover.continuation import Delivered, cut_error
from dataplane.failover.recover import failure_kind
from dataplane.forward.kserve import Call, Forwarder, Outcome, Piece
from dataplane.guard.hooks import Guards, Selected, Subject
from dataplane.intake.auth import Authenticator
from dataplane.intake.idempotency import Idempotency
from dataplane.intake.tokenwork import TokenWork
from dataplane.intake.validate import TIER_PRIORITY, ValidRequest, check_sampling, check_tier, validate_request
from dataplane.metrics import UNKNOWN, ProxyMetrics
from dataplane.pick.p2c import Branch, Decision, LocalLoad, Need
from dataplane.pick.state import Attempt, PickState, Routing
from dataplane.record.recorder import Recorder
from dataplane.table.local import Replica, Table, TableHolder
from dataplane.table.pool import UNLIMITED, Pool
from dataplane.tracing import Attribute, RequestTrace, Tracer
from dataplane.usage import UsageWindow
from ferry.config import Limits, TenantConfig
from ferry.errors import (
    DeadlineExceeded,
    FerryError,
    InvalidArgument,
    NoReplica,
    Overloaded,
    ReplicaFailed,
    Unavailable,
)
from ferry.logs import event
from ferry.tokens import Encoded
from ferry.v1 import inference_pb2

log = logging.getLogger("ferry.proxy")


@dataclasses.dataclass(slots=True)
class RequestState:
    """What one request carries through the path (typed; filled as it goes)."""

    request_id: str
    started: float
    deadline: float = 0.0
    model_label: str = UNKNOWN
    tier_label: str = UNKNOWN
    tenant: TenantConfig | None = None
    request: ValidRequest | None = None
    table: Table | None = None
    version: str = ""
    routing: Routing | None = None
    call: Call | None = None
    attempts: int = 0
    replica_id: str = ""
    forwarded_at: float = 0.0
    outcome: Outcome = dataclasses.field(default_factory=Outcome)
    admitted: bool = False
    region: str = ""  # the region of the replica that answered, when it is not the proxy's (spilled)
    rtt_ms: float = 0.0  # the round trip to that region
    spilled: Decision | None = None  # the region step chose another region (dataplane.pick.decide)
    limited: bool = False  # counted in the tenant's concurrency cap (dataplane.admission.tenantlimits)
    ticket: Ticket | None = None  # its place in the tier queues (dataplane.admission.gate), when queued
    cold_wait: float = 0.0  # seconds it may wait for its warming version to get ready (dataplane.admission.coldstart)
    encoded: Encoded | None = None  # the prompt's tokens, when encoded before begin (Router.encode)
    guard: Subject | None = None  # what the guardrail hooks are told, and their time (dataplane.guard.hooks)
    untouched: bool = False  # handed off as the client wrote it: the replica judges its own sampling parameters
    exclude: frozenset[str] = frozenset()  # replicas it may not go to (handed off: no endpoint for its wire, or
    # outside the gateway's subset hint); the decision takes them as tried
    trace: RequestTrace | None = None  # its spans, when traced (dataplane.tracing: None whenever tracing is off)
    branch: str = ""  # the decision branch of the attempt sent last (dataplane.pick.p2c.Branch; the recorder's)
    streamed: bool = False  # the client asked for a stream (set by its front door; the recorder's)


@dataclasses.dataclass(slots=True)
class Handoff:
    """A request handed to an external forwarder: the replicas to try in order, and the attempt in flight."""

    replicas: tuple[Replica, ...]  # the decision's replica first, then the fallbacks
    attempt: Attempt  # the attempt of the replica serving (moved by Router.served)
    closed: bool = False  # Router.handed_back ran


def _logprobs_asked(valid: ValidRequest) -> int | None:
    """None when the request asks no log probabilities, else how many alternatives per token (0: none)."""
    given = dict(valid.sampling)
    top = given.get("top_logprobs", 0)
    return (top if isinstance(top, int) else 0) if given.get("logprobs") else None


class Router:
    """Runs requests from validation to the last byte; see the module docstring."""

    def __init__(
        self,
        *,
        settings: ProxySettings,
        limits: Limits,
        authenticator: Authenticator,
        holder: TableHolder,
        forwarder: Forwarder,
        metrics: ProxyMetrics,
        rng: random.Random,
        clock: Callable[[], float],
        tokens: TokenWork | None = None,
        guards: Guards | None = None,
        tracer: Tracer | None = None,
        max_output: Mapping[str, int] | None = None,
    ) -> None:
        self._settings = settings
        self.tracer = tracer  # request traces (dataplane.tracing); None: off, and no hook below does anything
        self.guards = guards or Guards((), metrics, clock=clock)  # guardrail hooks (dataplane.guard.hooks)
        self.tokens = tokens or TokenWork()  # each model's tokenizer (dataplane.intake.tokenwork)
        self._max_output = dict(max_output or {})  # model -> max_output_tokens ([[models]]; absent or 0: no cap)
        self._limits = limits
        self._auth = authenticator
        self._holder = holder
        self._forwarder = forwarder
        self._metrics = metrics
        self._clock = clock
        server, queues = settings.server, settings.queues
        self._admission = InflightLimit(server.max_inflight, server.retry_after_seconds)
        self._tenants = TenantInflight(limits.max_inflight_per_tenant, server.retry_after_seconds)
        self.picker = PickState.from_settings(  # the decision and its state (dataplane.pick.state)
            settings.pick, rng, region=settings.region, regions=settings.regions,
            capacity_share=queues.admission_capacity_share, outliers=settings.outliers, retries=settings.retries)
        self.picker.on_eject = self._ejected
        self.tenant_limits = TenantLimits()
        self.usage = UsageWindow(start=clock(), max_rows=settings.watch.usage_max_rows)  # reported on the table watch
        self.recorder = Recorder.from_settings(settings.record, registry=metrics.registry)  # dataplane.record
        self.idempotency: Idempotency[inference_pb2.InferResponse] = Idempotency(
            clock=clock, max_entries=settings.idempotency.idempotency_entries,
            ttl=settings.idempotency.idempotency_ttl_seconds)
        # -- response cache (dataplane.cache.path): measured per (model, tenant), on per model on evidence
        self.cache = CachePath(settings.cache, clock=clock, registry=metrics.registry)
        self.admission = Admission(queues.queue_params(), clock=clock, registry=metrics.registry,
                                   capacity_share=queues.admission_capacity_share,
                                   tenant_labels=queues.tenant_metric_labels)
        # the attempt loop (dataplane.attempt): decide, send, record, retry; its failover continues cut streams
        self.loop = AttemptLoop(self.picker, settings.retries, clock=clock, gate=self.admission,
                                records=MetricRecords(metrics),
                                simulate_region_rtt=settings.regions.simulate_region_rtt)
        self.cold = ColdStarts(settings.coldstart, holder, clock,  # versions warming up (dataplane.admission.coldwait)
                               timeouts=queues.timeouts(), floor=server.retry_after_seconds)
        holder.on_applied(self.apply_table)
        if holder.table is not None:
            self.apply_table(holder.table)

    def apply_table(self, table: Table) -> None:
        """A table was applied: the decision's view and state, the tier queues' capacities, the cold-start waits."""
        self.picker.apply_table(table)
        if self._settings.queues.admission:
            self.admission.apply(table)
        self.cold.table_applied(table)
        self.cache.apply_table(table)  # -- response cache: answers of versions gone are dropped

    def reconfigure(self, settings: ProxySettings) -> None:
        """Run ``settings``' live keys from the next decision on (a router config, :mod:`ferry.routerconfig`).

        Called between requests on the event loop, it drops nothing: the picker swaps its parameters and keeps
        its state (:meth:`dataplane.pick.state.PickState.reconfigure`: in-flight attempts, loads, placements,
        the outlier detector, the retry budget's counts), the tier queues keep every ticket
        (:meth:`dataplane.admission.gate.Admission.reconfigure`), the retry policy reads the new attempts and
        tiers, the ring's load factor applies from the next table. Requests in flight finish under the view
        they decided with. ``settings`` must differ from the running ones in live keys only.
        """
        self._settings = settings
        queues = settings.queues
        self.picker.reconfigure(settings.pick, regions=settings.regions, capacity_share=queues.admission_capacity_share,
                                outliers=settings.outliers, retries=settings.retries)
        self.loop.reconfigure(settings.retries)
        self._holder.params = settings.table.table_params()
        if queues.admission:
            self.admission.reconfigure(queues.queue_params(), queues.admission_capacity_share, self._holder.table)

    @property
    def table(self) -> Table | None:
        """The table applied last (None before the first)."""
        return self._holder.table

    @property
    def local_load(self) -> LocalLoad:
        """This proxy's in-flight requests per replica."""
        return self.picker.local

    @property
    def inflight(self) -> int:
        """Requests admitted and not yet ended."""
        return self._admission.count

    async def encode(self, state: RequestState, metadata: Iterable[tuple[str, str | bytes]],
                     request: inference_pb2.InferRequest) -> None:
        """Encode a large prompt of a model with a tokenizer file off the loop, into ``state.encoded``.

        Only for an authenticated caller and a prompt within ``max_prompt_bytes``
        (:meth:`begin` refuses the rest); anything else is left to ``begin``."""
        tokenizer = self.tokens.tokenizer(request.model)
        size = len(request.prompt)
        if not self.tokens.offloads(tokenizer, size) or size > self._limits.max_prompt_bytes:
            return
        self._auth.authenticate(metadata)
        blocks = 0 if request.prefix_key else self._settings.pick.prefix_depths[-1]
        state.encoded = await self.tokens.encode(tokenizer, request.prompt, blocks=blocks, tail=self._tail(state))

    def _tail(self, state: RequestState) -> int:
        """The blocks of the prompt to hash in all: 0 (only the decision's deepest prefix depth, exactly), or for a
        request the recorder keeps ``record_max_blocks``, the blocks past that depth as sketches
        (:func:`ferry.tokens.sketch_hashes`), so a replay sees the whole prefix."""
        return self._settings.record.record_max_blocks if self.recorder.sampler.sampled(state.request_id) else 0

    async def _recount(self, model: str, outcome: Outcome) -> None:
        """A completion the replica gave no token count for: counted with the model's tokenizer file, if any
        (the words counted stay when the tokenizer's threads are full: an answer is never refused for it)."""
        tokenizer = self.tokens.tokenizer(model)
        if tokenizer.hf is not None and not outcome.completion_reported:
            with contextlib.suppress(Overloaded):
                outcome.completion_tokens = await self.tokens.count(tokenizer, outcome.text)

    def begin(
        self,
        state: RequestState,
        metadata: Iterable[tuple[str, str | bytes]],
        request: inference_pb2.InferRequest,
        time_remaining: float | None,
    ) -> None:
        """Authenticate, validate, resolve and admit; raises FerryError. Pair with :meth:`end`."""
        remaining = self._settings.server.default_deadline_seconds if time_remaining is None else time_remaining
        state.deadline = state.started + remaining
        state.tenant = self._auth.authenticate(metadata)
        valid = validate_request(request, self._limits, self._settings.pick.prefix_depths[-1],
                                 tokenizer=self.tokens.tokenizer(request.model), encoded=state.encoded,
                                 tail_blocks=self._tail(state))
        state.request, state.tier_label = valid, valid.tier
        check_tier(valid.tier, state.tenant)
        table = self._holder.table
        if table is None:
            raise Unavailable("no routing table yet: the proxy has not heard from a control plane")
        state.table = table
        state.exclude = table.http_only  # the relay speaks KServe v2: not to replicas reached over HTTP only
        state.routing = self.picker.prepare(table, tenant=state.tenant.name, model=valid.model,
                                            version=valid.version, prompt_tokens=valid.prompt_tokens,
                                            max_tokens=valid.max_tokens, prefix_key=valid.prefix_key,
                                            hashes=valid.prefix_hashes)
        if not valid.max_tokens:  # not given: as many as the model's context leaves (OpenAI's default)
            valid = state.request = self._room(valid, state.routing.pool)
            state.routing = dataclasses.replace(state.routing, need=Need(valid.prompt_tokens + valid.max_tokens,
                                                                         valid.prompt_tokens))
        state.version = state.routing.version
        state.model_label = valid.model
        # a sampling parameter the version's replicas do not declare is refused naming it (dataplane.intake.validate)
        tensors = () if state.untouched else check_sampling(valid, table.inputs(valid.model, state.version),
                                                             valid.model, state.version)
        state.call = Call(
            request_id=state.request_id,
            prompt=valid.prompt,
            prompt_tokens=valid.prompt_tokens,
            max_tokens=valid.max_tokens,
            tier=valid.tier,
            priority=TIER_PRIORITY[valid.tier],
            tenant=state.tenant.name,
            plan=state.tenant.plan,
            sampling=tensors,
            logprobs=_logprobs_asked(valid),
        )
        self._tenants.enter(state.tenant.name)  # dataplane.admission.limits: one tenant cannot take every slot
        try:
            self._admission.enter()
        except FerryError:
            self._tenants.leave(state.tenant.name)
            raise
        state.admitted = True
        # dataplane.admission.tenantlimits: the tenant's own rate limits and concurrency cap (end() undoes the above)
        state.limited = self.tenant_limits.admit(state.tenant, valid.prompt_tokens + valid.max_tokens, self._clock())
        if not valid.version:  # the region step: a request sent to another region skips this region's queues
            view = self.picker.view_of(table)
            if view.remote.targets:
                state.spilled = self.loop.region(state, view)
                if state.spilled is not None:
                    self._metrics.spilled.labels(self._settings.region, state.spilled.region).inc()
        if state.spilled is None and self.admission.active(valid.model):
            state.ticket = Ticket(tenant=state.tenant.name, plan=state.tenant.plan, tier=valid.tier,
                                  cost=valid.prompt_tokens + valid.max_tokens, deadline=state.deadline)
        if state.spilled is None and not state.routing.pool.replicas:  # no ready replica: a cold start?
            state.cold_wait = self.cold.allowed(table, model=valid.model, version=state.version, tier=valid.tier,
                                                deadline=state.deadline)
        self.loop.admitted()
        self._metrics.inflight.set(self._admission.count)

    def rate_limit_headers(self, state: RequestState) -> dict[str, str]:
        """The tenant's ``x-ratelimit-*`` headers (:meth:`TenantLimits.headers`); none before it is known."""
        return {} if state.tenant is None else self.tenant_limits.headers(state.tenant, self._clock())

    def _room(self, valid: ValidRequest, pool: Pool) -> ValidRequest:
        """``valid`` with ``max_tokens`` set to what the context leaves after the prompt: the smallest context of
        the pool's replicas (every one can take it; the largest when the smallest leaves none), at most
        ``[limits] max_tokens`` and the model's ``max_output_tokens``; raises InvalidArgument
        (``context_length_exceeded``) naming ``prompt`` when no replica has room for one more token."""
        cap = min(self._limits.max_tokens, self._max_output.get(valid.model) or self._limits.max_tokens)
        context = pool.min_context if pool.min_context > valid.prompt_tokens else pool.max_context
        room = cap if context >= UNLIMITED else context - valid.prompt_tokens
        if room < 1:
            raise InvalidArgument("prompt", f"a prompt of {valid.prompt_tokens} tokens leaves no room in the "
                                            f"largest context of the model's replicas ({context} tokens)",
                                  "context_length_exceeded")
        return dataclasses.replace(valid, max_tokens=min(cap, room))

    def _reroute(self, state: RequestState, table: Table) -> tuple[str, bool]:
        """Resolve the request's routing again on ``table`` (a cold start's wait): its version, whether ready."""
        valid = state.request
        assert valid is not None and state.tenant is not None
        state.table = table
        state.routing = self.picker.prepare(table, tenant=state.tenant.name, model=valid.model, version=valid.version,
                                            prompt_tokens=valid.prompt_tokens, max_tokens=valid.max_tokens,
                                            prefix_key=valid.prefix_key, hashes=valid.prefix_hashes)
        state.version = state.routing.version
        return state.version, bool(state.routing.pool.replicas)

    async def _warm_up(self, state: RequestState) -> None:
        """A cold start allowed to wait (``state.cold_wait``): wait for its version (dataplane.admission.coldwait)."""
        assert state.request is not None
        await self._traced(state, "cold_start", self.cold.wait(
            model=state.request.model, version=state.version, seconds=state.cold_wait,
            reroute=functools.partial(self._reroute, state)))

    def _queued(self, state: RequestState, ticket: Ticket, *, resume: bool = False) -> Awaitable[None]:
        """The wait for a tier-queue slot (again after a preemption, ``resume``), traced as ``admission``."""
        wait = (self.admission.resume if resume else self.admission.acquire)(state.model_label, ticket)
        return self._traced(state, "admission", wait)

    def _traced(self, state: RequestState, name: str, wait: Awaitable[None]) -> Awaitable[None]:
        """``wait`` in a span ``name`` of the request's trace; untraced, ``wait`` itself (nothing made)."""
        trace = state.trace
        if trace is None:
            return wait
        return trace.around(name, {"ferry.model": state.model_label, "ferry.tier": state.tier_label}, wait)

    def finish_trace(self, state: RequestState, status: str) -> None:
        """The request ended with gRPC status ``status`` (counted by its front door): its trace is ended and queued
        for export, with its model, tier, tokens, attempts and the replica that answered last."""
        trace, state.trace = state.trace, None
        if trace is None:
            return
        outcome = state.outcome
        ended: dict[str, Attribute] = {
            "ferry.request_id": state.request_id, "ferry.model": state.model_label, "ferry.tier": state.tier_label,
            "ferry.attempts": state.attempts, "ferry.prompt_tokens": outcome.prompt_tokens,
            "ferry.completion_tokens": outcome.completion_tokens}
        if state.replica_id:
            ended["ferry.replica"] = state.replica_id
            ended["ferry.region"] = state.region or self._settings.region
        trace.finish(status, ended)

    def end(self, state: RequestState) -> None:
        """Give back the request's in-flight slot (no-op when it was never admitted)."""
        if state.ticket is not None:
            self.admission.release(state.model_label, state.ticket)
            state.ticket = None
        if state.limited and state.tenant is not None:
            state.limited = False
            self.tenant_limits.release(state.tenant)
        if state.admitted:
            state.admitted = False
            self._admission.leave()
            if state.tenant is not None:
                self._tenants.leave(state.tenant.name)
            self._metrics.inflight.set(self._admission.count)

    def _decide(self, state: RequestState, failed: list[Replica]) -> Decision:
        """The decision for the next attempt (dataplane.pick.decide), off the replicas and nodes that failed."""
        assert state.request is not None and state.table is not None and state.routing is not None
        decision = self.loop.decide(state, self.picker.view_of(state.table), failed,
                                    applied_at=state.table.applied_at)
        if decision.branch is Branch.TOO_LONG:  # the prompt alone, or the room it leaves for max_tokens
            routing = state.routing
            field = "prompt" if routing.need.prompt_tokens >= routing.pool.max_context else "max_tokens"
            raise InvalidArgument(field, decision.reason, "context_length_exceeded")
        if decision.replica is None:
            raise NoReplica(state.request.model, decision.reason)
        return decision

    def _result(self, state: RequestState, attempt: Attempt, *, ok: bool, outcome: Outcome | None = None,
                error: FerryError | None = None) -> None:
        """Record one attempt's result in the attempt loop (outlier detector; a refused connection takes the replica
        out of the pick at once); an answer of another region's replica is not a local request's duration."""
        if ok and outcome is not None:
            self.loop.answered(attempt, completion_tokens=outcome.completion_tokens,
                               cached_tokens=outcome.cached_tokens if outcome.cached_reported else 0,
                               local=not state.region)
        else:
            self.loop.failed(attempt, error)

    @staticmethod
    def _decision_attributes(state: RequestState, attempt: int) -> dict[str, Attribute]:
        return {"ferry.model": state.model_label, "ferry.tier": state.tier_label, "ferry.attempt": attempt}

    def _ejected(self, replica_id: str, group: str, reason: str) -> None:
        """The outlier detector ejected a replica of ``group`` (model/version): counted and logged."""
        model = group.split("/", 1)[0]
        self._metrics.ejections.labels(model, reason).inc()
        event(log, "replica_ejected", logging.WARNING, replica_id=replica_id, model=model, reason=reason,
              phase=self.picker.outliers.last_phase if reason == "latency" else "")

    def _remaining(self, state: RequestState) -> float:
        remaining = state.deadline - self._clock()
        if remaining <= 0:
            raise DeadlineExceeded(f"deadline exceeded after {state.attempts} attempt(s)")
        return remaining

    def _next(self, state: RequestState, failed: list[Replica], last: FerryError | None, *,
              streamed: bool) -> tuple[Replica, Attempt]:
        """Decide the next attempt, off the replicas (and nodes) that failed; none left: the failure stands."""
        assert state.routing is not None
        trace = state.trace
        began = trace.now() if trace is not None else 0
        spilled = state.spilled if state.attempts == 0 else None
        if spilled is not None:  # the region step chose another region; a retry stays home
            assert spilled.replica is not None
            decision = spilled
        else:
            try:
                decision = self._decide(state, failed)
            except FerryError as error:
                if trace is not None:
                    trace.end(trace.start("decision", self._decision_attributes(state, state.attempts + 1),
                                          start_ns=began), error)
                if isinstance(error, NoReplica) and last is not None:
                    raise last from None
                raise
        replica = decision.replica
        assert replica is not None
        state.region, state.rtt_ms = decision.region, decision.rtt_ms
        state.branch = decision.branch.value
        state.replica_id = replica.replica_id
        state.version = replica.version  # the default may span versions when the table names none
        attempt = self.loop.send(state, decision, streamed=streamed)  # counted in state.attempts; the gate told
        state.forwarded_at = attempt.sent_at
        if trace is not None:  # the decision's span, then the attempt's (dataplane.tracing)
            chosen = self._decision_attributes(state, state.attempts)
            chosen.update({"ferry.branch": decision.branch.value, "ferry.replica": replica.replica_id,
                           "ferry.region": decision.region or self._settings.region, "ferry.version": replica.version})
            trace.end(trace.start("decision", chosen, start_ns=began))
            trace.attempt(replica.replica_id, state.attempts)
        return replica, attempt

    # -- handed off: an external forwarder (Envoy, asked through the endpoint picker of dataplane.epp) carries
    # the request's bytes; the same admission, decision and records as infer() and stream(), without the relay.

    async def hand_off(self, state: RequestState, *, fallbacks: int) -> Handoff:
        """Wait for a ready version and a tier-queue slot, then decide where an external forwarder sends the request.

        The attempt's replica first, then up to ``fallbacks`` others in the order the same decision ranks them
        (each decided with those before it, and their nodes, as tried), for the forwarder to go down when a
        replica never starts answering. The attempt is recorded as sent to the first; :meth:`served` and
        :meth:`handed_back` close it. Raises FerryError (no replica, deadline, shed from
        the queue). A handed-off stream is not preempted: its bytes do not pass here, so it cannot be parked.
        No prefill sample is taken: an event stream's headers come before its first token, and its tokens
        never come here.
        """
        if state.cold_wait:
            await self._warm_up(state)
        if state.ticket is not None:
            await self._queued(state, state.ticket)
        self._remaining(state)
        replica, attempt = self._next(state, [], None, streamed=True)
        order = [replica]
        assert state.table is not None
        view = self.picker.view_of(state.table)
        while len(order) <= fallbacks:
            try:
                decision = self.loop.decide_at(state, view, order, self._clock())
            except FerryError:
                break
            if decision.replica is None or decision.branch is Branch.TOO_LONG:
                break
            order.append(decision.replica)
        if state.trace is not None and state.trace.forward is not None and len(order) > 1:
            state.trace.forward.attributes["ferry.fallbacks"] = ",".join(r.replica_id for r in order[1:])
        return Handoff(replicas=tuple(order), attempt=attempt)

    def served(self, state: RequestState, handoff: Handoff, replica_id: str) -> None:
        """The forwarder says ``replica_id`` answered: when it is not the attempt's, the replicas before it in the
        order never answered (taken off the pick as unreachable) and the attempt moves to it."""
        if replica_id == handoff.attempt.replica_id or handoff.closed:
            return
        moved = next((r for r in handoff.replicas if r.replica_id == replica_id), None)
        if moved is None:
            return
        passed = False  # the attempt's replica is among those that never answered
        for replica in handoff.replicas:
            if replica.replica_id == replica_id:
                break
            passed = passed or replica.replica_id == handoff.attempt.replica_id
            self.loop.records.retried(state.model_label, "unreached")
        handoff.attempt = self.loop.moved(state, handoff.attempt, moved, unreached=passed)  # counted in attempts
        state.replica_id, state.branch = replica_id, Branch.FALLBACK.value
        state.forwarded_at = handoff.attempt.sent_at
        if state.trace is not None:  # the forwarder went down the fallbacks: the attempts before never answered
            state.trace.attempt_end("unreached")
            state.trace.attempt(replica_id, state.attempts, **{"ferry.branch": Branch.FALLBACK.value})

    def handed_back(self, state: RequestState, handoff: Handoff, *, ok: bool, completion_tokens: int,
                    failed: bool = False) -> None:
        """The forwarded request ended: its result fed to the outlier detector, its in-flight load given back.

        ``ok``: the replica answered in full; ``completion_tokens``: what it generated (as far as known);
        ``failed``: the replica answered with a server error (neither: the client left first). Idempotent."""
        if handoff.closed:
            return
        handoff.closed = True
        attempt = handoff.attempt
        if state.trace is not None:
            state.trace.attempt_end("ok" if ok else "failed" if failed else "cancelled",
                                    **{"ferry.completion_tokens": completion_tokens})
        if ok:
            state.outcome.completion_tokens = completion_tokens
            self.loop.answered(attempt, completion_tokens=completion_tokens, local=not state.region)
        elif failed:
            self.loop.failed(attempt)
        self.loop.done(attempt)

    async def infer(self, state: RequestState) -> Outcome:
        """Check the prompt, wait in the tier queue, forward (a preempted batch request waits again), check the
        answer; fills ``state.outcome``."""
        hooks = self._guarded(state)
        if hooks.prompt:
            await self._guard_prompt(state, hooks)
        # -- response cache (dataplane.cache.path): a hit skips the queue and the replica; the output hooks check it
        outcome = self.cache.lookup(state)
        if state.cold_wait and outcome is None:
            await self._warm_up(state)
        ticket = state.ticket
        if outcome is None and ticket is None:
            outcome = await self._infer(state)
        while outcome is None:
            assert ticket is not None
            await self._queued(state, ticket)
            try:
                outcome = await self.admission.preemptible(state.model_label, ticket, lambda: self._infer(state))
                break
            except Preempted:
                continue
        if hooks.output:
            assert state.guard is not None
            outcome.text = await self.guards.output(hooks.output, state.guard, outcome.text, final=True)
        return outcome

    def _guarded(self, state: RequestState) -> Selected:
        """The guardrail hooks of the request (dataplane.guard.hooks); sets ``state.guard`` when there are any."""
        hooks = self.guards.select(state.model_label, state.tier_label)
        if (hooks.prompt or hooks.output) and state.guard is None:
            state.guard = Subject(model=state.model_label, tier=state.tier_label,
                                  tenant=state.tenant.name if state.tenant is not None else "",
                                  request_id=state.request_id, deadline=state.deadline)
        return hooks

    async def _guard_prompt(self, state: RequestState, hooks: Selected) -> None:
        """Run the prompt hooks; a redaction replaces the prompt the replica sees."""
        assert state.call is not None and state.guard is not None
        prompt = state.call.prompt.decode("utf-8", errors="replace")
        checked = await self.guards.prompt(hooks.prompt, state.guard, prompt)
        if checked != prompt:
            state.call = dataclasses.replace(state.call, prompt=checked.encode("utf-8"))

    async def _infer(self, state: RequestState) -> Outcome:
        """Forward a unary request, retrying when policy allows."""
        assert state.call is not None
        failed: list[Replica] = []
        last: FerryError | None = None
        while True:
            replica, attempt = self._next(state, failed, last, streamed=False)
            cached: int | None = None
            trace, result = state.trace, "cancelled"  # the attempt's outcome in its forward span
            try:
                await self.loop.failover.cross_region(state.rtt_ms)
                state.outcome = await self._forwarder.infer(replica, state.call, self._remaining(state),
                                                            metadata=trace.headers() if trace is not None else None)
                await self._recount(state.model_label, state.outcome)
                cached = state.outcome.cached_tokens if state.outcome.cached_reported else None
                self._result(state, attempt, ok=True, outcome=state.outcome)
                self.cache.store(state)  # -- response cache: measured, and kept while the model's cache is on
                result = "ok"
                return state.outcome
            except FerryError as error:
                result = failure_kind(error)
                if isinstance(error, ReplicaFailed):
                    self._result(state, attempt, ok=False, error=error)
                if not self.loop.retry(state, error):
                    raise
                failed.append(replica)
                last = error
            finally:
                self.loop.done(attempt, cached)
                if trace is not None:
                    trace.attempt_end(result, **{"ferry.completion_tokens": state.outcome.completion_tokens})

    def stream(self, state: RequestState) -> AsyncGenerator[Piece, None]:
        """The answer's pieces (:meth:`_stream`); with guardrail hooks, the prompt checked first and the answer
        released a checked window at a time (:meth:`_guarded_stream`)."""
        hooks = self._guarded(state)
        if hooks.prompt or hooks.output:
            return self._guarded_stream(state, hooks)
        return self._stream(state)  # no layer per piece when no hook applies

    async def _guarded_stream(self, state: RequestState, hooks: Selected) -> AsyncGenerator[Piece, None]:
        """:meth:`_stream` between the prompt and the output hooks (:meth:`dataplane.guard.hooks.Guards.released`)."""
        if hooks.prompt:
            await self._guard_prompt(state, hooks)
        pieces = self._stream(state)
        if hooks.output:
            assert state.guard is not None
            pieces = self.guards.released(hooks.output, hooks.window, state.guard, pieces)
        async with contextlib.aclosing(pieces) as released:
            async for piece in released:
                yield piece

    async def _stream(self, state: RequestState) -> AsyncGenerator[Piece, None]:
        """Forward a streaming request: retried while nothing reached the caller, continued after (module doc).

        A batch or standard stream may be preempted like a unary request
        (:meth:`dataplane.admission.gate.Admission.watch`): its upstream call is
        cancelled and its slot freed at once; when its caller next asks for
        output it waits in its queue again, then continues from what it delivered.
        """
        assert state.call is not None
        if (replay := self.cache.replay(state)) is not None:  # -- response cache (dataplane.cache.path): a hit,
            for piece in replay:  # replayed with the chunking it was first delivered with
                yield piece
            return
        tape = self.cache.tape(state)  # -- response cache: the pieces delivered, for store below
        if state.cold_wait:
            await self._warm_up(state)
        ticket = state.ticket
        if ticket is not None:  # wait in the tier queue first
            await self._queued(state, ticket)
        failed: list[Replica] = []
        last: FerryError | None = None
        call: Call | None = state.call
        delivered = Delivered()
        parked = False
        while call is not None:
            if parked and ticket is not None:
                parked = False
                await self._queued(state, ticket, resume=True)
            replica, attempt = self._next(state, failed, last, streamed=True)
            outcome = Outcome()
            cached: int | None = None
            preemption = self.admission.watch(state.model_label, ticket) if ticket is not None else None
            trace, result = state.trace, "cancelled"  # the attempt's outcome in its forward span
            try:
                await self.loop.failover.cross_region(state.rtt_ms)
                pieces = self._forwarder.stream(replica, call, self._remaining(state), outcome,
                                                bind=preemption.bind if preemption is not None else None,
                                                metadata=trace.headers() if trace is not None else None)
                try:
                    got, probe = 0, self.picker.outliers.params.probe_tokens
                    async for piece in pieces:
                        if not attempt.prefilled:
                            self.loop.first(attempt)
                            if trace is not None:
                                trace.first_token()
                        if not attempt.decode_sampled:  # the clock only once the decode sample is due
                            got += piece.tokens
                            if got > probe:
                                self.loop.progress(attempt, got)
                        delivered.add(piece)
                        tape.add(piece)  # -- response cache
                        yield piece
                finally:
                    await pieces.aclose()
                state.outcome = delivered.merge(outcome, state.call)
                await self._recount(state.model_label, state.outcome)
                cached = outcome.cached_tokens if outcome.cached_reported else None
                self._result(state, attempt, ok=True, outcome=state.outcome)
                self.cache.store(state, tape)  # -- response cache: measured, and kept while the model's cache is on
                result = "ok"
                return
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if preemption is None or not preemption.fired or (task is not None and task.cancelling()):
                    raise
                result = "preempted"
                parked = True  # preempted: the slot is free; wait again, then continue from what was delivered
                call = self.loop.failover.preempted(state.call, call, delivered, state.model_label)
                if ticket is not None:
                    ticket.preemptible = self.loop.failover.may_continue(delivered)
            except FerryError as error:
                result = failure_kind(error)
                if isinstance(error, ReplicaFailed):
                    self._result(state, attempt, ok=False, error=error)
                if not delivered.tokens and not delivered.texts:
                    if not self.loop.retry(state, error):
                        raise
                    last = error
                else:
                    call = self.loop.failover.resume(state.call, error, delivered, state.model_label)
                    last = cut_error(delivered, error, "no other replica")
                failed.append(replica)
            finally:
                if ticket is not None:
                    self.admission.unwatch(ticket)
                self.loop.done(attempt, cached)
                if trace is not None:
                    trace.attempt_end(result, **{"ferry.completion_tokens": outcome.completion_tokens})
        # The cut stream had already delivered max_tokens: it is complete.
        state.outcome = Outcome(text=delivered.text, prompt_tokens=state.call.prompt_tokens,
                                completion_tokens=delivered.tokens)

