"""Nodes, cordons, models, usage, table diffs and gang allocation over the Admin API, in process."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from controlplane.api.auth import AdminAuth
from controlplane.config import ControlPlaneSettings
from controlplane.server import ControlPlane
from controlplane.store.memory import MemoryStore
from ferry.config import ModelConfig
from ferry.v1 import admin_pb2, common_pb2, fleet_pb2
from ferry_cli.ctl.client import AdminClient
from tests.controlplane.fakes import TOKEN, FakeAgent, Harness, load, register, replica, routed

KIND = fleet_pb2.Command
S = common_pb2


async def small_node(harness: Harness, node: str, count: int = 2, gpus: int = 4) -> FakeAgent:
    agent = harness.agent()
    await agent.register(register(node, *(replica(f"{node}/r{i}", gpus=gpus) for i in range(count))))
    return agent


async def test_every_admin_call_needs_the_token(harness: Harness) -> None:
    for call, request in (("ListNodes", admin_pb2.ListNodesRequest()), ("GetStatus", admin_pb2.GetStatusRequest()),
                          ("Allocate", admin_pb2.AllocateRequest(model="chat"))):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await getattr(harness.anonymous, call)(request, timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "FERRY_ADMIN_TOKEN" in (err.value.details() or "") and "--admin-token" in (err.value.details() or "")
    wrong = AdminClient(harness.channel, "not-the-token")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await wrong.ListNodes(admin_pb2.ListNodesRequest(), timeout=5)
    assert "not accepted" in (err.value.details() or "")
    call = harness.anonymous.Follow()  # the stream between control planes too
    await call.write(admin_pb2.FollowerReport(control_plane_id="cp9"))
    assert await call.code() == grpc.StatusCode.UNAUTHENTICATED
    rejected = harness.cp.controller.metrics.rejected.labels(reason="admin_unauthenticated")
    assert rejected._value.get() == 5  # type: ignore[attr-defined]


async def test_a_control_plane_without_a_token_keeps_the_admin_api_closed() -> None:
    cp = ControlPlane(ControlPlaneSettings())
    port = await cp.start("127.0.0.1:0")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await AdminClient(channel, "anything").ListNodes(admin_pb2.ListNodesRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and "closed" in (err.value.details() or "")
    finally:
        await cp.stop(grace=0.1)


async def test_cordon_takes_the_nodes_replicas_out_without_a_command(harness: Harness) -> None:
    proxy = harness.proxy()
    await proxy.subscribe()
    agent = await small_node(harness, "n1")
    await small_node(harness, "n2", count=1)
    await proxy.until(lambda t: routed(t) == ["n1/r0", "n1/r1", "n2/r0"])
    view = (await harness.admin.Cordon(admin_pb2.CordonRequest(node="n1"), timeout=5)).node
    assert (view.node, view.cordoned, view.agent_connected, view.control_plane) == ("n1", True, True, "controlplane")
    assert routed(await proxy.read()) == ["n2/r0"]  # pushed before Cordon returned
    replicas = await harness.replicas()
    assert replicas["n1/r0"].cordoned and not replicas["n1/r0"].in_table and not replicas["n2/r0"].cordoned
    assert replicas["n1/r0"].state == S.REPLICA_STATE_READY and not replicas["n1/r0"].drain_requested
    assert await harness.cp.store.get("/ferry/intent/cordon/n1") is not None
    await harness.admin.Uncordon(admin_pb2.CordonRequest(node="n1"), timeout=5)
    assert routed(await proxy.read()) == ["n1/r0", "n1/r1", "n2/r0"]
    with pytest.raises(TimeoutError):  # no command reached the agent: its replicas keep running
        await asyncio.wait_for(agent.call.read(), 0.2)


CORDON_ERRORS = [
    ("empty", "", grpc.StatusCode.INVALID_ARGUMENT, "node"),
    ("unknown", "nope", grpc.StatusCode.NOT_FOUND, "nope"),
]


@pytest.mark.parametrize(("node", "code", "named"), [c[1:] for c in CORDON_ERRORS], ids=[c[0] for c in CORDON_ERRORS])
async def test_cordon_errors(harness: Harness, node: str, code: grpc.StatusCode, named: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await harness.admin.Cordon(admin_pb2.CordonRequest(node=node), timeout=5)
    assert err.value.code() == code and named in (err.value.details() or "")


async def test_nodes_models_and_usage(harness: Harness) -> None:
    agent = await small_node(harness, "n1")
    await agent.telemetry(
        S.ReplicaLoad(replica_id="n1/r0", state=S.REPLICA_STATE_READY, queued=2, running=3, kv_blocks_free=25,
                      kv_blocks_total=100, gpu_utilization=0.5, requests_total=7),
        S.ReplicaLoad(replica_id="n1/r1", state=S.REPLICA_STATE_READY, queued=1, running=1, kv_blocks_free=75,
                      kv_blocks_total=100, gpu_utilization=0.1, requests_total=3))
    await harness.poll(lambda: harness.cp.controller.fleet.member("n1").loads.get("n1/r1") is not None,  # type: ignore[union-attr]
                       "telemetry")
    await harness.poll(lambda: bool(harness.cp.controller.tables.get("local")), "a table")
    nodes = (await harness.admin.ListNodes(admin_pb2.ListNodesRequest(), timeout=5)).nodes
    assert [(n.node, n.gpus, n.gpus_allocated, n.gpus_free, list(n.replica_ids), n.live) for n in nodes] == [
        ("n1", 8, 8, 0, ["n1/r0", "n1/r1"], True)]
    models = {m.model: m for m in (await harness.admin.ListModels(admin_pb2.ListModelsRequest(), timeout=5)).models}
    assert (models["chat"].replicas_total, list(models["chat"].versions), models["chat"].gpus_each) == (2, ["v1"], 1)
    assert models["empty-model"].replicas_total == 0
    usage = await harness.admin.GetUsage(admin_pb2.GetUsageRequest(), timeout=5)
    row = next(r for r in usage.rows if r.model == "chat")
    assert (row.replicas, row.queued, row.running, row.requests_total) == (2, 3, 4, 10)
    assert row.kv_utilisation == pytest.approx(0.5) and row.gpu_utilisation == pytest.approx(0.3)
    assert usage.sampled_at == pytest.approx(time.time(), abs=5)


async def test_table_diff_names_what_changed(harness: Harness) -> None:
    await small_node(harness, "n1")
    await harness.poll(lambda: len(harness.cp.controller.tables.history("local")) >= 1, "a table")
    await harness.admin.Drain(admin_pb2.DrainRequest(replica_id="n1/r0"), timeout=5)
    diff = await harness.admin.DiffTable(admin_pb2.DiffTableRequest(), timeout=5)
    assert [(c.change, c.replica_id) for c in diff.changes] == [("removed", "n1/r0")]
    assert diff.to_version == diff.kept_versions[-1] and diff.from_version == diff.kept_versions[-2]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await harness.admin.DiffTable(admin_pb2.DiffTableRequest(from_version=1), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "kept" in (err.value.details() or "")


async def test_alloc_drains_the_cheapest_node_and_tells_its_agent(harness: Harness) -> None:
    busy = await small_node(harness, "n1")
    await busy.telemetry(load("n1/r0", queued=20, running=15))  # drain cost 35 + 2 x 10 > budget 40
    await harness.poll(lambda: "n1/r0" in harness.cp.controller.fleet.member("n1").loads, "telemetry")  # type: ignore[union-attr]
    idle = await small_node(harness, "n2")
    answer = await harness.admin.Allocate(admin_pb2.AllocateRequest(model="chat", gpus=8), timeout=5)
    assert [(s.node, list(s.gpus), list(s.displaces), s.state, s.drain_cost) for s in answer.placed] == [
        ("n2", list(range(8)), ["n2/r0", "n2/r1"], "draining", 20.0)]
    assert not answer.pending
    commands = sorted([(await idle.command()).replica_id for _ in range(2)])
    assert commands == ["n2/r0", "n2/r1"]  # the only thing that reaches an agent: drains
    replicas = await harness.replicas()
    assert [r for r, v in sorted(replicas.items()) if v.drain_requested] == ["n2/r0", "n2/r1"]
    nodes = {n.node: n for n in (await harness.admin.ListNodes(admin_pb2.ListNodesRequest(), timeout=5)).nodes}
    assert (nodes["n2"].slots, nodes["n2"].gpus_allocated) == (1, 8)
    # n1 is too busy to drain for a young request: the second one waits (n1 reserved for it), and says why.
    second = await harness.admin.Allocate(admin_pb2.AllocateRequest(model="chat", gpus=8), timeout=5)
    assert not second.placed and "costs 55 > drain budget 40" in second.pending[0].reason
    released = await harness.admin.Release(admin_pb2.ReleaseRequest(replica_id=second.pending[0].request_id),
                                           timeout=5)
    assert released.released and not released.undrained
    slot = answer.placed[0].replica_id
    released = await harness.admin.Release(admin_pb2.ReleaseRequest(replica_id=slot), timeout=5)
    assert sorted(released.undrained) == ["n2/r0", "n2/r1"]
    assert sorted([(await idle.command()).kind for _ in range(2)]) == [KIND.KIND_UNDRAIN] * 2
    listing = await harness.admin.ListAllocations(admin_pb2.ListAllocationsRequest(), timeout=5)
    assert not listing.slots and not listing.pending


ALLOC_ERRORS = [
    ("no-model", {"model": ""}, grpc.StatusCode.INVALID_ARGUMENT, "model"),
    ("unknown-model", {"model": "nope"}, grpc.StatusCode.NOT_FOUND, "nope"),
    ("too-many-gpus", {"model": "chat", "gpus": 65}, grpc.StatusCode.INVALID_ARGUMENT, "gpus"),
    ("too-many-replicas", {"model": "chat", "replicas": 65}, grpc.StatusCode.INVALID_ARGUMENT, "replicas"),
    ("bad-region", {"model": "chat", "region": "a b"}, grpc.StatusCode.INVALID_ARGUMENT, "region"),
]


@pytest.mark.parametrize(("fields", "code", "named"), [c[1:] for c in ALLOC_ERRORS], ids=[c[0] for c in ALLOC_ERRORS])
async def test_alloc_errors(harness: Harness, fields: dict, code: grpc.StatusCode, named: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await harness.admin.Allocate(admin_pb2.AllocateRequest(**fields), timeout=5)
    assert err.value.code() == code and named in (err.value.details() or "")


async def test_waiting_requests_are_bounded(clock) -> None:  # type: ignore[no-untyped-def]
    h = await Harness.start(clock, max_pending_allocations=2)
    try:
        first = await h.admin.Allocate(admin_pb2.AllocateRequest(model="chat", gpus=8, replicas=2), timeout=5)
        assert len(first.pending) == 2 and "no live, uncordoned node" in first.pending[0].reason
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await h.admin.Allocate(admin_pb2.AllocateRequest(model="chat", gpus=8), timeout=5)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "limit is 2" in (err.value.details() or "")
    finally:
        await h.stop()


async def test_allocations_and_requests_survive_a_restart_on_the_same_store() -> None:
    store = MemoryStore()
    settings = ControlPlaneSettings(tick_seconds=0.1, debounce_seconds=0.001)
    catalog = (ModelConfig(name="chat"),)
    addresses = []
    for run in range(2):
        cp = ControlPlane(settings, catalog=catalog, store=store, admin_auth=AdminAuth.with_token(TOKEN))
        port = await cp.start("127.0.0.1:0")
        addresses.append(port)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            admin = AdminClient(channel, TOKEN)
            if run == 0:
                agent = FakeAgent(channel)
                await agent.register(register("n1", replica("n1/r0", gpus=4), replica("n1/r1", gpus=4)))
                await admin.Allocate(admin_pb2.AllocateRequest(model="chat", gpus=8, replicas=2), timeout=5)
            listing = await admin.ListAllocations(admin_pb2.ListAllocationsRequest(), timeout=5)
            assert (len(listing.slots), len(listing.pending)) == (1, 1), f"run {run}"
            assert list(listing.slots[0].displaces) == ["n1/r0", "n1/r1"]
        await cp.stop(grace=0.1)
