"""Members held by other control planes: liveness from reports and the store, and the merge with our own."""

from __future__ import annotations

import pytest

from controlplane.cluster.remote import RemoteFleet, merge
from controlplane.fleet.view import Member, is_live
from ferry.v1 import admin_pb2
from tests.controlplane.fakes import GRACE, FakeClock, fleet_with, load, register, replica


def remote_fleet(clock: FakeClock) -> RemoteFleet:
    return RemoteFleet(clock=clock, grace_seconds=GRACE, forget_after_seconds=60.0, max_members=3)


def report(*items: tuple[str, float, bool], queued: int = 0) -> admin_pb2.FollowerReport:
    return admin_pb2.FollowerReport(control_plane_id="cp2", members=[
        admin_pb2.MemberReport(node=node, heard_seconds_ago=ago, connected=connected,
                               loads=[load(f"{node}/r0", queued=queued), load("ghost")])
        for node, ago, connected in items
    ])


def live(members: list[Member], clock: FakeClock) -> dict[str, bool]:
    return {m.node: is_live(m, clock(), GRACE) for m in members}


LIVENESS = [
    # id, stored, reported seconds ago (None: never), own node, live
    ("stored-only", True, None, False, True),
    ("stored-but-ours", True, None, True, False),
    ("reported-recently", False, 1.0, False, True),
    ("reported-past-grace", False, GRACE + 0.5, False, False),
    ("deleted-but-still-reported", False, 0.5, False, True),
    ("deleted-and-silent", False, None, False, False),
]


@pytest.mark.parametrize(("stored", "ago", "own", "alive"), [c[1:] for c in LIVENESS], ids=[c[0] for c in LIVENESS])
def test_liveness(stored: bool, ago: float | None, own: bool, alive: bool) -> None:
    clock = FakeClock()
    fleet = remote_fleet(clock)
    fleet.stored("n1", register("n1", replica("n1/r0")))
    if ago is not None:
        fleet.report("cp2", report(("n1", ago, True)))
    if not stored:
        fleet.stored("n1", None)
    assert live(fleet.members(own={"n1"} if own else set()), clock) == {"n1": alive}


def test_reports_carry_loads_and_ignore_the_unknown() -> None:
    clock = FakeClock()
    fleet = remote_fleet(clock)
    fleet.stored("n1", register("n1", replica("n1/r0")))
    fleet.report("cp2", report(("n1", 0.25, True), ("n9", 0.0, True), queued=4))
    (member,) = fleet.members()
    assert member.loads["n1/r0"].queued == 4 and member.load_at["n1/r0"] == clock() - 0.25
    assert member.connected and fleet.ignored == {"unknown_node": 1, "unknown_replica": 1}
    fleet.report("cp3", report(("n1", 2.0, False), queued=9))  # older than what we have: ignored
    assert fleet.members()[0].loads["n1/r0"].queued == 4
    fleet.stored("n1", register("n1", replica("n1/r1")))  # re-registered: the gone replica's load goes
    assert fleet.members()[0].loads == {}


def test_bounded_and_forgotten() -> None:
    clock = FakeClock()
    fleet = remote_fleet(clock)
    for i in range(4):
        fleet.stored(f"n{i}", register(f"n{i}", replica(f"n{i}/r0")))
    assert len(fleet.entries) == 3 and fleet.ignored["remote_members_limit"] == 1
    fleet.stored("n0", None)
    clock.advance(61)
    assert fleet.forget_expired() == ["n0"]


def test_merge_prefers_the_connected_copy_and_gives_each_replica_one_node() -> None:
    clock = FakeClock()
    local, (here, stale) = fleet_with(clock, register("a", replica("a/r0")), register("b", replica("b/r0")))
    local.disconnect(stale)  # b moved to another control plane: still within grace here
    remote = remote_fleet(clock)
    for reg in (register("a", replica("a/r0")), register("b", replica("b/r0")),
                register("c", replica("c/r0"), replica("a/r0"))):  # c claims a/r0 too (a stale registration)
        remote.stored(reg.node, reg)
    remote.report("cp2", report(("b", 0.1, True), ("c", 0.1, True)))
    merged = merge(local.members(), remote.members(own={"a", "b"}), now=clock(), grace=GRACE)
    by_node = {m.node: m for m in merged}
    assert [m.node for m in merged] == ["a", "b", "c"]
    assert by_node["a"] is here  # connected here beats the store's copy of it
    assert by_node["b"] is not stale and by_node["b"].connected  # reported connected elsewhere beats stale here
    assert list(by_node["c"].replicas) == ["c/r0"]  # a/r0 stays with the node connected here


def test_a_key_of_a_node_held_here_does_not_ask_for_a_recomputation() -> None:
    """The store's echo of this control plane's own member writes (a burst of them when leases are written
    again) changed nothing in the merged view, yet each asked for a table pass; now only other nodes' do."""
    from controlplane.cluster.coordination import Cluster
    from controlplane.config import ControlPlaneSettings
    from controlplane.store.base import MEMBERS_PREFIX, KeyValue
    from controlplane.store.memory import MemoryStore

    clock = FakeClock()
    asked: list[int] = []
    cluster = Cluster(MemoryStore(clock=clock), ControlPlaneSettings(), address="127.0.0.1:1", clock=clock,
                      wall=clock, on_change=lambda: asked.append(1), report=admin_pb2.FollowerReport,
                      adopt=lambda snapshot: None, held=lambda node: node == "here")
    for node in ("here", "there"):
        value = register(node, replica(f"{node}/r0")).SerializeToString()
        cluster._member_key(MEMBERS_PREFIX + node, KeyValue(MEMBERS_PREFIX + node, value, 1))
    assert len(asked) == 1  # "there" only
    assert set(cluster.remote.entries) == {"here", "there"}  # both still known to the merge
    cluster._member_key(MEMBERS_PREFIX + "there", None)
    assert len(asked) == 2
