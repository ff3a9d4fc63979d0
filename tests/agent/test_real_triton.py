"""The adapter and the agent, unchanged, against a real Triton server (``tools/triton``, CPU, Python backend).

Needs ``.venv-triton`` (``tools/triton/setup_env.sh``); skipped without it,
unless ``CI`` or ``FERRY_REQUIRE_TRITON`` is set.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator

import pytest
import tritonclient.grpc.aio as triton
from prometheus_client import CollectorRegistry

from agent.agent import Agent, AgentMetrics, Endpoint, NodeInfo
from agent.triton import TritonEndpoint
from ferry.v1 import common_pb2
from tests.agent.helpers import llm_inputs
from tests.agent.test_agent import SETTINGS, FakeFleet, start_fleet
from tools.triton.launch import TritonEnvironmentMissing, TritonProcess, start_triton

pytestmark = [pytest.mark.triton, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonProcess]:
    try:
        process = start_triton(tmp_path_factory.mktemp("triton-agent"))
    except TritonEnvironmentMissing as exc:
        if os.environ.get("CI") or os.environ.get("FERRY_REQUIRE_TRITON"):
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))
    try:
        yield process
    finally:
        process.stop()


async def test_adapter_discovers_llms_and_reads_load(server):
    endpoint = TritonEndpoint(server.grpc, server.metrics_url, timeout_seconds=2.0)
    try:
        entries = await endpoint.discover()
        assert sorted((e.name, e.version, e.ready) for e in entries) == [("llm", "1", True), ("llm-unary", "1", True)]
        before = (await endpoint.poll([("llm-unary", "1")])).models[("llm-unary", "1")]
        async with triton.InferenceServerClient(server.grpc) as client:
            await client.infer("llm-unary", llm_inputs("hello real server", 3))
        after = (await endpoint.poll([("llm-unary", "1")])).models[("llm-unary", "1")]
        assert after.ready and after.source == "metrics" and after.queued == 0
        assert after.requests_total == before.requests_total + 1
    finally:
        await endpoint.close()


async def test_agent_adopts_the_real_endpoint(server):
    fake = FakeFleet()
    grpc_server, port = await start_fleet(fake)
    agent = Agent(node=NodeInfo(node="gpu-1"), control_planes=[f"127.0.0.1:{port}"],
                  endpoints=[Endpoint(address=server.grpc, metrics_url=server.metrics_url, adopt=True, gpus=8,
                                      http_address="127.0.0.1:9000")],  # its OpenAI front end, Envoy's way in
                  settings=SETTINGS, rng=random.Random(1), metrics=AgentMetrics(CollectorRegistry()))
    await agent.start()
    try:
        seen: dict[str, int] = {}
        while len(seen) < 2 or set(seen.values()) != {common_pb2.REPLICA_STATE_READY}:
            _, message = await fake.next("telemetry")
            seen.update({r.replica_id: r.state for r in message.replicas})
        assert sorted(seen) == ["gpu-1-llm-1", "gpu-1-llm-unary-1"]
        assert agent.inventory.replicas["gpu-1-llm-1"].spec.address == server.grpc
        assert agent.inventory.replicas["gpu-1-llm-1"].spec.http_address == "127.0.0.1:9000"
    finally:
        await agent.stop()
        await grpc_server.stop(None)
