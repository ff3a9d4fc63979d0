"""Region spill weights: excess interactive work goes to the nearest regions with spare capacity within budget."""

from __future__ import annotations

import math

import pytest

from controlplane.config import parse_rtt
from controlplane.regions.control import RegionSample, SpillController
from controlplane.regions.weights import (
    RegionLoad,
    batch_weights,
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


# -- sizing from the proxies' reports: keep 0.85 of a source's capacity, targets up to headroom 0.9.


@pytest.mark.parametrize(
    ("offered", "expected"),
    [
        # A's excess over 0.85 x 640 is 416 of 960; B's spare 0.9 x 640 - 320 = 256 bounds it.
        ({"a": 960.0, "b": 320.0}, {("a", "b"): 256 / 960}),
        ({"a": 960.0, "b": 100.0}, {("a", "b"): 416 / 960}),  # B has room for all of it
        ({"a": 500.0, "b": 100.0}, {}),  # A below what it keeps
        # Both between keep and headroom: both spill a little, so neither takes.
        ({"a": 560.0, "b": 560.0}, {}),
    ],
    ids=["spare-bound", "excess-bound", "below-keep", "no-taker"],
)
def test_the_sized_weight_is_the_excess_over_keep_within_the_targets_spare(
        offered: dict[str, float], expected: dict[tuple[str, str], float]) -> None:
    loads = [RegionLoad(n, capacity=640.0, offered=v, slots=128, service_ms=200.0) for n, v in offered.items()]
    assert spill_weights(loads, RTT, keep=0.85) == pytest.approx(expected)


def measured(name: str, load: float, offered: float, served: float, *, waiting: float = 0.0,
             spilled: float = 0.0) -> RegionSample:
    """A region of 128 slots (640 requests/s nominal at 200 ms) with its proxies' figures."""
    return RegionSample(name, 128, load=load, offered=offered, served=served, waiting=waiting, spilled=spilled)


@pytest.mark.parametrize(
    ("samples_", "capacity", "weights"),
    [
        # A 128 busy, 960 offered, 640 served: the law L = λW 640/s; B 40 busy for 200/s: 640/s too.
        # A's pressure 1.0 holds (high 2.0: no saturation step): the weight is the sized share. A's excess over
        # 0.85 x 640 is 416, B's spare 0.9 x 640 - 200 = 376: short, so both level at (960 + 200) / 1280.
        ([measured("a", 128, 960, 640), measured("b", 40, 200, 200)], {"a": 640, "b": 640},
         {("a", "b"): 380 / 960}),
        # B's replicas slower (64 busy for 200/s: 400/s): levelling stops at 0.95 x 400 - 200 = 180.
        ([measured("a", 128, 960, 640), measured("b", 64, 200, 200)], {"a": 640, "b": 400},
         {("a", "b"): 180 / 960}),
        # Nothing offered anywhere: no weight, nominal capacities (too few busy slots to measure).
        ([measured("a", 0, 0, 0), measured("b", 0, 0, 0)], {"a": 640, "b": 640}, {}),
    ],
    ids=["sized", "slow-target", "idle"],
)
def test_the_controller_sizes_weights_from_offered_rates_and_measured_capacity(
        samples_: list[RegionSample], capacity: dict[str, float], weights: dict[tuple[str, str], float]) -> None:
    ctl = SpillController(RTT, alpha=1.0, step=0.1, high=2.0, low=0.5)
    assert ctl.update(samples_).weights == pytest.approx(weights, abs=1e-6)
    assert ctl.capacity == pytest.approx(capacity)


def test_a_region_saturated_by_its_own_work_is_capped_at_what_it_serves() -> None:
    ctl = SpillController(RTT, alpha=1.0, step=0.1)
    # 128 busy and 64 waiting at its proxies (pressure 1.5): it answers 480/s, whatever the law L = λW says.
    ctl.update([measured("a", 128, 960, 480, waiting=64), measured("b", 40, 200, 200)])
    assert ctl.capacity["a"] == pytest.approx(480) and ctl.ceiling["a"] == pytest.approx(480 / 128)
    # No longer saturated: the ceiling only rises with what it serves.
    ctl.update([measured("a", 100, 500, 500), measured("b", 40, 200, 200)])
    assert ctl.ceiling["a"] == pytest.approx(500 / 128) and ctl.capacity["a"] == pytest.approx(500)
    # Twice the slots: the ceiling is per slot, so the capacity doubles with them.
    ctl.update([RegionSample("a", 256, load=128, offered=500, served=500), measured("b", 40, 200, 200)])
    assert ctl.capacity["a"] == pytest.approx(1000)


def test_the_spill_a_target_takes_counts_in_what_it_serves() -> None:
    ctl = SpillController(RTT, alpha=1.0, step=0.1, high=2.0, low=0.5)
    ctl.update([measured("a", 128, 960, 640), measured("b", 40, 200, 200)])
    # A's proxies sent 300/s away, all to b (its one weighted target): b's replicas answered 500/s with 100 busy.
    ctl.update([measured("a", 128, 960, 640, spilled=300), measured("b", 100, 200, 200)])
    assert ctl.served["b"] == pytest.approx(500) and ctl.capacity["b"] == pytest.approx(640)


def test_the_saturation_correction_is_bounded_around_the_sized_weight() -> None:
    ctl = SpillController(RTT, alpha=1.0, step=0.05, max_correction=0.15)
    # A stays saturated (pressure 1.5) while its sized weight is 0.2: the steps add at most 0.15.
    plans = [ctl.update([measured("a", 128, 680, 640, waiting=64), measured("b", 20, 100, 100)]) for _ in range(6)]
    sized = (680 - 0.85 * 640) / 680
    assert [p.weights[("a", "b")] for p in plans] == pytest.approx(
        [sized + 0.05, sized + 0.1, sized + 0.15, sized + 0.15, sized + 0.15, sized + 0.15], abs=1e-6)


def test_batch_goes_from_a_busy_region_to_idle_capacity_whatever_the_distance() -> None:
    ctl = controller()
    plan = ctl.update(samples(a=(16, 0), b=(8, 0), c=(4, 0)))  # idle: a 0, b 8/16, c 12/16 of their slots
    assert plan.batch == pytest.approx({("a", "b"): 0.4, ("a", "c"): 0.6})  # c is 200 ms away: batch goes too
    assert ("a", "c") in plan.routes  # 128 slots: c is within the interactive budget here
    quiet = controller().update(samples(a=(4, 0), b=(8, 0), c=(4, 0)))
    assert quiet.batch == {}  # a region with idle slots of its own keeps its batch home


@pytest.mark.parametrize(
    ("offered", "balance_to", "expected"),
    [
        ({"a": 960.0, "b": 320.0}, None, 256 / 960),  # B's spare alone (0.9 x 640 - 320)
        ({"a": 960.0, "b": 320.0}, 1.0, 320 / 960),  # levelled: both at (960 + 320) / 1280 = 1.0
        ({"a": 960.0, "b": 320.0}, 0.95, 288 / 960),  # levelling stops at 0.95 x 640 - 320
        ({"a": 700.0, "b": 100.0}, 1.0, (700 - 544) / 700),  # spare enough: levelling does not apply
    ],
    ids=["spare", "level", "level-bounded", "spare-enough"],
)
def test_levelling_shares_an_overload_the_targets_spare_cannot_take(
        offered: dict[str, float], balance_to: float | None, expected: float) -> None:
    loads = [RegionLoad(n, capacity=640.0, offered=v, slots=128, service_ms=200.0) for n, v in offered.items()]
    assert spill_weights(loads, RTT, keep=0.85, balance_to=balance_to) == {("a", "b"): pytest.approx(expected)}


def test_bad_sizing_settings_are_refused() -> None:
    with pytest.raises(ConfigError):
        SpillController(RTT, keep=0.95)  # keep above headroom (0.9)
    with pytest.raises(ConfigError):
        spill_weights([], RTT, keep=0.0)
