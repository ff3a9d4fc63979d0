"""Agent admission on the control plane: join token or certificate, claims, hostile telemetry."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from agent.agent import Agent, AgentMetrics, NodeInfo
from agent.config import AgentSettings
from controlplane.api.auth import AdminAuth
from controlplane.api.join import JoinCheck, sha256_hex
from controlplane.config import ControlPlaneSettings
from controlplane.fleet.telemetry import TelemetryRate
from controlplane.server import ControlPlane
from ferry import tls
from ferry.config import ModelConfig
from ferry.errors import Overloaded
from ferry.v1 import admin_pb2, common_pb2, fleet_pb2
from ferry_cli.ctl.client import AdminClient
from tests.controlplane.fakes import GRACE, TOKEN, FakeAgent, FakeClock, Harness, fleet_with, register, replica

JOIN = "fjt_secret-join-token"
S = common_pb2.ReplicaState


def metric(h: Harness, name: str, **labels: str) -> float:
    value = h.cp.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def queued(h: Harness, replica_id: str) -> int | None:
    member = h.cp.controller.fleet.find(replica_id)
    load = None if member is None else member.loads.get(replica_id)
    return None if load is None else load.queued


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    """A control plane (plain text) with open admission."""
    h = await Harness.start(FakeClock())
    try:
        yield h
    finally:
        await h.stop()


@pytest.fixture
async def guarded() -> AsyncIterator[Harness]:
    """A control plane (plain text) that wants the join token JOIN."""
    h = await Harness.start(FakeClock(), join_token_sha256=sha256_hex(JOIN))
    try:
        yield h
    finally:
        await h.stop()


def with_token(reg: fleet_pb2.Register, token: str) -> fleet_pb2.Register:
    reg.join_token = token
    return reg


TOKENS = [("none", "", "required"), ("wrong", "fjt_guess", "not accepted"), ("empty-space", " ", "not accepted")]


@pytest.mark.parametrize(("token", "why"), [c[1:] for c in TOKENS], ids=[c[0] for c in TOKENS])
async def test_an_agent_without_a_valid_join_token_is_refused(guarded: Harness, token: str, why: str) -> None:
    agent = guarded.agent()
    await agent.send(register=with_token(register("n1", replica("n1/r0")), token))
    code, details = await agent.status()
    assert code == grpc.StatusCode.UNAUTHENTICATED and details.startswith("register.join_token") and why in details
    assert JOIN not in details
    assert (await guarded.replicas()) == {}  # nothing of it reached the fleet
    assert metric(guarded, "ferry_controlplane_rejected_messages_total", reason="register_unauthenticated") == 1


async def test_an_agent_with_the_join_token_is_admitted(guarded: Harness) -> None:
    registered = await guarded.agent().register(with_token(register("n1", replica("n1/r0")), JOIN))
    assert registered.control_plane_id
    assert set(await guarded.replicas()) == {"n1/r0"}


CLAIMS = [
    ("replica-id", register("n2", replica("n1/r0", address="127.0.0.2:7000")), "register.replicas[0].replica_id"),
    ("address", register("n2", replica("n2/r0", address=replica("n1/r0").address)), "register.replicas[0].address"),
    ("node-from-another-host", register("n1", replica("n1/r9", address="10.0.0.9:7000")), "register.node"),
]


@pytest.mark.parametrize(("claim", "field"), [c[1:] for c in CLAIMS], ids=[c[0] for c in CLAIMS])
async def test_a_claim_on_what_a_live_node_holds_is_refused_naming_the_field(
        harness: Harness, claim: fleet_pb2.Register, field: str) -> None:
    holder = harness.agent()
    await holder.register(register("n1", replica("n1/r0")))
    intruder = harness.agent()
    await intruder.send(register=claim)
    code, details = await intruder.status()
    assert code == grpc.StatusCode.ALREADY_EXISTS and details.split(":")[0] == field, details
    views = await harness.replicas()
    assert set(views) == {"n1/r0"} and views["n1/r0"].node == "n1"
    assert metric(harness, "ferry_controlplane_rejected_messages_total", reason="register_conflict") == 1


def good_load(**kw: Any) -> common_pb2.ReplicaLoad:
    fields: dict[str, Any] = {"replica_id": "n1/r0", "state": S.REPLICA_STATE_READY, "queued": 1, "running": 2,
                              "kv_blocks_free": 10, "kv_blocks_total": 20, "gpu_utilization": 0.5}
    fields.update(kw)
    return common_pb2.ReplicaLoad(**fields)


HOSTILE = [
    ("nan-utilization", [good_load(gpu_utilization=math.nan)], "telemetry.replicas[0].gpu_utilization"),
    ("inf-utilization", [good_load(gpu_utilization=math.inf)], "telemetry.replicas[0].gpu_utilization"),
    ("negative-utilization", [good_load(gpu_utilization=-0.1)], "telemetry.replicas[0].gpu_utilization"),
    ("utilization-over-one", [good_load(gpu_utilization=7.0)], "telemetry.replicas[0].gpu_utilization"),
    ("huge-queue", [good_load(queued=2**32 - 1)], "telemetry.replicas[0].queued"),
    ("huge-running", [good_load(running=10**9)], "telemetry.replicas[0].running"),
    ("free-over-total", [good_load(kv_blocks_free=21)], "telemetry.replicas[0].kv_blocks_free"),
    ("huge-kv", [good_load(kv_blocks_total=2**31, kv_blocks_free=0)], "telemetry.replicas[0].kv_blocks_total"),
    ("unknown-state", [good_load(state=99)], "telemetry.replicas[0].state"),
    ("twice", [good_load(), good_load(queued=3)], "telemetry.replicas[1].replica_id"),
    ("too-many", [good_load(replica_id=f"x{i}") for i in range(65)], "telemetry.replicas"),
]


@pytest.mark.parametrize(("loads", "field"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
async def test_hostile_telemetry_is_refused_naming_the_field_and_not_applied(
        harness: Harness, loads: list[common_pb2.ReplicaLoad], field: str) -> None:
    agent = harness.agent()
    await agent.register(register("n1", replica("n1/r0")))
    # a valid load first, then the hostile message: the valid one must remain, nothing of the other
    await agent.telemetry(good_load(queued=1), good_load(replica_id="n1/r0-ghost"))
    await harness.poll(lambda: queued(harness, "n1/r0") == 1, "the valid load")
    await agent.telemetry(*loads, good_load(replica_id="n1/r0", queued=55))
    code, details = await agent.status()
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.split(":")[0] == field, details
    view = (await harness.replicas())["n1/r0"]
    assert (view.load.queued, view.load.gpu_utilization) == (1, 0.5)
    assert metric(harness, "ferry_controlplane_rejected_messages_total", reason="telemetry_field") == 1


def test_telemetry_rate_is_bounded_with_a_retry_after() -> None:
    clock = FakeClock()
    rate = TelemetryRate(rate=10.0, burst=3.0, clock=clock)
    for _ in range(3):
        rate.take()
    with pytest.raises(Overloaded) as info:
        rate.take()
    assert info.value.retry_after == pytest.approx(0.1)
    clock.advance(0.1)
    rate.take()  # one more after a tenth of a second


# -- mutual TLS: the certificate's common name admits agents and operators

@pytest.fixture
async def mtls_cp(pki: tuple[str, dict[str, tls.TLSConfig]]) -> AsyncIterator[tuple[ControlPlane, int]]:
    _, certs = pki
    cp = ControlPlane(ControlPlaneSettings(tick_seconds=0.1, debounce_seconds=0.001),
                      catalog=(ModelConfig(name="chat"),), tls=certs["controlplane"],
                      join_check=JoinCheck(sha256_hex(JOIN), mutual_tls=True), admin_auth=AdminAuth.with_token(TOKEN))
    port = await cp.start("127.0.0.1:0")
    try:
        yield cp, port
    finally:
        await cp.stop(grace=0.2)


REGISTRATIONS = [
    ("agent-cert", "agent", "", grpc.StatusCode.OK),
    ("other-cert-no-token", "node", "", grpc.StatusCode.UNAUTHENTICATED),
    ("other-cert-with-token", "node", JOIN, grpc.StatusCode.OK),
    ("no-cert", None, JOIN, grpc.StatusCode.UNAVAILABLE),
]


@pytest.mark.parametrize(("role", "token", "expected"), [c[1:] for c in REGISTRATIONS],
                         ids=[c[0] for c in REGISTRATIONS])
async def test_over_mutual_tls_agents_are_admitted_by_certificate_or_token(
        pki: tuple[str, dict[str, tls.TLSConfig]], mtls_cp: tuple[ControlPlane, int], role: str | None, token: str,
        expected: grpc.StatusCode) -> None:
    _, certs = pki
    creds = (certs[role].channel_credentials() if role is not None
             else grpc.ssl_channel_credentials(root_certificates=certs["agent"].ca))
    async with grpc.aio.secure_channel(f"127.0.0.1:{mtls_cp[1]}", creds) as channel:
        agent = FakeAgent(channel)
        try:
            await agent.send(register=with_token(register("n1", replica("n1/r0")), token))
        except grpc.aio.AioRpcError as exc:  # the handshake failed before anything was sent
            assert exc.code() == expected == grpc.StatusCode.UNAVAILABLE
            return
        if expected == grpc.StatusCode.OK:
            assert (await agent.read()).WhichOneof("body") == "registered"
            agent.call.cancel()
        else:
            code, details = await agent.status()
            assert code == expected, details
            if expected == grpc.StatusCode.UNAUTHENTICATED:
                assert details.startswith("register.join_token")


ADMINS = [
    ("admin-cert-no-token", "admin", None, grpc.StatusCode.OK),
    ("agent-cert-no-token", "agent", None, grpc.StatusCode.UNAUTHENTICATED),
    ("agent-cert-with-token", "agent", TOKEN, grpc.StatusCode.OK),
]


@pytest.mark.parametrize(("role", "token", "expected"), [c[1:] for c in ADMINS], ids=[c[0] for c in ADMINS])
async def test_over_mutual_tls_the_admin_api_takes_an_admin_certificate_or_the_token(
        pki: tuple[str, dict[str, tls.TLSConfig]], mtls_cp: tuple[ControlPlane, int], role: str, token: str | None,
        expected: grpc.StatusCode) -> None:
    _, certs = pki
    async with tls.channel(f"127.0.0.1:{mtls_cp[1]}", certs[role]) as channel:
        admin: Any = AdminClient(channel, token)
        try:
            await admin.ListReplicas(admin_pb2.ListReplicasRequest(), timeout=5)
            code = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
    assert code == expected


@pytest.mark.parametrize(("token", "mutual", "cn", "admitted"), [
    ("", False, None, True), ("", True, "agent", True), ("", True, "proxy", False), ("", True, None, False),
], ids=["open", "mtls-agent", "mtls-other", "mtls-nocert"])
def test_admission_decision_table(token: str, mutual: bool, cn: str | None, admitted: bool) -> None:
    admission = JoinCheck(token and sha256_hex(token), mutual)
    try:
        admission.check("", cn)
        got = True
    except Exception:
        got = False
    assert got == admitted


AGENTS = [("right-token", JOIN, True), ("wrong-token", "fjt_wrong", False), ("no-token", "", False)]


@pytest.mark.parametrize(("token", "joins"), [c[1:] for c in AGENTS], ids=[c[0] for c in AGENTS])
async def test_a_real_agent_joins_only_with_the_token(guarded: Harness, token: str, joins: bool,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    address = f"127.0.0.1:{guarded.cp.port}"
    agent = Agent(node=NodeInfo(node="n-real", region="local", gpus=1), control_planes=[address], endpoints=[],
                  settings=AgentSettings(backoff_initial_seconds=0.02, backoff_max_seconds=0.05),
                  metrics=AgentMetrics(CollectorRegistry()), join_token=token)
    await agent.start()
    try:
        refused = "ferry_controlplane_rejected_messages_total"
        await guarded.poll(lambda: (guarded.cp.controller.fleet.member("n-real") is not None) if joins
                           else metric(guarded, refused, reason="register_unauthenticated") >= 2, "the outcome")
        assert (guarded.cp.controller.fleet.member("n-real") is not None) == joins
        assert all(JOIN not in r.getMessage() for r in caplog.records)
    finally:
        await agent.stop()


def test_the_address_index_follows_registrations_telemetry_and_expiry() -> None:
    clock = FakeClock()
    fleet, (n1,) = fleet_with(clock, register("n1", replica("a", address="127.0.0.1:7001"),
                                              replica("b", address="127.0.0.1:7001")))
    assert fleet.serving("127.0.0.1:7001") == {"n1"}  # two replicas of one node behind one address
    fleet.apply_telemetry(n1, fleet_pb2.Telemetry(seq=1, removed=["a"]))
    assert fleet.serving("127.0.0.1:7001") == {"n1"}
    fleet.apply_telemetry(n1, fleet_pb2.Telemetry(seq=2, changed=[replica("b", address="127.0.0.1:7002")]))
    assert (fleet.serving("127.0.0.1:7001"), fleet.serving("127.0.0.1:7002")) == (set(), {"n1"})
    fleet.disconnect(n1)
    clock.advance(GRACE + 1)  # n1 is dead: its address may be claimed by another node
    fleet.register(register("n2", replica("c", address="127.0.0.1:7002")))
    assert fleet.serving("127.0.0.1:7002") == {"n1", "n2"}
    clock.advance(400)
    fleet.forget_expired()
    assert fleet.serving("127.0.0.1:7002") == set()  # n2 too was silent past forget_after


async def test_an_agent_stops_whenever_stop_comes_while_it_is_being_refused(guarded: Harness) -> None:
    """stop() cancels the connection loop at any point, also while a refused session cleans up."""
    address = f"127.0.0.1:{guarded.cp.port}"
    rng = random.Random(11)
    for _ in range(30):
        agent = Agent(node=NodeInfo(node="n-stop", region="local", gpus=1), control_planes=[address], endpoints=[],
                      settings=AgentSettings(backoff_initial_seconds=0.001, backoff_max_seconds=0.002),
                      metrics=AgentMetrics(CollectorRegistry()), join_token="fjt_wrong")
        await agent.start()
        await asyncio.sleep(rng.uniform(0.0, 0.03))
        await asyncio.wait_for(agent.stop(), 2)  # a swallowed cancellation kept it reconnecting: this hung
        assert not agent.connected
