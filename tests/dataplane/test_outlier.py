"""Outlier ejection: consecutive failures or far-above-peers latency eject a replica for a growing period."""

from __future__ import annotations

import pytest

from dataplane.outlier import OutlierDetector, OutlierParams
from ferry.errors import ConfigError
from tests.dataplane.conftest import PAID, request
from tests.dataplane.fakes import Behaviour

FAST, SLOW = 0.01, 0.1


def _feed(d: OutlierDetector, rid: str, per_token: float, n: int, now: float, pool: int = 4) -> str | None:
    reason = None
    for _ in range(n):
        reason = d.record(rid, "m", ok=True, seconds_per_token=per_token, now=now, pool_size=pool) or reason
    return reason


@pytest.mark.parametrize(
    ("failures", "ejected"),
    [(4, False), (5, True)],
    ids=["four-in-a-row", "five-in-a-row"],
)
def test_consecutive_failures_eject(failures: int, ejected: bool) -> None:
    d = OutlierDetector()
    for _ in range(failures):
        d.record("r1", "m", ok=False, seconds_per_token=None, now=1.0, pool_size=10)
    assert ("r1" in d.ejected(1.0)) is ejected


def test_a_success_resets_the_failure_count() -> None:
    d = OutlierDetector()
    for ok in (False, False, False, False, True, False, False, False, False):
        d.record("r1", "m", ok=ok, seconds_per_token=0.01 if ok else None, now=1.0, pool_size=10)
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
            d.record(f"r{i}", "m", ok=False, seconds_per_token=None, now=1.0, pool_size=pool)
    assert len(d.ejected(1.0)) == most


def test_forget_drops_replicas_that_left_the_table() -> None:
    d = OutlierDetector()
    for _ in range(5):
        d.record("gone", "m", ok=False, seconds_per_token=None, now=1.0, pool_size=10)
    assert d.ejected(1.0) == {"gone"}
    d.forget({"other"})
    assert d.ejected(1.0) == frozenset()


@pytest.mark.parametrize("kwargs", [{"consecutive_failures": 0}, {"latency_factor": 1.0},
                                    {"base_ejection_seconds": 100.0}, {"max_ejected_share": 1.5}],
                         ids=["failures", "factor", "base-over-max", "share"])
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
