"""ferry.backoff: equal jitter over a capped exponential, reset on success (deterministic with a seeded rng)."""

import random

import pytest

from ferry.backoff import Backoff


@pytest.mark.parametrize(
    ("initial", "cap", "expected_nominal"),
    [(0.1, 5.0, [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]), (1.0, 1.0, [1.0, 1.0, 1.0])],
    ids=["doubling-to-cap", "flat"],
)
def test_each_delay_lies_in_the_upper_half_of_its_nominal(initial, cap, expected_nominal):
    backoff = Backoff(initial, cap, rng=random.Random(3))
    for nominal in expected_nominal:
        assert backoff.nominal() == pytest.approx(nominal)
        assert nominal / 2 <= backoff.next_delay() <= nominal


def test_delays_are_jittered_and_the_same_seed_gives_the_same_delays():
    a, b = Backoff(0.1, 5.0, rng=random.Random(7)), Backoff(0.1, 5.0, rng=random.Random(7))
    assert [a.next_delay() for _ in range(8)] == [b.next_delay() for _ in range(8)]
    firsts = {Backoff(0.1, 5.0, rng=random.Random(seed)).next_delay() for seed in range(20)}
    assert len(firsts) == 20  # clients that failed together do not retry together
    at_cap = Backoff(1.0, 1.0, rng=random.Random(3))
    assert len({at_cap.next_delay() for _ in range(10)}) == 10


def test_the_delay_grows_with_failures_until_the_cap():
    backoff = Backoff(0.1, 5.0, rng=random.Random(11))
    delays = [backoff.next_delay() for _ in range(12)]
    # the lower bound of attempt n+2 (2 * nominal) exceeds the upper bound of attempt n below the cap
    assert all(delays[n + 2] > delays[n] for n in range(4))
    assert max(delays) <= 5.0 and min(delays[6:]) >= 2.5


def test_reset_starts_over_from_initial():
    backoff = Backoff(0.1, 5.0, rng=random.Random(5))
    for _ in range(6):
        backoff.next_delay()
    backoff.reset()
    assert backoff.nominal() == 0.1 and 0.05 <= backoff.next_delay() <= 0.1


def test_many_failures_stay_at_the_cap_without_overflow():
    backoff = Backoff(0.1, 5.0, rng=random.Random(1))
    delays = [backoff.next_delay() for _ in range(2000)]
    assert all(2.5 <= delay <= 5.0 for delay in delays[6:])


@pytest.mark.parametrize(
    ("initial", "cap"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)], ids=["zero", "negative", "inverted"]
)
def test_bad_bounds_are_refused(initial, cap):
    with pytest.raises(ValueError, match="0 < initial <= cap"):
        Backoff(initial, cap)
