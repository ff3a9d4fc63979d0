"""The ring and its load bound: walks, stability under membership change, bounded-load invariants."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.table.ring import Ring, key_draw, key_shares

IDS = [f"r{i}" for i in range(8)]


def test_walk_meets_every_replica_once_home_first() -> None:
    ring = Ring(IDS, vnodes=16)
    for key in (0, 1, 2**63, 2**64 - 1, 12345):
        walk = list(ring.walk(key))
        assert sorted(walk) == list(range(len(IDS)))
        assert walk[0] == ring.home(key)


def test_same_ids_same_ring_whatever_the_process() -> None:
    assert [Ring(IDS).home(k) for k in range(0, 2**64, 2**58)] == [Ring(IDS).home(k) for k in range(0, 2**64, 2**58)]


def test_adding_a_replica_moves_only_keys_to_it() -> None:
    before, after = Ring(IDS), Ring([*IDS, "r8"])
    rng = random.Random(3)
    keys = [rng.getrandbits(64) for _ in range(2000)]
    moved = [k for k in keys if before.ids[before.home(k)] != after.ids[after.home(k)]]
    assert all(after.ids[after.home(k)] == "r8" for k in moved)
    assert 0.05 < len(moved) / len(keys) < 0.2  # about 1/9 of the keys, with room for arc sizes


def test_key_draw_is_uniform_enough_and_deterministic() -> None:
    draws = [key_draw(k) for k in range(10_000)]  # consecutive keys: the worst case for a weak mix
    assert all(0.0 <= d < 1.0 for d in draws)
    assert abs(sum(d < 0.5 for d in draws) / len(draws) - 0.5) < 0.03
    assert key_draw(42) == key_draw(42)


loads = st.lists(st.floats(min_value=0.0, max_value=1000.0, allow_nan=False), min_size=1, max_size=32)


def test_a_tiny_load_keeps_its_share_of_keys() -> None:
    """A load so small that the bound's product would underflow keeps its share of keys, not none."""
    assert key_shares([0.0, 5e-324], [1, 1], 1.25) == (1.0, 0.625)  # c x its half of the load, not 0


@settings(max_examples=200, deadline=None)
@given(loads=loads, data=st.data(), factor=st.floats(min_value=1.01, max_value=4.0))
def test_key_shares_keep_every_replica_within_the_bound(loads: list[float], data: st.DataObject,
                                                       factor: float) -> None:
    capacities = data.draw(st.lists(st.integers(min_value=1, max_value=128), min_size=len(loads),
                                    max_size=len(loads)))
    shares = key_shares(loads, capacities, factor)
    total, cap = sum(loads), sum(capacities)
    for load, capacity, share in zip(loads, capacities, shares, strict=True):
        assert 0.0 < share <= 1.0
        bound = factor * total * capacity / cap
        assert load * share <= bound * (1 + 1e-9) + 1e-9      # what it keeps is within c x its share
        if load <= bound:
            assert share == 1.0                               # a replica under the bound keeps all its keys


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**32), hot=st.integers(min_value=0, max_value=7),
       excess=st.floats(min_value=1.5, max_value=8.0))
def test_only_an_overloaded_replica_sheds_keys_and_always_the_same_ones(seed: int, hot: int, excess: float) -> None:
    # One replica's load is `excess` x the others': it sheds exactly the keys whose draw is above its share
    # (the same keys however often they come), and every other key stays home.
    loads = [10.0] * len(IDS)
    loads[hot] = 10.0 * excess
    shares = key_shares(loads, [1] * len(IDS), 1.25)
    assert shares[hot] < 1.0 and all(s == 1.0 for i, s in enumerate(shares) if i != hot)
    ring, rng = Ring(IDS, vnodes=32), random.Random(seed)
    for _ in range(200):
        key = rng.getrandbits(64)
        taker = next(i for i in ring.walk(key) if key_draw(key) < shares[i])
        home = ring.home(key)
        assert taker == home or (home == hot and key_draw(key) >= shares[hot])
