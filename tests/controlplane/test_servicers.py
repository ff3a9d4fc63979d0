"""The three services over loopback: generated stubs act as agents, proxies and an operator."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from ferry.v1 import admin_pb2, common_pb2, fleet_pb2, tables_pb2
from tests.controlplane.fakes import GRACE, WAIT, FakeClock, Harness, load, register, replica, routed

S = common_pb2
KIND = fleet_pb2.Command


def metric(h: Harness, name: str, **labels: str) -> float:
    value = h.cp.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_register_puts_the_replica_in_the_pushed_table(harness: Harness) -> None:
    proxy = harness.proxy()
    first = await proxy.subscribe()
    assert first.region == "local" and first.nonce == "1" and routed(first) == []
    assert [m.model for m in first.models] == ["chat", "empty-model"]

    agent = harness.agent()
    registered = await agent.register(register("n1", replica("n1/r0"), replica("n1/r1", state=S.REPLICA_STATE_WARMING)))
    assert (registered.control_plane_id, registered.telemetry_interval_seconds, registered.grace_seconds) == (
        "controlplane", 0.5, GRACE,
    )
    table = await proxy.until(lambda t: routed(t) == ["n1/r0"])
    assert table.version > first.version
    views = await harness.replicas()
    assert (views["n1/r0"].in_table, views["n1/r1"].in_table) == (True, False)
    assert views["n1/r1"].state == S.REPLICA_STATE_WARMING
    stored = await harness.cp.store.get("/ferry/members/n1")
    assert stored is not None and fleet_pb2.Register.FromString(stored.value).node == "n1"
    assert metric(harness, "ferry_controlplane_table_pushes_total", region="local") >= 1
    assert metric(harness, "ferry_controlplane_table_version", region="local") == table.version
    assert metric(harness, "ferry_controlplane_replicas", region="local", state="warming") == 1
    assert metric(harness, "ferry_controlplane_members") == 1


async def test_telemetry_load_reaches_the_next_table(harness: Harness) -> None:
    proxy = harness.proxy()
    await proxy.subscribe()
    agent = harness.agent()
    await agent.register(register("n1", replica("n1/r0")))
    await agent.telemetry(load("n1/r0", queued=4, running=9), load("ghost"))
    table = await proxy.until(lambda t: bool(routed(t)) and t.models[0].replicas[0].load.queued == 4)
    assert table.models[0].replicas[0].load.running == 9
    assert metric(harness, "ferry_controlplane_telemetry_messages_total") == 1
    assert metric(harness, "ferry_controlplane_rejected_messages_total", reason="unknown_replica") == 1
    await agent.telemetry(load("n1/r0", state=S.REPLICA_STATE_DRAINING))  # the agent decides to drain
    await proxy.until(lambda t: routed(t) == [])


async def test_drain_leaves_the_table_at_once_and_tells_the_agent(harness: Harness) -> None:
    proxy = harness.proxy()
    await proxy.subscribe()
    agent = harness.agent()
    await agent.register(register("n1", replica("n1/r0"), replica("n1/r1")))
    before = await proxy.until(lambda t: routed(t) == ["n1/r0", "n1/r1"])

    drained = await harness.admin.Drain(admin_pb2.DrainRequest(replica_id="n1/r0"), timeout=5)
    assert (drained.replica.drain_requested, drained.replica.in_table) == (True, False)
    assert drained.replica.state == S.REPLICA_STATE_READY  # the agent has not reported draining yet
    # The new table was pushed before Drain returned: it is the very next one the proxy reads.
    after = await proxy.read()
    assert routed(after) == ["n1/r1"] and after.version == before.version + 1
    command = await agent.command()
    assert (command.kind, command.replica_id) == (KIND.KIND_DRAIN, "n1/r0")
    assert command.command_id
    views = await harness.replicas()
    assert (views["n1/r0"].drain_requested, views["n1/r0"].in_table) == (True, False)
    assert await harness.cp.store.get("/ferry/intent/drain/n1/r0") is not None

    undrained = await harness.admin.Undrain(admin_pb2.DrainRequest(replica_id="n1/r0"), timeout=5)
    assert (undrained.replica.drain_requested, undrained.replica.in_table) == (False, True)
    assert routed(await proxy.read()) == ["n1/r0", "n1/r1"]
    assert (await agent.command()).kind == KIND.KIND_UNDRAIN


async def test_a_node_registering_again_is_told_its_pending_drains(harness: Harness) -> None:
    agent = harness.agent()
    await agent.register(register("n1", replica("n1/r0")))
    await harness.admin.Drain(admin_pb2.DrainRequest(replica_id="n1/r0"), timeout=5)
    assert (await agent.command()).kind == KIND.KIND_DRAIN
    again = harness.agent()
    await again.register(register("n1", replica("n1/r0")))  # still reports ready
    assert (await again.command()).kind == KIND.KIND_DRAIN
    code, details = await agent.status()  # the earlier stream is replaced
    assert code == grpc.StatusCode.ABORTED and "registered again" in details


DRAIN_ERRORS = [
    ("empty", "", grpc.StatusCode.INVALID_ARGUMENT, "replica_id"),
    ("unknown", "nope", grpc.StatusCode.NOT_FOUND, "nope"),
    ("spaces", "a b", grpc.StatusCode.INVALID_ARGUMENT, "replica_id"),
]


@pytest.mark.parametrize(("rid", "code", "named"), [c[1:] for c in DRAIN_ERRORS], ids=[c[0] for c in DRAIN_ERRORS])
@pytest.mark.parametrize("rpc", ["Drain", "Undrain"])
async def test_drain_errors(harness: Harness, rpc: str, rid: str, code: grpc.StatusCode, named: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await getattr(harness.admin, rpc)(admin_pb2.DrainRequest(replica_id=rid), timeout=5)
    assert err.value.code() == code and named in (err.value.details() or "")


async def test_a_closed_agent_stream_leaves_the_table_after_grace(harness: Harness, clock: FakeClock) -> None:
    proxy = harness.proxy()
    await proxy.subscribe()
    agent = harness.agent()
    await agent.register(register("n1", replica("n1/r0")))
    await proxy.until(lambda t: routed(t) == ["n1/r0"])
    agent.call.cancel()
    fleet = harness.cp.controller.fleet
    await harness.poll(lambda: not fleet.member("n1").connected, "the stream end")  # type: ignore[union-attr]
    clock.advance(GRACE - 0.5)
    harness.cp.controller.notify()
    assert (await harness.replicas())["n1/r0"].in_table  # within grace: still routable
    clock.advance(1.0)
    harness.cp.controller.notify()
    await proxy.until(lambda t: routed(t) == [])
    view = (await harness.replicas())["n1/r0"]
    assert (view.state, view.in_table) == (S.REPLICA_STATE_DEAD, False)


async def test_acks_nacks_and_lag_in_get_table(harness: Harness) -> None:
    proxy = harness.proxy("p1")
    first = await proxy.subscribe()
    await proxy.ack(first)
    agent = harness.agent()
    await agent.register(register("n1", replica("n1/r0")))

    async def proxies() -> dict[str, admin_pb2.ProxyView]:
        table = await harness.admin.GetTable(admin_pb2.GetTableRequest(), timeout=5)
        return {p.proxy_id: p for p in table.proxies}

    table = await proxy.until(lambda t: routed(t) == ["n1/r0"])
    region = harness.cp.controller.tables.get("local")
    assert region is not None and region.version == table.version
    await harness.poll(lambda: harness.cp.controller.watchers.statuses()[0].applied_version == first.version, "ack")
    view = (await proxies())["p1"]
    assert (view.applied_version, view.connected) == (first.version, True)
    assert view.lag_versions == table.version - first.version > 0

    await proxy.ack(table, applied=False, error="replica address unresolvable")
    await harness.poll(lambda: harness.cp.controller.watchers.statuses()[0].last_error != "", "nack")
    view = (await proxies())["p1"]
    assert view.last_error == "replica address unresolvable" and view.applied_version == first.version
    await proxy.ack(first)  # a stale nonce: ignored and counted
    await agent.telemetry(load("n1/r0", queued=1))
    table = await proxy.until(lambda t: routed(t) == ["n1/r0"] and t.models[0].replicas[0].load.queued == 1)
    await proxy.ack(table)
    await harness.poll(lambda: harness.cp.controller.watchers.statuses()[0].applied_version == table.version, "ack")
    view = (await proxies())["p1"]
    assert view.lag_versions == 0 and view.last_ack_age_seconds == 0.0
    assert view.last_error == "replica address unresolvable"  # the last rejection stays on record
    assert metric(harness, "ferry_controlplane_rejected_messages_total", reason="ack_stale") == 1
    assert metric(harness, "ferry_controlplane_proxy_applied_version", proxy="p1") == table.version
    assert metric(harness, "ferry_controlplane_proxy_lag_versions", proxy="p1") == 0
    regions = (await harness.admin.GetTable(admin_pb2.GetTableRequest(region="local"), timeout=5)).regions
    assert [(r.region, r.version, r.replicas, list(r.models)) for r in regions] == [
        ("local", table.version, 1, ["chat", "empty-model"])
    ]

    proxy.call.cancel()
    await harness.poll(lambda: not harness.cp.controller.watchers.statuses()[0].connected, "disconnect")
    assert not (await proxies())["p1"].connected


async def test_a_second_proxy_gets_the_current_snapshot_at_once(harness: Harness) -> None:
    agent = harness.agent()
    await agent.register(register("n1", replica("n1/r0")))
    first = harness.proxy("p1")
    current = await first.subscribe()
    if not routed(current):  # subscribed before the registration was computed
        current = await first.until(lambda t: routed(t) == ["n1/r0"])
    second = await harness.proxy("p2").subscribe()
    assert (second.version, routed(second)) == (current.version, ["n1/r0"])
    eu = await harness.proxy("p3", region="eu").subscribe()  # a region with no node yet
    assert (eu.region, routed(eu), [m.model for m in eu.models]) == ("eu", [], ["chat", "empty-model"])


async def test_a_proxy_holding_the_current_version_still_gets_it_on_subscribe(harness: Harness) -> None:
    current = await harness.proxy("p1").subscribe()
    again = await harness.proxy("p2").subscribe(have_version=current.version)
    assert (again.version, again.nonce) == (current.version, "1")


FIRST = [
    ("agent-telemetry-first", "Connect", fleet_pb2.AgentMessage(telemetry=fleet_pb2.Telemetry()), "register"),
    ("agent-empty-first", "Connect", fleet_pb2.AgentMessage(), "register"),
    ("proxy-ack-first", "Watch", tables_pb2.WatchRequest(ack=tables_pb2.Ack()), "subscribe"),
    ("proxy-empty-first", "Watch", tables_pb2.WatchRequest(), "subscribe"),
]


@pytest.mark.parametrize(("rpc", "message", "named"), [c[1:] for c in FIRST], ids=[c[0] for c in FIRST])
async def test_an_invalid_first_message_is_refused(harness: Harness, rpc: str, message, named: str) -> None:
    client = harness.agent() if rpc == "Connect" else harness.proxy()
    await client.call.write(message)
    code, details = await _status(client.call)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(named)


def _bad(**kw) -> fleet_pb2.ReplicaInfo:
    return replica("n1/r2", **kw)


REGISTER_ERRORS = [
    ("node-empty", register("", replica("a")), "register.node"),
    ("node-too-long", register("n" * 129), "register.node"),
    ("node-with-space", register("n 1"), "register.node"),
    ("region-empty", register("n1", region=""), "register.region"),
    ("replica-id-empty", register("n1", replica("a"), replica("b"), replica("")), "register.replicas[2].replica_id"),
    ("replica-id-twice", register("n1", replica("a"), replica("a")), "register.replicas[1].replica_id"),
    ("model-empty", register("n1", replica("a", model="")), "register.replicas[0].model"),
    ("version-empty", register("n1", replica("a", version="")), "register.replicas[0].version"),
    ("address-no-port", register("n1", replica("a"), replica("b"), _bad(address="h")), "register.replicas[2].address"),
    ("address-bad-port", register("n1", _bad(address="h:70000")), "register.replicas[0].address"),
    ("address-empty", register("n1", _bad(address="")), "register.replicas[0].address"),
    ("http-address-no-port", register("n1", _bad(http_address="h")), "register.replicas[0].http_address"),
    ("http-only-bad-port", register("n1", _bad(address="", http_address="h:0")), "register.replicas[0].http_address"),
    ("engine-unknown", register("n1", _bad(engine="gpt")), "register.replicas[0].engine"),
    ("max-concurrency-zero", register("n1", _bad(max_concurrency=0)), "register.replicas[0].max_concurrency"),
    ("too-many-replicas", register("n1", *(replica(f"r{i}") for i in range(65))), "register.replicas"),
]


@pytest.mark.parametrize(("reg", "field"), [c[1:] for c in REGISTER_ERRORS], ids=[c[0] for c in REGISTER_ERRORS])
async def test_invalid_register_fields_are_named(harness: Harness, reg: fleet_pb2.Register, field: str) -> None:
    agent = harness.agent()
    await agent.send(register=reg)
    code, details = await agent.status()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.split(":")[0] == field
    assert metric(harness, "ferry_controlplane_rejected_messages_total", reason="register_field") == 1


async def test_a_replica_reached_over_http_only_is_routed_with_its_http_address(harness: Harness) -> None:
    agent, proxy = harness.agent(), harness.proxy()
    await agent.register(register("n1", replica("n1/h", address="", http_address="127.0.0.1:8000", engine="vllm"),
                                  replica("n1/g", http_address="127.0.0.1:8001", engine="simulated")))
    table = await proxy.subscribe()
    if len(routed(table)) < 2:
        table = await proxy.until(lambda t: len(routed(t)) == 2)
    rows = {r.replica_id: (r.address, r.http_address, r.engine) for m in table.models for r in m.replicas}
    assert rows == {"n1/h": ("", "127.0.0.1:8000", "vllm"),
                    "n1/g": (replica("n1/g").address, "127.0.0.1:8001", "simulated")}
    other = harness.agent()  # an HTTP address is claimed as a KServe address is
    await other.send(register=register("n2", replica("n2/h", address="", http_address="127.0.0.1:8000")))
    code, details = await other.status()
    assert code == grpc.StatusCode.ALREADY_EXISTS and details.startswith("register.replicas[0].http_address")


async def test_a_replica_held_by_another_live_node_is_refused(harness: Harness) -> None:
    holder = harness.agent()
    await holder.register(register("n1", replica("shared")))
    other = harness.agent()
    await other.send(register=register("n2", replica("shared")))
    code, details = await other.status()
    assert code == grpc.StatusCode.ALREADY_EXISTS and details.startswith("register.replicas[0].replica_id")


STREAM_ERRORS = [
    ("second-register", fleet_pb2.AgentMessage(register=register("n1")), "register"),
    ("bad-changed", fleet_pb2.AgentMessage(telemetry=fleet_pb2.Telemetry(changed=[_bad(address="x")])),
     "telemetry.changed[0].address"),
    ("empty-body", fleet_pb2.AgentMessage(), "body"),
]


@pytest.mark.parametrize(("message", "field"), [c[1:] for c in STREAM_ERRORS], ids=[c[0] for c in STREAM_ERRORS])
async def test_bad_messages_after_register_end_the_stream(harness: Harness, message, field: str) -> None:
    agent = harness.agent()
    await agent.register(register("n1", replica("n1/r0")))
    await agent.call.write(message)
    code, details = await agent.status()
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.split(":")[0] == field


SUBSCRIBE_ERRORS = [
    ("proxy-id-empty", "", "local", "subscribe.proxy_id"),
    ("region-empty", "p1", "", "subscribe.region"),
    ("region-too-long", "p1", "r" * 65, "subscribe.region"),
]


@pytest.mark.parametrize(
    ("pid", "region", "field"), [c[1:] for c in SUBSCRIBE_ERRORS], ids=[c[0] for c in SUBSCRIBE_ERRORS],
)
async def test_invalid_subscribe_fields_are_named(harness: Harness, pid: str, region: str, field: str) -> None:
    proxy = harness.proxy(pid, region)
    await proxy.send_subscribe()
    code, details = await _status(proxy.call)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.split(":")[0] == field


async def test_watchers_are_bounded(clock: FakeClock) -> None:
    h = await Harness.start(clock, max_watchers=2, max_proxies=2)
    try:
        held = [h.proxy("p1"), h.proxy("p2")]  # held: a dropped call is cancelled
        for proxy in held:
            await proxy.subscribe()
        extra = h.proxy("p3")
        await extra.send_subscribe()
        code, details = await _status(extra.call)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "watchers" in details
        again = await h.proxy("p1").subscribe()  # the same proxy may replace its stream
        assert again.nonce == "1"
        code, details = await _status(held[0].call)
        assert code == grpc.StatusCode.ABORTED and "subscribed again" in details
    finally:
        await h.stop()


async def test_list_replicas_filters_and_get_table_regions(harness: Harness) -> None:
    agents = [harness.agent(), harness.agent()]
    await agents[0].register(register("a", replica("a/r0"), replica("a/r1", "embed"), region="eu"))
    await agents[1].register(register("b", replica("b/r0"), region="us"))
    assert sorted(await harness.replicas()) == ["a/r0", "a/r1", "b/r0"]
    assert sorted(await harness.replicas(region="eu")) == ["a/r0", "a/r1"]
    assert sorted(await harness.replicas(model="chat")) == ["a/r0", "b/r0"]
    assert sorted(await harness.replicas(model="chat", region="us")) == ["b/r0"]
    await harness.poll(lambda: harness.cp.controller.tables.regions() == ["eu", "us"], "tables")
    table = await harness.admin.GetTable(admin_pb2.GetTableRequest(), timeout=5)
    assert [(r.region, r.replicas, list(r.models)) for r in table.regions] == [
        ("eu", 2, ["chat", "embed", "empty-model"]), ("us", 1, ["chat", "embed", "empty-model"]),
    ]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await harness.admin.ListReplicas(admin_pb2.ListReplicasRequest(region="a b"), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and (err.value.details() or "").startswith("region")


async def test_stop_ends_streams_with_unavailable(clock: FakeClock) -> None:
    h = await Harness.start(clock)
    agent = h.agent()
    await agent.register(register("n1", replica("n1/r0")))
    proxy = h.proxy()
    await proxy.subscribe()
    await h.cp.controller.stop()
    assert (await agent.status())[0] == grpc.StatusCode.UNAVAILABLE
    assert (await _status(proxy.call))[0] == grpc.StatusCode.UNAVAILABLE
    await h.stop()


async def _status(call) -> tuple[grpc.StatusCode, str]:
    try:
        while await asyncio.wait_for(call.read(), WAIT) is not grpc.aio.EOF:
            pass
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return await call.code(), await call.details()


async def test_get_status_of_a_control_plane_alone(harness: Harness) -> None:
    agent = harness.agent()
    await agent.register(register("n1", replica("n1/r0")))
    proxy = harness.proxy("p1")
    table = await proxy.subscribe()
    if routed(table) != ["n1/r0"]:
        table = await proxy.until(lambda t: routed(t) == ["n1/r0"])
    await harness.admin.Drain(admin_pb2.DrainRequest(replica_id="n1/r0"), timeout=5)
    status = await harness.admin.GetStatus(admin_pb2.GetStatusRequest(), timeout=5)
    assert (status.control_plane_id, status.role, status.leader_id) == ("controlplane", "single", "controlplane")
    assert [(c.id, c.leader) for c in status.control_planes] == [("controlplane", True)]
    assert (status.store.backend, status.store.healthy, status.store.endpoint) == ("memory", True, "")
    assert (status.members, status.drains, status.allocations, status.agents) == (1, 1, 0, 1)
    assert [r.region for r in status.regions] == ["local"] and [p.proxy_id for p in status.proxies] == ["p1"]
    assert status.regions[0].version > table.version  # the drain made a new one
