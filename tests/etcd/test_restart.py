"""A control plane restarted from etcd keeps the operator's intent: drains and GPU allocations.

Every control plane is killed (SIGKILL: nothing is handed over), one is
started again on the same port: all it knows comes from etcd.
"""

from __future__ import annotations

import asyncio

from controlplane.allocation.records import Allocation, allocate
from controlplane.store.etcd import EtcdStore
from ferry.v1 import admin_pb2, common_pb2
from tests.etcd.harness import wait_for

GANG = Allocation("node-b-r1", "chat", "v1", tuple(range(8)))


async def _allocate(endpoint: str) -> None:
    store = EtcdStore(endpoint)
    try:
        await allocate(store, "node-b", GANG, node_gpus=8)
    finally:
        await store.close()


def test_a_restarted_control_plane_keeps_drains_and_allocations(make_fleet, etcd) -> None:
    fleet = make_fleet({"node-a": ["chat:v1", "chat:v1"], "node-b": ["chat:v1"]}, control_planes=1)
    channel, admin = fleet.admin(0)
    with channel:
        view = admin.Drain(admin_pb2.DrainRequest(replica_id="node-a-r0"), timeout=5).replica
    assert view.drain_requested and not view.in_table
    asyncio.run(_allocate(etcd.endpoint))  # as a gang allocation would store it
    wait_for(lambda: fleet.status(0).allocations == 1, 5, "the allocation mirrored")
    fleet.cps[0].kill()
    fleet.restart_cp(0)
    status = fleet.status(0)
    assert (status.drains, status.allocations, status.role) == (1, 1, "leader")
    wait_for(lambda: fleet.status(0).agents == 2, 15, "both agents back")
    replicas = wait_for(lambda: (r := fleet.replicas(0)) and sorted(i for i, v in r.items() if v.in_table) == [
        "node-a-r1", "node-b-r0"] and r, 10, "the replicas not drained back in the table")
    assert replicas["node-a-r0"].drain_requested and not replicas["node-a-r0"].in_table
    wait_for(lambda: fleet.replicas(0)["node-a-r0"].state == common_pb2.REPLICA_STATE_DRAINED, 10,
             "the agent to be told the drain again, and drain")
