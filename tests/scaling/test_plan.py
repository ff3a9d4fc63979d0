"""The pure scaling plan: needed now, the ramp ahead by the start-up time, the floor, the cool-down, standby."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.scaling.plan import (
    DAY,
    HOUR,
    Demand,
    HourRecord,
    Plan,
    Shape,
    State,
    Targets,
    bound,
    day_of,
    forecast,
    hour_of_week,
    needed_for,
    plan,
    standby_for,
)
from ferry.errors import InvalidArgument

T0 = 20_000 * DAY  # a midnight, UTC
SHAPE = Shape(slots=10, kv_tokens=100_000, replica_rate=5.0)
TARGETS = Targets(utilisation=0.5, floor=1, cooldown_seconds=600.0, step_down=1, lookback_days=7, lead_seconds=0.0,
                  failure_rate_per_hour=0.0)


QUIET = Demand()


def run(demand: Demand = QUIET, *, at: float = T0, history: dict[int, HourRecord] | None = None,
        targets: Targets = TARGETS, startup: float = 300.0, replacement: float = 1800.0, current: int = 0,
        standby: int = 0, previous: State | None = None) -> Plan:
    return plan(demand, SHAPE, targets, history=history or {}, now=at, startup_seconds=startup,
                replacement_seconds=replacement, current=current, standby_nodes=standby, previous=previous)


def morning(peak: float, *, hour: int = 8, days: int = 7) -> dict[int, HourRecord]:
    """Records of ``peak`` requests/s at ``hour`` on each of the ``days`` days before T0's."""
    today = day_of(T0)
    return {hour_of_week((today - d) * DAY + hour * HOUR): HourRecord(today - d, peak) for d in range(1, days + 1)}


@pytest.mark.parametrize(("demand", "expected"), [
    (Demand(), 1),                                                     # nothing: the floor
    (Demand(arrival_rate=10.0), 4),                                    # 10 / (5 x 0.5)
    (Demand(arrival_rate=10.1), 5),                                    # rounds up
    (Demand(in_flight=60.0), 12),                                      # 60 / (10 x 0.5)
    (Demand(arrival_rate=10.0, queued=600.0), 5),                      # (10 + 600 / 300) / (5 x 0.5)
    (Demand(tokens_in_flight=300_000.0), 6),                           # 300k / (100k x 0.5)
    (Demand(arrival_rate=1.0, queue_wait_seconds=5.0, ready=7), 8),    # queue over the target: one more than ready
    (Demand(arrival_rate=1.0, queue_wait_seconds=0.5, ready=7), 1),    # queue within queue_share x target
])
def test_needed_now(demand: Demand, expected: int) -> None:
    assert run(demand).desired == expected


def test_littles_law_when_the_replica_rate_is_unknown() -> None:
    shape = dataclasses.replace(SHAPE, replica_rate=0.0)
    assert needed_for(10.0, shape, TARGETS, service_seconds=2.0) == pytest.approx(4.0)  # 10 x 2 / (10 x 0.5)
    assert needed_for(10.0, shape, TARGETS) == 0.0  # neither rate nor service time known: no rate term


def test_the_ramp_is_asked_for_a_start_up_time_ahead() -> None:
    history = morning(50.0)  # 20 replicas at 08:00 on every previous day
    before = T0 + 8 * HOUR - 301.0  # 08:00 is more than the start-up time away
    ahead = T0 + 8 * HOUR - 299.0   # 08:00 is within the start-up time
    assert run(at=before, history=history, startup=300.0).needed_for_ramp == 0
    decided = run(at=ahead, history=history, startup=300.0)
    assert decided.needed_for_ramp == 20 and decided.desired == 20 and decided.forecast_rate == 50.0
    # a longer start-up asks earlier
    assert run(at=before - 3600.0, history=history, startup=3600.0 + 400.0).needed_for_ramp == 20


def test_the_forecast_reads_only_previous_days_within_the_lookback() -> None:
    today = day_of(T0)
    slot = hour_of_week(T0 + 8 * HOUR)
    assert forecast({slot: HourRecord(today, 99.0)}, T0 + 8 * HOUR, T0 + 8 * HOUR, 7) is None  # today's own
    week_ago = hour_of_week((today - 7) * DAY + 8 * HOUR)
    assert week_ago == slot  # a week ago is the same slot, overwritten since
    assert forecast(morning(10.0, days=3), T0 + 8 * HOUR, T0 + 8 * HOUR, 2) == HourRecord(today - 1, 10.0)
    old = {hour_of_week((today - 3) * DAY + 8 * HOUR): HourRecord(today - 3, 10.0)}
    assert forecast(old, T0 + 8 * HOUR, T0 + 8 * HOUR, 2) is None


def test_scale_down_waits_for_the_cool_down_and_steps() -> None:
    up = run(Demand(arrival_rate=25.0), at=T0)
    assert up.desired == 10
    quiet = Demand(arrival_rate=0.0)
    held = run(quiet, at=T0 + 599.0, previous=up.state, current=10)
    assert held.desired == 10 and held.state == up.state
    first = run(quiet, at=T0 + 600.0, previous=held.state, current=10)
    assert first.desired == 9 and first.state.changed_at == T0 + 600.0
    assert run(quiet, at=T0 + 1100.0, previous=first.state, current=9).desired == 9
    assert run(quiet, at=T0 + 1200.0, previous=first.state, current=9).desired == 8


def test_scale_up_is_at_once_and_restarts_the_cool_down() -> None:
    state = State(3, T0)
    assert bound(7, state, T0 + 1.0, TARGETS) == State(7, T0 + 1.0)
    assert bound(2, State(7, T0 + 1.0), T0 + 500.0, TARGETS) == State(7, T0 + 1.0)


def test_a_new_leader_scales_up_at_once_and_down_only_after_a_cool_down() -> None:
    assert run(Demand(arrival_rate=25.0), current=4).desired == 10
    first = run(current=6)
    assert first.desired == 6 and first.state == State(6, T0)
    assert run(at=T0 + 600.0, current=6, previous=first.state).desired == 5


def test_never_below_the_floor() -> None:
    targets = dataclasses.replace(TARGETS, floor=3, step_down=10)
    assert run(targets=targets).desired == 3
    assert bound(0, State(10, T0), T0 + DAY, targets) == State(3, T0 + DAY)


def test_standby_to_keep_from_the_replacement_time() -> None:
    history = morning(50.0)  # 20 replicas at 08:00
    at = T0 + 7 * HOUR  # 07:00, desired 1 now (start-up 5 min: the ramp is not yet within it)
    assert run(at=at, history=history, replacement=1800.0).standby_to_keep == 0  # 08:00 is beyond 35 min
    # a machine there in 30 min takes the replicas asked for then, needed a start-up time later
    assert run(at=at, history=history, replacement=1800.0, startup=1801.0).standby_to_keep == 20 - 1
    keep = run(at=at, history=history, replacement=2 * HOUR).standby_to_keep
    assert keep == 20 - 1  # new machines would come too late for the ramp: keep the growth warm
    reserve = dataclasses.replace(TARGETS, failure_rate_per_hour=0.1)
    # 10 replicas, 10 % lost an hour, 2 h to replace: 2 more
    assert run(Demand(arrival_rate=25.0), targets=reserve, replacement=2 * HOUR).standby_to_keep == 2
    # a region sums its models' reserves before rounding up: two models of one replica keep one, not two
    small = dataclasses.replace(TARGETS, failure_rate_per_hour=0.01)
    plans = [run(Demand(arrival_rate=1.0), targets=small) for _ in range(2)]
    assert [p.standby_to_keep for p in plans] == [1, 1] and standby_for(plans) == 1


def test_a_standby_node_gets_a_model_only_when_the_forecast_needs_it() -> None:
    history = morning(50.0)
    quiet = run(at=T0 + 6 * HOUR, history=history, current=1, standby=30)
    assert quiet.promote == 0
    ramp = run(at=T0 + 8 * HOUR - 200.0, history=history, current=1, standby=30)
    assert ramp.promote == 19  # desired 20, 1 there
    short = run(at=T0 + 8 * HOUR - 200.0, history=history, current=1, standby=5)
    assert short.promote == 5


@pytest.mark.parametrize(("field", "change"), [
    ("demand.arrival_rate", {"demand": Demand(arrival_rate=-1.0)}),
    ("demand.service_seconds", {"demand": Demand(service_seconds=float("nan"))}),
    ("demand.queued", {"demand": Demand(queued=-3.0)}),
    ("targets.drain_seconds", {"targets": dataclasses.replace(TARGETS, drain_seconds=0.0)}),
    ("startup_seconds", {"startup": -1.0}),
    ("replacement_seconds", {"replacement": float("inf")}),
    ("current", {"current": -1}),
    ("standby_nodes", {"standby": -2}),
    ("targets.utilisation", {"targets": dataclasses.replace(TARGETS, utilisation=0.0)}),
    ("targets.floor", {"targets": dataclasses.replace(TARGETS, floor=-1)}),
    ("targets.step_down", {"targets": dataclasses.replace(TARGETS, step_down=0)}),
    ("targets.lookback_days", {"targets": dataclasses.replace(TARGETS, lookback_days=8)}),
])
def test_bad_inputs_are_refused_naming_the_field(field: str, change: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument) as caught:
        run(**change)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_bad_shape_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="shape.slots"):
        plan(Demand(), Shape(slots=0), TARGETS, history={}, now=T0, startup_seconds=1.0, replacement_seconds=1.0,
             current=0, standby_nodes=0, previous=None)


rates = st.floats(min_value=0.0, max_value=500.0, allow_nan=False)
steps = st.lists(st.tuples(rates, st.floats(min_value=0.0, max_value=2000.0)), min_size=1, max_size=40)


@given(steps=steps, floor=st.integers(0, 5), step_down=st.integers(1, 4), peak=rates)
def test_properties_floor_and_cool_down(steps: list[tuple[float, float]], floor: int, step_down: int,
                                        peak: float) -> None:
    """Never below the floor; any fall is at most step_down and at least a cool-down after the last change."""
    targets = dataclasses.replace(TARGETS, floor=floor, step_down=step_down)
    history = morning(peak)
    at, previous = T0 + 6 * HOUR, None
    for rate, dt in steps:
        at += dt
        decided = run(Demand(arrival_rate=rate), at=at, history=history, targets=targets, previous=previous)
        assert decided.desired >= floor
        assert decided.desired >= decided.needed_now or previous is not None
        if previous is not None:
            if decided.desired < previous.desired:
                assert previous.desired - decided.desired <= step_down
                assert at - previous.changed_at >= targets.cooldown_seconds
            else:
                assert decided.desired >= max(decided.needed_now, decided.needed_for_ramp, floor)
        assert decided.promote >= 0 and decided.standby_to_keep >= 0
        previous = decided.state
