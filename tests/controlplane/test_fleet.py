"""The fleet view: liveness on a fake clock, re-registration, telemetry, bounds."""

from __future__ import annotations

import pytest

from controlplane.fleet.view import FleetView, is_live, replica_state
from ferry.errors import AlreadyExists, Overloaded
from ferry.v1 import common_pb2, fleet_pb2
from tests.controlplane.fakes import GRACE, FakeClock, fleet_with, load, register, replica

LIVENESS = [
    # id, seconds silent before the stream ends (None: stays open), seconds after, live
    ("connected-fresh", None, 0.0, True),
    ("connected-at-grace", None, GRACE, True),
    ("connected-telemetry-stale", None, GRACE + 0.01, False),
    ("gone-just-now", 0.0, 0.0, True),
    ("gone-within-grace", 0.0, GRACE - 0.01, True),
    ("gone-past-grace", 0.0, GRACE + 0.01, False),
    ("silent-then-gone", 2.0, 1.5, False),  # telemetry older than grace although the stream went 1.5 s ago
]


@pytest.mark.parametrize(("silent", "after", "live"), [c[1:] for c in LIVENESS], ids=[c[0] for c in LIVENESS])
def test_liveness(silent: float | None, after: float, live: bool) -> None:
    clock = FakeClock()
    fleet, (member,) = fleet_with(clock, register("n1", replica("n1/r0")))
    if silent is not None:
        clock.advance(silent)
        fleet.disconnect(member)
    clock.advance(after)
    assert fleet.live(member) is live
    assert is_live(member, clock(), GRACE) is live
    expected = common_pb2.REPLICA_STATE_READY if live else common_pb2.REPLICA_STATE_DEAD
    assert replica_state(member, "n1/r0", live) == expected


def test_telemetry_keeps_a_member_live() -> None:
    clock = FakeClock()
    fleet, (member,) = fleet_with(clock, register("n1", replica("n1/r0")))
    for _ in range(5):
        clock.advance(GRACE - 0.5)
        fleet.apply_telemetry(member, fleet_pb2.Telemetry(seq=1, replicas=[load("n1/r0")]))
    assert fleet.live(member)
    assert member.load_at["n1/r0"] == clock()


def test_registering_again_replaces_the_earlier_registration() -> None:
    clock = FakeClock()
    fleet, (old,) = fleet_with(clock, register("n1", replica("n1/r0"), replica("n1/r1")))
    new = fleet.register(register("n1", replica("n1/r2"), region="eu"))
    assert fleet.member("n1") is new and new.session != old.session
    assert list(new.replicas) == ["n1/r2"] and new.region == "eu"
    assert fleet.find("n1/r0") is None
    assert fleet.disconnect(old) is False  # the earlier stream ending does not touch the new one
    assert new.connected


def test_a_replica_id_held_by_a_live_node_is_refused_naming_the_field() -> None:
    clock = FakeClock()
    fleet, _ = fleet_with(clock, register("n1", replica("n1/r0")))
    with pytest.raises(AlreadyExists) as err:
        fleet.register(register("n2", replica("n2/r0"), replica("n1/r0")))
    assert err.value.field == "register.replicas[1].replica_id"


def test_a_replica_id_moves_from_a_dead_node() -> None:
    clock = FakeClock()
    fleet, (old,) = fleet_with(clock, register("n1", replica("shared")))
    fleet.disconnect(old)
    clock.advance(GRACE + 1)
    new = fleet.register(register("n2", replica("shared")))
    assert fleet.find("shared") is new
    assert "shared" not in old.replicas


def test_telemetry_adds_changes_removes_and_counts_what_it_ignores() -> None:
    clock = FakeClock()
    fleet, (member, other) = fleet_with(
        clock, register("n1", replica("n1/r0"), replica("n1/r1")), register("n2", replica("n2/r0")),
    )
    outcome = fleet.apply_telemetry(member, fleet_pb2.Telemetry(
        seq=1,
        replicas=[load("n1/r0", queued=2), load("ghost"), load("n1/r2")],
        changed=[replica("n1/r2", "embed"), replica("n2/r0")],
        removed=["n1/r1", "gone"],
    ))
    assert outcome.membership_changed
    assert dict(outcome.ignored) == {"unknown_replica": 2, "replica_conflict": 1}
    assert sorted(member.replicas) == ["n1/r0", "n1/r2"]
    assert member.loads["n1/r0"].queued == 2 and "n1/r2" in member.loads
    assert fleet.find("n2/r0") is other


def test_telemetry_beyond_the_replica_limit_is_ignored() -> None:
    clock = FakeClock()
    fleet = FleetView(clock=clock, grace_seconds=GRACE, max_replicas_per_node=2)
    member = fleet.register(register("n1", replica("a"), replica("b")))
    outcome = fleet.apply_telemetry(member, fleet_pb2.Telemetry(changed=[replica("c"), replica("a", version="v2")]))
    assert dict(outcome.ignored) == {"replicas_limit": 1}
    assert sorted(member.replicas) == ["a", "b"] and member.replicas["a"].version == "v2"


def test_members_are_bounded_and_dead_ones_forgotten_first() -> None:
    clock = FakeClock()
    fleet = FleetView(clock=clock, grace_seconds=GRACE, forget_after_seconds=10.0, max_members=2)
    first = fleet.register(register("n1"))
    fleet.register(register("n2"))
    with pytest.raises(Overloaded):
        fleet.register(register("n3"))
    second = fleet.register(register("n2"))  # a known node may always register again
    fleet.disconnect(first)
    clock.advance(5.0)
    with pytest.raises(Overloaded):  # dead, but still shown to operators
        fleet.register(register("n3"))
    clock.advance(6.0)
    fleet.apply_telemetry(second, fleet_pb2.Telemetry(seq=1))
    fleet.register(register("n3"))
    assert sorted(m.node for m in fleet.members()) == ["n2", "n3"]


def test_forget_expired_drops_long_dead_members_only() -> None:
    clock = FakeClock()
    fleet = FleetView(clock=clock, grace_seconds=GRACE, forget_after_seconds=10.0)
    dead = fleet.register(register("n1", replica("n1/r0")))
    fleet.register(register("n2"))
    fleet.disconnect(dead)
    clock.advance(10.5)
    live = fleet.member("n2")
    assert live is not None
    fleet.apply_telemetry(live, fleet_pb2.Telemetry(seq=1))
    assert fleet.forget_expired() == ["n1"]
    assert fleet.find("n1/r0") is None and len(fleet) == 1


def test_kserve_model_defaults_to_the_model() -> None:
    clock = FakeClock()
    reg = register("n1", replica("n1/r0", "chat"), replica("n1/r1", "chat", kserve_model="x"))
    _, (member,) = fleet_with(clock, reg)
    assert [i.kserve_model for i in member.replicas.values()] == ["chat", "x"]
