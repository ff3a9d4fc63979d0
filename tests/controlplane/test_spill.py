"""Region spill weights: excess interactive work goes to the nearest regions with spare capacity within budget."""

from __future__ import annotations

import math

import pytest

from controlplane.spill import (
    RegionLoad,
    RegionSample,
    SpillController,
    batch_weights,
    parse_rtt,
    queue_ms,
    queue_p99_ms,
    reachable,
    spill_weights,
)
from ferry.errors import ConfigError

RTT = parse_rtt({"a:b": 40, "a:c": 200, "b:c": 180})


def region(name: str, load: float, capacity: float = 100.0, service_ms: float = 150.0) -> RegionLoad:
    return RegionLoad(name, capacity=capacity, offered=load * capacity, slots=60, service_ms=service_ms)


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        # A at 150 %, B at 50 %, C at 20 %: A keeps 90, B takes its spare 40 -> 40/150; C gets the last 20.
        ({"a": 1.5, "b": 0.5, "c": 0.2}, {("a", "b"): 40 / 150, ("a", "c"): 20 / 150}),
        # B has room for all of A's excess: nothing to C.
        ({"a": 1.2, "b": 0.3, "c": 0.2}, {("a", "b"): 30 / 120}),
        ({"a": 0.8, "b": 0.5, "c": 0.2}, {}),  # nobody saturated
        ({"a": 1.5, "b": 0.95, "c": 0.95}, {}),  # nobody has spare
    ],
    ids=["b-then-c", "b-enough", "none-saturated", "no-spare"],
)
def test_excess_goes_nearest_first_within_spare(loads: dict[str, float],
                                                expected: dict[tuple[str, str], float]) -> None:
    got = spill_weights([region(n, v) for n, v in loads.items()], RTT)
    assert got == pytest.approx(expected)


def test_a_region_beyond_the_latency_budget_gets_nothing() -> None:
    # 60 slots at 0.9: a p99 wait of 148 ms for a 250 ms service. B: 40 + 148 + 250 fits 500 ms; C's 200 ms does not.
    regions = [region("a", 1.5, service_ms=250.0), region("b", 0.5, service_ms=250.0),
               region("c", 0.2, service_ms=250.0)]
    assert spill_weights(regions, RTT) == pytest.approx({("a", "b"): 40 / 150})


def test_two_saturated_sources_share_one_target_without_exceeding_its_spare() -> None:
    regions = [region("a", 1.5), region("c", 1.2), region("b", 0.2)]
    got = spill_weights(regions, RTT)
    taken = got[("a", "b")] * 150 + got.get(("c", "b"), 0.0) * 120
    assert taken == pytest.approx(70.0)  # B's spare: 0.9 x 100 - 20


def test_regions_without_a_configured_rtt_are_never_targets() -> None:
    assert spill_weights([region("a", 1.5), region("z", 0.1)], RTT) == {}


@pytest.mark.parametrize(("rho", "expected"), [(0.0, 0.0), (1.0, math.inf)], ids=["idle", "full"])
def test_queueing_estimate_bounds(rho: float, expected: float) -> None:
    assert queue_ms(100.0, 4, rho) == expected


@pytest.mark.parametrize(
    ("slots", "rho", "expected"),
    [(16, 0.9, 512.5), (32, 0.9, 241.0), (16, 0.0, 0.0), (16, 1.0, math.inf), (200, 0.5, 0.0)],
    ids=["16-slots", "32-slots", "idle", "full", "rarely-waits"],
)
def test_the_p99_wait_is_the_exponential_tail_beyond_the_chance_to_wait(slots: int, rho: float,
                                                                       expected: float) -> None:
    assert queue_p99_ms(200.0, slots, rho) == pytest.approx(expected, rel=2e-3)


def test_queueing_grows_with_utilisation_and_shrinks_with_slots() -> None:
    assert queue_ms(100.0, 4, 0.5) < queue_ms(100.0, 4, 0.9)
    assert queue_ms(100.0, 60, 0.9) < queue_ms(100.0, 4, 0.9)


def test_batch_goes_where_capacity_is_idle() -> None:
    assert batch_weights([region("a", 1.5), region("b", 0.5), region("c", 0.0)]) == pytest.approx(
        {"b": 50 / 150, "c": 100 / 150})
    assert batch_weights([region("a", 1.5)]) == {}


@pytest.mark.parametrize("config", [{"a": 1.0}, {"a:a": 1.0}, {"a:b": -1.0}], ids=["no-colon", "self", "negative"])
def test_bad_rtt_config_is_refused_by_key(config: dict[str, float]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_rtt(config)
    assert info.value.key == "controlplane.region_rtt_ms"


# -- the controller on replica loads (SpillController): 128 slots per region, service 200 ms, budget 500 ms.
# Reachable: a->b 40 + 47 + 200, a->c 200 + 47 + 200, b->c 427 (the p99 wait at 0.9 on 128 slots is 47 ms).


def samples(**regions: tuple[float, float]) -> list[RegionSample]:
    """region=(queued + running, queued) in sixteenths of its 128 slots."""
    return [RegionSample(name, 128, load=8 * load, queued=8 * queued) for name, (load, queued) in regions.items()]


def controller(**kw: float) -> SpillController:
    return SpillController(RTT, alpha=1.0, step=0.1, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("before", "loads", "after"),
    [
        # a saturated (pressure 1.25 >= 0.95), b and c open: one step to the nearest, b.
        ({}, {"a": (20, 4), "b": (8, 0), "c": (2, 0)}, {("a", "b"): 0.1}),
        # b busy at 0.94 of its slots (above fill, 0.85), no wait: not open, nor skipped for c: a waits for it.
        ({}, {"a": (20, 4), "b": (15, 0), "c": (2, 0)}, {}),
        # a in the dead band (0.8 <= pressure < 0.95): the weight holds.
        ({("a", "b"): 0.4}, {"a": (14, 0), "b": (8, 0), "c": (2, 0)}, {("a", "b"): 0.4}),
        # a light (< 0.8): its farthest weight drops a step.
        ({("a", "b"): 0.4, ("a", "c"): 0.1}, {"a": (8, 0), "b": (8, 0), "c": (2, 0)}, {("a", "b"): 0.4}),
        # b's replicas hold a wait of 14/16 x 200 ms = 175 ms > (500 - 40 - 200) / 2: overfull, its weight drops
        # (and a, still saturated, takes the step to c instead).
        ({("a", "b"): 0.4}, {"a": (20, 4), "b": (30, 14), "c": (2, 0)}, {("a", "b"): 0.3, ("a", "c"): 0.1}),
        # b with a short wait (4/16 x 200 ms = 50 ms) and busy below 0.85 stays open: a queue alone is no reason.
        ({("a", "b"): 0.4}, {"a": (20, 4), "b": (17, 4), "c": (2, 0)}, {("a", "b"): 0.5}),
        # a source keeps a tenth of its work home (max_share 0.9).
        ({("a", "b"): 0.85}, {"a": (20, 4), "b": (8, 0), "c": (2, 0)}, {("a", "b"): 0.9}),
    ],
    ids=["to-nearest-open", "nearest-busy-waits", "dead-band-holds", "light-drops-farthest", "overfull-target-drops",
         "short-queue-open", "max-share"],
)
def test_the_controller_steers_on_saturation_one_step_per_update(
        before: dict[tuple[str, str], float], loads: dict[str, tuple[float, float]],
        after: dict[tuple[str, str], float]) -> None:
    ctl = controller()
    ctl.weights = dict(before)
    ctl.routes = tuple(sorted(before))
    assert ctl.update(samples(**loads)).weights == pytest.approx(after)


def test_routes_lead_a_busy_region_to_every_target_in_budget_even_at_weight_zero() -> None:
    ctl = controller()
    plan = ctl.update(samples(a=(12, 0), b=(4, 0), c=(2, 0)))  # a busy (0.75 > 0.5) but not saturated
    assert plan.weights == {}
    assert plan.routes == (("a", "b"), ("a", "c"))


def test_work_flows_downhill_only_and_a_region_taking_spill_does_not_spill_in_turn() -> None:
    ctl = controller()
    plan = ctl.update(samples(a=(20, 4), b=(18, 2), c=(2, 0)))  # both saturated, a more than b; b's engines full
    assert plan.weights == {("b", "c"): 0.1}  # a waits for b (busy, not overfull); b goes to c
    assert plan.routes == (("a", "b"), ("a", "c"), ("b", "c"))  # a is more loaded than b: never b's target
    plan = ctl.update(samples(a=(20, 4), b=(18, 2), c=(2, 0)))
    assert plan.routes == (("a", "c"), ("b", "c"))  # b spills now: no target for a
    assert plan.weights == {("a", "c"): 0.1, ("b", "c"): 0.2}
    taking = controller()
    taking.weights, taking.routes = {("a", "b"): 0.3}, (("a", "b"),)
    plan = taking.update(samples(a=(20, 4), b=(18, 2), c=(2, 0)))  # b saturated by what a sends it
    assert plan.weights == {("a", "b"): 0.3}  # b does not pass it on to c; a waits (b busy, not overfull)


def test_routes_outlive_a_busy_spell_by_hold_updates() -> None:
    ctl = controller(hold=2)
    ctl.update(samples(a=(12, 0), b=(4, 0)))
    quiet = [ctl.update(samples(a=(6, 0), b=(2, 0))).routes for _ in range(3)]  # a at 0.375: no longer busy
    assert quiet == [(("a", "b"),), (("a", "b"),), ()]


def test_smoothing_takes_alpha_of_each_new_sample() -> None:
    ctl = SpillController(RTT, alpha=0.5)
    ctl.update(samples(a=(16, 0), b=(0, 0)))
    ctl.update(samples(a=(0, 0), b=(0, 0)))
    assert ctl.utilisation["a"] == pytest.approx(0.5)


def test_reachable_is_the_budget_test_alone_nearest_first() -> None:
    loads = [RegionLoad(n, capacity=128.0, offered=128.0, slots=128, service_ms=200.0) for n in "abc"]
    assert reachable(loads, RTT) == {"a": ("b", "c"), "b": ("a", "c"), "c": ("b", "a")}
    small = [RegionLoad(n, capacity=32.0, offered=0.0, slots=32, service_ms=200.0) for n in "abc"]
    assert reachable(small, RTT) == {"a": ("b",), "b": ("a",)}  # 32 slots: a p99 wait of 241 ms at 0.9


def test_bad_controller_settings_are_refused() -> None:
    with pytest.raises(ConfigError):
        SpillController(RTT, low=0.9, high=0.8)
