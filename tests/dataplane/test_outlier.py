"""Outlier ejection: consecutive failures, or a decode or prefill rate far above the peers', eject a replica."""

from __future__ import annotations

import pytest

from dataplane.pick.outlier import DECODE, PREFILL, OutlierDetector, OutlierParams, Timing, prefill_sample, samples
from ferry.errors import ConfigError
from tests.dataplane.conftest import PAID, request
from tests.dataplane.fakes import Behaviour

FAST, SLOW = 0.01, 0.1


def _decode(per_token: float, now: float, tokens: int = 20) -> Timing:
    """A streamed request with a short prompt: ``tokens`` tokens, ``per_token`` seconds each after the first."""
    return Timing(sent=now - per_token * tokens, first=now - per_token * (tokens - 1), ended=now, prompt_tokens=10,
                  completion_tokens=tokens)


def _feed(d: OutlierDetector, rid: str, per_token: float, n: int, now: float, pool: int = 4) -> str | None:
    reason = None
    for _ in range(n):
        reason = d.answered(rid, "m", _decode(per_token, now), now=now, pool_size=pool) or reason
    return reason


def _fail(d: OutlierDetector, rid: str, now: float, pool: int) -> None:
    d.failed(rid, "m", now=now, pool_size=pool)


@pytest.mark.parametrize(
    ("failures", "ejected"),
    [(4, False), (5, True)],
    ids=["four-in-a-row", "five-in-a-row"],
)
def test_consecutive_failures_eject(failures: int, ejected: bool) -> None:
    d = OutlierDetector()
    for _ in range(failures):
        _fail(d, "r1", 1.0, 10)
    assert ("r1" in d.ejected(1.0)) is ejected


def test_a_success_resets_the_failure_count() -> None:
    d = OutlierDetector()
    for ok in (False, False, False, False, True, False, False, False, False):
        if ok:
            d.answered("r1", "m", _decode(0.01, 1.0), now=1.0, pool_size=10)
        else:
            _fail(d, "r1", 1.0, 10)
    assert d.ejected(1.0) == frozenset()


@pytest.mark.parametrize(("slow", "ejected"), [(FAST * 3, False), (SLOW, True)], ids=["3x-stays", "10x-ejected"])
def test_latency_far_above_the_peers_ejects(slow: float, ejected: bool) -> None:
    d = OutlierDetector()
    for rid in ("r1", "r2", "r3"):
        _feed(d, rid, FAST, 5, 0.0)
    reason = _feed(d, "r4", slow, 5, 0.0)
    assert (reason == "latency") is ejected
    assert ("r4" in d.ejected(0.0)) is ejected


def test_ejection_grows_and_readmits_with_fresh_statistics() -> None:
    d = OutlierDetector(OutlierParams(base_ejection_seconds=2.0, max_ejection_seconds=60.0))
    for rid in ("r1", "r2", "r3"):
        _feed(d, rid, FAST, 5, 0.0)
    ends = []
    now = 0.0
    for _ in range(3):
        assert _feed(d, "r4", SLOW, 5, now) == "latency"
        while "r4" in d.ejected(now):
            now += 0.5
        ends.append(now)
    assert [round(b - a, 1) for a, b in zip([0.0, *ends], ends, strict=False)] == [2.0, 4.0, 8.0]
    # Recovered: it serves at its peers' speed and stays in.
    assert _feed(d, "r4", FAST, 20, now) is None and d.ejected(now + 100) == frozenset()


@pytest.mark.parametrize(("pool", "share", "most"), [(2, 0.1, 1), (10, 0.1, 1), (30, 0.1, 3), (30, 0.0, 1)],
                         ids=["two-replicas", "ten", "thirty", "share-zero-still-one"])
def test_never_more_than_the_share_of_a_pool_at_once(pool: int, share: float, most: int) -> None:
    d = OutlierDetector(OutlierParams(max_ejected_share=share))
    for i in range(pool):
        for _ in range(5):
            _fail(d, f"r{i}", 1.0, pool)
    assert len(d.ejected(1.0)) == most


def test_forget_drops_replicas_that_left_the_table() -> None:
    d = OutlierDetector()
    for _ in range(5):
        _fail(d, "gone", 1.0, 10)
    assert d.ejected(1.0) == {"gone"}
    d.forget({"other"})
    assert d.ejected(1.0) == frozenset()


@pytest.mark.parametrize("kwargs", [{"consecutive_failures": 0}, {"latency_factor": 1.0},
                                    {"base_ejection_seconds": 100.0}, {"max_ejected_share": 1.5},
                                    {"window_seconds": 0.0}, {"min_prefill_tokens": 0}],
                         ids=["failures", "factor", "base-over-max", "share", "window", "min-prefill"])
def test_bad_params_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        OutlierParams(**kwargs)  # type: ignore[arg-type]


async def test_a_failing_replica_is_ejected_and_costs_no_more_retries(rig) -> None:
    r = await rig({"bad": Behaviour(kind="fail"), "ok1": Behaviour(), "ok2": Behaviour()})
    replies = [await r.stub.Infer(request(), metadata=PAID, timeout=5) for _ in range(40)]
    assert {reply.replica_id for reply in replies} <= {"ok1", "ok2"}
    assert r.served()["bad"] == 5  # five failures in a row, each retried elsewhere; then ejected
    assert r.proxy is not None
    assert r.proxy.metrics.value("proxy_outlier_ejections_total", model="m", reason="failures") == 1


SAMPLES = [
    # id, timing, expected (phase, seconds, work) samples
    ("stream-long-answer", Timing(sent=0.0, first=0.1, ended=2.1, prompt_tokens=10, completion_tokens=101),
     [(DECODE, 2.0, 100.0)]),
    ("stream-long-prompt-short-answer", Timing(sent=0.0, first=0.5, ended=0.52, prompt_tokens=10_000,
                                               completion_tokens=2, cached_tokens=2_000, ahead_tokens=2_000),
     [(PREFILL, 0.5, 10_000.0)]),
    ("stream-both", Timing(sent=0.0, first=0.2, ended=1.2, prompt_tokens=1_000, completion_tokens=51),
     [(DECODE, 1.0, 50.0), (PREFILL, 0.2, 1_000.0)]),
    ("stream-prefill-without-cache-report", Timing(sent=0.0, first=0.3, ended=0.31, prompt_tokens=5_000,
                                                   completion_tokens=2), [(PREFILL, 0.3, 5_000.0)]),
    ("too-short-to-say-anything", Timing(sent=0.0, first=0.01, ended=0.02, prompt_tokens=50, completion_tokens=3),
     []),
    ("prompt-all-cached", Timing(sent=0.0, first=0.01, ended=0.02, prompt_tokens=5_000, completion_tokens=2,
                                 cached_tokens=4_900), []),
    ("unary-short-prompt-is-decode", Timing(sent=0.0, first=None, ended=1.0, prompt_tokens=10, completion_tokens=20),
     [(DECODE, 1.0, 20.0)]),
    ("unary-long-prompt-says-nothing", Timing(sent=0.0, first=None, ended=1.0, prompt_tokens=5_000,
                                              completion_tokens=20), []),
]


@pytest.mark.parametrize(("timing", "expected"), [c[1:] for c in SAMPLES], ids=[c[0] for c in SAMPLES])
def test_what_an_attempt_says_about_its_replica(timing: Timing, expected: list[tuple[str, float, float]]) -> None:
    params = OutlierParams(min_prefill_tokens=256)
    got = samples(timing, params)
    prefill = prefill_sample(timing, params)
    got += [prefill] if prefill is not None else []
    assert [phase for phase, _, _ in got] == [phase for phase, _, _ in expected]
    assert [x for _, s, w in got for x in (s, w)] == pytest.approx([x for _, s, w in expected for x in (s, w)])


def test_long_prompts_and_queueing_do_not_make_a_replica_look_slow() -> None:
    """One replica gets every long prompt (10 k tokens, 2 tokens out), queued behind each other; the others short
    prompts with long answers. Prefill is judged per token of work including what waited ahead: no ejection."""
    d = OutlierDetector()
    now = 0.0
    for step in range(200):
        now = step * 0.1
        ahead = (step % 5) * 10_000  # up to four long prompts ahead of this one
        long = Timing(sent=now - 0.2 * (1 + step % 5), first=now - 0.01, ended=now, prompt_tokens=10_000,
                      completion_tokens=2, ahead_tokens=ahead)
        d.first_token("long", "m", long, now=now, pool_size=4)
        d.answered("long", "m", long, now=now, pool_size=4)
        for rid in ("a", "b", "c"):
            short = Timing(sent=now - 2.1, first=now - 2.0, ended=now, prompt_tokens=300, completion_tokens=101)
            d.first_token(rid, "m", short, now=now, pool_size=4)
            d.answered(rid, "m", short, now=now, pool_size=4)
    assert not d.history and d.ejected(now) == frozenset()


def test_a_ten_times_slower_prefill_is_ejected() -> None:
    d = OutlierDetector()
    for step in range(40):
        now = step * 0.1
        for rid, per_token in (("a", 20e-6), ("b", 20e-6), ("c", 20e-6), ("slow", 200e-6)):
            reason = d.first_token(rid, "m", Timing(sent=now - per_token * 8_000, first=now, ended=now,
                                                    prompt_tokens=8_000, completion_tokens=1), now=now, pool_size=4)
            if reason:
                assert (rid, reason, d.last_phase) == ("slow", "latency", PREFILL)
                assert now < 10.0
                return
    raise AssertionError("the slow replica was never ejected")
