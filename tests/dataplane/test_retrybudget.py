"""The retry budget: retries stay under min_retries + ratio x requests over a sliding window."""

from __future__ import annotations

import pytest

from dataplane.failover.budget import RetryBudget, charged
from ferry.errors import ConfigError, DeadlineExceeded, FerryError, ReplicaFailed


@pytest.mark.parametrize(
    ("requests", "ratio", "floor", "allowed"),
    [
        (0, 0.1, 10, 10),  # a quiet proxy can still retry a few
        (100, 0.1, 0, 10),  # 10 % of 100 requests
        (1000, 0.1, 10, 110),
        (1000, 0.0, 3, 3),
        (0, 0.1, 0, 0),  # nothing at all: no retry
    ],
    ids=["floor-only", "ratio-only", "both", "ratio-off", "none"],
)
def test_retries_allowed_in_one_window(requests: int, ratio: float, floor: int, allowed: int) -> None:
    budget = RetryBudget(ratio=ratio, min_per_second=floor / 10, window_seconds=10.0)
    for _ in range(requests):
        budget.note_request(1.0)
    spent = sum(budget.try_spend(1.5) for _ in range(allowed + 50))
    assert spent == allowed


def test_an_outage_of_every_replica_adds_at_most_ten_percent() -> None:
    budget = RetryBudget(ratio=0.1, min_per_second=1.0, window_seconds=10.0)
    retries = 0
    for i in range(10_000):  # 100 requests/s for 100 s, every one failing
        now = i * 0.01
        budget.note_request(now)
        retries += budget.try_spend(now)
    assert retries <= 0.1 * 10_000 + 10 * (100 / 10) + 10
    assert retries >= 0.09 * 10_000


@pytest.mark.parametrize(("later", "allowed"), [(5.0, 0), (10.5, 2), (11.5, 2), (100.0, 2)],
                         ids=["same-window", "first-slot-expired", "all-expired", "long-idle"])
def test_old_retries_leave_the_window(later: float, allowed: int) -> None:
    budget = RetryBudget(ratio=0.0, min_per_second=0.2, window_seconds=10.0, slots=10)
    assert budget.try_spend(0.0) and budget.try_spend(0.5)
    assert not budget.try_spend(0.9)
    assert sum(budget.try_spend(later) for _ in range(5)) == allowed


@pytest.mark.parametrize(("kwargs", "key"), [({"ratio": -0.1}, "proxy.retry_budget_ratio"),
                                             ({"min_per_second": -1}, "proxy.retry_budget_min_per_second"),
                                             ({"window_seconds": 0}, "proxy.retry_budget_window_seconds")],
                         ids=["ratio", "min", "window"])
def test_bad_settings_are_refused_by_name(kwargs: dict[str, float], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        RetryBudget(**kwargs)  # type: ignore[arg-type]
    assert info.value.key == key


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ReplicaFailed("r1", "UNAVAILABLE: failed to connect to all addresses", output_started=False,
                       retryable=True), False),
        (ReplicaFailed("r1", "UNAVAILABLE: Connection refused", output_started=False, retryable=True), False),
        (ReplicaFailed("r1", "INTERNAL: engine crashed", output_started=False, retryable=True), True),
        (ReplicaFailed("r1", "RESOURCE_EXHAUSTED: queue full", output_started=False, retryable=True), True),
        (DeadlineExceeded("late"), True),
    ],
    ids=["unreachable", "refused", "internal", "overloaded", "other"],
)
def test_only_requests_that_reached_a_replica_spend_budget(error: FerryError, expected: bool) -> None:
    assert charged(error) is expected
