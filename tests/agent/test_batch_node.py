"""The agent over ferry's batch runtime: registration, load from its metrics, a GPU failure, ``ferry node`` flags."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from agent.agent import Agent, AgentMetrics, NodeInfo
from agent.batch import metrics
from agent.batch.dispatch import ModelContract
from agent.batch.gpusched import SchedulerConfig
from agent.batch.host import HostedRuntime, RuntimeSpec, spec_from_args
from agent.batch.reference import transform
from agent.batch.runtime import BatchRuntime, HostedModel
from agent.batch.server import serve
from agent.main import BATCH_PREFIX, batch_endpoint, build_parser
from agent.scrape import Samples, parse
from agent.triton import from_metrics
from ferry.errors import ConfigError
from ferry.v1 import common_pb2
from tests.agent.test_agent import SETTINGS, FakeFleet, start_fleet, state_of
from tests.batch.fakes import GatedBackend

pytestmark = pytest.mark.timeout(30)
READY, WARMING = common_pb2.REPLICA_STATE_READY, common_pb2.REPLICA_STATE_WARMING
SLOW = dataclasses.replace(SETTINGS, telemetry_interval_seconds=1.0)


class Node:
    """A batch runtime on 2 GPUs (small model ``s``, gang model ``g``) behind its own KServe server."""

    def __init__(self, hosted: HostedRuntime, backend: GatedBackend) -> None:
        self.hosted, self.backend = hosted, backend

    @property
    def runtime(self) -> BatchRuntime:
        return self.hosted.runtime


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    backend = GatedBackend()
    contracts = [ModelContract(name="s", max_batch=2, max_wait_s=30.0),  # batches leave full, never on the timer
                 ModelContract(name="g", gpus_per_batch=2, max_batch=2, max_wait_s=30.0)]
    runtime = BatchRuntime([HostedModel(c, backend) for c in contracts], SchedulerConfig(gpus=2), version="v1")
    await runtime.start()
    server, port = await serve(runtime, "127.0.0.1:0", allow_faults=True)
    http, metrics_port = await metrics.serve("127.0.0.1:0", runtime.metrics)
    hosted = HostedRuntime(runtime, server, http, host="127.0.0.1", port=port, metrics_port=metrics_port)
    try:
        yield Node(hosted, backend)
    finally:
        backend.gate.set()
        await hosted.stop(grace=0)


def load_of(telemetry, replica_id: str):  # type: ignore[no-untyped-def]
    return next(r for r in telemetry.replicas if r.replica_id == replica_id)


async def test_agent_reports_batch_load_and_a_gang_model_that_lost_a_gpu(node: Node) -> None:
    fake = FakeFleet(interval=SLOW.telemetry_interval_seconds)  # so that a prompt report stands out
    server, port = await start_fleet(fake)
    spec = RuntimeSpec(model="s", gang_model="g", gpus=2, version="v1")
    agent = Agent(node=NodeInfo(node="n1", gpus=2), control_planes=[f"127.0.0.1:{port}"],
                  endpoints=[batch_endpoint("n1", node.hosted, spec)], settings=SLOW, rng=random.Random(1),
                  metrics=AgentMetrics(CollectorRegistry()))
    node.runtime._on_change = agent.poll_now
    await agent.start()
    try:
        _, register = await fake.next("register")
        assert [(r.replica_id, r.model, r.version, r.gpus, r.max_concurrency) for r in register.replicas] == [
            ("n1-b0", "s", "v1", 1, 8), ("n1-b1", "g", "v1", 2, 4)]  # 2 batches in flight x max 2 x slots
        calls = [asyncio.create_task(node.runtime.infer("s", f"r{i}", tenant=f"t{i % 2}")) for i in range(6)]
        await node.backend.wait_started(2)  # two batches of 2 on the two GPUs, 2 requests pending
        _, seen = await fake.next("telemetry", lambda t: load_of(t, "n1-b0").running == 4, within=5)
        small = load_of(seen, "n1-b0")
        assert (small.state, small.queued, small.running) == (READY, 2, 4)
        assert 0 < small.gpu_utilization <= 1 and state_of(seen, "n1-b1") == READY

        report = node.runtime.kill_gpu(1)  # one GPU of two: the gang model cannot run on this node any more
        assert report.unavailable == ("g",) and len(report.requeued) == 2
        at_kill = asyncio.get_running_loop().time()
        at, seen = await fake.next("telemetry", lambda t: state_of(t, "n1-b1") == WARMING, within=5)
        assert at - at_kill < SLOW.telemetry_interval_seconds / 2  # polled at once, not at the next interval
        assert (load_of(seen, "n1-b0").queued, load_of(seen, "n1-b0").running) == (4, 2)
        if agent.inventory.replicas["n1-b0"].spec.max_concurrency != 4:  # 2 batches x 2 x one healthy slot
            await fake.next("telemetry", lambda t: [(c.replica_id, c.max_concurrency) for c in t.changed
                                                    if c.replica_id == "n1-b0"] == [("n1-b0", 4)], within=5)
        assert agent.inventory.replicas["n1-b0"].spec.max_concurrency == 4

        node.backend.gate.set()
        answers = await asyncio.gather(*calls)
        assert sorted(a.text for a in answers) == sorted(transform(f"r{i}") for i in range(6))
        assert node.runtime.counters["s"].answered == 6 and node.runtime.counters["s"].aborted == 1

        node.runtime.restore_gpu(1)
        _, seen = await fake.next("telemetry", lambda t: state_of(t, "n1-b1") == READY, within=5)
        assert agent.inventory.replicas["n1-b0"].spec.max_concurrency == 8  # both slots back
    finally:
        await agent.stop()
        await server.stop(None)


async def test_from_metrics_reads_the_runtimes_exposition(node: Node) -> None:
    calls = [asyncio.create_task(node.runtime.infer("s", f"r{i}")) for i in range(5)]
    await node.backend.wait_started(2)
    samples = Samples(parse(node.runtime.metrics.render()))
    small = from_metrics(samples, "s", "v1", ready=True)
    assert (small.queued, small.running, small.max_concurrency, small.requests_total) == (1, 4, 8, 0)
    assert small.gpu_utilization > 0
    gang = from_metrics(samples, "g", "v1", ready=True)
    assert (gang.queued, gang.running, gang.max_concurrency) == (0, 0, 4)
    node.backend.gate.set()
    await asyncio.gather(*calls[:4])
    done = from_metrics(Samples(parse(node.runtime.metrics.render())), "s", "v1", ready=True)
    assert (done.queued, done.running, done.requests_total) == (1, 0, 4)  # the fifth waits for its timer


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param([], {"model": "batchstring", "gang_model": None, "version": "v1", "gpus": 8, "max_batch": 100,
                          "budget_ms": 500.0, "aging": True, "allow_faults": False}, id="defaults"),
        pytest.param(["--batch-model", "b", "--batch-gang-model", "big", "--batch-max-batch", "50", "--batch-ms", "80",
                      "--batch-no-aging", "--allow-fault-injection", "--gpus", "2", "--batch-version", "v3"],
                     {"model": "b", "gang_model": "big", "version": "v3", "gpus": 2, "max_batch": 50,
                      "batch_ms": 80.0, "aging": False, "allow_faults": True}, id="all-flags"),
    ],
)
def test_node_batch_flags(argv: list[str], expected: dict[str, object]) -> None:
    args = build_parser().parse_args(["--control-plane", "127.0.0.1:1", "--batch-runtime", *argv])
    spec = spec_from_args(args, gpus=args.gpus, prefix=BATCH_PREFIX)
    assert {k: getattr(spec, k) for k in expected} == expected


@pytest.mark.parametrize(
    "argv",
    [["--batch-max-batch", "0"], ["--batch-gang-model", "batchstring"], ["--batch-budget-ms", "100"],
     ["--batch-gpus-per-batch", "9"]],
    ids=["empty-batch", "gang-same-name", "budget-too-small", "more-gpus-than-the-node"],
)
def test_bad_batch_flags_raise_config_error(argv: list[str]) -> None:
    args = build_parser().parse_args(["--control-plane", "127.0.0.1:1", "--batch-runtime", *argv])
    with pytest.raises(ConfigError):
        spec_from_args(args, gpus=args.gpus, prefix=BATCH_PREFIX)
