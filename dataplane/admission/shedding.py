"""Shedding driven by observed queue depth and drain rate, with the retry-after to send back.

- :class:`DrainRate`: an exponentially decayed rate of dispatches per second
  (time constant ``tau``, default 2 s): ``rate <- rate x e^(-dt/tau) + 1/tau``
  per dispatch, read as ``rate x e^(-dt/tau)``. Clock passed in (``now``).
- :func:`shed_reason`: whether a request joining a tier queue is refused,
  and why (the metric label), from the queue's depth, its bound, the
  expected wait (depth / drain rate) against the tier's queue timeout and
  the request's own deadline, and the tenant's plan. The free plan may use
  only ``free_share`` (default 0.5) of the bound and of the timeout, so
  under pressure it is refused first; paid and enterprise use all of it.
  Lower tiers drain only after higher ones (strict priority at dispatch),
  so their expected wait grows first and batch is refused before standard,
  standard before interactive: that is the tier order of shedding, without
  a static bucket.
- :func:`retry_after`: seconds until the queue should have room:
  depth / drain rate, clamped to [``floor``, ``ceiling``] (0.1 s, 60 s);
  the tier's queue timeout when nothing has drained yet.
- :func:`victim_order`: which waiting request to evict when the proxy's
  total queue bound is reached: batch before standard before interactive,
  free before paid, newest first.

Cost: O(1) each (``victim_order`` is a sort key).
"""

from __future__ import annotations

import math

from ferry.config import TIERS

QUEUE_FULL = "queue_full"
WAIT = "wait"
DEADLINE = "deadline"
EVICTED = "evicted"
TIMEOUT = "timeout"
PLAN_RANK = {"free": 0, "paid": 1, "enterprise": 2}


class DrainRate:
    """Dispatches per second, exponentially decayed; see the module docstring."""

    __slots__ = ("_at", "_rate", "tau")

    def __init__(self, tau: float = 2.0) -> None:
        self.tau = tau
        self._rate = 0.0
        self._at = 0.0

    def rate(self, now: float) -> float:
        """The current rate at ``now``."""
        return self._rate * math.exp(-max(now - self._at, 0.0) / self.tau)

    def add(self, now: float, count: int = 1) -> None:
        """Count ``count`` dispatches at ``now``."""
        self._rate = self.rate(now) + count / self.tau
        self._at = now


def expected_wait(depth: int, rate: float, timeout: float) -> float:
    """Seconds a request joining behind ``depth`` others should wait at ``rate`` dispatches/s."""
    if depth <= 0:
        return 0.0
    return depth / rate if rate > 0 else timeout


def shed_reason(*, depth: int, bound: int, rate: float, timeout: float, remaining: float, plan: str,
                free_share: float = 0.5, ahead: int | None = None) -> str | None:
    """The shed reason for a request that would join a queue of ``depth``, or None to queue it.

    ``ahead``: the requests served before it under the fair share (its tenant's
    own backlog times the tenants with work; default ``depth``), so a tenant's
    backlog makes only that tenant's requests look slow.
    """
    share = free_share if plan == "free" else 1.0
    if depth >= max(int(bound * share), 1 if share >= 1.0 else 0):
        return QUEUE_FULL
    wait = expected_wait(depth if ahead is None else min(ahead, depth), rate, timeout)
    if rate > 0 and wait > timeout * share:
        return WAIT
    if rate > 0 and wait > remaining:
        return DEADLINE
    return None


def retry_after(depth: int, rate: float, timeout: float, *, floor: float = 0.1, ceiling: float = 60.0) -> float:
    """Seconds to wait before retrying: the time to drain ``depth`` at ``rate``, clamped."""
    seconds = depth / rate if rate > 0 else timeout
    return round(min(max(seconds, floor), ceiling), 3)


def victim_order(tier: str, plan: str, enqueued_at: float) -> tuple[int, int, float]:
    """Sort key: the smallest is evicted first (lowest tier, then free, then newest)."""
    return (-TIERS.index(tier), PLAN_RANK.get(plan, 1), -enqueued_at)
