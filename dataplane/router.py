"""The request path of the proxy, between the servicer (wire) and the forwarder (replicas).

Per request: :meth:`Router.begin` authenticates (:mod:`dataplane.auth`),
validates (:mod:`dataplane.validate`), checks the tier against the plan,
resolves the model and version in the current table, and takes an in-flight
slot (:class:`dataplane.policy.InflightLimit`), in that order, so the first
problem found is the one reported. Then :meth:`Router.infer` or
:meth:`Router.stream` picks (:func:`dataplane.pick.pick`) and forwards with
the remaining deadline, counting the request in the proxy's per-replica
in-flight load while it runs; a failure before any output is retried when
:func:`dataplane.policy.retry_reason` says so, on a replica not yet tried
and, when there is one, on another node than the failed ones (a node that
dies takes all its replicas with it).
:meth:`Router.end` gives the slot back. Every error is a
:class:`ferry.errors.FerryError`; the servicer chooses the status.

State: the holder's current table (read once per request) and the local
load; nothing else survives a request.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import AsyncGenerator, Callable, Iterable

from dataplane.auth import Authenticator
from dataplane.config import ProxySettings
from dataplane.forward import Call, Forwarder, Outcome, Piece
from dataplane.metrics import UNKNOWN, ProxyMetrics
from dataplane.pick import Branch, Need, ScoreParams, pick
from dataplane.policy import InflightLimit, LocalLoad, retry_reason
from dataplane.table import Replica, Table, TableHolder
from dataplane.validate import TIER_PRIORITY, ValidRequest, check_tier, resolve, validate_request
from ferry.config import Limits, TenantConfig
from ferry.errors import DeadlineExceeded, FerryError, NoReplica, Unavailable
from ferry.v1 import inference_pb2


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
    candidates: tuple[Replica, ...] = ()
    call: Call | None = None
    attempts: int = 0
    replica_id: str = ""
    forwarded_at: float = 0.0
    outcome: Outcome = dataclasses.field(default_factory=Outcome)
    admitted: bool = False


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
    ) -> None:
        self._settings = settings
        self._limits = limits
        self._auth = authenticator
        self._holder = holder
        self._forwarder = forwarder
        self._metrics = metrics
        self._rng = rng
        self._clock = clock
        self._admission = InflightLimit(settings.max_inflight, settings.retry_after_seconds)
        self._params = ScoreParams(
            fresh_seconds=settings.telemetry_fresh_seconds, stale_seconds=settings.telemetry_stale_seconds
        )
        self.local_load = LocalLoad()

    @property
    def inflight(self) -> int:
        """Requests admitted and not yet ended."""
        return self._admission.count

    def begin(
        self,
        state: RequestState,
        metadata: Iterable[tuple[str, str | bytes]],
        request: inference_pb2.InferRequest,
        time_remaining: float | None,
    ) -> None:
        """Authenticate, validate, resolve and admit; raises FerryError. Pair with :meth:`end`."""
        remaining = self._settings.default_deadline_seconds if time_remaining is None else time_remaining
        state.deadline = state.started + remaining
        state.tenant = self._auth.authenticate(metadata)
        valid = validate_request(request, self._limits)
        state.request, state.tier_label = valid, valid.tier
        check_tier(valid.tier, state.tenant)
        table = self._holder.table
        if table is None:
            raise Unavailable("no routing table yet: the proxy has not heard from a control plane")
        state.table = table
        state.version, state.candidates = resolve(table, valid)
        state.model_label = valid.model
        state.call = Call(
            request_id=state.request_id,
            prompt=valid.prompt,
            prompt_tokens=valid.prompt_tokens,
            max_tokens=valid.max_tokens,
            tier=valid.tier,
            priority=TIER_PRIORITY[valid.tier],
            tenant=state.tenant.name,
            plan=state.tenant.plan,
        )
        self._admission.enter()
        state.admitted = True
        self._metrics.inflight.set(self._admission.count)

    def end(self, state: RequestState) -> None:
        """Give back the request's in-flight slot (no-op when it was never admitted)."""
        if state.admitted:
            state.admitted = False
            self._admission.leave()
            self._metrics.inflight.set(self._admission.count)

    def _pick(self, state: RequestState, excluded: set[str], avoid_nodes: set[str]) -> Replica:
        assert state.request is not None and state.table is not None
        need = Need(state.request.prompt_tokens + state.request.max_tokens)
        table_age = self._clock() - state.table.applied_at
        decision = pick(
            state.candidates, need, self.local_load, self._rng, excluded,
            avoid_nodes=avoid_nodes, table_age=table_age, params=self._params,
        )
        self._metrics.picks.labels(state.model_label, decision.branch.value).inc()
        if decision.replica is None:
            raise NoReplica(state.request.model, decision.reason)
        assert decision.branch is not Branch.NONE
        self._metrics.telemetry_age.observe(decision.replica.telemetry_age + table_age)
        return decision.replica

    def _remaining(self, state: RequestState) -> float:
        remaining = state.deadline - self._clock()
        if remaining <= 0:
            raise DeadlineExceeded(f"deadline exceeded after {state.attempts} attempt(s)")
        return remaining

    def _retry(self, state: RequestState, error: FerryError) -> bool:
        reason = retry_reason(
            error,
            tier=state.tier_label,
            attempts=state.attempts,
            max_attempts=self._settings.max_attempts,
            retry_tiers=self._settings.retry_tiers,
        )
        if reason is None:
            return False
        self._metrics.retries.labels(state.model_label, reason).inc()
        return True

    def _next(self, state: RequestState, failed: list[Replica], last: FerryError | None) -> Replica:
        """Pick for the next attempt, off the replicas (and nodes) that failed; none left: the failure stands."""
        try:
            replica = self._pick(state, {r.replica_id for r in failed}, {r.node for r in failed if r.node})
        except NoReplica:
            if last is not None:
                raise last from None
            raise
        state.attempts += 1
        state.replica_id = replica.replica_id
        state.version = replica.version  # the default may span versions when the table names none
        state.forwarded_at = self._clock()
        return replica

    async def infer(self, state: RequestState) -> Outcome:
        """Forward a unary request, retrying when policy allows; fills ``state.outcome``."""
        assert state.call is not None
        failed: list[Replica] = []
        last: FerryError | None = None
        while True:
            replica = self._next(state, failed, last)
            self.local_load.add(replica.replica_id)
            try:
                state.outcome = await self._forwarder.infer(replica, state.call, self._remaining(state))
                return state.outcome
            except FerryError as error:
                if not self._retry(state, error):
                    raise
                failed.append(replica)
                last = error
            finally:
                self.local_load.done(replica.replica_id)

    async def stream(self, state: RequestState) -> AsyncGenerator[Piece, None]:
        """Forward a streaming request; retries only while no piece reached the caller."""
        assert state.call is not None
        failed: list[Replica] = []
        last: FerryError | None = None
        while True:
            replica = self._next(state, failed, last)
            self.local_load.add(replica.replica_id)
            outcome = Outcome()
            try:
                pieces = self._forwarder.stream(replica, state.call, self._remaining(state), outcome)
                try:
                    async for piece in pieces:
                        yield piece
                finally:
                    await pieces.aclose()
                state.outcome = outcome
                return
            except FerryError as error:
                if not self._retry(state, error):
                    raise
                failed.append(replica)
                last = error
            finally:
                self.local_load.done(replica.replica_id)
