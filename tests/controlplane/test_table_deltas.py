"""Deltas on the wire: a real control plane on loopback, proxies that apply what it sends with the proxy's holder.

A drain arrives as a delta; a proxy that misses one resyncs with the full table; a NACKed delta leaves the
proxy on its last good table and the next version goes in full; a proxy that subscribes with a version the
control plane keeps gets the deltas from it; every proxy is sent the same bytes, serialized once; a
follower's proxies get the leader's tables as deltas the follower computes; and a real
proxy (dataplane.server.Proxy) watching a real control plane serves around a drained replica it learnt of
by a delta.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from controlplane.server import ControlPlane
from dataplane.config import ProxySettings
from dataplane.server import Proxy
from dataplane.table.local import TableHolder, TableRejected
from ferry.v1 import admin_pb2, inference_pb2_grpc, tables_pb2
from tests.controlplane.fakes import WAIT, FakeAgent, FakeClock, Harness, Pair, load, register, replica
from tests.dataplane.conftest import FAST, PAID, TENANTS, request
from tests.dataplane.fakes import Behaviour, FakeReplica

pytestmark = pytest.mark.timeout(30)

WATCH = "/ferry.v1.Tables/Watch"


class DeltaProxy:
    """One ``Tables.Watch`` stream that takes deltas, reads the raw bytes and applies them with the proxy's holder."""

    def __init__(self, h: Harness | grpc.aio.Channel, proxy_id: str = "p1") -> None:
        channel = h.channel if isinstance(h, Harness) else h
        self.call = channel.stream_stream(WATCH, request_serializer=tables_pb2.WatchRequest.SerializeToString,
                                            response_deserializer=None)()
        self.proxy_id = proxy_id
        self.holder = TableHolder("local", clock=lambda: 0.0)
        self.raw: list[bytes] = []

    async def subscribe(self, have_version: int = 0) -> None:
        sub = tables_pb2.Subscribe(proxy_id=self.proxy_id, region="local", have_version=have_version, deltas=True)
        await self.call.write(tables_pb2.WatchRequest(subscribe=sub))

    async def read(self) -> tables_pb2.TableSnapshot:
        raw = await asyncio.wait_for(self.call.read(), WAIT)
        assert isinstance(raw, bytes), raw
        self.raw.append(raw)
        return tables_pb2.TableSnapshot.FromString(raw)

    async def ack(self, message: tables_pb2.TableSnapshot, **fields: Any) -> None:
        ack = tables_pb2.Ack(version=message.version, nonce=message.nonce, **{"applied": True, **fields})
        await self.call.write(tables_pb2.WatchRequest(ack=ack))

    async def apply(self, message: tables_pb2.TableSnapshot) -> None:
        """Apply with the holder and answer as the proxy's watcher does."""
        try:
            self.holder.apply(message)
        except TableRejected as exc:
            await self.ack(message, applied=False, error=exc.reason, resync=exc.resync)
            return
        await self.ack(message)

    async def next_applied(self) -> tables_pb2.TableSnapshot:
        message = await self.read()
        await self.apply(message)
        return message


def current(h: Harness | ControlPlane) -> tables_pb2.TableSnapshot:
    cp = h.cp if isinstance(h, Harness) else h
    published = cp.controller.table_service.versions.get("local")
    assert published is not None
    return published.snapshot


def same_table(held: tables_pb2.TableSnapshot | None, h: Harness | ControlPlane) -> bool:
    if held is None:
        return False
    bare = tables_pb2.TableSnapshot()
    bare.CopyFrom(held)
    bare.nonce = ""
    return bare == current(h)


def routed(snapshot: tables_pb2.TableSnapshot | None) -> set[str]:
    return {r.replica_id for m in (snapshot.models if snapshot else ()) for r in m.replicas}


async def fleet(h: Harness, *rids: str, addresses: dict[str, str] | None = None) -> Any:
    agent = h.agent()
    infos = [replica(rid, **({"address": addresses[rid]} if addresses else {})) for rid in rids]
    await agent.register(register("n1", *infos))
    await agent.telemetry(*[load(rid) for rid in rids])
    await h.poll(lambda: routed(current(h) if h.cp.controller.table_service.versions.get("local") else None)
                 == set(rids), "the replicas in the table")
    return agent


async def drain(h: Harness, rid: str) -> None:
    await h.admin.Drain(admin_pb2.DrainRequest(replica_id=rid), timeout=WAIT)


async def test_a_drain_arrives_as_a_delta_and_gives_the_control_planes_table(clock: FakeClock) -> None:
    h = await Harness.start(clock)
    try:
        agent = await fleet(h, "a", "b", "c")
        proxy = DeltaProxy(h)
        await proxy.subscribe()
        first = await proxy.next_applied()
        assert not first.HasField("delta") and same_table(proxy.holder.snapshot, h)
        await drain(h, "b")
        message = await proxy.next_applied()
        assert message.HasField("delta") and message.delta.base_version == first.version
        assert [list(m.removed_replicas) for m in message.delta.models] == [["b"]]
        assert routed(proxy.holder.snapshot) == {"a", "c"} and same_table(proxy.holder.snapshot, h)
        assert len(proxy.raw[-1]) < len(proxy.raw[0])
        await agent.telemetry(load("a", queued=5))  # telemetry alone: a load update, no route
        message = await proxy.next_applied()
        (changes,) = message.delta.models
        assert [u.replica_id for u in changes.loads] == ["a"] and not changes.replicas
        assert same_table(proxy.holder.snapshot, h)
        await h.poll(lambda: h.cp.controller.table_service.watchers.statuses()[0].applied_version
                     == message.version, "the ack recorded")
    finally:
        await h.stop()


async def test_a_proxy_that_misses_a_delta_resyncs_with_the_full_table(clock: FakeClock) -> None:
    h = await Harness.start(clock)
    try:
        await fleet(h, "a", "b", "c")
        proxy = DeltaProxy(h)
        await proxy.subscribe()
        first = await proxy.next_applied()
        await drain(h, "a")
        missed = await proxy.read()  # lost: neither applied nor acked
        assert missed.HasField("delta")
        await drain(h, "b")
        gap = await proxy.read()
        assert gap.delta.base_version == missed.version != first.version
        await proxy.apply(gap)  # the holder refuses it: a resync
        assert proxy.holder.version == first.version
        full = await proxy.next_applied()
        assert not full.HasField("delta") and full.version == gap.version
        assert routed(proxy.holder.snapshot) == {"c"} and same_table(proxy.holder.snapshot, h)
        status = h.cp.controller.table_service.watchers.statuses()[0]
        assert "from version" in status.last_error
        await drain(h, "c")  # and deltas again after it
        message = await proxy.next_applied()
        assert message.HasField("delta") and same_table(proxy.holder.snapshot, h)
    finally:
        await h.stop()


async def test_a_nacked_delta_leaves_the_last_good_table_and_the_next_version_goes_in_full(clock: FakeClock) -> None:
    h = await Harness.start(clock)
    try:
        await fleet(h, "a", "b", "c")
        proxy = DeltaProxy(h)
        await proxy.subscribe()
        first = await proxy.next_applied()
        await drain(h, "a")
        refused = await proxy.read()
        assert refused.HasField("delta")
        await proxy.ack(refused, applied=False, error="refused by the test")  # the proxy keeps version 1
        await h.poll(lambda: h.cp.controller.table_service.watchers.statuses()[0].last_error == "refused by the test",
                     "the NACK recorded")
        assert proxy.holder.version == first.version
        await drain(h, "b")
        full = await proxy.next_applied()
        assert not full.HasField("delta") and same_table(proxy.holder.snapshot, h)
        await drain(h, "c")
        message = await proxy.next_applied()
        assert message.delta.base_version == full.version and same_table(proxy.holder.snapshot, h)
    finally:
        await h.stop()


async def test_a_proxy_that_comes_back_with_a_version_kept_gets_the_deltas_from_it(clock: FakeClock) -> None:
    h = await Harness.start(clock)
    try:
        await fleet(h, "a", "b", *[f"r{i:02d}" for i in range(20)])  # deltas lighter than the table
        proxy = DeltaProxy(h)
        await proxy.subscribe()
        first = await proxy.next_applied()
        proxy.call.cancel()
        await drain(h, "a")
        await drain(h, "b")
        again = DeltaProxy(h)
        again.holder = proxy.holder
        await again.subscribe(have_version=first.version)
        for _ in range(2):
            message = await again.next_applied()
            assert message.HasField("delta"), "two deltas from the version held"
        assert same_table(again.holder.snapshot, h)
        again.call.cancel()
        holding = DeltaProxy(h)
        holding.holder = again.holder
        await holding.subscribe(have_version=current(h).version)
        message = await holding.next_applied()  # it holds the newest: an empty delta, acked
        assert message.delta == tables_pb2.TableDelta(base_version=current(h).version)
        holding.call.cancel()
        stranger = DeltaProxy(h, "p2")
        await stranger.subscribe(have_version=12345)
        assert not (await stranger.next_applied()).HasField("delta")
    finally:
        await h.stop()


async def test_every_proxy_is_sent_the_same_bytes_serialized_once(clock: FakeClock) -> None:
    h = await Harness.start(clock)
    try:
        await fleet(h, "a", "b", "c")
        proxies = [DeltaProxy(h, f"p{i}") for i in range(3)]
        for p in proxies:
            await p.subscribe()
            await p.next_applied()
        await drain(h, "a")
        for p in proxies:
            await p.next_applied()
        push = h.cp.controller.table_service.watchers.feed.current("local")
        assert push is not None and push.delta() is push.delta()
        body = push.delta()
        assert body is not None
        assert all(p.raw[-1].startswith(body) for p in proxies)
        assert len({p.raw[-1] for p in proxies}) == 1  # the same nonce, the second send of each stream
    finally:
        await h.stop()


async def test_a_followers_proxies_get_the_leaders_tables_as_deltas(pair: Pair) -> None:
    agent = FakeAgent(pair.channels[0])
    await agent.register(register("n1", *[replica(rid) for rid in ("a", "b", "c")]))
    await agent.telemetry(*[load(rid) for rid in ("a", "b", "c")])
    proxy = DeltaProxy(pair.channels[1], "p-follower")
    await proxy.subscribe()
    async with asyncio.timeout(WAIT):
        while routed(proxy.holder.snapshot) != {"a", "b", "c"}:
            await proxy.next_applied()
    await pair.admin(0).Drain(admin_pb2.DrainRequest(replica_id="b"), timeout=WAIT)
    async with asyncio.timeout(WAIT):
        while "b" in routed(proxy.holder.snapshot):
            message = await proxy.next_applied()
            assert message.HasField("delta")
    assert same_table(proxy.holder.snapshot, pair.cps[0]) and same_table(proxy.holder.snapshot, pair.cps[1])
    proxy.call.cancel()


async def test_a_real_proxy_learns_of_a_drain_by_a_delta_and_serves_around_it(clock: FakeClock) -> None:
    h = await Harness.start(clock)
    replicas = {rid: await FakeReplica(rid, Behaviour()).start() for rid in ("a", "b")}
    proxy = Proxy(settings=ProxySettings.from_section({"proxy_id": "p-e2e", **FAST}), tenants=TENANTS,
                  control_planes=[f"127.0.0.1:{h.cp.port}"], registry=CollectorRegistry(), rng=random.Random(3))
    try:
        await fleet(h, "a", "b", addresses={rid: r.address for rid, r in replicas.items()})
        port = await proxy.start("127.0.0.1:0")
        await h.poll(lambda: routed(proxy.holder.snapshot) == {"a", "b"}, "the proxy's first table")
        await drain(h, "a")
        await h.poll(lambda: routed(proxy.holder.snapshot) == {"b"}, "the drain at the proxy")
        assert same_table(proxy.holder.snapshot, h)
        (watcher,) = h.cp.controller.table_service.watchers.of_region("local")
        assert watcher.deltas and watcher.deltas_sent >= 1 and watcher.sent - watcher.deltas_sent == 1
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            for _ in range(4):
                reply = await stub.Infer(request(model="chat"), metadata=PAID, timeout=5)
                assert reply.replica_id == "b"
    finally:
        await proxy.stop(0)
        await h.stop()
        for r in replicas.values():
            await r.stop()
