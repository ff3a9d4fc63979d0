"""The recorded traffic on the control plane (controlplane.traffic): rows as JSON, the segment store's rotation
and bounds, the memory ring, the relay from a follower to the leader, and ExportTraffic on both."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import grpc
import pytest

from controlplane.config import ControlPlaneSettings
from controlplane.services.traffic import TrafficService
from controlplane.traffic.rows import check, from_json, to_json
from controlplane.traffic.store import MemoryStore, SegmentStore, StoreLimits
from ferry.errors import ConfigError
from ferry.v1 import admin_pb2, tables_pb2
from tests.controlplane.fakes import WAIT, FakeProxy, Pair


class Wall:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def row(arrival: float, model: str = "chat", **fields: object) -> tables_pb2.TrafficRow:
    base: dict[str, object] = {"tier": "standard", "tenant": "ab" * 8, "prompt_tokens": 600,
                               "completion_tokens": 20, "max_tokens": 32, "hash_ids": [1, 2**64 - 1],
                               "e2e_seconds": 0.5, "replica_id": "n1/r0", "branch": "p2c", "outcome": "OK",
                               "proxy_id": "p1", "region": "local"}
    return tables_pb2.TrafficRow(arrival=arrival, model=model, **{**base, **fields})  # type: ignore[arg-type]


def read_all(store: SegmentStore | MemoryStore, since: float, model: str = "") -> tuple[list[float], int]:
    reader = store.reader(since, model)
    arrivals, dropped = [], 0
    while (chunk := reader.next_chunk()) is not None:
        arrivals += [r.arrival for r in chunk.rows]
        dropped += chunk.dropped
    return arrivals, dropped


def test_a_row_round_trips_through_json() -> None:
    one = row(5.0, ttft_seconds=0.1)
    assert from_json(json.loads(json.dumps(to_json(one)))) == one
    none = row(5.0)
    assert to_json(none)["ttft_seconds"] is None and not from_json(to_json(none)).HasField("ttft_seconds")
    for bad in ({**to_json(one), "model": 3}, {**to_json(one), "hash_ids": [-1]}, {**to_json(one), "arrival": "x"}, []):
        with pytest.raises(ValueError):
            from_json(bad)
    assert check(one) is None and check(row(-1.0)) == "traffic_value"
    assert check(row(1.0, branch="x" * 300)) == "traffic_name"


def test_segments_rotate_by_size_and_age_and_the_whole_is_bounded(tmp_path: Path) -> None:
    wall = Wall()
    limits = StoreLimits(segment_bytes=2000, segment_seconds=60.0, max_bytes=5000, max_age_seconds=600.0)
    store = SegmentStore(tmp_path, limits, wall=wall)
    t0 = wall.now
    store.append([row(t0 + i) for i in range(3)], 0, "p1")
    assert len(store.segments()) == 1
    store.append([row(t0 + 3 + i) for i in range(5)], 0, "p1")  # the segment is past 2000 bytes now
    store.append([row(t0 + 8)], 0, "p1")
    assert len(store.segments()) == 2  # rotated by size
    wall.now += 61
    store.append([row(wall.now)], 0, "p1")
    assert len(store.segments()) == 3  # rotated by age
    for i in range(20):  # past max_bytes: the oldest go
        store.append([row(wall.now + i) for _ in range(4)], 0, "p1")
    assert store.bytes <= limits.max_bytes + limits.segment_bytes and store.deleted > 0
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) == store.bytes
    assert all(p.stat().st_mode & 0o077 == 0 for p in tmp_path.iterdir())
    wall.now += 700  # past max_age: all but the current one go at the next append
    store.append([row(wall.now)], 0, "p1")
    assert len(store.segments()) == 1
    store.close()


def test_reading_filters_by_arrival_and_model_counts_drops_and_survives_a_restart(tmp_path: Path) -> None:
    wall = Wall()
    store = SegmentStore(tmp_path, StoreLimits(segment_bytes=1500), wall=wall)
    t0 = wall.now
    store.append([row(t0 - 100), row(t0 - 10), row(t0 - 5, model="other")], 3, "p1")
    store.append([row(t0 - 1)], 2, "p2")
    store.close()
    with (tmp_path / sorted(p.name for p in tmp_path.iterdir())[-1]).open("a") as f:
        f.write("{not json\n{\"half\": ")  # a damaged line and one being written: skipped
    again = SegmentStore(tmp_path, StoreLimits(segment_bytes=1500), wall=wall)  # a restart reads the old segments
    assert read_all(again, t0 - 50) == ([t0 - 10, t0 - 5, t0 - 1], 5)
    assert read_all(again, t0 - 50, "chat") == ([t0 - 10, t0 - 1], 5)
    again.append([row(t0)], 0, "p1")
    assert read_all(again, t0 - 2)[0] == [t0 - 1, t0]
    again.close()


def test_the_memory_ring_is_bounded_by_rows_and_age() -> None:
    wall = Wall()
    store = MemoryStore(StoreLimits(memory_rows=3, max_age_seconds=100.0), wall=wall)
    store.append([row(wall.now + i) for i in range(5)], 4, "p1")
    assert read_all(store, 0.0) == ([wall.now + 2, wall.now + 3, wall.now + 4], 4)
    wall.now += 200
    store.append([row(wall.now)], 0, "p1")
    assert read_all(store, 0.0) == ([wall.now], 0)
    assert read_all(MemoryStore(StoreLimits(), wall=wall), 0.0) == ([], 0)


def test_a_follower_relays_each_row_once_and_stores_them_once_it_leads() -> None:
    leading = False
    settings = ControlPlaneSettings(traffic_relay_rows=2, traffic_relay_max_rows=3)
    wall = Wall()
    service = TrafficService(settings, leading=lambda: leading, wall=wall)
    report = tables_pb2.Report(window_seconds=1.0, traffic=[row(1.0, proxy_id=""), row(2.0), row(3.0), row(4.0)],
                               traffic_dropped=5)
    service.take("p9", "west", report)
    assert not report.traffic and not report.traffic_dropped  # the report kept and relayed carries none
    first, second, third = (admin_pb2.FollowerReport() for _ in range(3))
    service.relay(first)
    service.relay(second)
    service.relay(third)
    assert [r.arrival for r in first.traffic] == [1.0, 2.0] and first.traffic_dropped == 6  # 5 + 1 outbox full
    assert [r.arrival for r in second.traffic] == [3.0] and not third.traffic and not second.traffic_dropped
    assert {(r.proxy_id, r.region) for r in first.traffic} == {("p9", "west")}
    assert service.count("relayed") == 3 and service.count("dropped") == 1
    t = wall.now
    service.take("p9", "west", tables_pb2.Report(window_seconds=1.0, traffic=[row(t + 5)]))
    leading = True  # now it leads: the outbox goes to its store with the next rows
    service.absorb("cp2", [row(t + 6), row(t + 7, model="")], 0)
    assert read_all(service.store, 0.0) == ([t + 5, t + 6, t + 7], 0)
    assert service.count("stored") == 3


@pytest.mark.parametrize(("key", "value"), [("traffic_segment_bytes", 0), ("traffic_max_age_seconds", 0.0),
                                            ("traffic_relay_rows", -1), ("traffic_export_max_rows", 0)])
def test_settings_are_checked(key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"controlplane.{key}"):
        ControlPlaneSettings(**{key: value})


async def exported(admin: object, **fields: object) -> tuple[list[tables_pb2.TrafficRow], int]:
    rows: list[tables_pb2.TrafficRow] = []
    dropped = 0
    async for batch in admin.ExportTraffic(admin_pb2.ExportTrafficRequest(**fields), timeout=WAIT):  # type: ignore[attr-defined]
        rows += batch.rows
        dropped += batch.dropped
    return rows, dropped


async def test_a_followers_proxy_rows_reach_the_leaders_export(pair: Pair) -> None:
    proxy = FakeProxy(pair.channels[1], "p-follower", "local")
    table = await proxy.subscribe()
    await proxy.ack(table)
    now = time.time()
    report = tables_pb2.Report(window_seconds=1.0, traffic=[row(now - 1, proxy_id="", region=""), row(now)],
                               traffic_dropped=2)
    await proxy.call.write(tables_pb2.WatchRequest(report=report))
    deadline = time.monotonic() + WAIT
    while len((found := await exported(pair.admin(0), since_seconds=60))[0]) < 2:
        assert time.monotonic() < deadline, "the follower's relay of its proxy's rows"
        await asyncio.sleep(0.05)
    rows, dropped = found
    assert [(r.proxy_id, r.region) for r in rows] == [("p-follower", "local")] * 2 and dropped == 2
    assert len((await exported(pair.admin(0), since_seconds=60, max_rows=1))[0]) == 1
    assert not (await exported(pair.admin(0), since_seconds=60, model="other"))[0]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await exported(pair.admin(1), since_seconds=60)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "cp1" in (refused.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await exported(pair.admin(0), since_seconds=-1)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "since_seconds" in (bad.value.details() or "")
    proxy.call.cancel()
