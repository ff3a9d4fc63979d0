"""The proxy's usage window (dataplane.usage): status classes, the latency sketch's error bound, bounds, the report."""

from __future__ import annotations

import asyncio
import math
import random

import pytest

from dataplane.config import ProxySettings
from dataplane.usage import BUCKETS, GROWTH, MAX_SECONDS, MIN_SECONDS, LatencySketch, UsageWindow
from ferry.errors import ConfigError
from tests.dataplane.conftest import PAID, request
from tests.dataplane.fakes import Behaviour

BOUND = math.sqrt(GROWTH) - 1  # documented relative error of a quantile between MIN_SECONDS and MAX_SECONDS


def exact(values: list[float], q: float) -> float:
    """Nearest-rank quantile."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


@pytest.mark.parametrize(("name", "values"), [
    ("constant", [0.2] * 50),
    ("uniform", [random.Random(1).uniform(0.001, 2.0) for _ in range(2000)]),
    ("exponential", [random.Random(2).expovariate(10.0) + 0.001 for _ in range(5000)]),
    ("two modes", [0.01] * 980 + [5.0] * 20),
    ("heavy tail", [random.Random(3).paretovariate(1.5) * 0.01 for _ in range(3000)]),
])
@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_quantiles_are_within_the_documented_bound(name: str, values: list[float], q: float) -> None:
    sketch = LatencySketch()
    for v in values:
        sketch.add(v)
    truth = exact(values, q)
    assert abs(sketch.quantile(q) - truth) <= BOUND * truth + 1e-12, name


@pytest.mark.parametrize(("seconds", "bucket"), [
    (0.0, 0), (-1.0, 0), (float("nan"), 0), (MIN_SECONDS, 0), (MIN_SECONDS * 1.01, 1),
    (MIN_SECONDS * GROWTH ** 10 * 0.999, 10), (MAX_SECONDS * 10, BUCKETS - 1), (math.inf, BUCKETS - 1),
])
def test_bucket_edges(seconds: float, bucket: int) -> None:
    assert LatencySketch.bucket(seconds) == bucket


def test_sketch_edge_cases() -> None:
    empty = LatencySketch()
    assert empty.quantile(0.99) == 0.0
    one = LatencySketch()
    one.add(0.123)
    assert one.quantile(0.5) == one.quantile(0.99) == 0.123  # clamped to what was seen
    tiny = LatencySketch()
    for _ in range(10):
        tiny.add(0.0001)
    assert abs(tiny.quantile(0.99) - 0.0001) <= MIN_SECONDS
    huge = LatencySketch()
    huge.add(7200.0)
    assert huge.quantile(0.99) == 7200.0
    assert len(huge.counts) <= BUCKETS


@pytest.mark.parametrize(("status", "requests", "errors", "shed", "timed"), [
    ("OK", 1, 0, 0, True),
    ("RESOURCE_EXHAUSTED", 0, 0, 1, False),
    ("UNAVAILABLE", 1, 1, 0, False),
    ("DEADLINE_EXCEEDED", 1, 1, 0, False),
    ("INTERNAL", 1, 1, 0, False),
    ("INVALID_ARGUMENT", 1, 0, 0, False),   # the caller's mistake: a request, not an error
    ("CANCELLED", 1, 0, 0, False),
    ("NOT_FOUND", 1, 0, 0, False),
])
def test_status_classes(status: str, requests: int, errors: int, shed: int, timed: bool) -> None:
    window = UsageWindow(start=0.0)
    window.record("m", "standard", status, 0.25)
    [sample] = window.report(2.0).usage
    assert (sample.requests, sample.errors, sample.shed) == (requests, errors, shed)
    assert sample.p99_seconds == (0.25 if timed else 0.0)
    assert sample.offered_per_second == pytest.approx((requests + shed) / 2.0)


def test_report_rows_window_queue_and_reset() -> None:
    window = UsageWindow(start=10.0)
    for i in range(100):
        window.record("b", "interactive", "OK", 0.01 * (i + 1))
    window.record("b", "interactive", "RESOURCE_EXHAUSTED", 0.0)
    window.record("a", "batch", "OK", 1.0, spilled=True)
    window.record("_unknown", "standard", "UNAUTHENTICATED", 0.0)  # never resolved to a model: not counted
    window.record("", "standard", "OK", 0.1)
    report = window.report(12.0, {("c", "standard"): 3, ("a", "batch"): 0, ("_unknown", "batch"): 9})
    assert report.window_seconds == pytest.approx(2.0)
    rows = {(s.model, s.tier): s for s in report.usage}
    assert list(rows) == [("a", "batch"), ("b", "interactive"), ("c", "standard")]  # sorted; queued-only row too
    b = rows[("b", "interactive")]
    assert (b.requests, b.shed, b.spilled) == (100, 1, 0)
    assert b.p99_seconds == pytest.approx(0.99, rel=BOUND) and b.p50_seconds == pytest.approx(0.5, rel=BOUND)
    assert b.offered_per_second == pytest.approx(101 / 2.0)
    assert rows[("a", "batch")].spilled == 1 and rows[("c", "standard")].queued == 3
    assert rows[("c", "standard")].requests == 0
    again = window.report(13.0)
    assert again.window_seconds == pytest.approx(1.0) and list(again.usage) == []


def test_rows_are_bounded_and_the_rest_counted_as_dropped() -> None:
    window = UsageWindow(start=0.0, max_rows=2)
    for model in ("a", "b", "c", "c"):
        window.record(model, "batch", "OK", 0.1)
    window.record("a", "batch", "OK", 0.1)  # an existing row still counts
    report = window.report(1.0, {("z", "batch"): 5})
    assert [(s.model, s.requests) for s in report.usage] == [("a", 2), ("b", 1)]
    assert window.dropped == 2
    with pytest.raises(ValueError):
        UsageWindow(start=0.0, max_rows=0)


@pytest.mark.parametrize(("fields", "ok"), [
    ({}, True), ({"usage_report_seconds": 0.0}, True), ({"usage_report_seconds": -1.0}, False),
    ({"usage_report_seconds": 61.0}, False), ({"usage_max_rows": 0}, False),
])
def test_settings(fields: dict[str, float], ok: bool) -> None:
    if ok:
        ProxySettings.from_section(fields)
    else:
        with pytest.raises(ConfigError):
            ProxySettings.from_section(fields)


@pytest.mark.timeout(20)
async def test_the_proxy_reports_its_requests_on_the_table_watch(rig) -> None:
    r = await rig({"r1": Behaviour()}, settings={"usage_report_seconds": 0.1})
    for _ in range(5):
        await r.stub.Infer(request(), metadata=PAID, timeout=5)
    seen = 0
    p99 = 0.0
    while seen < 5:  # the five may span two windows
        report = await asyncio.wait_for(r.cp.reports.get(), 5)
        assert 0 < report.window_seconds < 5
        for sample in report.usage:
            assert (sample.model, sample.tier) == ("m", "interactive")
            seen += sample.requests
            p99 = max(p99, sample.p99_seconds)
    assert seen == 5 and 0 < p99 < 5
    assert r.proxy is not None and r.proxy.holder.version == 1  # acks and reports share the stream
