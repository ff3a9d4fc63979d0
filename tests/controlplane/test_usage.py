"""The proxies' usage reports (controlplane.tables.usage): keeping, expiry, relay, merge, and the Admin views."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest

from controlplane.tables.usage import (
    Figures,
    ProxyUsage,
    merge,
    rollup,
    sample_figures,
    spill_views,
    tier_views,
    usage_rows,
)
from ferry.v1 import admin_pb2, tables_pb2
from ferry_cli.ctl.top import frame_rows
from tests.controlplane.fakes import WAIT, FakeClock, FakeProxy, Harness, Pair


def sample(model: str = "chat", tier: str = "interactive", **fields: Any) -> tables_pb2.UsageSample:
    return tables_pb2.UsageSample(model=model, tier=tier, **fields)


def report(*samples: tables_pb2.UsageSample, window: float = 1.0) -> tables_pb2.Report:
    return tables_pb2.Report(window_seconds=window, usage=list(samples))


# -- keeping reports


@pytest.mark.parametrize(("proxy_id", "region", "rep", "age", "reason"), [
    ("p1", "a", report(sample(requests=1)), 0.0, None),
    ("p1", "a", report(), 0.0, None),                                                  # idle: kept
    ("", "a", report(), 0.0, "usage_report_field"),
    ("p1", "", report(), 0.0, "usage_report_field"),
    ("p1", "a", report(window=0.0), 0.0, "usage_report_window_seconds"),
    ("p1", "a", report(window=-1.0), 0.0, "usage_report_window_seconds"),
    ("p1", "a", report(window=7200.0), 0.0, "usage_report_window_seconds"),
    ("p1", "a", report(sample(model="")), 0.0, "usage_report_usage_name"),
    ("p1", "a", report(sample(tier="")), 0.0, "usage_report_usage_name"),
    ("p1", "a", report(sample(model="m" * 300)), 0.0, "usage_report_usage_name"),
    ("p1", "a", report(sample(p99_seconds=math.nan)), 0.0, "usage_report_usage_value"),
    ("p1", "a", report(sample(p99_seconds=math.inf)), 0.0, "usage_report_usage_value"),
    ("p1", "a", report(sample(offered_per_second=-1.0)), 0.0, "usage_report_usage_value"),
    ("p1", "a", report(*[sample(model=f"m{i}") for i in range(5)]), 0.0, "usage_report_usage_rows"),
    ("p1", "a", report(), -1.0, "usage_report_field"),
    ("p1", "a", report(), 5.0, "usage_report_expired"),
])
def test_put_checks_each_report(proxy_id: str, region: str, rep: tables_pb2.Report, age: float,
                                reason: str | None) -> None:
    usage = ProxyUsage(clock=FakeClock(), max_samples=4)
    assert usage.put(proxy_id, region, rep, age=age) == reason
    assert len(usage.entries()) == (1 if reason is None else 0)


def test_reports_expire_and_end_with_their_stream() -> None:
    clock = FakeClock()
    usage = ProxyUsage(clock=clock, expire_seconds=5.0)
    first, second = object(), object()
    usage.put("p1", "a", report(sample(requests=1)), stream=first)
    usage.put("p2", "a", report(sample(requests=2)), stream=first)
    usage.put("p1", "a", report(sample(requests=3)), stream=second)  # p1 subscribed again
    usage.drop("p1", first)  # the old stream's end does not take the new stream's report
    assert [e.report.usage[0].requests for e in usage.entries()] == [3, 2]
    usage.drop("p2", first)
    assert [e.proxy_id for e in usage.entries()] == ["p1"]
    clock.advance(4.9)
    assert len(usage.entries()) == 1
    clock.advance(0.1)
    assert usage.entries() == []


def test_rows_over_all_reports_are_bounded() -> None:
    clock = FakeClock()
    usage = ProxyUsage(clock=clock, max_total_samples=3)
    assert usage.put("p1", "a", report(sample(), sample(tier="batch"))) is None
    assert usage.put("p2", "a", report(sample(), sample(tier="batch"))) == "usage_report_total"
    assert usage.put("p2", "a", report(sample())) is None
    assert usage.put("p1", "a", report(sample(), sample(tier="batch"), sample(tier="standard"))) == (
        "usage_report_total")
    assert usage.put("p1", "a", report()) is None  # p1's two rows are replaced by none
    assert usage.put("p3", "a", report(sample(), sample(tier="batch"))) is None
    usage.drop("p3", None)  # relayed entries have no stream: not dropped this way
    assert [e.proxy_id for e in usage.entries()] == ["p1", "p2", "p3"]
    clock.advance(10.0)
    assert usage.entries() == [] and usage.put("p4", "a", report(sample(), sample(tier="b"), sample(tier="c"))) is None


def test_proxies_are_bounded() -> None:
    clock = FakeClock()
    usage = ProxyUsage(clock=clock, max_proxies=2)
    assert usage.put("p1", "a", report()) is None and usage.put("p2", "a", report()) is None
    assert usage.put("p3", "a", report()) == "usage_report_proxies"
    assert usage.put("p2", "a", report()) is None  # a known proxy still reports
    clock.advance(10.0)  # the others expired: room again
    assert usage.put("p3", "a", report()) is None
    assert usage.absorb([admin_pb2.ProxyUsageReport(proxy_id=f"x{i}", region="a", report=report())
                         for i in range(3)]) == ["usage_relay_rows"]


def test_a_follower_relays_its_proxies_and_the_leader_keeps_the_freshest() -> None:
    clock = FakeClock()
    follower, leader = ProxyUsage(clock=clock), ProxyUsage(clock=clock)
    stream = object()
    follower.put("p1", "b", report(sample(requests=10)), stream=stream)
    clock.advance(1.0)
    relayed = follower.relay()
    assert [(r.proxy_id, r.region, r.age_seconds) for r in relayed] == [("p1", "b", 1.0)]
    assert leader.absorb(relayed) == []
    leader.put("p1", "b", report(sample(requests=20)), stream=object())  # p1 moved to the leader: fresher
    assert leader.absorb(relayed) == []  # the follower's older relay does not replace it
    [entry] = leader.entries()
    assert entry.report.usage[0].requests == 20
    assert leader.relay() == leader.relay() and len(leader.relay()) == 1
    assert ProxyUsage(clock=clock).absorb([admin_pb2.ProxyUsageReport(proxy_id="p9", region="b", report=report(),
                                                                      age_seconds=9.0)]) == ["usage_report_expired"]
    relayed_only = ProxyUsage(clock=clock)
    relayed_only.absorb(relayed)
    assert relayed_only.relay() == []  # relayed reports are not relayed again


# -- merging


def test_merge_sums_rates_and_takes_the_highest_p99() -> None:
    clock = FakeClock()
    usage = ProxyUsage(clock=clock)
    usage.put("p1", "a", report(sample(requests=10, errors=1, shed=10, spilled=2, p99_seconds=0.2, p50_seconds=0.1,
                                       offered_per_second=10.0, queued=3), window=2.0))
    usage.put("p2", "a", report(sample(requests=4, p99_seconds=0.5, p50_seconds=0.05, offered_per_second=4.0,
                                       queued=1),
                                sample(tier="batch", requests=1, p99_seconds=9.0, offered_per_second=1.0)))
    usage.put("p3", "a", report(sample(shed=2, offered_per_second=2.0)))  # only shed: no p99 of its own
    usage.put("p4", "b", report(sample(requests=1, p99_seconds=3.0, offered_per_second=1.0)))
    figures = merge(usage.entries())
    f = figures[("chat", "a", "interactive")]
    assert f.request_rate == pytest.approx(5 + 4)
    assert f.offered_rate == pytest.approx(10 + 4 + 2)
    assert f.shed_per_s == pytest.approx(5 + 2) and f.shed_rate == pytest.approx(7 / 16)
    assert f.error_rate == pytest.approx(0.5 / 9) and f.spilled_per_s == pytest.approx(1.0)
    assert (f.p99_seconds, f.p50_seconds, f.queued, f.proxies) == (0.5, 0.1, 4, 3)
    per_model = rollup(figures, lambda k: (k[0], k[1]))
    assert per_model[("chat", "a")].p99_seconds == 9.0  # the slowest tier's
    assert per_model[("chat", "a")].request_rate == pytest.approx(10)
    assert figures[("chat", "b", "interactive")].p99_seconds == 3.0
    assert usage.figures() == figures


@pytest.mark.parametrize(("figures", "shed", "errors"), [
    (Figures(), 0.0, 0.0),
    (Figures(request_rate=0.0, shed_per_s=3.0, offered_rate=3.0), 1.0, 0.0),
    (Figures(request_rate=4.0, error_rate_per_s=1.0, shed_per_s=1.0, offered_rate=5.0), 0.2, 0.25),
    (Figures(request_rate=1.0, error_rate_per_s=2.0, shed_per_s=9.0, offered_rate=3.0), 1.0, 1.0),  # capped
])
def test_shares(figures: Figures, shed: float, errors: float) -> None:
    assert (figures.shed_rate, figures.error_rate) == (pytest.approx(shed), pytest.approx(errors))


def test_p99_merge_is_an_upper_bound_of_the_merged_distribution() -> None:
    proxies = [[0.01] * 95 + [1.0] * 5, [0.02] * 1000, [0.5] * 3]
    p99s = [sorted(v)[math.ceil(0.99 * len(v)) - 1] for v in proxies]
    merged = sorted(x for v in proxies for x in v)
    assert merged[math.ceil(0.99 * len(merged)) - 1] <= max(p99s)


# -- Admin views


def fig(**fields: Any) -> Figures:
    return Figures(proxies=1, **fields)


def test_usage_rows_join_telemetry_and_reports() -> None:
    base = [admin_pb2.UsageRow(model="chat", region="a", replicas=2, replicas_ready=2, queued=5),
            admin_pb2.UsageRow(model="idle", region="a", replicas=1)]
    figures = {("chat", "a", "batch"): fig(request_rate=1.0, p99_seconds=4.0, queued=7, offered_rate=1.0),
               ("chat", "a", "interactive"): fig(request_rate=9.0, p99_seconds=0.2, shed_per_s=1.0, offered_rate=10.0,
                                                 queued=2),
               ("ghost", "b", "standard"): fig(request_rate=0.0, shed_per_s=2.0, offered_rate=2.0)}
    rows = usage_rows(base, figures, by_tier=False)
    assert [(r.model, r.region, r.tier) for r in rows] == [("chat", "a", ""), ("ghost", "b", ""), ("idle", "a", "")]
    chat = rows[0]
    assert (chat.request_rate, chat.p99_seconds, chat.queued, chat.replicas) == (10.0, 4.0, 5, 2)
    assert chat.shed_rate == pytest.approx(1 / 11)
    assert rows[1].shed_rate == 1.0 and rows[1].replicas == 0 and rows[2].request_rate == 0.0
    tiered = usage_rows(base, figures, by_tier=True)
    assert [(r.model, r.tier) for r in tiered] == [("chat", ""), ("chat", "interactive"), ("chat", "batch"),
                                                   ("ghost", ""), ("ghost", "standard"), ("idle", "")]
    assert (tiered[1].queued, tiered[1].p99_seconds, tiered[2].queued) == (2, 0.2, 7)
    assert base[0].request_rate == 0.0  # the telemetry rows are copied, not changed


QUOTAS = [tables_pb2.TierQuota(tier="interactive", reserved_share=0.7, reserved_slots=7, quota_slots=7),
          tables_pb2.TierQuota(tier="standard", reserved_share=0.2, reserved_slots=2, quota_slots=2),
          tables_pb2.TierQuota(tier="batch", reserved_share=0.1, reserved_slots=1, quota_slots=1, lent_slots=0)]


@pytest.mark.parametrize(("region", "expected"), [
    ("", [("a", "interactive"), ("a", "standard"), ("a", "batch"), ("b", "batch")]),
    ("a", [("a", "interactive"), ("a", "standard"), ("a", "batch")]),
    ("b", [("b", "batch")]),
    ("z", []),
])
def test_tier_views(region: str, expected: list[tuple[str, str]]) -> None:
    figures = {("chat", "a", "interactive"): fig(request_rate=3.0, p99_seconds=0.3, offered_rate=4.0, shed_per_s=1.0,
                                                 queued=2),
               ("big", "a", "interactive"): fig(request_rate=1.0, p99_seconds=0.9, offered_rate=1.0),
               ("chat", "b", "batch"): fig(request_rate=1.0, offered_rate=1.0)}
    views = tier_views({"a": QUOTAS}, figures, region=region)
    assert [(v.region, v.tier) for v in views] == expected
    if region in ("", "a"):
        interactive = views[0]
        assert (interactive.reserved_slots, interactive.quota_slots, interactive.reserved_share) == (7, 7, 0.7)
        assert (interactive.request_rate, interactive.p99_seconds, interactive.queued) == (4.0, 0.9, 2)
        assert interactive.shed_rate == pytest.approx(0.2) and interactive.offered_rate == 5.0
        assert views[1].request_rate == 0.0


@pytest.mark.parametrize(("routes", "spilled", "expected"), [
    ({}, {}, {("a", "b"): (0.0, 40.0, 0.0), ("b", "a"): (0.0, 40.0, 0.0), ("a", "c"): (0.0, 80.0, 0.0),
              ("c", "a"): (0.0, 80.0, 0.0)}),
    ({"a": [("b", 0.3, 40.0)]}, {"a": 6.0},        # one target: all of it
     {("a", "b"): (0.3, 40.0, 6.0), ("a", "c"): (0.0, 80.0, 0.0)}),
    ({"a": [("b", 0.3, 40.0), ("c", 0.1, 80.0)]}, {"a": 8.0},   # split by weight
     {("a", "b"): (0.3, 40.0, 6.0), ("a", "c"): (0.1, 80.0, 2.0)}),
    ({}, {"a": 4.0},                                 # weights fell to 0 since: evenly
     {("a", "b"): (0.0, 40.0, 2.0), ("a", "c"): (0.0, 80.0, 2.0)}),
])
def test_spill_views(routes: dict[str, list[tuple[str, float, float]]], spilled: dict[str, float],
                     expected: dict[tuple[str, str], tuple[float, float, float]]) -> None:
    configured = {("a", "b"): 40.0, ("b", "a"): 40.0, ("a", "c"): 80.0, ("c", "a"): 80.0}
    table_routes = {s: [tables_pb2.SpillRoute(region=t, weight=w, rtt_ms=rtt) for t, w, rtt in r]
                    for s, r in routes.items()}
    figures = {("chat", s, "interactive"): fig(spilled_per_s=rate) for s, rate in spilled.items()}
    views = {(v.source, v.target): (v.weight, v.rtt_ms, pytest.approx(v.spilled_rate))
             for v in spill_views(table_routes, configured, figures)}
    for pair, want in expected.items():
        assert views[pair] == want
    assert [v.source for v in spill_views(table_routes, configured, figures, region="b")] == ["b"]
    assert spill_views({}, {}, figures) == []


# -- over the wire


async def until(predicate: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def done(value: bool) -> bool:
    return value


async def rows(admin: Any) -> bool:
    return bool((await admin.GetUsage(admin_pb2.GetUsageRequest(), timeout=WAIT)).rows)


async def nothing(admin: Any) -> bool:
    return not await rows(admin)


async def test_watch_reports_reach_the_admin_views_and_metrics(clock: FakeClock) -> None:
    h = await Harness.start(clock, region_rtt_ms={"local:far": 40.0})
    try:
        proxy = h.proxy("p1")
        table = await proxy.subscribe()
        await proxy.ack(table)
        good = report(sample(requests=20, shed=5, errors=2, p99_seconds=0.25, offered_per_second=12.5, queued=3),
                      window=2.0)
        await proxy.call.write(tables_pb2.WatchRequest(report=good))
        await proxy.call.write(tables_pb2.WatchRequest(report=report(window=-1)))  # ignored, counted; stream lives
        await until(lambda: rows(h.admin), "the report in GetUsage")
        usage = await h.admin.GetUsage(admin_pb2.GetUsageRequest(by_tier=True), timeout=WAIT)
        [row, tier_row] = [r for r in usage.rows if r.model == "chat"]
        assert (row.tier, row.request_rate, row.p99_seconds) == ("", 10.0, 0.25)
        assert row.shed_rate == pytest.approx(0.2) and row.error_rate == pytest.approx(0.1)
        assert (tier_row.tier, tier_row.queued) == ("interactive", 3)
        tiers = await h.admin.GetTiers(admin_pb2.GetTiersRequest(region="local"), timeout=WAIT)
        interactive = {t.tier: t for t in tiers.tiers}["interactive"]
        assert (interactive.request_rate, interactive.queued, interactive.p99_seconds) == (10.0, 3, 0.25)
        spill = await h.admin.GetSpill(admin_pb2.GetSpillRequest(), timeout=WAIT)
        assert [(p.source, p.target, p.rtt_ms) for p in spill.pairs] == [("far", "local", 40.0),
                                                                          ("local", "far", 40.0)]
        registry = h.cp.registry

        def value(name: str) -> float | None:
            return registry.get_sample_value(name, {"model": "chat", "region": "local", "tier": "interactive"})

        await until(lambda: done(value("ferry_region_requests_per_second") is not None), "the metric")
        assert value("ferry_region_requests_per_second") == 10.0 and value("ferry_region_p99_seconds") == 0.25
        assert value("ferry_region_shed_ratio") == pytest.approx(0.2)
        assert registry.get_sample_value("ferry_controlplane_rejected_messages_total",
                                         {"reason": "usage_report_window_seconds"}) == 1
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await h.admin.GetTiers(admin_pb2.GetTiersRequest(region="x" * 1000), timeout=WAIT)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        proxy.call.cancel()  # the stream ends: its report goes at once
        await until(lambda: nothing(h.admin), "the report dropped with its stream")  # only the proxy knew chat
    finally:
        await h.stop()


async def test_a_followers_proxies_reach_the_leader(pair: Pair) -> None:
    proxy = FakeProxy(pair.channels[1], "p-follower", "local")
    table = await proxy.subscribe()
    await proxy.ack(table)
    await proxy.call.write(tables_pb2.WatchRequest(report=report(sample(requests=4, p99_seconds=0.4,
                                                                        offered_per_second=4.0))))
    await until(lambda: rows(pair.admin(0)), "the follower to relay its proxy's report to the leader")
    [row] = (await pair.admin(0).GetUsage(admin_pb2.GetUsageRequest(), timeout=WAIT)).rows
    assert (row.model, row.region, row.request_rate, row.p99_seconds) == ("chat", "local", 4.0, 0.4)
    [own] = (await pair.admin(1).GetUsage(admin_pb2.GetUsageRequest(), timeout=WAIT)).rows  # the follower's own
    assert own.request_rate == 4.0
    proxy.call.cancel()


def test_guard_time_merges_as_the_mean_per_request_and_top_shows_it() -> None:
    one = sample_figures(tables_pb2.UsageSample(model="chat", tier="batch", requests=10, guard_seconds=0.5), 1.0)
    other = sample_figures(tables_pb2.UsageSample(model="chat", tier="batch", requests=30, guard_seconds=0.3), 1.0)
    one.add(other)
    (row,) = usage_rows([], {("chat", "a", "batch"): one}, by_tier=False)
    assert row.guard_seconds == pytest.approx(0.8 / 40)  # 20 ms per request over both proxies
    (shown,) = frame_rows(None, admin_pb2.GetUsageResponse(rows=[row], sampled_at=1.0))
    assert shown["guard_ms"] == 20.0
    (none,) = frame_rows(None, admin_pb2.GetUsageResponse(rows=[admin_pb2.UsageRow(model="m")], sampled_at=1.0))
    assert none["guard_ms"] is None  # no hook ran: shown as -
