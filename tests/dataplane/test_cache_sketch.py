"""The duplicate sketch (dataplane.cache.sketch) and the windowed meter (dataplane.cache.measure): bounds, accuracy."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.cache.measure import DuplicateMeter
from dataplane.cache.sketch import SeenSet

# (key, seconds since the previous observation): keys from a small set, so that repeats happen; times in
# quarter seconds, exact in binary floating point, so the reference's arithmetic is the sketch's
STEPS = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 20).map(lambda q: q / 4)), max_size=300)


def reference(steps: list[tuple[int, float]], window: float) -> list[bool]:
    """Exact answers: was the key seen less than ``window`` seconds before?"""
    last: dict[int, float] = {}
    now = 0.0
    out = []
    for key, gap in steps:
        now += gap
        out.append(key in last and now - last[key] < window)
        last[key] = now
    return out


@settings(max_examples=200, deadline=None)
@given(STEPS, st.integers(1, 80).map(lambda q: q / 4))
def test_exact_while_the_distinct_keys_fit(steps: list[tuple[int, float]], window: float) -> None:
    seen = SeenSet(window=window, capacity=64)  # 41 possible keys: the cap is never reached
    now, got = 0.0, []
    for key, gap in steps:
        now += gap
        got.append(seen.observe(key, now))
    assert got == reference(steps, window)
    assert seen.evicted == 0


@settings(max_examples=200, deadline=None)
@given(STEPS, st.integers(1, 16))
def test_bounded_and_one_sided_past_the_cap(steps: list[tuple[int, float]], capacity: int) -> None:
    window = 30.0
    seen = SeenSet(window=window, capacity=capacity)
    now, got = 0.0, []
    for key, gap in steps:
        now += gap
        got.append(seen.observe(key, now))
        assert len(seen) <= capacity
    exact = reference(steps, window)
    assert all(e or not g for g, e in zip(got, exact, strict=True))  # never a false duplicate
    assert sum(exact) - sum(got) <= seen.evicted  # each eviction hides at most one duplicate


def test_a_payload_seen_a_window_ago_is_new_again() -> None:
    seen = SeenSet(window=10, capacity=8)
    assert not seen.observe(1, 0.0)
    assert seen.observe(1, 9.0)
    assert not seen.observe(1, 19.0)  # last seen at 9: exactly one window ago
    assert len(seen) == 1


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        SeenSet(window=0, capacity=8)
    with pytest.raises(ValueError):
        SeenSet(window=1, capacity=0)
    with pytest.raises(ValueError):
        DuplicateMeter(window=1, capacity=8, max_rows=0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 5), st.floats(0, 3, allow_nan=False)),
                max_size=200))
def test_the_meter_counts_every_request_of_the_window(steps: list[tuple[str, int, float]]) -> None:
    meter = DuplicateMeter(window=1e9, capacity=1024, max_rows=16)
    now, duplicates = 0.0, 0
    for tenant, key, gap in steps:
        now += gap
        duplicates += meter.observe("m", tenant, hash((tenant, key)), now, seconds=1.0)
    totals = meter.model_totals("m", now)
    assert (totals.deterministic, totals.duplicates, totals.seconds) == (len(steps), duplicates, float(duplicates))
    rows = meter.samples(now, lambda model: False)
    assert sum(r.deterministic for r in rows) == len(steps)
    assert sum(r.duplicates for r in rows) == duplicates


def test_the_meter_forgets_what_left_the_window_and_rows_that_emptied() -> None:
    meter = DuplicateMeter(window=10, capacity=64, max_rows=4, buckets=10)
    meter.observe("m", "t1", 1, 0.0, seconds=2.0)
    meter.observe("m", "t1", 1, 0.5, seconds=2.0)  # a duplicate
    assert (meter.model_totals("m", 0.5).deterministic, meter.model_totals("m", 0.5).duplicates) == (2, 1)
    [row] = meter.samples(5.0, lambda model: model == "m")
    assert (row.model, row.tenant, row.deterministic, row.duplicates, row.duplicate_seconds, row.enabled) == (
        "m", "t1", 2, 1, 2.0, True)
    assert row.window_seconds == pytest.approx(5.0)
    assert meter.samples(10.5, lambda model: False) == []  # the bucket started at 0 ended at 10
    assert meter.model_totals("m", 10.5).deterministic == 0


def test_the_meter_rows_are_bounded() -> None:
    meter = DuplicateMeter(window=10, capacity=64, max_rows=2)
    for i, tenant in enumerate(["a", "b", "c", "d"]):
        meter.observe("m", tenant, i, 0.0, seconds=0.0)
    assert meter.dropped == 2
    assert [r.tenant for r in meter.samples(1.0, lambda model: False)] == ["a", "b"]
