"""The max_wait derivation and the capacity arithmetic."""

from __future__ import annotations

import pytest

from agent.batch.budget import LatencyBudget, busy_gpus, derive, floor_gpus, rule_of_thumb_gpus
from ferry.errors import ConfigError


@pytest.mark.parametrize(
    ("budget", "wait_ms"),
    [
        pytest.param(LatencyBudget(), 50.0, id="brief-500ms-100ms"),
        pytest.param(LatencyBudget(retries=0), 240.0, id="no-retry-reserve"),
        pytest.param(LatencyBudget(budget_s=1.0), 250.0, id="one-second-budget"),
        pytest.param(LatencyBudget(headroom=0.0), 100.0, id="no-headroom"),
        pytest.param(LatencyBudget(batch_s=0.05), 100.0, id="faster-batches"),
    ],
)
def test_max_wait_is_solved_from_the_budget(budget: LatencyBudget, wait_ms: float) -> None:
    d = derive(budget)
    assert d.max_wait_s * 1e3 == pytest.approx(wait_ms)
    assert sum(t.ms for t in d.terms) == pytest.approx(budget.budget_s * 1e3)


def test_retry_reserve_is_another_wait_queue_and_batch() -> None:
    d = derive(LatencyBudget())
    assert d.retry_reserve_ms == pytest.approx(50 + 40 + 100)
    assert "max_wait" in d.lines()[-1] and "50.0 ms" in d.lines()[-1]


@pytest.mark.parametrize(
    "budget",
    [
        pytest.param(LatencyBudget(budget_s=0.2), id="budget-under-two-batches"),
        pytest.param(LatencyBudget(budget_s=0.5, batch_s=0.2), id="batch-too-slow"),
    ],
)
def test_a_budget_with_no_room_for_waiting_is_refused(budget: LatencyBudget) -> None:
    with pytest.raises(ConfigError):
        derive(budget)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        pytest.param({"headroom": 1.0}, "headroom", id="headroom"),
        pytest.param({"retries": -1}, "retries", id="retries"),
        pytest.param({"batch_s": -0.1}, "batch_s", id="negative-time"),
    ],
)
def test_budget_fields_are_validated(kwargs: dict[str, float], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        LatencyBudget(**kwargs)  # type: ignore[arg-type]
    assert exc.value.key == key


@pytest.mark.parametrize(
    ("rate", "floor", "thumb"),
    [
        pytest.param(10_000, 10, 18, id="10k"),
        pytest.param(100, 1, 3, id="100"),
        pytest.param(28_000, 28, 46, id="28k"),
    ],
)
def test_floor_and_rule_of_thumb(rate: float, floor: int, thumb: int) -> None:
    assert floor_gpus(rate, 100, 0.1) == floor
    assert rule_of_thumb_gpus(rate, 100, 0.1) == thumb


@pytest.mark.parametrize(
    ("rate", "wait_s", "busy"),
    [
        pytest.param(100, 0.05, 100 / 6 * 0.1, id="timer-leads-50ms"),
        pytest.param(100, 0.02, 100 / 3 * 0.1, id="timer-leads-20ms"),
        pytest.param(10_000, 0.05, 10.0, id="size-leads"),
    ],
)
def test_busy_gpus_from_the_timer(rate: float, wait_s: float, busy: float) -> None:
    assert busy_gpus(rate, wait_s, 0.1, 100) == pytest.approx(busy)
