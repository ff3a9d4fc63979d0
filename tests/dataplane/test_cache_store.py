"""The response cache (dataplane.cache.store), the decision (dataplane.cache.decide) and their settings."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.cache.decide import CachePolicy, decide, share
from dataplane.cache.store import ENTRY_OVERHEAD, Answer, ResponseCache
from dataplane.config import ProxySettings
from ferry.errors import ConfigError


def answer(tenant: str = "t1", version: str = "v1", text: str = "yes", model: str = "m",
           pieces: tuple[tuple[str, int], ...] | None = None) -> Answer:
    return Answer(tenant=tenant, model=model, version=version, text=text, prompt_tokens=3, completion_tokens=1,
                  finish_reason="stop", service_seconds=0.25, pieces=pieces)


def test_an_answer_is_served_to_its_tenant_model_and_version_only() -> None:
    cache = ResponseCache(max_entries=8, max_bytes=1 << 20, ttl=60)
    assert cache.put(b"k", answer(), now=0.0)
    assert cache.get(b"k", tenant="t1", model="m", version="v1", now=1.0) == answer()
    # the same key (a digest collision) asked for by another tenant, model or version: nothing
    assert cache.get(b"k", tenant="t2", model="m", version="v1", now=1.0) is None
    assert cache.get(b"k", tenant="t1", model="other", version="v1", now=1.0) is None
    assert cache.get(b"k", tenant="t1", model="m", version="v2", now=1.0) is None


def test_the_ttl_ends_an_answer() -> None:
    cache = ResponseCache(max_entries=8, max_bytes=1 << 20, ttl=60)
    cache.put(b"k", answer(), now=0.0)
    assert cache.get(b"k", tenant="t1", model="m", version="v1", now=59.9) is not None
    assert cache.get(b"k", tenant="t1", model="m", version="v1", now=60.0) is None
    assert len(cache) == 0 and cache.bytes == 0


def test_entries_and_bytes_are_bounded_oldest_first() -> None:
    cache = ResponseCache(max_entries=3, max_bytes=1 << 20, ttl=60)
    for i in range(5):
        cache.put(bytes([i]), answer(text=str(i)), now=float(i))
    assert len(cache) == 3 and cache.evicted == 2
    assert cache.get(bytes([0]), tenant="t1", model="m", version="v1", now=5.0) is None
    assert cache.get(bytes([4]), tenant="t1", model="m", version="v1", now=5.0) is not None

    size = answer(text="x" * 100).size
    assert size == ENTRY_OVERHEAD + 100
    small = ResponseCache(max_entries=100, max_bytes=size * 8, ttl=60)
    for i in range(20):
        assert small.put(bytes([i]), answer(text="x" * 100), now=0.0)
        assert small.bytes <= small.max_bytes
    assert len(small) == 8
    assert not small.put(b"big", answer(text="x" * size), now=0.0)  # over an eighth of the bound: not stored


def test_a_version_leaving_the_table_takes_its_answers() -> None:
    cache = ResponseCache(max_entries=8, max_bytes=1 << 20, ttl=60)
    cache.put(b"a", answer(version="v1"), now=0.0)
    cache.put(b"b", answer(version="v2"), now=0.0)
    cache.put(b"c", answer(version="v1", model="n"), now=0.0)
    assert cache.invalidate("m", {"v2"}) == 1
    assert cache.get(b"a", tenant="t1", model="m", version="v1", now=0.0) is None
    assert cache.get(b"b", tenant="t1", model="m", version="v2", now=0.0) is not None
    assert cache.get(b"c", tenant="t1", model="n", version="v1", now=0.0) is not None
    assert cache.invalidate("m", set()) == 1 and cache.models() == {"n"}


def test_a_stream_replays_only_an_answer_stored_with_its_pieces() -> None:
    cache = ResponseCache(max_entries=8, max_bytes=1 << 20, ttl=60)
    cache.put(b"u", answer(), now=0.0)
    cache.put(b"s", answer(text="a bc", pieces=(("a ", 1), ("bc", 1))), now=0.0)
    assert cache.get(b"u", tenant="t1", model="m", version="v1", now=0.0, stream=True) is None
    got = cache.get(b"s", tenant="t1", model="m", version="v1", now=0.0, stream=True)
    assert got is not None and got.pieces == (("a ", 1), ("bc", 1))


@pytest.mark.parametrize(("on", "deterministic", "duplicates", "expected"), [
    (False, 100, 10, False),   # under min_requests: as it was
    (True, 100, 0, True),
    (False, 1000, 50, False),  # 5 %: not above enable_above
    (False, 1000, 51, True),
    (True, 1000, 40, True),    # between the thresholds: stays on
    (False, 1000, 40, False),  # ... and stays off
    (True, 1000, 29, False),   # under disable_below
    (True, 1000, 30, True),
])
def test_the_decision_has_hysteresis(on: bool, deterministic: int, duplicates: int, expected: bool) -> None:
    policy = CachePolicy(enable_above=0.05, disable_below=0.03, min_requests=200)
    assert decide(on, deterministic, duplicates, policy) is expected


def test_mode_off_measures_only() -> None:
    assert not decide(True, 1000, 1000, CachePolicy(mode="off"))
    assert share(0, 0) == 0.0 and share(4, 1) == 0.25


@pytest.mark.parametrize(("key", "value"), [
    ("cache_mode", "always"), ("cache_enable_above", 1.5), ("cache_disable_below", -0.1),
    ("cache_min_requests", -1), ("cache_window_seconds", 0), ("cache_window_seconds", 1e6),
    ("cache_sketch_hashes", 0), ("cache_max_rows", 0), ("cache_max_entries", 0), ("cache_max_bytes", 0),
    ("cache_ttl_seconds", float("nan")),
])
def test_bad_settings_are_refused_naming_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"proxy.{key}"):
        ProxySettings.from_section({key: value})


def test_disable_below_above_enable_above_is_refused() -> None:
    with pytest.raises(ConfigError, match="proxy.cache_disable_below"):
        ProxySettings.from_section({"cache_enable_above": 0.02, "cache_disable_below": 0.03})
    settings = ProxySettings.from_section({"cache_enable_above": 0.1, "cache_disable_below": 0.05,
                                           "cache_min_requests": 10})
    assert settings.cache.policy() == CachePolicy(enable_above=0.1, disable_below=0.05, min_requests=10)


OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, 30), st.sampled_from(["m", "n"]), st.sampled_from(["v1", "v2"]),
              st.integers(0, 400)),
    st.tuples(st.just("invalidate"), st.sampled_from(["m", "n"]), st.sets(st.sampled_from(["v1", "v2"]))),
    st.tuples(st.just("tick"), st.integers(0, 40)),
), max_size=120)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_the_bounds_and_the_accounting_hold_whatever_happens(ops: list[tuple[Any, ...]]) -> None:
    cache = ResponseCache(max_entries=8, max_bytes=4096, ttl=30)
    now = 0.0
    for op in ops:
        if op[0] == "put":
            _, key, model, version, size = op
            cache.put(bytes([key]), answer(model=model, version=version, text="x" * size), now)
        elif op[0] == "invalidate":
            cache.invalidate(op[1], op[2])
            for k in range(31):
                got = cache.get(bytes([k]), tenant="t1", model=op[1], version="v1", now=now)
                assert got is None or "v1" in op[2]
        else:
            now += op[1]
        entries = list(cache._entries.values())
        assert len(entries) <= cache.max_entries and cache.bytes <= cache.max_bytes
        assert cache.bytes == sum(e.size for e in entries)
        assert cache.models() == {e.answer.model for e in entries}
