"""The failover's part of the ``[proxy]`` section: retries, the retry budget and stream continuation.

Composed into :class:`dataplane.config.ProxySettings` (``retries``); checked here (ConfigError naming
``proxy.<key>``).
"""

from __future__ import annotations

import dataclasses

from dataplane.failover.budget import RetryBudget
from ferry.config import TIERS, at_least_zero, positive
from ferry.errors import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetrySettings:
    """Retries and stream continuation (:func:`dataplane.failover.recover.retry_reason`, ``.budget``)."""

    max_attempts: int = 2
    retry_tiers: tuple[str, ...] = ("interactive",)
    retry_budget_ratio: float = 0.1  # retries and continuations at most 10 % of requests per window …
    retry_budget_min_per_second: float = 10.0  # … plus this many per second (dataplane.failover.budget)
    retry_budget_window_seconds: float = 10.0
    max_continuations: int = 2  # a stream cut mid-way is continued at most this often (dataplane.failover.continuation)

    def __post_init__(self) -> None:
        positive("proxy", {"max_attempts": self.max_attempts,
                           "retry_budget_window_seconds": self.retry_budget_window_seconds})
        for tier in self.retry_tiers:
            if tier not in TIERS:
                raise ConfigError("proxy.retry_tiers", f"unknown tier {tier!r} (known: {', '.join(TIERS)})")
        at_least_zero("proxy", {"retry_budget_ratio": self.retry_budget_ratio,
                                "retry_budget_min_per_second": self.retry_budget_min_per_second,
                                "max_continuations": self.max_continuations})

    def budget(self) -> RetryBudget:
        """A fresh retry budget of these settings."""
        return RetryBudget(ratio=self.retry_budget_ratio, min_per_second=self.retry_budget_min_per_second,
                           window_seconds=self.retry_budget_window_seconds)
