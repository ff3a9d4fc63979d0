"""The proxies' cache measurements merged (controlplane.tables.cachestats), the tables marked, GetCache's rows."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from controlplane.tables.cachestats import attach_cache, cache_views, merge_cache
from controlplane.tables.usage import ProxyUsage
from ferry.v1 import admin_pb2, tables_pb2


def report(*rows: tuple[str, str, int, int, float, bool], window: float = 10.0) -> tables_pb2.Report:
    return tables_pb2.Report(window_seconds=1.0, cache=[
        tables_pb2.CacheSample(model=m, tenant=t, deterministic=d, duplicates=u, duplicate_seconds=s,
                               window_seconds=window, hits=u if on else 0, enabled=on)
        for m, t, d, u, s, on in rows])


def usage(*reports: tuple[str, str, tables_pb2.Report]) -> ProxyUsage:
    kept = ProxyUsage(clock=lambda: 100.0)
    for proxy_id, region, r in reports:
        assert kept.put(proxy_id, region, r) is None
    return kept


def test_counts_and_rates_add_up_over_proxies_and_tenants() -> None:
    kept = usage(("p1", "eu", report(("clf", "a", 100, 40, 8.0, True), ("clf", "b", 100, 20, 4.0, True))),
                 ("p2", "eu", report(("clf", "a", 200, 60, 12.0, True), ("chat", "a", 300, 3, 0.5, False),
                                     window=20.0)))
    merged = merge_cache(kept.entries())
    clf = merged[("eu", "clf", "")]
    assert (clf.deterministic, clf.duplicates, clf.seconds) == (400, 120, 24.0)
    assert clf.share == pytest.approx(0.3)
    assert clf.deterministic_rate == pytest.approx(100 / 10 + 100 / 10 + 200 / 20)
    assert clf.saved_per_s == pytest.approx(8 / 10 + 4 / 10 + 12 / 20)
    assert merged[("eu", "clf", "a")].deterministic == 300
    views = {(v.model, v.tenant): v for v in cache_views(merged)}
    assert set(views) == {("chat", ""), ("clf", "")}
    assert (views[("clf", "")].proxies, views[("clf", "")].proxies_enabled) == (2, 2)
    assert (views[("chat", "")].proxies, views[("chat", "")].proxies_enabled) == (1, 0)
    assert views[("chat", "")].duplicate_share == pytest.approx(0.01)
    by_tenant = [(v.model, v.tenant, v.deterministic) for v in cache_views(merged, by_tenant=True, model="clf")]
    assert by_tenant == [("clf", "a", 300), ("clf", "b", 100)]


def test_the_tables_say_where_the_cache_is_on() -> None:
    kept = usage(("p1", "eu", report(("clf", "a", 10, 5, 1.0, True), ("half", "a", 10, 5, 1.0, True))),
                 ("p2", "eu", report(("clf", "a", 10, 5, 1.0, True), ("half", "a", 10, 0, 0.0, False))),
                 ("p3", "us", report(("clf", "a", 10, 0, 0.0, False))))
    tables = {region: tables_pb2.TableSnapshot(region=region, models=[
        tables_pb2.ModelRoute(model=m) for m in ("clf", "half", "chat")]) for region in ("eu", "us")}
    attach_cache(tables, merge_cache(kept.entries()))
    marks = {(region, r.model): (r.cache_enabled, r.cache_proxies) for region, t in tables.items() for r in t.models}
    assert marks == {("eu", "clf"): (True, 2), ("eu", "half"): (False, 1), ("eu", "chat"): (False, 0),
                     ("us", "clf"): (False, 0), ("us", "half"): (False, 0), ("us", "chat"): (False, 0)}


@pytest.mark.parametrize("row", [
    tables_pb2.CacheSample(model="", tenant="a", deterministic=1, window_seconds=1),
    tables_pb2.CacheSample(model="m", tenant="a", deterministic=1, duplicates=2, window_seconds=1),
    tables_pb2.CacheSample(model="m", tenant="a", deterministic=1, duplicate_seconds=float("inf"), window_seconds=1),
    tables_pb2.CacheSample(model="m", tenant="a", deterministic=1, duplicate_seconds=-1, window_seconds=1),
    tables_pb2.CacheSample(model="m", tenant="a", deterministic=1, window_seconds=0),
    tables_pb2.CacheSample(model="m" * 300, tenant="a", deterministic=1, window_seconds=1),
])
def test_a_malformed_row_is_skipped(row: tables_pb2.CacheSample) -> None:
    good = tables_pb2.CacheSample(model="ok", tenant="a", deterministic=2, duplicates=1, window_seconds=1)
    kept = usage(("p1", "eu", tables_pb2.Report(window_seconds=1.0, cache=[row, good])))
    assert set(merge_cache(kept.entries())) == {("eu", "ok", "a"), ("eu", "ok", "")}


async def test_the_leader_marks_its_tables_and_answers_get_cache(harness: Any) -> None:
    """Two proxies report on the watch; the table says where the cache is on; GetCache merges both."""
    proxies = [harness.proxy("p1"), harness.proxy("p2")]
    for proxy in proxies:
        await proxy.ack(await proxy.subscribe())

    async def send(proxy: Any, on: bool, duplicates: int) -> None:
        await proxy.call.write(tables_pb2.WatchRequest(report=report(("chat", "t1", 100, duplicates, 2.0, on))))

    await send(proxies[0], True, 40)
    await send(proxies[1], True, 20)
    marked = await proxies[0].until(lambda s: any(m.model == "chat" and m.cache_proxies == 2 for m in s.models))
    assert {m.model: m.cache_enabled for m in marked.models}["chat"] is True
    reply = await harness.admin.GetCache(admin_pb2.GetCacheRequest(), timeout=5)
    [row] = reply.rows
    assert (row.model, row.deterministic, row.duplicates, row.proxies, row.proxies_enabled) == ("chat", 200, 60, 2, 2)
    assert row.duplicate_share == pytest.approx(0.3)
    await send(proxies[1], False, 0)  # one proxy turned its cache off: the region's is no longer on everywhere
    unmarked = await proxies[0].until(lambda s: any(m.model == "chat" and m.cache_proxies == 1 for m in s.models))
    assert {m.model: m.cache_enabled for m in unmarked.models}["chat"] is False
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await harness.admin.GetCache(admin_pb2.GetCacheRequest(model="bad\tname"), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "model" in (info.value.details() or "")
