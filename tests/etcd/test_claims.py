"""Ownership on a real etcd with two control planes: a fake agent cannot take or move a live node's replica.

node-b's agent is attached to controlplane-2; the fake agent connects to
controlplane-1 (the leader). Its registration claiming node-b-r0, and its
telemetry moving node-b-r0 to its own address, are both refused with the
field and the holder named, and every table keeps node-b-r0 on node-b.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator

import grpc
import pytest

from ferry.v1 import admin_pb2, fleet_pb2, fleet_pb2_grpc
from tests.etcd.harness import EtcdFleet, etcd_keys

FAKE = "127.0.0.1:9"


class Stream:
    """One ``Fleet.Connect`` stream from the test: messages in through a queue, the reply stream out."""

    def __init__(self, address: str) -> None:
        self._channel = grpc.insecure_channel(address)
        self._out: queue.Queue[fleet_pb2.AgentMessage | None] = queue.Queue()
        self.replies = fleet_pb2_grpc.FleetStub(self._channel).Connect(self._messages(), timeout=10)

    def _messages(self) -> Iterator[fleet_pb2.AgentMessage]:
        while (message := self._out.get()) is not None:
            yield message

    def send(self, **body: object) -> None:
        self._out.put(fleet_pb2.AgentMessage(**body))  # type: ignore[arg-type]

    def ended(self) -> grpc.RpcError:
        """The status the control plane ended the stream with."""
        with pytest.raises(grpc.RpcError) as err:
            for _ in self.replies:
                pass
        return err.value

    def close(self) -> None:
        self._out.put(None)
        self.replies.cancel()
        self._channel.close()


def _where(fleet: EtcdFleet, i: int) -> tuple[str, str]:
    view = fleet.replicas(i)["node-b-r0"]
    return view.node, view.address


@pytest.fixture
def two(make_fleet) -> EtcdFleet:
    fleet = make_fleet({"node-a": ["chat:v1"], "node-b": ["chat:v1"]}, control_planes=2, proxies=1)
    assert [n.control_plane for n in _nodes(fleet) if n.node == "node-b"] == ["controlplane-2"]
    return fleet


def _nodes(fleet: EtcdFleet) -> list[admin_pb2.NodeView]:
    channel, admin = fleet.admin(0)
    with channel:
        return list(admin.ListNodes(admin_pb2.ListNodesRequest(), timeout=5).nodes)


def test_a_fake_agent_on_another_control_plane_cannot_claim_a_live_replica(two: EtcdFleet, etcd) -> None:
    before = [_where(two, i) for i in (0, 1)]
    assert "/ferry/claims/replica/node-b-r0" in etcd_keys(etcd, "/ferry/claims/")
    fake = Stream(two.addresses[0])
    try:
        fake.send(register=fleet_pb2.Register(node="fake", region="local", gpus=1, replicas=[fleet_pb2.ReplicaInfo(
            replica_id="node-b-r0", model="chat", version="v1", address=FAKE, max_concurrency=8, gpus=1)]))
        err = fake.ended()
    finally:
        fake.close()
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS, err
    assert err.details().startswith("register.replicas[0].replica_id: held by node 'node-b' on control plane "
                                    "'controlplane-2'"), err.details()
    assert [_where(two, i) for i in (0, 1)] == before


def test_a_fake_agent_cannot_move_a_live_replica_by_telemetry(two: EtcdFleet) -> None:
    before = [_where(two, i) for i in (0, 1)]
    fake = Stream(two.addresses[0])
    try:
        fake.send(register=fleet_pb2.Register(node="fake", region="local", gpus=1))
        assert next(fake.replies).WhichOneof("body") == "registered"
        fake.send(telemetry=fleet_pb2.Telemetry(seq=1, changed=[fleet_pb2.ReplicaInfo(
            replica_id="node-b-r0", model="fake-model", version="v1", address=FAKE, max_concurrency=8, gpus=1)]))
        err = fake.ended()
    finally:
        fake.close()
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS, err
    assert err.details().startswith("telemetry.changed[0].replica_id: held by node 'node-b' on control plane "
                                    "'controlplane-2'"), err.details()
    assert [_where(two, i) for i in (0, 1)] == before
    assert two.replicas(0)["node-b-r0"].in_table
