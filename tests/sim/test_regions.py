"""The regions simulator: A at 150 % spills to B (40 ms) within the budget, nothing to C (200 ms).

The same policies as ``ferry up``: the control plane's SpillController on a tick-old sample of the replicas'
loads and the proxies' offered and served rates, the proxies' admission queues and their region choice
(weighted draw, then spill on queue).
"""

from __future__ import annotations

import dataclasses

from tools.bench.regions import REGIONS, RTT_MS
from tools.sim.regions import RegionsConfig, simulate

CONFIG = RegionsConfig(regions=REGIONS, rtt_ms=RTT_MS, duration_seconds=25.0, warmup_seconds=5.0)


def test_a_saturated_region_meets_its_budget_by_spilling_to_the_near_neighbour() -> None:
    result = simulate(CONFIG)
    assert 0.3 < result.spill_share["a->b"] < 0.5
    assert "a->c" not in result.spill_share
    assert result.p99_ms["a"] < 500 and result.p99_ms["b"] < 500


def test_without_spill_the_saturated_region_misses_its_budget() -> None:
    result = simulate(dataclasses.replace(CONFIG, spill=False))
    assert result.p99_ms["a"] > 1000 and not result.spill_share
    assert result.shed["a"] > 0.2 * result.requests["a"]  # its proxy refuses what waits too long


def test_spill_on_queue_alone_keeps_a_within_budget_while_the_weights_are_zero() -> None:
    # A controller that never moves its weights (a step too small to matter): the proxies' spill on queue carries it.
    result = simulate(dataclasses.replace(CONFIG, step=1e-9, usage=False))
    assert result.p99_ms["a"] < 500 and result.spill_share["a->b"] > 0.3


def test_the_weights_sized_from_offered_rates_alone_keep_a_within_budget() -> None:
    # No spill on queue at the proxies: the controller's weights, sized from the offered rates, carry it.
    result = simulate(dataclasses.replace(CONFIG, queue_ms=1e9))
    assert result.p99_ms["a"] < 500 and result.p99_ms["b"] < 500
    assert 0.3 < result.spill_share["a->b"] < 0.5 and "a->c" not in result.spill_share
    assert not result.shed.get("a")
