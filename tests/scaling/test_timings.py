"""Start-up and replacement times measured from the fleet's reports (pure)."""

from __future__ import annotations

import pytest

from controlplane.scaling.timings import Timings, ewma


def make() -> Timings:
    return Timings(startup_default=120.0, replacement_default=600.0, alpha=0.5, max_tracked=2, max_regions=2)


def test_defaults_until_measured() -> None:
    t = make()
    assert (t.startup("eu"), t.replacement("eu")) == (120.0, 600.0)
    assert t.measured() == {}


def test_startup_from_first_warming_to_ready() -> None:
    t = make()
    t.observe(0.0, [("r1", "eu", False)], [])
    t.observe(10.0, [("r1", "eu", False)], [])
    t.observe(40.0, [("r1", "eu", True)], [])
    assert t.startup("eu") == 40.0
    t.observe(50.0, [("r2", "eu", False)], [])
    t.observe(70.0, [("r2", "eu", True)], [])
    assert t.startup("eu") == ewma(40.0, 20.0, 0.5) == 30.0
    t.observe(80.0, [("r3", "eu", True)], [])  # first seen ready: no sample
    assert t.startup("eu") == 30.0


def test_a_replica_gone_while_warming_gives_no_sample() -> None:
    t = make()
    t.observe(0.0, [("r1", "eu", False)], [])
    t.observe(5.0, [], [])
    t.observe(9.0, [("r1", "eu", True)], [])
    assert t.startup("eu") == 120.0


def test_replacement_from_a_lost_node_to_the_next_new_one_of_its_region() -> None:
    t = make()
    t.observe(0.0, [], [("n1", "eu"), ("n2", "eu"), ("m1", "us")])
    t.observe(100.0, [], [("n2", "eu"), ("m1", "us")])      # n1 lost
    t.observe(200.0, [], [("n2", "eu"), ("m1", "us"), ("m2", "us")])  # a new node in another region
    assert t.replacement("eu") == 600.0 and t.replacement("us") == 600.0
    t.observe(400.0, [], [("n2", "eu"), ("m1", "us"), ("m2", "us"), ("n3", "eu")])
    assert t.replacement("eu") == 300.0


def test_bounded() -> None:
    t = make()
    t.observe(0.0, [("a", "r1", False), ("b", "r2", False), ("c", "r1", False)], [])  # c not tracked
    t.observe(9.0, [("a", "r1", True), ("b", "r2", True), ("c", "r1", True)], [])
    assert t.startup("r1") == 9.0
    t.restore("r3", startup=5.0, replacement=None)  # two regions measured already: r3 not kept
    assert t.startup("r3") == 120.0


def test_restore_does_not_override_a_measurement() -> None:
    t = make()
    t.observe(0.0, [("a", "eu", False)], [])
    t.observe(7.0, [("a", "eu", True)], [])
    t.restore("eu", startup=99.0, replacement=50.0)
    assert (t.startup("eu"), t.replacement("eu")) == (7.0, 50.0)
    assert t.measured() == {"eu": (7.0, 50.0)}


@pytest.mark.parametrize(("prev", "sample", "expected"), [(None, 4.0, 4.0), (10.0, 0.0, 5.0)])
def test_ewma(prev: float | None, sample: float, expected: float) -> None:
    assert ewma(prev, sample, 0.5) == expected
