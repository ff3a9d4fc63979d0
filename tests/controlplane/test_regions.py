"""The spill planner: per-region demand from the tables' loads, weights and SpillRoutes in the tables."""

from __future__ import annotations

import pytest

from controlplane.regions import SpillPlanner
from ferry.v1 import common_pb2, tables_pb2

RTT = {"a:b": 40.0, "a:c": 200.0, "b:c": 180.0}


def table(region: str, busy: list[int], slots: int = 10) -> tables_pb2.TableSnapshot:
    replicas = [tables_pb2.ReplicaRoute(replica_id=f"{region}{i}", region=region, version="v1",
                                        address="127.0.0.1:1", max_concurrency=slots,
                                        load=common_pb2.ReplicaLoad(running=min(b, slots), queued=max(0, b - slots)))
                for i, b in enumerate(busy)]
    return tables_pb2.TableSnapshot(region=region, models=[
        tables_pb2.ModelRoute(model="m", default_version="v1", replicas=replicas)])


def test_a_saturated_region_gets_a_spill_route_to_its_nearest_neighbour_with_room() -> None:
    planner = SpillPlanner(RTT, hidden=0.0)
    tables = {"a": table("a", [15, 15]), "b": table("b", [5, 5, 5, 5]), "c": table("c", [2, 2])}
    weights = planner.attach(tables)
    assert set(weights) == {("a", "b")}
    assert weights[("a", "b")] == pytest.approx((30 - 18) / 30)
    (route,) = tables["a"].spill
    assert (route.region, route.rtt_ms) == ("b", 40.0)
    assert [r.replica_id for r in route.models[0].replicas] == ["b0", "b1", "b2", "b3"]
    assert not tables["b"].spill and not tables["c"].spill


def test_demand_accounts_for_what_is_already_spilled_so_weights_settle() -> None:
    planner = SpillPlanner(RTT, alpha=1.0, hidden=0.0)
    first = planner.attach({"a": table("a", [15, 15]), "b": table("b", [5, 5, 5, 5])})[("a", "b")]
    # Spilling as planned, a keeps 18 of its 30 and b carries 12 more: the weight stays where it was.
    again = planner.attach({"a": table("a", [9, 9]), "b": table("b", [8, 8, 8, 8])})
    assert again[("a", "b")] == pytest.approx(first)


def test_no_rtt_configured_means_no_spill() -> None:
    tables = {"a": table("a", [15, 15]), "b": table("b", [0, 0])}
    assert SpillPlanner({}).attach(tables) == {} and not tables["a"].spill


def test_a_region_that_stays_saturated_spills_more_at_every_computation() -> None:
    planner = SpillPlanner(RTT)
    # Its proxies queue what its replicas cannot take: the control plane sees all slots busy, every time.
    weights = [planner.attach({"a": table("a", [10, 10]), "b": table("b", [2] * 8)})[("a", "b")] for _ in range(3)]
    assert weights[0] < weights[1] < weights[2] <= 1.0
