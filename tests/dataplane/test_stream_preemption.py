"""Preemptible streams: a batch stream gives its slot to waiting standard work and is continued afterwards.

A real proxy and a simulated replica (KServe v2 gRPC, in process) whose
concurrency target is 4. Batch streams fill the 4 slots; standard requests
arrive. The streams are preempted (upstream call cancelled, slot freed at
once), the standard requests are served, and each stream, once its client
reads again, waits in its queue, is continued from what it delivered and
ends with exactly ``max_tokens`` tokens, one final chunk, no error. Both
cases: clients that stop reading (the proxy's writes to them wait) and
clients that keep reading.
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
from dataplane.admission.queues import QueueParams, Ticket, TierQueues
from dataplane.config import ProxySettings
from dataplane.server import Proxy
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tests.dataplane.conftest import FAST, PAID, TENANTS
from tests.dataplane.fakes import FakeControlPlane, route, snapshot

pytestmark = pytest.mark.timeout(60)

SMALL_WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)]
STREAM_TOKENS = 300  # 300 decode steps of 5 ms: running long after the standard requests arrive
BATCH = {"prompt": "a b c", "max_tokens": STREAM_TOKENS, "tier": common_pb2.TIER_BATCH}


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[SimulatedReplica, Proxy, str]]:
    replica = await SimulatedReplica("m-kserve", "v1", params=EngineParams(
        max_running=8, decode_base_seconds=0.005, decode_seconds_per_request=0.0)).start()
    cp = FakeControlPlane(snapshot(1, [route("sim", replica.address, max_concurrency=4)]))
    await cp.start()
    settings = ProxySettings.from_section({"proxy_id": "p-preempt", **FAST, "stream_unread_timeout_seconds": 30.0,
                                           "interactive_headroom_max_share": 0.0})
    proxy = Proxy(settings=settings, tenants=TENANTS, control_planes=[cp.address], registry=CollectorRegistry(),
                  rng=random.Random(5))
    port = await proxy.start("127.0.0.1:0")
    assert (await cp.next_ack()).applied
    try:
        yield replica, proxy, f"127.0.0.1:{port}"
    finally:
        await proxy.stop(0)
        await cp.stop()
        await replica.stop()


def preempted(proxy: Proxy) -> float:
    """Streams and unary requests of model ``m`` preempted so far."""
    return sum(proxy.router.admission.metrics.preempted.labels("m", reason)._value.get()
               for reason in ("reclaim", "room"))


async def read_all(call: Any) -> tuple[int, str, Any]:
    """Read a stream to its end: (tokens of its chunks, its text, the final chunk's summary)."""
    tokens, text, summary = 0, [], None
    while (chunk := await call.read()) is not grpc.aio.EOF:
        assert summary is None, "a chunk after the final one"
        tokens += chunk.tokens
        text.append(chunk.text)
        if chunk.final:
            summary = chunk.summary
    return tokens, "".join(text), summary


async def standard_requests(stub: Any, n: int) -> list[Any]:
    """``n`` standard requests at once; each must be answered in full."""
    replies = await asyncio.gather(*(stub.Infer(inference_pb2.InferRequest(
        model="m", prompt=f"s {i}", max_tokens=8, tier=common_pb2.TIER_STANDARD), metadata=PAID, timeout=20)
        for i in range(n)))
    assert [r.completion_tokens for r in replies] == [8] * n
    return replies


async def test_unread_batch_streams_give_their_slots_to_standard_then_finish_in_full(fleet: Any) -> None:
    replica, proxy, address = fleet
    async with grpc.aio.insecure_channel(address, options=SMALL_WINDOW) as slow, \
            grpc.aio.insecure_channel(address) as fast:
        streams = [inference_pb2_grpc.InferenceStub(slow).InferStream(
            inference_pb2.InferRequest(model="m", **BATCH), metadata=PAID, timeout=40) for _ in range(4)]
        first = [await call.read() for call in streams]  # they started, then nobody reads
        assert all(chunk.tokens for chunk in first)
        assert proxy.router.admission.models["m"].running("batch") == 4
        await standard_requests(inference_pb2_grpc.InferenceStub(fast), 4)
        assert preempted(proxy) >= 1
        # Each stream, read at last, is continued from what it delivered: all its tokens, once.
        for call, head in zip(streams, first, strict=True):
            tokens, _, summary = await read_all(call)
            assert head.tokens + tokens == STREAM_TOKENS
            assert summary is not None and summary.completion_tokens == STREAM_TOKENS
            assert summary.finish_reason == "length"
            assert await call.code() == grpc.StatusCode.OK
    assert proxy.router.inflight == 0
    assert proxy.router.admission.models["m"].running("batch") == 0
    assert replica.runner is not None and replica.runner.engine.load().cancelled >= 1  # cut upstream
    continued = proxy.metrics.continuations.labels("m", "preempted")._value.get()
    assert continued == preempted(proxy)


async def test_read_batch_streams_are_preempted_and_continued_while_they_are_read(fleet: Any) -> None:
    replica, proxy, address = fleet
    async with grpc.aio.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        streams = [stub.InferStream(inference_pb2.InferRequest(model="m", **BATCH), metadata=PAID, timeout=40)
                   for _ in range(4)]
        readers = [asyncio.create_task(read_all(call)) for call in streams]
        queues = proxy.router.admission.models["m"]
        for _ in range(500):  # polled: the four streams are running
            if queues.running("batch") == 4:
                break
            await asyncio.sleep(0.01)
        assert queues.running("batch") == 4
        await standard_requests(stub, 4)
        assert preempted(proxy) >= 1
        for tokens, text, summary in await asyncio.gather(*readers):
            assert tokens == STREAM_TOKENS and summary.completion_tokens == STREAM_TOKENS
            assert text.startswith("the")
    assert proxy.router.inflight == 0
    assert replica.runner is not None and replica.runner.engine.load().running == 0


def test_a_parked_stream_frees_its_slot_and_goes_back_to_the_head_of_its_queue() -> None:
    queues = TierQueues(QueueParams(max_queued=100, headroom_max_share=0.0), capacity=2)
    tickets = [Ticket(tenant="t", plan="paid", tier="batch", cost=10, deadline=100.0) for _ in range(3)]
    for ticket in tickets:
        queues.offer(ticket, 0.0)
    started = queues.dispatch(0.0)
    assert started == tickets[:2] and queues.running("batch") == 2
    queues.park(started[0])
    assert started[0].state == "parked" and queues.running("batch") == 1
    assert queues.dispatch(0.1) == [tickets[2]]  # its slot went to the next at once
    queues.requeue(started[0], 0.2)  # its client read again: first in line
    assert started[0].state == "queued" and queues.depth("batch") == 1
    queues.finish(tickets[2])
    assert queues.dispatch(0.3) == [started[0]]
    queues.park(tickets[1])
    queues.finish(tickets[1])  # a parked stream whose client went away: nothing left counted
    queues.finish(started[0])
    assert queues.running("batch") == 0 and queues.depth("batch") == 0


def test_a_stream_out_of_continuations_is_never_preempted() -> None:
    queues = TierQueues(QueueParams(max_queued=100, headroom_max_share=0.0), capacity=1)
    stream = Ticket(tenant="t", plan="paid", tier="batch", cost=10, deadline=100.0)
    stream.preemptible = False
    queues.offer(stream, 0.0)
    assert queues.dispatch(0.0) == [stream]
    standard = Ticket(tenant="u", plan="paid", tier="standard", cost=10, deadline=100.0)
    queues.offer(standard, 0.1)
    assert queues.dispatch(0.1) == [] and queues.preemptions() == []
