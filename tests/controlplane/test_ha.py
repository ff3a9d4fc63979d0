"""Two control planes in one process on one shared store: election, relay, telemetry forwarding, failover.

The same code runs against etcd with real processes in tests/etcd/; here the
store is the embedded one (shared, so both control planes see the same keys)
and the clock is real, with short ticks and leases.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import pytest

from ferry.v1 import admin_pb2, fleet_pb2
from tests.controlplane.fakes import (
    TICK,
    WAIT,
    FakeAgent,
    FakeProxy,
    Pair,
    load,
    register,
    replica,
    routed,
)


async def until_async(predicate: Any, what: str, seconds: float = WAIT) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = await predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_only_the_leader_computes_and_the_follower_relays_its_tables(pair: Pair) -> None:
    statuses = [await pair.status(0), await pair.status(1)]
    assert [(s.role, s.leader_id) for s in statuses] == [("leader", "cp1"), ("follower", "cp1")]
    assert [(c.id, c.leader) for c in statuses[0].control_planes] == [("cp1", True), ("cp2", False)]
    agents = [FakeAgent(pair.channels[0]), FakeAgent(pair.channels[1])]
    await agents[0].register(register("n1", replica("n1/r0")))
    await agents[1].register(register("n2", replica("n2/r0")))
    proxies = [FakeProxy(pair.channels[0], "p1"), FakeProxy(pair.channels[1], "p2")]
    tables = []
    for proxy in proxies:
        await proxy.send_subscribe()
        tables.append(await proxy.until(lambda t: routed(t) == ["n1/r0", "n2/r0"]))
    leader_version = pair.cps[0].controller.tables.get("local").version  # type: ignore[union-attr]
    assert pair.cps[1].controller.tables.get("local").version == leader_version  # type: ignore[union-attr]
    assert pair.cps[1].controller.metrics.leader._value.get() == 0  # type: ignore[attr-defined]
    views = (await pair.admin(1).ListReplicas(admin_pb2.ListReplicasRequest(), timeout=WAIT)).replicas
    # The fleet, not just cp2's own node:
    assert [(v.replica_id, v.in_table) for v in views] == [("n1/r0", True), ("n2/r0", True)]


async def test_telemetry_received_by_a_follower_reaches_the_leaders_next_table_within_two_ticks(pair: Pair) -> None:
    agent = FakeAgent(pair.channels[1])
    await agent.register(register("n2", replica("n2/r0")))
    proxy = FakeProxy(pair.channels[0], "p1")
    await proxy.send_subscribe()
    await proxy.until(lambda t: routed(t) == ["n2/r0"])
    for queued in (3, 5, 8):
        started = time.monotonic()
        await agent.telemetry(load("n2/r0", queued=queued))
        await proxy.until(lambda t, q=queued: t.models[0].replicas[0].load.queued == q)  # type: ignore[misc]
        elapsed = time.monotonic() - started
        print(f"telemetry at the follower -> leader's table: {elapsed * 1000:.0f} ms (tick {TICK * 1000:.0f} ms)")
        assert elapsed < 2 * TICK


async def test_a_drain_asked_of_the_follower_reaches_the_leaders_agent_and_every_table(pair: Pair) -> None:
    agent = FakeAgent(pair.channels[0])
    await agent.register(register("n1", replica("n1/r0"), replica("n1/r1")))
    proxy = FakeProxy(pair.channels[1], "p2")
    await proxy.send_subscribe()
    await proxy.until(lambda t: routed(t) == ["n1/r0", "n1/r1"])
    view = (await pair.admin(1).Drain(admin_pb2.DrainRequest(replica_id="n1/r0"), timeout=WAIT)).replica
    assert (view.drain_requested, view.in_table) == (True, False)  # the relayed table dropped it before Drain returned
    command = await agent.command()  # sent by cp1, which holds the agent's stream
    assert (command.kind, command.replica_id) == (fleet_pb2.Command.KIND_DRAIN, "n1/r0")
    await proxy.until(lambda t: routed(t) == ["n1/r1"])


async def test_follow_is_refused_by_a_follower_naming_the_leader(pair: Pair) -> None:
    call = pair.admin(1).Follow()
    await call.write(admin_pb2.FollowerReport(control_plane_id="cp9"))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(call.read(), WAIT)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "does not lead" in (err.value.details() or "") and "cp1" in (err.value.details() or "")


async def test_when_the_leader_stops_the_follower_leads_at_once_with_higher_versions(pair: Pair) -> None:
    agent = FakeAgent(pair.channels[0])
    await agent.register(register("n1", replica("n1/r0")))
    proxy = FakeProxy(pair.channels[1], "p2")
    await proxy.send_subscribe()
    before = await proxy.until(lambda t: routed(t) == ["n1/r0"])
    await pair.cps[0].stop()  # revokes its lease: cp2 sees the key go and campaigns
    after = await proxy.until(lambda t: t.version > before.version)
    assert routed(after) == ["n1/r0"]  # cp1's node is in the store (its lease outlives the stream by the grace)
    assert (await pair.status(1)).role == "leader"


async def test_an_allocation_asked_of_the_follower_is_placed_by_the_leader(pair: Pair) -> None:
    agent = FakeAgent(pair.channels[0])  # held by cp1, the leader
    await agent.register(register("n1", replica("n1/r0", gpus=4), replica("n1/r1", gpus=4)))
    proxy = FakeProxy(pair.channels[1], "p2")
    await proxy.send_subscribe()
    await proxy.until(lambda t: routed(t) == ["n1/r0", "n1/r1"])
    answer = await pair.admin(1).Allocate(admin_pb2.AllocateRequest(model="chat", gpus=8), timeout=WAIT)
    assert [(s.node, list(s.displaces)) for s in answer.placed] == [("n1", ["n1/r0", "n1/r1"])]
    drained = sorted([(await agent.command()).replica_id for _ in range(2)])
    assert drained == ["n1/r0", "n1/r1"]
    await proxy.until(lambda t: routed(t) == [])
    nodes = (await pair.admin(0).ListNodes(admin_pb2.ListNodesRequest(), timeout=WAIT)).nodes
    assert [(n.node, n.control_plane, n.slots) for n in nodes] == [("n1", "cp1", 1)]  # the stream is cp1's
    assert (await pair.admin(1).ListAllocations(admin_pb2.ListAllocationsRequest(), timeout=WAIT)).slots


async def test_while_the_store_is_away_intent_is_refused_and_the_last_tables_stay(pair: Pair) -> None:
    agent = FakeAgent(pair.channels[1])
    await agent.register(register("n2", replica("n2/r0"), replica("n2/r1")))
    proxy = FakeProxy(pair.channels[1], "p2")
    await proxy.send_subscribe()
    table = await proxy.until(lambda t: routed(t) == ["n2/r0", "n2/r1"])
    for link in pair.links:
        link.down = True
    for i in (0, 1):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pair.admin(i).Drain(admin_pb2.DrainRequest(replica_id="n2/r0"), timeout=WAIT)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "store" in (err.value.details() or "") and "refused" in (err.value.details() or "")
    await until_async(lambda: _role(pair, 0, "leader-unconfirmed"), "the leader to stop leading unconfirmed")
    await agent.telemetry(load("n2/r0", queued=1))  # keeps n2 live; no table while nobody leads
    await asyncio.sleep(2 * TICK)
    assert pair.cps[1].controller.tables.get("local").version == table.version  # type: ignore[union-attr]
    for link in pair.links:
        link.down = False  # the leases ran out meanwhile (the store's clock went on): a new election
    await until_async(lambda: _one_leader(pair), "one leader again")
    view = (await pair.admin(1).Drain(admin_pb2.DrainRequest(replica_id="n2/r0"), timeout=WAIT)).replica
    assert view.drain_requested
    await proxy.until(lambda t: routed(t) == ["n2/r1"])


async def _role(pair: Pair, i: int, role: str) -> bool:
    return (await pair.status(i)).role == role


async def _one_leader(pair: Pair) -> bool:
    roles = sorted([(await pair.status(0)).role, (await pair.status(1)).role])
    return roles == ["follower", "leader"]


async def test_a_tenant_written_on_the_follower_is_in_its_tables_when_the_call_returns(pair: Pair) -> None:
    proxy = FakeProxy(pair.channels[1], "p2")
    await proxy.send_subscribe()
    await proxy.until(lambda t: True)
    tenant = admin_pb2.TenantView(name="acme", api_key_sha256="a" * 64)
    await pair.admin(1).PutTenant(admin_pb2.PutTenantRequest(tenant=tenant), timeout=WAIT)
    held = pair.cps[1].controller.tables.get("local")
    assert held is not None and held.snapshot.tenants_managed
    assert [t.name for t in held.snapshot.tenants] == ["acme"]  # relayed by the leader before the answer
    await pair.admin(1).DeleteTenant(admin_pb2.DeleteTenantRequest(name="acme"), timeout=WAIT)
    assert not pair.cps[1].controller.tables.get("local").snapshot.tenants  # type: ignore[union-attr]
