"""The scaling task's step on real parts: a fleet view fed registrations and telemetry, the embedded store,
the metrics registry; the plan it publishes and what it writes."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from controlplane.fleet.view import FleetView
from controlplane.main import main
from controlplane.metrics import Metrics
from controlplane.scaling.history import HISTORY_PREFIX, TIMINGS_PREFIX
from controlplane.scaling.plan import DAY, HOUR, Targets
from controlplane.services.scaling import ScalingService, ScalingSettings
from controlplane.store.memory import MemoryStore
from controlplane.tables.usage import Figures
from ferry.config import load_file
from ferry.errors import ConfigError, InvalidArgument
from ferry.v1 import admin_pb2, common_pb2, fleet_pb2

READY, WARMING = common_pb2.REPLICA_STATE_READY, common_pb2.REPLICA_STATE_WARMING


class Clock:
    """A settable clock (monotonic and wall share it here)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def replica(rid: str, state: int) -> fleet_pb2.ReplicaInfo:
    return fleet_pb2.ReplicaInfo(replica_id=rid, model="m", version="v1", address=f"127.0.0.1:{9000 + len(rid)}",
                                 kserve_model="m", gpus=1, max_concurrency=10, kv_block_tokens=16, state=state)


def build(clock: Clock, store: MemoryStore, figures: dict[tuple[str, str, str], Figures],
          cordoned: set[str] | None = None) -> tuple[ScalingService, FleetView, CollectorRegistry]:
    fleet = FleetView(clock=clock, grace_seconds=3.0)
    registry = CollectorRegistry()
    settings = ScalingSettings(targets=Targets(utilisation=0.5, floor=1, lead_seconds=0.0),
                               startup_default_seconds=300.0, history_write_seconds=60.0)
    service = ScalingService(settings, store=store, members=fleet.members, figures=lambda: figures,
                             leading=lambda: True, cordoned=lambda: cordoned or set(), metrics=Metrics(registry),
                             clock=clock, wall=clock, grace_seconds=3.0)
    return service, fleet, registry


async def test_a_step_plans_publishes_and_writes() -> None:
    clock = Clock(20_000 * DAY + 7 * HOUR)
    store = MemoryStore()
    figures = {("m", "eu", "interactive"): Figures(request_rate=4.0, offered_rate=5.0, queued=0)}
    service, fleet, registry = build(clock, store, figures, cordoned={"spare-2"})
    node = fleet.register(fleet_pb2.Register(node="n1", region="eu", gpus=2,
                                             replicas=[replica("r1", READY), replica("r22", WARMING)]))
    fleet.apply_telemetry(node, fleet_pb2.Telemetry(seq=1, replicas=[
        common_pb2.ReplicaLoad(replica_id="r1", state=READY, running=8, queued=0, kv_blocks_total=100,
                               kv_blocks_free=50)]))
    for name in ("spare-1", "spare-2"):
        fleet.register(fleet_pb2.Register(node=name, region="eu", gpus=8, standby=True))
    await service.step()
    reply = service.scale(admin_pb2.GetScaleRequest())
    assert reply.leading and reply.sampled_at == clock.now
    [view] = reply.models
    assert (view.model, view.region, view.current, view.ready) == ("m", "eu", 2, 1)
    assert view.service_seconds == 2.0  # 8 running / 4 ended per second
    assert view.needed_now == 2  # 5/s x 2 s / (10 slots x 0.5)
    assert view.desired == 2 and view.promote == 0
    [pool] = reply.regions
    assert (pool.region, pool.standby_nodes, pool.startup_seconds) == ("eu", 1, 300.0)  # spare-2 is cordoned
    value = registry.get_sample_value("ferry_scaling_replicas", {"model": "m", "region": "eu", "kind": "desired"})
    assert value == 2.0
    assert registry.get_sample_value("ferry_scaling_standby_nodes", {"region": "eu", "kind": "current"}) == 1.0
    assert len((await store.list(HISTORY_PREFIX)).items) == 1

    # the warming replica turns ready 40 s later: a start-up time measured, written with the next history write
    clock.now += 40.0
    fleet.apply_telemetry(node, fleet_pb2.Telemetry(seq=2, replicas=[
        common_pb2.ReplicaLoad(replica_id="r1", state=READY, running=8, kv_blocks_total=100, kv_blocks_free=50),
        common_pb2.ReplicaLoad(replica_id="r22", state=READY, kv_blocks_total=100, kv_blocks_free=100)]))
    for name in ("spare-1", "spare-2"):
        fleet.register(fleet_pb2.Register(node=name, region="eu", gpus=8, standby=True))
    await service.step()
    assert service.scale(admin_pb2.GetScaleRequest(region="eu")).regions[0].startup_seconds == 40.0
    assert not (await store.list(TIMINGS_PREFIX)).items  # within history_write_seconds
    clock.now += 60.0
    fleet.apply_telemetry(node, fleet_pb2.Telemetry(seq=3))
    for name in ("spare-1", "spare-2"):
        fleet.register(fleet_pb2.Register(node=name, region="eu", gpus=8, standby=True))
    await service.step()
    assert len((await store.list(TIMINGS_PREFIX)).items) == 1
    assert not service.scale(admin_pb2.GetScaleRequest(region="us")).models


async def test_a_bad_region_filter_is_refused_naming_it() -> None:
    service, _, _ = build(Clock(0.0), MemoryStore(), {})
    with pytest.raises(InvalidArgument) as caught:
        service.scale(admin_pb2.GetScaleRequest(region="x" * 100))
    assert caught.value.field == "region"


async def test_a_control_plane_that_stops_leading_publishes_nothing_and_reloads_when_leading_again() -> None:
    clock = Clock(20_000 * DAY + 7 * HOUR)
    store = MemoryStore()
    service, fleet, registry = build(clock, store, {("m", "eu", "standard"): Figures(request_rate=1.0,
                                                                                     offered_rate=1.0)})
    fleet.register(fleet_pb2.Register(node="n1", region="eu", gpus=2, replicas=[replica("r1", READY)]))
    await service.step()
    assert service.scale(admin_pb2.GetScaleRequest()).models
    desired = {"model": "m", "region": "eu", "kind": "desired"}
    assert registry.get_sample_value("ferry_scaling_replicas", desired) == 1.0
    service.forget()
    assert not service.scale(admin_pb2.GetScaleRequest()).models
    assert registry.get_sample_value("ferry_scaling_replicas", desired) is None
    assert not service.history.loaded
    await service.step()
    assert service.history.loaded and service.history.records("m", "eu")


def test_the_scaling_section_of_the_config_file_is_read_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "ferry.toml"
    path.write_text("[scaling]\ninterval_seconds = 2.0\n[scaling.targets]\nfloor = 2\nttft_target_seconds = 1.5\n")
    settings = load_file(path).section(ScalingSettings, "scaling")
    assert settings.interval_seconds == 2.0
    assert (settings.targets.floor, settings.targets.ttft_target_seconds) == (2, 1.5)
    path.write_text("[scaling]\ninterval_seconds = 0\n")
    with pytest.raises(ConfigError) as bad:
        load_file(path).section(ScalingSettings, "scaling")
    assert bad.value.key == "scaling.interval_seconds"
    path.write_text("[scaling.targets]\nflor = 2\n")
    with pytest.raises(ConfigError) as typo:
        load_file(path).section(ScalingSettings, "scaling")
    assert typo.value.key == "scaling.targets.flor"
    assert main(["--config", str(path)]) == 2  # ferry controlplane refuses it at start
