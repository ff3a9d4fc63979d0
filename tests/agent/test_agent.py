"""The agent against an in-process fake ``ferry.v1.Fleet`` server and a simulated replica."""

from __future__ import annotations

import asyncio
import itertools
import random

import pytest
import tritonclient.grpc.aio as triton
from prometheus_client import CollectorRegistry

from agent.agent import Agent, AgentMetrics, Endpoint, NodeInfo
from agent.config import AgentSettings
from agent.inventory import ReplicaSpec
from agent.replica.server import SimulatedReplica
from ferry.grpcutil import start_server
from ferry.v1 import common_pb2, fleet_pb2, fleet_pb2_grpc
from tests.agent.helpers import FAST, llm_inputs, until

READY, DRAINING, DRAINED, DEAD = (common_pb2.REPLICA_STATE_READY, common_pb2.REPLICA_STATE_DRAINING,
                                  common_pb2.REPLICA_STATE_DRAINED, common_pb2.REPLICA_STATE_DEAD)
SETTINGS = AgentSettings(telemetry_interval_seconds=0.25, backoff_initial_seconds=0.05, backoff_max_seconds=0.2,
                         probe_timeout_seconds=0.5)


class FakeFleet(fleet_pb2_grpc.FleetServicer):
    """Records every agent message with its arrival time; sends Registered, then queued commands."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.received: asyncio.Queue[tuple[float, fleet_pb2.AgentMessage]] = asyncio.Queue()
        self.commands: asyncio.Queue[fleet_pb2.Command] = asyncio.Queue()

    async def Connect(self, request_iterator, context):
        loop = asyncio.get_running_loop()

        async def pump():
            async for message in request_iterator:
                await self.received.put((loop.time(), message))

        reader = asyncio.create_task(pump())
        await context.write(fleet_pb2.ControlMessage(registered=fleet_pb2.Registered(
            control_plane_id="fake", telemetry_interval_seconds=self.interval)))
        try:
            while True:
                command = await self.commands.get()
                await context.write(fleet_pb2.ControlMessage(command=command))
        finally:
            reader.cancel()

    async def next(self, kind: str, predicate=lambda body: True, within: float = 3.0):
        """The next message with body ``kind`` that satisfies ``predicate`` (earlier ones are dropped)."""
        async def scan():
            while True:
                at, message = await self.received.get()
                if message.WhichOneof("body") == kind and predicate(getattr(message, kind)):
                    return at, getattr(message, kind)
        return await asyncio.wait_for(scan(), within)


async def start_fleet(fake: FakeFleet, listen: str = "127.0.0.1:0"):
    return await start_server([(fleet_pb2_grpc.add_FleetServicer_to_server, fake, "ferry.v1.Fleet")], listen)


def state_of(telemetry, replica_id: str) -> int:
    return next(r.state for r in telemetry.replicas if r.replica_id == replica_id)


@pytest.fixture
async def fleet():
    fake = FakeFleet()
    server, port = await start_fleet(fake)
    fake.port = port
    yield fake
    await server.stop(None)


@pytest.fixture
async def replica():
    async with SimulatedReplica("chat", "v1", params=FAST, replica_id="n1-r0") as rep:
        yield rep


def make_agent(replica, addresses):
    spec = ReplicaSpec(replica_id=replica.replica_id, model="chat", version="v1", address=replica.address,
                       kserve_model="chat", gpus=4, max_concurrency=FAST.max_running,
                       kv_block_tokens=FAST.kv_block_tokens, max_context_tokens=FAST.max_context_tokens)
    return Agent(node=NodeInfo(node="n1", region="eu", gpus=8), control_planes=addresses,
                 endpoints=[Endpoint(address=replica.address, metrics_url=replica.metrics_url, replicas=(spec,))],
                 settings=SETTINGS, rng=random.Random(7), metrics=AgentMetrics(CollectorRegistry()))


@pytest.fixture
async def agent(replica, fleet):
    a = make_agent(replica, [f"127.0.0.1:{fleet.port}"])
    await a.start()
    yield a
    await a.stop()


async def test_register_carries_node_and_replicas(agent, fleet, replica):
    _, register = await fleet.next("register")
    assert (register.node, register.region, register.gpus, register.agent_version) == ("n1", "eu", 8, "0.1.0")
    (info,) = register.replicas
    assert (info.replica_id, info.model, info.version, info.address, info.kserve_model) == (
        "n1-r0", "chat", "v1", replica.address, "chat")
    assert (info.gpus, info.max_concurrency, info.kv_block_tokens, info.max_context_tokens) == (4, 8, 16, 2048)
    assert info.state in (common_pb2.REPLICA_STATE_WARMING, READY)
    _, telemetry = await fleet.next("telemetry", lambda t: state_of(t, "n1-r0") == READY)
    load = telemetry.replicas[0]
    assert (load.kv_blocks_total, load.kv_blocks_free, load.queued, load.running) == (256, 256, 0, 0)
    await until(lambda: agent.connected)
    sample = agent.metrics.registry.get_sample_value
    assert sample("ferry_agent_connected") == 1 and sample("ferry_agent_telemetry_messages_total") >= 1
    assert sample("ferry_agent_replicas", {"state": "ready"}) == 1


async def test_telemetry_cadence_and_sequence(agent, fleet):
    await fleet.next("register")
    times, seqs = [], []
    for _ in range(6):
        at, telemetry = await fleet.next("telemetry")
        times.append(at)
        seqs.append(telemetry.seq)
    assert seqs == list(range(seqs[0], seqs[0] + 6))
    gaps = sorted(b - a for a, b in itertools.pairwise(times[1:]))  # skip the first: a state change
    assert 0.2 <= gaps[len(gaps) // 2] <= 0.4


async def test_drain_then_drained_then_undrain(agent, fleet, replica):
    await fleet.next("telemetry", lambda t: state_of(t, "n1-r0") == READY)
    async with triton.InferenceServerClient(replica.address) as client:
        async def one():
            yield {"model_name": "chat", "inputs": llm_inputs("x", 1000, stream=True)}

        stream = client.stream_infer(one())
        await stream.__anext__()
        await fleet.commands.put(fleet_pb2.Command(command_id="c1", kind=fleet_pb2.Command.KIND_DRAIN,
                                                   replica_id="n1-r0"))
        _, result = await fleet.next("result")
        assert (result.command_id, result.ok) == ("c1", True)
        await fleet.next("telemetry", lambda t: state_of(t, "n1-r0") == DRAINING and t.replicas[0].running == 1)
        stream.cancel()
    await fleet.next("telemetry", lambda t: state_of(t, "n1-r0") == DRAINED)
    await fleet.commands.put(fleet_pb2.Command(command_id="c2", kind=fleet_pb2.Command.KIND_UNDRAIN,
                                               replica_id="n1-r0"))
    _, result = await fleet.next("result")
    assert (result.command_id, result.ok) == ("c2", True)
    _, telemetry = await fleet.next("telemetry")
    assert state_of(telemetry, "n1-r0") == READY


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (fleet_pb2.Command(command_id="c3", kind=fleet_pb2.Command.KIND_DRAIN, replica_id="nope"), "unknown replica"),
        (fleet_pb2.Command(command_id="c3", kind=fleet_pb2.Command.KIND_UNSPECIFIED, replica_id="n1-r0"),
         "unknown command kind"),
    ],
    ids=["unknown-replica", "unknown-kind"],
)
async def test_bad_commands_answer_not_ok(agent, fleet, command, message):
    await fleet.next("register")
    await fleet.commands.put(command)
    _, result = await fleet.next("result")
    assert (result.command_id, result.ok) == ("c3", False) and message in result.message
    assert agent.states() == {"n1-r0": agent.states()["n1-r0"]}


async def test_reconnects_and_registers_again_after_a_restart(replica):
    fake = FakeFleet()
    server, port = await start_fleet(fake)
    agent = make_agent(replica, [f"127.0.0.1:{port}"])
    await agent.start()
    try:
        await fake.next("register")
        await until(lambda: agent.connected)
        await server.stop(None)
        await until(lambda: not agent.connected and agent.reconnects >= 1)
        async with triton.InferenceServerClient(replica.address) as client:  # replicas keep serving
            assert (await client.infer("chat", llm_inputs("still here", 2))).as_numpy("text_output") is not None
        fake = FakeFleet()
        server, _ = await start_fleet(fake, f"127.0.0.1:{port}")
        _, register = await fake.next("register")
        assert [r.replica_id for r in register.replicas] == ["n1-r0"]
        await fake.next("telemetry")
        await until(lambda: agent.connected)
    finally:
        await agent.stop()
        await server.stop(None)


async def test_tries_the_next_control_plane(replica, fleet):
    dead = "127.0.0.1:1"
    agent = make_agent(replica, [dead, f"127.0.0.1:{fleet.port}"])
    await agent.start()
    try:
        _, register = await fleet.next("register")
        assert register.node == "n1" and agent.reconnects >= 1
    finally:
        await agent.stop()


async def test_a_stopped_replica_is_reported_dead(agent, fleet, replica):
    await fleet.next("telemetry", lambda t: state_of(t, "n1-r0") == READY)
    await replica.stop()
    _, telemetry = await fleet.next("telemetry", lambda t: state_of(t, "n1-r0") == DEAD)
    assert telemetry.replicas[0].running == 0
