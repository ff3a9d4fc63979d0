"""What the request path does after a replica failed: the retry policy, the retry budget's word, continuation.

:func:`retry_reason` is the retry policy: retry on another replica when the
failure is a :class:`ferry.errors.ReplicaFailed` marked retryable (no output
reached the client; a transport or replica error, not a bad request), the
request's tier is in ``retry_tiers`` (default: interactive only) and
attempts are left (``max_attempts``, default 2 = one retry). A request the
replica served nothing of (:func:`dataplane.forward.failures.unserved`: the
connection was refused, or broke before any output: the replica or its node
is gone) is retried in every tier: nothing of it ran anywhere, so a retry
cannot run it twice, and no tier should fail for a node lost under it. One
that never reached a replica (:func:`dataplane.forward.failures.unreached`)
may take ``UNREACHED_EXTRA_ATTEMPTS`` (2) attempts beyond ``max_attempts``:
refusals cost no replica any work, and several replicas of a dead node may
refuse before the table drops them. It returns the metric reason label
(``unreached`` and ``transport_lost`` for those two, else the failure's
kind), or None for no retry; pure, shared with the simulator. The deadline
and the retry budget bound all of them.

:class:`Failover` owns, per proxy, the decision to retry after an error
(:mod:`dataplane.failover.budget`, the budget being the
:class:`dataplane.pick.state.PickState`'s, so the simulator spends the same one)
and the stream continuation decision (:mod:`dataplane.failover.continuation`). The
attempt loop (:class:`dataplane.attempt.AttemptLoop`) holds it; the router calls it
for continuation and preemption. What it counts goes to :class:`Counts`. Outlier ejection and the region
step are part of the decision (:mod:`dataplane.pick.decide`). Settings:
:class:`dataplane.failover.settings.RetrySettings` (``max_continuations``), and the
``simulate_region_rtt`` key of ``[proxy]`` (:class:`dataplane.regions.settings.RegionSettings`).

Cost per request: O(1).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from typing import Protocol

from dataplane.failover.budget import RetryBudget, charged
from dataplane.failover.continuation import Delivered, continuable, continuation, cut_error
from dataplane.failover.settings import RetrySettings
from dataplane.forward.failures import unreached, unserved
from dataplane.forward.kserve import Call
from ferry.errors import DeadlineExceeded, FerryError, ReplicaFailed
from ferry.logs import event

log = logging.getLogger(__name__)

UNREACHED_EXTRA_ATTEMPTS = 2  # attempts beyond max_attempts for requests that never reached a replica


def retry_reason(error: FerryError, *, tier: str, attempts: int, max_attempts: int,
                 retry_tiers: Collection[str]) -> str | None:
    """The retry reason label if the request should try another replica, else None."""
    if not isinstance(error, ReplicaFailed) or not error.retryable or error.output_started:
        return None
    if unreached(error):
        return "unreached" if attempts < max_attempts + UNREACHED_EXTRA_ATTEMPTS else None
    if unserved(error):
        return "transport_lost" if attempts < max_attempts else None
    if tier not in retry_tiers or attempts >= max_attempts:
        return None
    return failure_kind(error)


def failure_kind(error: FerryError) -> str:
    """A failure's bounded name: a replica failure's ``kind`` (``unavailable``, ``stream_error``, …), else
    ``replica_failed``, else the error's class name (``DeadlineExceeded``)."""
    kind = getattr(error, "kind", "")
    if isinstance(kind, str) and kind:
        return kind
    return "replica_failed" if isinstance(error, ReplicaFailed) else type(error).__name__


class Counts(Protocol):
    """What :class:`Failover` counts (the proxy's metrics, :class:`dataplane.attempt.MetricRecords`)."""

    def budget_exhausted(self, model: str) -> None:
        """A retry or continuation refused by the retry budget."""

    def continued(self, model: str, outcome: str) -> None:
        """A stream ``continued``, ``cut`` or ``preempted``."""


class Failover:
    """Retry budget and stream continuation for one proxy."""

    def __init__(self, settings: RetrySettings, counts: Counts, budget: RetryBudget, *,
                 clock: Callable[[], float], simulate_region_rtt: bool = False) -> None:
        self._settings = settings
        self._simulate_rtt = simulate_region_rtt
        self._counts = counts
        self._clock = clock
        self.budget = budget

    def reconfigure(self, settings: RetrySettings) -> None:
        """New retry settings (a router config): ``max_continuations`` from the next stream cut."""
        self._settings = settings

    def note_request(self) -> None:
        """A request was admitted (the budget's denominator)."""
        self.budget.note_request(self._clock())

    def may_retry(self, error: FerryError, model: str) -> bool:
        """Whether the retry budget allows retrying after ``error`` (counts a refusal)."""
        if charged(error) and not self.budget.try_spend(self._clock()):
            self._counts.budget_exhausted(model)
            return False
        return True

    def resume(self, original: Call, error: FerryError, delivered: Delivered, model: str) -> Call | None:
        """The call continuing a stream cut after output (None: all was delivered); raises Unavailable if none."""
        why = ""
        if isinstance(error, DeadlineExceeded):
            why = "the request's deadline passed"
        elif not continuable(error):
            why = "the failure is not the replica's"
        elif delivered.continuations >= self._settings.max_continuations:
            why = f"{delivered.continuations} continuation(s) already"
        elif not self.may_retry(error, model):
            why = "retry budget exhausted"
        if why:
            self._counts.continued(model, "cut")
            event(log, "stream_cut", logging.WARNING, request_id=original.request_id, model=model,
                  tokens_delivered=delivered.tokens, error=str(error), reason=why)
            raise cut_error(delivered, error, why) from None
        self._counts.continued(model, "continued")
        event(log, "stream_continued", request_id=original.request_id, model=model,
              tokens_delivered=delivered.tokens, error=str(error), continuation=delivered.continuations + 1)
        return continuation(original, delivered)

    def may_continue(self, delivered: Delivered) -> bool:
        """Whether a stream that delivered ``delivered`` may still be continued (``max_continuations``)."""
        return delivered.continuations < self._settings.max_continuations

    def preempted(self, original: Call, current: Call, delivered: Delivered, model: str) -> Call | None:
        """The call resuming a preempted stream: ``current`` again if it delivered nothing, else a continuation.

        None: it had delivered everything. Counted as
        ``ferry_proxy_stream_continuations_total{outcome="preempted"}``; a continuation counts
        among the stream's ``max_continuations``.
        """
        self._counts.continued(model, "preempted")
        event(log, "stream_preempted", request_id=original.request_id, model=model,
              tokens_delivered=delivered.tokens, continuation=delivered.continuations + 1)
        if not delivered.tokens and not delivered.texts:
            return current
        return continuation(original, delivered)

    async def cross_region(self, rtt_ms: float) -> None:
        """On one machine, a forward to another region waits the configured round trip (``simulate_region_rtt``)."""
        if rtt_ms and self._simulate_rtt:
            await asyncio.sleep(rtt_ms / 1000.0)
