"""Ownership across control planes: a claim or a telemetry change on what a live node holds anywhere is refused.

Two control planes on one shared embedded store (the same code runs against
etcd in tests/etcd/test_claims.py): node n2's agent is on cp2, an intruder on
cp1 (the leader, which computes the tables). Every refusal names the field
and the holder, and the leader's table keeps n2/r0 where n2 serves it.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from controlplane.fleet.claims import Claim, Holder, claim_key, refusal
from ferry.v1 import admin_pb2, fleet_pb2
from tests.controlplane.fakes import WAIT, FakeAgent, FakeProxy, Harness, Pair, register, replica, routed

N2 = replica("n2/r0")
FAKE = "127.0.0.9:7000"


async def _n2_on_cp2(pair: Pair) -> tuple[FakeAgent, FakeProxy]:
    agent = FakeAgent(pair.channels[1])
    await agent.register(register("n2", N2))
    proxy = FakeProxy(pair.channels[0], "p1")
    await proxy.send_subscribe()
    await proxy.until(lambda t: routed(t) == ["n2/r0"])
    return agent, proxy


async def _unchanged(pair: Pair) -> None:
    """Both control planes show n2/r0 on n2 at its own address, and nothing else."""
    for i in (0, 1):
        views = (await pair.admin(i).ListReplicas(admin_pb2.ListReplicasRequest(), timeout=WAIT)).replicas
        assert [(v.replica_id, v.node, v.address) for v in views] == [("n2/r0", "n2", N2.address)], views
    table = pair.cps[0].controller.tables.get("local")
    assert table is not None and sorted(table.replica_ids) == ["n2/r0"]
    route = table.snapshot.models[0].replicas[0]
    assert (route.node, route.address) == ("n2", N2.address)


CLAIMS = [
    ("replica-id", register("x", replica("n2/r0", address=FAKE)), "register.replicas[0].replica_id"),
    ("address", register("x", replica("x/r0", address=N2.address)), "register.replicas[0].address"),
    ("node-from-another-host", register("n2", replica("n2/r9", address=FAKE)), "register.node"),
]


@pytest.mark.parametrize(("claim", "field"), [c[1:] for c in CLAIMS], ids=[c[0] for c in CLAIMS])
async def test_a_claim_on_a_replica_held_on_another_control_plane_is_refused(
        pair: Pair, claim: fleet_pb2.Register, field: str) -> None:
    await _n2_on_cp2(pair)
    intruder = FakeAgent(pair.channels[0])
    await intruder.send(register=claim)
    code, details = await intruder.status()
    assert code == grpc.StatusCode.ALREADY_EXISTS and details.split(":")[0] == field, details
    assert "'n2'" in details and "'cp2'" in details, details
    await _unchanged(pair)


MOVES = [
    ("replica-id", replica("n2/r0", address=FAKE), "telemetry.changed[0].replica_id"),
    ("address", replica("x/r1", address=N2.address), "telemetry.changed[0].address"),
]


@pytest.mark.parametrize(("change", "field"), [c[1:] for c in MOVES], ids=[c[0] for c in MOVES])
async def test_telemetry_cannot_move_a_replica_held_on_another_control_plane(
        pair: Pair, change: fleet_pb2.ReplicaInfo, field: str) -> None:
    await _n2_on_cp2(pair)
    intruder = FakeAgent(pair.channels[0])
    await intruder.register(register("x"))  # a node of its own, no replicas
    await intruder.telemetry(changed=[change])
    code, details = await intruder.status()
    assert code == grpc.StatusCode.ALREADY_EXISTS and details.split(":")[0] == field, details
    assert "'n2'" in details and "'cp2'" in details, details
    await _unchanged(pair)


async def test_the_node_itself_moves_to_another_control_plane_at_once(pair: Pair) -> None:
    old, _proxy = await _n2_on_cp2(pair)
    moved = FakeAgent(pair.channels[0])
    await moved.register(register("n2", N2))  # same hosts: the node reconnecting, not a claim from elsewhere
    nodes = (await pair.admin(0).ListNodes(admin_pb2.ListNodesRequest(), timeout=WAIT)).nodes
    assert [(n.node, n.control_plane) for n in nodes] == [("n2", "cp1")]
    await old.call.done_writing()


async def test_telemetry_cannot_take_an_address_a_node_serves_on_the_same_control_plane(harness: Harness) -> None:
    await harness.agent().register(register("n1", replica("n1/r0")))
    intruder = harness.agent()
    await intruder.register(register("n2", replica("n2/r0")))
    await intruder.telemetry(changed=[replica("n2/r1", address=replica("n1/r0").address)])
    code, details = await intruder.status()
    assert code == grpc.StatusCode.ALREADY_EXISTS and details.split(":")[0] == "telemetry.changed[0].address"
    views = await harness.replicas()
    assert sorted(views) == ["n1/r0", "n2/r0"]


REFUSALS = [
    ("free", None, "n1", set(), None),
    ("own", Holder("n1", "cp2"), "n1", set(), None),
    ("other-live", Holder("n2", "cp2"), "n1", set(), "held by node 'n2' on control plane 'cp2'"),
    ("other-dead", Holder("n2", "cp2"), "n1", {"n2"}, None),
]


@pytest.mark.parametrize(("holder", "node", "dead", "why"), [c[1:] for c in REFUSALS], ids=[c[0] for c in REFUSALS])
def test_refusal_rule(holder: Holder | None, node: str, dead: set[str], why: str | None) -> None:
    claim = Claim("register.replicas[0].replica_id", "replica", "/ferry/claims/replica/r")
    assert refusal(claim, holder, node=node, control_plane="cp1", hosts=frozenset({"h"}),
                   dead=lambda n: n in dead) == why


NODE_CLAIMS = [
    ("same-hosts", {"h"}, ("h", "g"), False),
    ("other-hosts", {"z"}, ("h",), True),
    ("no-replicas", set(), ("h",), True),
]


@pytest.mark.parametrize(("hosts", "held", "refused"), [c[1:] for c in NODE_CLAIMS], ids=[c[0] for c in NODE_CLAIMS])
def test_a_node_name_held_on_another_control_plane_moves_only_from_its_own_hosts(
        hosts: set[str], held: tuple[str, ...], refused: bool) -> None:
    claim = Claim("register.node", "node", "/ferry/claims/node/n1")
    why = refusal(claim, Holder("n1", "cp2", held), node="n1", control_plane="cp1", hosts=frozenset(hosts),
                  dead=lambda n: False)
    assert (why is not None) == refused


async def test_a_replica_the_node_drops_is_released_for_another_node(harness: Harness) -> None:
    holder = harness.agent()
    await holder.register(register("n1", replica("n1/r0"), replica("n1/r1")))
    key = claim_key("replica", "n1/r1")
    assert await harness.cp.store.get(key) is not None
    await holder.telemetry(removed=["n1/r1"])
    deadline = time.monotonic() + WAIT
    while await harness.cp.store.get(key) is not None:  # released at the next member write (a tick)
        assert time.monotonic() < deadline, "the claim of n1/r1 was not released"
        await asyncio.sleep(0.01)
    await harness.agent().register(register("n2", replica("n1/r1")))
    assert (await harness.replicas())["n1/r1"].node == "n2"
