"""The pure table computation and the version counter, table by table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from controlplane.tables.compute import TableVersions, catalog_models, compute_tables, content_key, initial_version
from ferry.config import ModelConfig
from ferry.v1 import common_pb2, fleet_pb2, tables_pb2
from tests.controlplane.fakes import GRACE, FakeClock, fleet_with, load, register, replica, routed

CATALOG = (ModelConfig(name="chat", default_version="v1"), ModelConfig(name="empty-model", default_version="v2"))
S = common_pb2


@dataclass(frozen=True)
class Case:
    id: str
    state: int = S.REPLICA_STATE_READY  # what the agent reports in telemetry
    drain: bool = False
    silent_for: float = 0.0  # seconds since the node's last message
    gone_for: float | None = None  # seconds since its stream ended (None: still connected)
    routable: bool = True


CASES = [
    Case("ready"),
    Case("warming", state=S.REPLICA_STATE_WARMING, routable=False),
    Case("draining", state=S.REPLICA_STATE_DRAINING, routable=False),
    Case("drained", state=S.REPLICA_STATE_DRAINED, routable=False),
    Case("reported-dead", state=S.REPLICA_STATE_DEAD, routable=False),
    Case("drain-requested", drain=True, routable=False),
    Case("telemetry-at-grace", silent_for=GRACE),
    Case("stale-member", silent_for=GRACE + 0.1, routable=False),
    Case("stream-gone-within-grace", gone_for=1.0, silent_for=1.0),
    Case("stream-gone-past-grace", gone_for=GRACE + 0.1, silent_for=GRACE + 0.1, routable=False),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_routable_replicas(case: Case) -> None:
    clock = FakeClock()
    fleet, (member,) = fleet_with(clock, register("n1", replica("n1/r0"), replica("n1/r1")))
    fleet.apply_telemetry(member, fleet_pb2.Telemetry(seq=1, replicas=[load("n1/r0", state=case.state), load("n1/r1")]))
    if case.gone_for is not None:
        clock.advance(case.silent_for - case.gone_for)
        fleet.disconnect(member)
        clock.advance(case.gone_for)
    else:
        clock.advance(case.silent_for)
    drains = {"n1/r0"} if case.drain else set()

    tables = compute_tables(fleet.members(), CATALOG, drains, now=clock(), grace_seconds=GRACE)

    live_other = ["n1/r1"] if case.silent_for <= GRACE else []
    expected = (["n1/r0"] if case.routable else []) + live_other
    assert routed(tables["local"], "chat") == expected


def test_every_catalog_model_is_listed_even_without_replicas() -> None:
    clock = FakeClock()
    fleet, _ = fleet_with(
        clock, register("n1", replica("n1/r0"), replica("n1/r1", "embed", version="v3"), replica("n1/r2", "embed")),
    )
    tables = compute_tables(fleet.members(), CATALOG, set(), now=clock(), grace_seconds=GRACE)
    models = {m.model: m for m in tables["local"].models}
    assert list(models) == ["chat", "embed", "empty-model"]  # sorted, registered-only model included
    assert [r.replica_id for r in models["empty-model"].replicas] == []
    assert models["empty-model"].default_version == "v2"
    assert models["embed"].default_version == "v3"  # greatest version among its replicas


def test_catalog_keeps_configured_defaults() -> None:
    clock = FakeClock()
    _, members = fleet_with(clock, register("n1", replica("n1/r0", version="v9")))
    assert catalog_models(CATALOG, members) == list(CATALOG)


def test_watched_region_without_nodes_gets_a_table() -> None:
    clock = FakeClock()
    fleet, _ = fleet_with(clock, register("n1", replica("n1/r0")))
    tables = compute_tables(fleet.members(), CATALOG, set(), now=clock(), grace_seconds=GRACE, regions=["eu"])
    assert sorted(tables) == ["eu", "local"]
    assert [m.model for m in tables["eu"].models] == ["chat", "empty-model"]
    assert routed(tables["eu"]) == []
    assert routed(tables["local"]) == ["n1/r0"]


def test_regions_hold_only_their_own_replicas() -> None:
    clock = FakeClock()
    fleet, _ = fleet_with(
        clock, register("a", replica("a/r0"), region="eu"), register("b", replica("b/r0"), region="us"),
    )
    tables = compute_tables(fleet.members(), CATALOG, set(), now=clock(), grace_seconds=GRACE)
    assert {region: routed(t) for region, t in tables.items()} == {"eu": ["a/r0"], "us": ["b/r0"]}


def test_route_carries_the_http_address_and_engine() -> None:
    clock = FakeClock()
    fleet, _ = fleet_with(clock, register("n1", replica("n1/r0", address="", http_address="10.0.0.1:8000",
                                                        engine="sglang")))
    tables = compute_tables(fleet.members(), CATALOG, set(), now=clock(), grace_seconds=GRACE)
    (route,) = tables["local"].models[0].replicas
    assert (route.address, route.http_address, route.engine) == ("", "10.0.0.1:8000", "sglang")


def test_order_is_deterministic() -> None:
    clock = FakeClock()
    regs = [register("n2", replica("n2/b"), replica("n2/a")), register("n1", replica("n1/z"))]
    fleet_a, _ = fleet_with(clock, *regs)
    fleet_b, _ = fleet_with(clock, *reversed(regs))
    a = compute_tables(fleet_a.members(), CATALOG, set(), now=clock(), grace_seconds=GRACE)
    b = compute_tables(fleet_b.members(), CATALOG, set(), now=clock(), grace_seconds=GRACE)
    assert routed(a["local"]) == ["n1/z", "n2/a", "n2/b"]
    assert a["local"].SerializeToString(deterministic=True) == b["local"].SerializeToString(deterministic=True)


def test_route_carries_load_and_age_from_the_injected_clock() -> None:
    clock = FakeClock()
    fleet, (member,) = fleet_with(clock, register("n1", replica("n1/r0", kv_block_tokens=16)))
    clock.advance(0.5)
    fleet.apply_telemetry(member, fleet_pb2.Telemetry(seq=1, replicas=[load("n1/r0", queued=3, running=7)]))
    clock.advance(0.25)
    tables = compute_tables(fleet.members(), CATALOG, set(), now=clock(), grace_seconds=GRACE)
    (route,) = tables["local"].models[0].replicas
    expected = ("n1", "local", replica("n1/r0").address, "chat")
    assert (route.node, route.region, route.address, route.kserve_model) == expected
    assert (route.load.queued, route.load.running, route.kv_block_tokens) == (3, 7, 16)
    assert route.telemetry_age_seconds == pytest.approx(0.25)


def test_a_load_without_telemetry_is_aged_from_registration() -> None:
    clock = FakeClock()
    fleet, _ = fleet_with(clock, register("n1", replica("n1/r0")))
    clock.advance(1.5)
    tables = compute_tables(fleet.members(), CATALOG, set(), now=clock(), grace_seconds=GRACE)
    (route,) = tables["local"].models[0].replicas
    assert route.telemetry_age_seconds == pytest.approx(1.5)
    assert route.load.replica_id == "n1/r0"


# -- versions

def _tables(
    clock: FakeClock, queued: int = 0, drains: frozenset[str] = frozenset(),
) -> dict[str, tables_pb2.TableSnapshot]:
    fleet, (member,) = fleet_with(clock, register("n1", replica("n1/r0"), replica("n1/r1")))
    fleet.apply_telemetry(member, fleet_pb2.Telemetry(seq=1, replicas=[load("n1/r0", queued=queued)]))
    clock.advance(0.1)
    return compute_tables(fleet.members(), CATALOG, drains, now=clock(), grace_seconds=GRACE, regions=["eu"])


STEPS = [
    ("same-content-later", {"queued": 0}, False),
    ("load-changed", {"queued": 5}, True),
    ("drain-requested", {"drains": frozenset({"n1/r1"})}, True),
]


@pytest.mark.parametrize(("change", "bumps"), [(s[1], s[2]) for s in STEPS], ids=[s[0] for s in STEPS])
def test_version_bumps_only_on_change(change: dict[str, Any], bumps: bool) -> None:
    clock = FakeClock()
    versions = TableVersions(start=1_000)
    first = versions.publish(_tables(clock), computed_at=1.0)
    assert [(p.snapshot.region, p.version) for p in first] == [("eu", 1_001), ("local", 1_002)]
    clock.advance(2.0)  # ages differ; they are not content
    second = versions.publish(_tables(clock, **change), computed_at=2.0)
    local = versions.get("local")
    assert local is not None
    if bumps:
        assert [p.snapshot.region for p in second] == ["local"]
        assert (local.version, local.snapshot.computed_at) == (1_003, 2.0)
    else:
        assert second == []
        assert (local.version, local.snapshot.computed_at) == (1_002, 1.0)
    eu = versions.get("eu")
    assert eu is not None and eu.version == 1_001  # an unchanged region keeps its version


def test_a_region_that_comes_back_starts_above_every_version() -> None:
    clock = FakeClock()
    versions = TableVersions(start=0)
    versions.publish(_tables(clock), computed_at=1.0)  # eu 1, local 2
    versions.publish(_tables(clock, queued=1), computed_at=2.0)  # local 3
    tables = _tables(clock)
    versions.publish({"local": tables["local"]}, computed_at=3.0)  # eu dropped, local 4
    assert versions.regions() == ["local"]
    (eu,) = versions.publish(tables, computed_at=4.0)
    assert eu.snapshot.region == "eu" and eu.version == 5  # not 1 or 2 again


def test_published_table_records_routable_ids_and_ignores_nonce() -> None:
    clock = FakeClock()
    versions = TableVersions(start=0)
    tables = _tables(clock, drains=frozenset({"n1/r0"}))
    (_, local) = versions.publish(tables, computed_at=1.0)
    assert local.replica_ids == frozenset({"n1/r1"})
    stamped = type(local.snapshot)()
    stamped.CopyFrom(local.snapshot)
    stamped.nonce, stamped.version = "7", 99
    assert content_key(stamped) == local.key


def test_initial_version_grows_with_time() -> None:
    assert initial_version(1_700_000_000.0) == 1_700_000_000_000_000
    assert initial_version(1_700_000_000.002) > initial_version(1_700_000_000.001)
