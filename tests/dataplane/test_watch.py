"""The Tables.Watch client: ACK/NACK, serving on the last table, reconnect and resync."""

from __future__ import annotations

import random

import grpc
import pytest
from prometheus_client import CollectorRegistry

from dataplane.config import ProxySettings
from dataplane.server import Proxy
from ferry.v1 import inference_pb2_grpc
from tests.dataplane.conftest import FAST, PAID, TENANTS, request
from tests.dataplane.fakes import Behaviour, FakeControlPlane, FakeReplica, route, snapshot

pytestmark = pytest.mark.timeout(20)


async def test_rejected_snapshot_is_nacked_and_the_last_good_table_stays(rig) -> None:
    r = await rig({"r1": Behaviour(), "r2": Behaviour()})
    bad = snapshot(2, [route(r.replicas["r1"]), route(r.replicas["r1"])])  # r1 twice
    r.cp.push(bad)
    ack = await r.cp.next_ack()
    assert (ack.version, ack.nonce, ack.applied) == (2, "n2", False)
    assert "'r1' appears twice" in ack.error
    assert r.proxy.holder.version == 1
    assert r.proxy.metrics.value("proxy_table_rejections_total") == 1
    reply = await r.stub.Infer(request(), metadata=PAID, timeout=5)
    assert reply.replica_id in ("r1", "r2")
    r.cp.push(snapshot(3, [route(r.replicas["r2"])]))
    ack = await r.cp.next_ack()
    assert ack.applied and ack.version == 3 and ack.error == ""
    assert r.proxy.metrics.value("proxy_table_version") == 3
    assert (await r.stub.Infer(request(), metadata=PAID, timeout=5)).replica_id == "r2"


async def test_serves_on_last_table_without_control_plane_and_resyncs(rig) -> None:
    r = await rig({"r1": Behaviour(), "r2": Behaviour()})
    first = await r.cp.subscribes.get()
    assert (first.proxy_id, first.region, first.have_version) == ("p-test", "local", 0)
    port = r.cp.port
    await r.cp.stop()
    for _ in range(3):
        assert (await r.stub.Infer(request(), metadata=PAID, timeout=5)).text
    back = FakeControlPlane(snapshot(7, [route(r.replicas["r2"])]))
    await back.start(port)
    try:
        again = await back.subscribes.get()
        assert again.have_version == 1
        ack = await back.next_ack()
        assert ack.applied and ack.version == 7
        assert r.proxy.holder.version == 7
        assert (await r.stub.Infer(request(), metadata=PAID, timeout=5)).replica_id == "r2"
    finally:
        await back.stop()


async def test_moves_along_the_list_of_control_planes() -> None:
    replica = await FakeReplica("r1").start()
    cp = await FakeControlPlane(snapshot(4, [route(replica)])).start()
    proxy = Proxy(settings=ProxySettings.from_section({"proxy_id": "p2", **FAST}), tenants=TENANTS,
                  control_planes=["127.0.0.1:1", cp.address], registry=CollectorRegistry(), rng=random.Random(1))
    port = await proxy.start()
    try:
        ack = await cp.next_ack()
        assert ack.applied and ack.version == 4
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = await inference_pb2_grpc.InferenceStub(channel).Infer(request(), metadata=PAID, timeout=5)
        assert reply.replica_id == "r1"
    finally:
        await proxy.stop(0)
        await cp.stop()
        await replica.stop()


async def test_no_table_yet_is_unavailable() -> None:
    proxy = Proxy(settings=ProxySettings.from_section({"proxy_id": "p3", **FAST}), tenants=TENANTS,
                  control_planes=["127.0.0.1:1"], registry=CollectorRegistry())
    port = await proxy.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await inference_pb2_grpc.InferenceStub(channel).Infer(request(), metadata=PAID, timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "table" in info.value.details()
    finally:
        await proxy.stop(0)
