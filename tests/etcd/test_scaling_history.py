"""The scaling history in a real etcd: written by one control plane's history, read back by the next one's."""

from __future__ import annotations

import asyncio
import signal

import pytest
from prometheus_client import CollectorRegistry

from controlplane.fleet.view import FleetView
from controlplane.metrics import Metrics
from controlplane.scaling.history import History, history_key
from controlplane.scaling.plan import DAY, HOUR, HourRecord, Targets, forecast, hour_of_week
from controlplane.services.scaling import ScalingService, ScalingSettings
from controlplane.store.etcd import EtcdStore
from controlplane.tables.usage import Figures
from ferry.errors import Unavailable
from ferry.v1 import admin_pb2, common_pb2, fleet_pb2
from harness.etcd import LocalEtcd

T0 = 20_000 * DAY


async def test_history_survives_a_new_control_plane(etcd: LocalEtcd) -> None:
    store = EtcdStore(etcd.endpoint, timeout=2.0)
    try:
        history = History(store)
        for day in range(1, 4):  # three previous mornings at 08:00, rising
            history.observe("m", "eu", T0 - day * DAY + 8 * HOUR, 10.0 * day, 1.5)
        history.observe("m", "us", T0 - DAY + 9 * HOUR, 7.0)
        await history.save_timings({"eu": (95.0, None)})
        assert await history.flush() == 4
        listed = await store.list("/ferry/scaling/")
        assert len(listed.items) == 5

        again = History(store)
        await again.load()
        assert again.records("m", "eu") == history.records("m", "eu")
        assert again.pairs() == [("m", "eu"), ("m", "us")]
        assert await again.load_timings() == {"eu": (95.0, None)}
        ahead = forecast(again.records("m", "eu"), T0 + 8 * HOUR, T0 + 8 * HOUR, 7)
        assert ahead == HourRecord(20_000 - 3, 30.0, 1.5)
        stored = await store.get(history_key("m", "eu", hour_of_week(T0 - DAY + 8 * HOUR)))
        assert stored is not None
    finally:
        await store.close()


async def test_a_store_that_does_not_answer_keeps_the_records_for_the_next_flush(etcd: LocalEtcd) -> None:
    store = EtcdStore(etcd.endpoint, timeout=1.0)
    try:
        history = History(store)
        history.observe("m", "eu", T0, 3.0)
        etcd.signal(signal.SIGKILL)
        with pytest.raises(Unavailable):
            await history.flush()
        with pytest.raises(Unavailable):
            await history.load()
        assert not history.loaded
        etcd.start()  # the same data dir and port
        for _ in range(50):  # the client reconnects on its own; no timing is asserted
            try:
                written = await history.flush()
                break
            except Unavailable:
                await asyncio.sleep(0.2)
        assert written == 1
        assert await store.get(history_key("m", "eu", hour_of_week(T0))) is not None
        await history.load()
        assert history.loaded and history.records("m", "eu")[hour_of_week(T0)].peak_rate == 3.0
    finally:
        await store.close()


async def test_the_leaders_task_writes_the_history_a_new_leader_forecasts_from(etcd: LocalEtcd) -> None:
    """The scaling task on etcd: a day of one hour's traffic written, read by a new leader the next day."""
    now = [T0 + 8 * HOUR]
    figures = {("m", "eu", "interactive"): Figures(request_rate=20.0, offered_rate=20.0)}

    def service(store: EtcdStore) -> tuple[ScalingService, FleetView]:
        fleet = FleetView(clock=lambda: now[0], grace_seconds=3.0)
        fleet.register(fleet_pb2.Register(node="n1", region="eu", gpus=8, replicas=[fleet_pb2.ReplicaInfo(
            replica_id="r1", model="m", version="v1", address="127.0.0.1:9001", kserve_model="m", gpus=8,
            max_concurrency=10, state=common_pb2.REPLICA_STATE_READY)]))
        settings = ScalingSettings(targets=Targets(utilisation=0.5, lead_seconds=0.0), startup_default_seconds=600.0)
        return ScalingService(settings, store=store, members=fleet.members, figures=lambda: figures,
                              leading=lambda: True, cordoned=set, metrics=Metrics(CollectorRegistry()),
                              clock=lambda: now[0], wall=lambda: now[0], grace_seconds=3.0), fleet

    first = EtcdStore(etcd.endpoint, timeout=2.0)
    try:
        leader, _ = service(first)
        await leader.step()  # 20 req/s at 08:00 on day T0, written at the first step
    finally:
        await first.close()
    now[0] = T0 + DAY + 8 * HOUR - 599.0  # the next day, a start-up time before 08:00, no traffic yet
    figures.clear()
    second = EtcdStore(etcd.endpoint, timeout=2.0)
    try:
        successor, _ = service(second)
        await successor.step()
        [view] = successor.scale(admin_pb2.GetScaleRequest()).models
        assert view.forecast_rate == 20.0 and view.needed_now == 0
        assert view.needed_for_ramp == 8  # 20 req/s x 2 s / (10 slots x 0.5)
        assert view.desired == 8 and view.promote == 0  # no standby node: new machines
    finally:
        await second.close()
