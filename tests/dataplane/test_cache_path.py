"""The response cache on the request path: a real proxy and a simulated replica (KServe v2 gRPC, in process).

The cache turns on for the model once its measured duplicate share is above
the threshold (here: any duplicate, after 2 deterministic requests). Then:
a tenant's repeat is answered from the cache (no replica id, no attempt);
another tenant's identical request is never answered with the first
tenant's entry (it goes to the replica, then has an entry of its own); a
stream is replayed with the chunks it was first delivered in; a request
that is not deterministic is neither measured nor cached; a table whose
version changed drops the answers of the old one; the usage report carries
the measurement per tenant.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from agent.replica.engine import EngineParams
from agent.replica.server import SimulatedReplica
from agent.replica.tensors import SAMPLING_INPUTS
from dataplane.config import ProxySettings
from dataplane.server import Proxy
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tests.dataplane.conftest import FAST, KEYS, PAID, TENANTS
from tests.dataplane.fakes import FakeControlPlane, route, snapshot

pytestmark = pytest.mark.timeout(60)

FREE = (("x-api-key", KEYS["free"]),)
CACHE = {"cache_min_requests": 2, "cache_enable_above": 0.0, "cache_disable_below": 0.0}


def table(version: int, replica: SimulatedReplica, model_version: str = "v1") -> Any:
    r = route("sim", replica.address, max_concurrency=8, version=model_version)
    r.inputs.extend(SAMPLING_INPUTS)  # the replica accepts temperature and seed
    return snapshot(version, [r], default_version=model_version)


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[Proxy, FakeControlPlane, SimulatedReplica, Any]]:
    replica = await SimulatedReplica("m-kserve", "v1", params=EngineParams(decode_base_seconds=0.001)).start()
    cp = FakeControlPlane(table(1, replica))
    await cp.start()
    proxy = Proxy(settings=ProxySettings.from_section({"proxy_id": "p-cache", **FAST, **CACHE}), tenants=TENANTS,
                  control_planes=[cp.address], registry=CollectorRegistry(), rng=random.Random(3))
    port = await proxy.start("127.0.0.1:0")
    assert (await cp.next_ack()).applied
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield proxy, cp, replica, inference_pb2_grpc.InferenceStub(channel)
    finally:
        await channel.close()
        await proxy.stop(0)
        await cp.stop()
        await replica.stop()


def ask(prompt: str, **fields: Any) -> inference_pb2.InferRequest:
    base: dict[str, Any] = {"model": "m", "prompt": prompt, "max_tokens": 6, "tier": common_pb2.TIER_STANDARD,
                            "temperature": 0.0}
    return inference_pb2.InferRequest(**{**base, **fields})


async def turn_on(stub: Any, proxy: Proxy) -> None:
    """Two identical deterministic requests: a duplicate share of 1/2, above the threshold of 0."""
    for _ in range(2):
        assert (await stub.Infer(ask("warm up"), metadata=PAID, timeout=10)).replica_id == "sim"
    assert proxy.router.cache.enabled("m")


async def test_a_tenant_never_reads_another_tenants_cached_answer(fleet: Any) -> None:
    proxy, _, _, stub = fleet
    assert not proxy.router.cache.enabled("m")
    await turn_on(stub, proxy)
    first = await stub.Infer(ask("which team owns this?"), metadata=PAID, timeout=10)
    again = await stub.Infer(ask("which team owns this?"), metadata=PAID, timeout=10)
    assert first.replica_id == "sim" and first.attempts == 1
    assert again.replica_id == "" and again.attempts == 0  # answered from the cache
    assert again.text == first.text and again.completion_tokens == first.completion_tokens
    # the other tenant, the same payload: its own request reaches the replica, never acme's entry
    other = await stub.Infer(ask("which team owns this?"), metadata=FREE, timeout=10)
    assert other.replica_id == "sim" and other.attempts == 1
    other_again = await stub.Infer(ask("which team owns this?"), metadata=FREE, timeout=10)
    assert other_again.replica_id == ""  # now from its own entry
    hits = proxy.metrics.registry.get_sample_value("ferry_proxy_cache_hits_total", {"model": "m"})
    assert hits == 2
    assert proxy.metrics.registry.get_sample_value("ferry_proxy_cache_enabled", {"model": "m"}) == 1
    rows = {(r.tenant, r.deterministic, r.duplicates, r.hits, r.enabled) for r in proxy._usage_report().cache}
    assert rows == {("acme", 4, 2, 1, True), ("hobby", 2, 1, 1, True)}


async def test_a_stream_is_replayed_with_the_chunking_it_was_delivered_with(fleet: Any) -> None:
    proxy, _, _, stub = fleet
    await turn_on(stub, proxy)

    async def chunks() -> tuple[list[tuple[str, int]], inference_pb2.InferResponse]:
        out, summary = [], None
        async for chunk in stub.InferStream(ask("tell me a story", max_tokens=12), metadata=PAID, timeout=10):
            if chunk.final:
                summary = chunk.summary
            else:
                out.append((chunk.text, chunk.tokens))
        assert summary is not None
        return out, summary

    first, summary = await chunks()
    replayed, replay_summary = await chunks()
    assert len(first) > 1 and summary.replica_id == "sim"
    assert replayed == first and replay_summary.replica_id == ""
    assert replay_summary.completion_tokens == summary.completion_tokens == 12
    # a unary request of the same payload is answered from the stream's entry, with its text
    unary = await stub.Infer(ask("tell me a story", max_tokens=12), metadata=PAID, timeout=10)
    assert unary.replica_id == "" and unary.text == "".join(t for t, _ in first)


async def test_requests_that_are_not_deterministic_are_neither_measured_nor_cached(fleet: Any) -> None:
    proxy, _, _, stub = fleet
    await turn_on(stub, proxy)
    for fields in ({"temperature": 0.7}, {}, {"top_p": 0.5}):  # a temperature above 0, or the model's default
        for _ in range(2):
            request = ask("roll a die", **fields)
            if "temperature" not in fields:
                request.ClearField("temperature")
            assert (await stub.Infer(request, metadata=PAID, timeout=10)).replica_id == "sim"
    seeded = [await stub.Infer(ask("roll a die", temperature=0.9, seed=7), metadata=PAID, timeout=10)
              for _ in range(2)]
    assert [r.replica_id for r in seeded] == ["sim", ""]  # a seed makes it deterministic
    [row] = proxy._usage_report().cache
    assert (row.deterministic, row.duplicates) == (4, 2)  # the warm-up's two and the seeded two


async def test_a_new_version_in_the_table_drops_the_old_answers(fleet: Any) -> None:
    proxy, cp, replica, stub = fleet
    await turn_on(stub, proxy)
    assert len(proxy.router.cache.cache) == 1  # the warm-up's answer
    cp.push(table(2, replica, model_version="v2"))
    assert (await cp.next_ack()).applied
    assert len(proxy.router.cache.cache) == 0
