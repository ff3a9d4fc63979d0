"""What the control plane tells operators: dead replicas without load, telemetry ages measured where the telemetry is,
dead proxies measured by the control plane they watched from."""

from __future__ import annotations

import asyncio
import time

from ferry.v1 import admin_pb2, common_pb2
from tests.controlplane.fakes import GRACE, TICK, WAIT, FakeAgent, FakeClock, FakeProxy, Harness, Pair, load, register
from tests.controlplane.fakes import replica as replica_info


def _gauge(cp: object, name: str, **labels: str) -> float | None:
    value: float | None = cp.registry.get_sample_value(name, labels)  # type: ignore[attr-defined]
    return value


async def test_a_dead_replica_is_shown_without_its_last_load(harness: Harness, clock: FakeClock) -> None:
    agent = harness.agent()
    await agent.register(register("n1", replica_info("n1/r0")))
    await agent.telemetry(load("n1/r0", queued=5, running=3))
    await harness.poll(lambda: harness.cp.controller.fleet.find("n1/r0").loads.get("n1/r0") is not None,  # type: ignore[union-attr]
                       "the load")
    assert (await harness.replicas())["n1/r0"].load.queued == 5
    await agent.call.done_writing()
    await harness.poll(lambda: not harness.cp.controller.fleet.member("n1").connected,  # type: ignore[union-attr]
                       "the stream to end")
    clock.advance(GRACE + 1)
    view = (await harness.replicas())["n1/r0"]
    assert view.state == common_pb2.REPLICA_STATE_DEAD
    assert (view.load.queued, view.load.running) == (0, 0)
    assert view.telemetry_age_seconds >= GRACE


async def test_a_follower_does_not_age_the_leaders_telemetry(pair: Pair) -> None:
    agent = FakeAgent(pair.channels[0])  # on the leader
    await agent.register(register("n1", replica_info("n1/r0")))
    proxy = FakeProxy(pair.channels[1], "p2")
    await proxy.send_subscribe()
    await proxy.until(lambda t: [r.replica_id for m in t.models for r in m.replicas] == ["n1/r0"])
    until = time.monotonic() + 6 * TICK  # an idle fleet: the same load over and over, no new table
    while time.monotonic() < until:
        await agent.telemetry(load("n1/r0", queued=1))
        await asyncio.sleep(TICK / 5)
    views = (await pair.admin(1).ListReplicas(admin_pb2.ListReplicasRequest(), timeout=WAIT)).replicas
    assert [v.replica_id for v in views] == ["n1/r0"]
    assert views[0].telemetry_age_seconds < 3 * TICK, views[0].telemetry_age_seconds
    age = _gauge(pair.cps[1], "ferry_controlplane_telemetry_max_age_seconds", region="local")
    assert age is None, age  # the follower holds no agent: it measures no age
    leader = _gauge(pair.cps[0], "ferry_controlplane_telemetry_max_age_seconds", region="local")
    assert leader is not None and leader < 3 * TICK


async def test_a_dead_proxy_is_measured_by_its_control_plane(harness: Harness, clock: FakeClock) -> None:
    await harness.agent().register(register("n1", replica_info("n1/r0")))
    proxy = harness.proxy("p1")
    table = await proxy.subscribe()
    await proxy.ack(table)
    name = "ferry_controlplane_proxy_behind_seconds"
    await harness.poll(lambda: _gauge(harness.cp, name, proxy="p1") == 0.0, "p1 in sync")
    await proxy.call.done_writing()
    await harness.poll(lambda: _gauge(harness.cp, "ferry_controlplane_proxies_disconnected", region="local") == 1,
                       "p1 counted disconnected")
    clock.advance(30)
    await harness.poll(lambda: (_gauge(harness.cp, name, proxy="p1") or 0.0) >= 30, "p1 behind for 30 s")
