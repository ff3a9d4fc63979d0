"""The spill planner: per-region demand from the tables' loads, weights and SpillRoutes in the tables."""

from __future__ import annotations

import pytest

from controlplane.tables.spill import SpillPlanner
from controlplane.tables.usage import Figures
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
    planner = SpillPlanner(RTT, step=0.1)
    tables = {"a": table("a", [15, 15]), "b": table("b", [5, 5, 5, 5]), "c": table("c", [2, 2])}
    weights = planner.attach(tables)
    assert weights == {("a", "b"): pytest.approx(0.1)}  # one step towards the nearest open region
    # c: 200 ms away, and the p99 wait on its 20 slots at 0.9 (about 400 ms) leaves no budget: no interactive
    # route; a batch route only (batch goes to idle capacity whatever the distance).
    route, far = tables["a"].spill
    assert (route.region, route.rtt_ms, route.weight, route.batch_only) == ("b", 40.0, pytest.approx(0.1), False)
    assert (far.region, far.weight, far.batch_only) == ("c", 0.0, True)
    # idle: b 40 - 20 of its slots, c 20 - 4: batch shares 20/36 and 16/36.
    assert route.batch_weight == pytest.approx(20 / 36, abs=1e-4)
    assert far.batch_weight == pytest.approx(16 / 36, abs=1e-4)
    assert [r.replica_id for r in route.models[0].replicas] == ["b0", "b1", "b2", "b3"]
    assert [r.load.running for r in route.models[0].replicas] == [5, 5, 5, 5]  # the loads travel with them
    assert not tables["b"].spill and not tables["c"].spill


def test_the_weight_settles_once_the_source_is_no_longer_saturated() -> None:
    planner = SpillPlanner(RTT, alpha=1.0, step=0.1)
    saturated = [planner.attach({"a": table("a", [12, 12]), "b": table("b", [4] * 4)})[("a", "b")] for _ in range(3)]
    # Spilling 0.3, a's replicas are 85 % busy (in the dead band): the weight stays.
    held = [planner.attach({"a": table("a", [9, 8]), "b": table("b", [6] * 4)})[("a", "b")] for _ in range(3)]
    assert saturated == pytest.approx([0.1, 0.2, 0.3]) and held == pytest.approx([0.3, 0.3, 0.3])


def test_no_rtt_configured_means_no_spill() -> None:
    tables = {"a": table("a", [15, 15]), "b": table("b", [0, 0])}
    assert SpillPlanner({}).attach(tables) == {} and not tables["a"].spill


def test_a_region_that_stays_saturated_spills_more_at_every_computation() -> None:
    planner = SpillPlanner(RTT)
    # Its proxies queue what its replicas cannot take: the control plane sees all slots busy, every time.
    weights = [planner.attach({"a": table("a", [10, 10]), "b": table("b", [2] * 8)})[("a", "b")] for _ in range(3)]
    assert weights[0] < weights[1] < weights[2] <= 0.9


def test_the_proxies_offered_rates_size_the_weight() -> None:
    planner = SpillPlanner(RTT, alpha=1.0, service_ms=200.0, high=2.0, low=0.5)  # no saturation step: sizing alone
    # a: 2 x 10 slots (100/s nominal), 15 busy answering 75/s (the law L = λW: 100/s), 150/s offered;
    # b: 4 x 10 slots, 20 busy for 100/s (200/s); c: 2 x 10 slots, little offered.
    tables = {"a": table("a", [8, 7]), "b": table("b", [5, 5, 5, 5]), "c": table("c", [2, 2])}
    usage = {("m", "a", "interactive"): Figures(offered_rate=150.0, request_rate=75.0),
             ("m", "b", "interactive"): Figures(offered_rate=100.0, request_rate=100.0),
             ("m", "c", "interactive"): Figures(offered_rate=20.0, request_rate=20.0),
             ("m", "a", "batch"): Figures(offered_rate=500.0)}  # other tiers do not count
    weights = planner.attach(tables, usage)
    # a keeps 0.85 x 100; its excess 65 of 150 fits b's spare (0.9 x 200 - 100 = 80).
    assert weights == {("a", "b"): pytest.approx(65 / 150, abs=1e-4)}
    assert planner.controller.offered == {"a": 150.0, "b": 100.0, "c": 20.0}
    assert [r.region for r in tables["a"].spill if not r.batch_only] == ["b"]
