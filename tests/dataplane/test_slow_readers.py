"""Slow readers: an unread stream holds a bounded buffer at the proxy, and past its timeout frees its replica.

A real proxy and a simulated replica (over KServe v2 gRPC, in process); the
unread clients' channels keep a small receive window (no BDP probing, 1 KiB
lookahead), so the proxy's writes to them wait at once.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from agent.replica.engine import EngineParams
from agent.replica.server import SimulatedReplica
from dataplane.config import ProxySettings
from dataplane.failover.continuation import JOIN_PIECES, Delivered
from dataplane.forward.kserve import Piece
from dataplane.server import Proxy
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tests.dataplane.conftest import FAST, PAID, TENANTS
from tests.dataplane.fakes import FakeControlPlane, route, snapshot

pytestmark = pytest.mark.timeout(30)

UNREAD_TIMEOUT = 0.5
SMALL_WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)]
# Long enough that an unread stream is cancelled long before its replica would finish it (3,000 steps of 5 ms).
LONG = {"prompt": "a b c", "max_tokens": 3000, "tier": common_pb2.TIER_STANDARD}


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[SimulatedReplica, Proxy, str]]:
    replica = await SimulatedReplica("m-kserve", "v1", params=EngineParams(
        max_running=8, decode_base_seconds=0.005, decode_seconds_per_request=0.0)).start()
    cp = FakeControlPlane(snapshot(1, [route("sim", replica.address, max_concurrency=16)]))
    await cp.start()
    proxy = Proxy(settings=ProxySettings.from_section({"proxy_id": "p-slow", **FAST,
                                                       "stream_unread_timeout_seconds": UNREAD_TIMEOUT}),
                  tenants=TENANTS, control_planes=[cp.address], registry=CollectorRegistry(), rng=random.Random(3))
    port = await proxy.start("127.0.0.1:0")
    assert (await cp.next_ack()).applied
    try:
        yield replica, proxy, f"127.0.0.1:{port}"
    finally:
        await proxy.stop(0)
        await cp.stop()
        await replica.stop()


async def running(replica: SimulatedReplica) -> int:
    assert replica.runner is not None
    return replica.runner.engine.load().running


async def test_unread_streams_are_cancelled_upstream_and_others_are_served_meanwhile(fleet: Any) -> None:
    replica, proxy, address = fleet
    async with grpc.aio.insecure_channel(address, options=SMALL_WINDOW) as slow, \
            grpc.aio.insecure_channel(address) as fast:
        unread = [inference_pb2_grpc.InferenceStub(slow).InferStream(
            inference_pb2.InferRequest(model="m", **LONG), metadata=PAID, timeout=10) for _ in range(4)]
        for call in unread:
            assert (await call.read()).text  # they started, then nobody reads
        assert await running(replica) == 4
        # Meanwhile, other requests are served (the unread ones hold 4 of the replica's 8 slots).
        reader = inference_pb2_grpc.InferenceStub(fast)
        for i in range(5):
            reply = await reader.Infer(inference_pb2.InferRequest(model="m", prompt=f"x {i}", max_tokens=8,
                                                                  tier=common_pb2.TIER_INTERACTIVE),
                                       metadata=PAID, timeout=5)
            assert reply.completion_tokens == 8
        # Past the unread timeout each unread stream is cancelled upstream: the replica's slots are freed.
        assert replica.runner is not None
        for _ in range(300):  # polled: the replica has no event for it
            if replica.runner.engine.load().cancelled == 4:
                break
            await asyncio.sleep(0.01)
        load = replica.runner.engine.load()
        assert load.running == 0 and load.cancelled == 4, load
        failed = proxy.metrics.requests.labels("m", "standard", "RESOURCE_EXHAUSTED")._value.get()
        assert failed == 4 and proxy.router.inflight == 0
        # A client that reads at last gets what was buffered, then the status naming why its stream ended.
        for call in unread:
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                while await call.read() is not grpc.aio.EOF:
                    pass
            assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (ended.value.details() or "").startswith("stream: not read for 0.5 s"), ended.value.details()


def test_a_long_stream_holds_its_text_as_one_string_not_its_pieces() -> None:
    delivered = Delivered()
    for i in range(1000):
        delivered.add(Piece(f"w{i} ", 1))
    assert len(delivered.texts) <= JOIN_PIECES and delivered.tokens == 1000
    assert delivered.text == "".join(f"w{i} " for i in range(1000))
