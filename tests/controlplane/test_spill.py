"""Region spill weights: excess interactive work goes to the nearest regions with spare capacity within budget."""

from __future__ import annotations

import math

import pytest

from controlplane.spill import RegionLoad, batch_weights, parse_rtt, queue_ms, spill_weights
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
    # C's 200 ms round trip plus a 350 ms service time is over 500 ms: only B may take A's excess.
    regions = [region("a", 1.5, service_ms=350.0), region("b", 0.5, service_ms=350.0),
               region("c", 0.2, service_ms=350.0)]
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
