"""A retry budget: retries may add at most a share of the traffic, so they cannot amplify an outage.

Algorithm: a sliding window of ``window_seconds`` (default 10 s) cut into
``slots`` (default 10) buckets, each counting requests and retries. A retry
(or a stream continuation) is allowed while the retries in the window stay
below ``min_per_second * window_seconds + ratio * requests`` (defaults:
``min_per_second`` 10, so a quiet proxy can still retry, as in the usual
retry budgets; ``ratio`` 0.1, so a busy one adds at most 10 % more
attempts). When one replica of many fails, its few
in-flight requests fit the budget and are retried; when every replica fails,
at most about 10 % of requests are tried twice instead of 100 %.

Retries of requests that never reached a replica
(:func:`dataplane.forward.failures.unreached`, and
so :func:`charged` is false: the connection was refused, so no replica did
any work for them) are not charged: the budget exists to stop retries from
multiplying the work sent to a struggling fleet, and a dead replica's
refusals add none; the retry policy still bounds them per request
(:func:`dataplane.failover.recover.retry_reason`), and the refusing replica
leaves the pick at once (:mod:`dataplane.pick.unreachable`).
:func:`dataplane.forward.failures.unserved` is wider: also a call whose connection to the replica broke
before the replica sent anything (its process or node is gone, and the work
it had started with it); such a retry is charged.

Pure: the clock is passed to every call (seconds, monotonic). Cost: O(1)
amortised per call (advancing clears at most ``slots`` buckets), memory
O(``slots``).
"""

from __future__ import annotations

from dataplane.forward.failures import unreached
from ferry.errors import ConfigError, FerryError

DEFAULT_RATIO = 0.1
DEFAULT_MIN_PER_SECOND = 10.0
DEFAULT_WINDOW_SECONDS = 10.0
DEFAULT_SLOTS = 10


def charged(error: FerryError) -> bool:
    """Whether retrying after ``error`` spends budget: not when the request never reached the replica."""
    return not unreached(error)


class RetryBudget:
    """Counts requests and retries over a sliding window; :meth:`try_spend` says whether one more retry fits."""

    def __init__(self, *, ratio: float = DEFAULT_RATIO, min_per_second: float = DEFAULT_MIN_PER_SECOND,
                 window_seconds: float = DEFAULT_WINDOW_SECONDS, slots: int = DEFAULT_SLOTS) -> None:
        if not ratio >= 0:
            raise ConfigError("proxy.retry_budget_ratio", "must be >= 0")
        if not min_per_second >= 0:
            raise ConfigError("proxy.retry_budget_min_per_second", "must be >= 0")
        if not window_seconds > 0:
            raise ConfigError("proxy.retry_budget_window_seconds", "must be positive")
        if slots < 1:
            raise ConfigError("retry_budget.slots", "must be >= 1")
        self.ratio = ratio
        self.min_retries = min_per_second * window_seconds
        self._slot_seconds = window_seconds / slots
        self._requests = [0] * slots
        self._retries = [0] * slots
        self._slot = -1  # absolute index of the newest bucket; -1: nothing counted yet
        self._request_sum = 0
        self._retry_sum = 0

    def retune(self, *, ratio: float, min_per_second: float) -> None:
        """New ``ratio`` and ``min_per_second`` (a router config); the window and its counts stay."""
        if not ratio >= 0 or not min_per_second >= 0:
            raise ConfigError("proxy.retry_budget_ratio", "ratio and min_per_second must be >= 0")
        self.ratio = ratio
        self.min_retries = min_per_second * self._slot_seconds * len(self._requests)

    def _advance(self, now: float) -> int:
        slot = int(now // self._slot_seconds)
        if self._slot < 0:
            self._slot = slot
        elif slot > self._slot:
            size = len(self._requests)
            for absolute in range(self._slot + 1, min(slot, self._slot + size) + 1):
                i = absolute % size
                self._request_sum -= self._requests[i]
                self._retry_sum -= self._retries[i]
                self._requests[i] = self._retries[i] = 0
            self._slot = slot
        return self._slot % len(self._requests)

    def note_request(self, now: float) -> None:
        """One more request arrived."""
        i = self._advance(now)
        self._requests[i] += 1
        self._request_sum += 1

    def allowance(self, now: float) -> float:
        """Retries still allowed in the current window (may be fractional or negative)."""
        self._advance(now)
        return self.min_retries + self.ratio * self._request_sum - self._retry_sum

    def try_spend(self, now: float) -> bool:
        """Spend one retry if the budget allows; returns whether it did."""
        if self.allowance(now) < 1:
            return False
        i = self._slot % len(self._retries)
        self._retries[i] += 1
        self._retry_sum += 1
        return True
