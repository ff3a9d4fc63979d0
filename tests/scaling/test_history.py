"""The history's encoding and its bounds, on the embedded store (the etcd run is tests/etcd/test_scaling_history.py)."""

from __future__ import annotations

import pytest

from controlplane.scaling.history import History, decode, encode, history_key, parse_key, timings_key
from controlplane.scaling.plan import DAY, HOUR, HourRecord, hour_of_week
from controlplane.store.memory import MemoryStore
from ferry.errors import InvalidArgument

T0 = 20_000 * DAY


def test_round_trip() -> None:
    record = HourRecord(20_000, 12.5, 1.25)
    assert decode(encode(record)) == record


@pytest.mark.parametrize(("value", "field"), [
    (b"not json", "value"), (b"[]", "value"), (b'{"peak_rate": 1}', "day"), (b'{"day": 1.5, "peak_rate": 1}', "day"),
    (b'{"day": 1, "peak_rate": -1}', "peak_rate"), (b'{"day": 1, "peak_rate": true}', "peak_rate"),
    (b'{"day": 1, "peak_rate": 1, "service_seconds": "x"}', "service_seconds"),
])
def test_bad_values_are_refused_naming_the_field(value: bytes, field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        decode(value)
    assert caught.value.field == field


@pytest.mark.parametrize(("key", "expected"), [
    (history_key("m", "eu", 7), ("m", "eu", 7)), (history_key("m", "eu", 168), None),
    ("/ferry/scaling/history/m/eu", None), ("/ferry/scaling/history/m/eu/x", None), ("/ferry/other/m/eu/1", None),
])
def test_keys(key: str, expected: tuple[str, str, int] | None) -> None:
    assert parse_key(key) == expected


async def test_observe_keeps_the_hours_peak_and_flushes_what_changed() -> None:
    store = MemoryStore()
    history = History(store, max_series=2)
    at = T0 + 8 * HOUR
    assert history.observe("m", "eu", at, 5.0, 1.0)
    assert history.observe("m", "eu", at + 60, 3.0)  # lower: kept at 5
    assert history.observe("m", "eu", at + 120, 9.0)
    assert history.records("m", "eu") == {hour_of_week(at): HourRecord(20_000, 9.0, 1.0)}
    assert await history.flush() == 1
    assert await history.flush() == 0
    stored = await store.get(history_key("m", "eu", hour_of_week(at)))
    assert stored is not None and decode(stored.value) == HourRecord(20_000, 9.0, 1.0)
    # a week later the slot starts again from the new day
    assert history.observe("m", "eu", at + 7 * DAY, 2.0)
    assert history.records("m", "eu")[hour_of_week(at)] == HourRecord(20_007, 2.0, 0.0)


async def test_bounded_series_and_names() -> None:
    history = History(MemoryStore(), max_series=1)
    assert history.observe("m", "eu", T0, 1.0)
    assert not history.observe("m", "us", T0, 1.0)
    assert not History(MemoryStore()).observe("a/b", "eu", T0, 1.0)
    assert history.observe("m", "eu", T0, float("nan"))  # ignored, the pair is kept
    assert history.records("m", "eu")[hour_of_week(T0)].peak_rate == 1.0


async def test_load_skips_what_does_not_decode() -> None:
    store = MemoryStore()
    await store.put(history_key("m", "eu", 3), encode(HourRecord(19_999, 4.0)))
    await store.put(history_key("m", "eu", 4), b"garbage")
    await store.put("/ferry/scaling/history/m/eu/x", b"{}")
    await store.put(timings_key("eu"), b'{"startup_seconds": 42.0, "replacement_seconds": null}')
    await store.put(timings_key("us"), b'{"startup_seconds": -1}')
    history = History(store)
    await history.load()
    assert history.records("m", "eu") == {3: HourRecord(19_999, 4.0)}
    assert history.skipped == 2
    assert await history.load_timings() == {"eu": (42.0, None)}
    assert history.skipped == 3
