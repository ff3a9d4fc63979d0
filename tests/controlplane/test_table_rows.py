"""Incremental table rows (:class:`controlplane.tables.compute.RouteRows`) against a full computation.

A property test drives one fleet view through random sequences of changes (registrations, drains
and undrains, cordons, telemetry with loads, states, added and removed replicas, members that go
silent, disconnect or are forgotten, rollout weights) and checks after every step that the
computation with the caller's cached rows gives exactly the tables of a computation from scratch.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.fleet.view import FleetView
from controlplane.rollout.plan import CANARY, PROMOTED, Rollout
from controlplane.tables.compute import RouteRows, compute_tables
from ferry.config import ModelConfig
from ferry.v1 import common_pb2, fleet_pb2, tables_pb2
from tests.controlplane.fakes import GRACE, FakeClock, load, register, replica

S = common_pb2
CATALOG = (ModelConfig(name="chat", default_version="v1"),)
NODES = [f"n{i}" for i in range(4)]
REPLICAS = [f"r{i}" for i in range(3)]
STATES = [S.REPLICA_STATE_READY, S.REPLICA_STATE_WARMING, S.REPLICA_STATE_DRAINING, S.REPLICA_STATE_DRAINED]

node_ = st.sampled_from(NODES)
replica_ = st.sampled_from(REPLICAS)
change = st.one_of(
    st.tuples(st.just("register"), node_, st.sampled_from(["local", "eu"]),
              st.lists(st.tuples(replica_, st.sampled_from(["chat", "code"]), st.sampled_from(["v1", "v2"])),
                       max_size=3, unique_by=lambda t: t[0])),
    st.tuples(st.just("drain"), node_, replica_),
    st.tuples(st.just("undrain"), node_, replica_),
    st.tuples(st.just("cordon"), node_),
    st.tuples(st.just("uncordon"), node_),
    st.tuples(st.just("telemetry"), node_, replica_, st.sampled_from(STATES), st.integers(0, 9)),
    st.tuples(st.just("add"), node_, replica_, st.sampled_from(["v1", "v2"])),
    st.tuples(st.just("remove"), node_, replica_),
    st.tuples(st.just("disconnect"), node_),
    st.tuples(st.just("time"), st.sampled_from([0.1, 1.0, GRACE + 0.5, 400.0])),
    st.tuples(st.just("forget")),
    st.tuples(st.just("weights"), st.sampled_from([0.0, 0.05, 0.5, 1.0]), st.sampled_from([CANARY, PROMOTED])),
    st.tuples(st.just("no-rollout")),
)


def rid(node: str, r: str) -> str:
    return f"{node}/{r}"


class Fleet:
    """The inputs of a computation, changed one step at a time."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.view = FleetView(clock=self.clock, grace_seconds=GRACE)
        self.drains: set[str] = set()
        self.cordons: set[str] = set()
        self.rollouts: dict[str, Rollout] = {}
        self.seq = 0

    def apply(self, step: tuple[Any, ...]) -> None:
        kind, *args = step
        member = self.view.member(args[0]) if args and isinstance(args[0], str) else None
        if kind == "register":
            node, region, specs = args
            self.view.register(register(node, *(replica(rid(node, r), m, version=v) for r, m, v in specs),
                                        region=region))
        elif kind == "drain":
            self.drains.add(rid(args[0], args[1]))
        elif kind == "undrain":
            self.drains.discard(rid(args[0], args[1]))
        elif kind == "cordon":
            self.cordons.add(args[0])
        elif kind == "uncordon":
            self.cordons.discard(args[0])
        elif kind == "forget":
            self.view.forget_expired()
        elif kind == "time":
            self.clock.advance(args[0])
        elif kind == "weights":
            self.rollouts["chat"] = Rollout("chat", "v1", "v2", args[0], args[1], self.clock())
        elif kind == "no-rollout":
            self.rollouts.clear()
        elif member is not None and member.connected:
            self.seq += 1
            r = rid(args[0], args[1])
            if kind == "telemetry":
                message = fleet_pb2.Telemetry(seq=self.seq, replicas=[load(r, state=args[2], queued=args[3])])
            elif kind == "add":
                message = fleet_pb2.Telemetry(seq=self.seq, changed=[replica(r, version=args[2])])
            elif kind == "remove":
                message = fleet_pb2.Telemetry(seq=self.seq, removed=[r])
            else:  # disconnect
                self.view.disconnect(member)
                return
            self.view.apply_telemetry(member, message)

    def compute(self, rows: RouteRows | None) -> dict[str, bytes]:
        tables = compute_tables(self.view.members(), CATALOG, self.drains, now=self.clock(), grace_seconds=GRACE,
                                regions=["local"], cordons=self.cordons, rollouts=self.rollouts, rows=rows)
        return {region: t.SerializeToString(deterministic=True) for region, t in tables.items()}


@settings(max_examples=200, deadline=None)
@given(st.lists(change, min_size=1, max_size=40))
def test_cached_rows_give_the_tables_of_a_full_computation(steps: list[tuple[Any, ...]]) -> None:
    fleet = Fleet()
    rows = RouteRows()
    for step in steps:
        fleet.apply(step)
        assert fleet.compute(rows) == fleet.compute(None), step
        assert len(rows) <= sum(len(m.replicas) for m in fleet.view.members())  # bounded by the fleet


def test_one_drain_builds_no_row_and_one_telemetry_builds_one() -> None:
    fleet = Fleet()
    for node in NODES:
        fleet.apply(("register", node, "local", [(r, "chat", "v1") for r in REPLICAS]))
    rows = RouteRows()
    fleet.compute(rows)
    assert (rows.built, rows.reused) == (12, 0)
    fleet.apply(("drain", "n1", "r0"))
    fleet.compute(rows)
    assert (rows.built, rows.reused) == (0, 11)
    fleet.apply(("telemetry", "n2", "r1", S.REPLICA_STATE_READY, 5))
    fleet.clock.advance(0.2)
    tables = compute_tables(fleet.view.members(), CATALOG, fleet.drains, now=fleet.clock(), grace_seconds=GRACE,
                            rows=rows)
    assert (rows.built, rows.reused) == (1, 10)
    ages = {r.replica_id: r.telemetry_age_seconds for m in tables["local"].models for r in m.replicas}
    # ages move with the clock on reused rows too
    assert ages["n2/r1"] == pytest.approx(0.2) and ages["n3/r2"] == pytest.approx(0.2)


def test_rows_in_a_published_snapshot_are_copies() -> None:
    """A later computation sets ages on the cached rows; a table already built keeps its own."""
    fleet = Fleet()
    fleet.apply(("register", "n0", "local", [("r0", "chat", "v1")]))
    rows = RouteRows()
    first = compute_tables(fleet.view.members(), CATALOG, set(), now=fleet.clock(), grace_seconds=GRACE, rows=rows)
    fleet.clock.advance(1.0)
    compute_tables(fleet.view.members(), CATALOG, set(), now=fleet.clock(), grace_seconds=GRACE, rows=rows)
    route: tables_pb2.ReplicaRoute = first["local"].models[0].replicas[0]
    assert route.telemetry_age_seconds == 0.0
