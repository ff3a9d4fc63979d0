"""The scaling history in a real etcd: written by one control plane's history, read back by the next one's."""

from __future__ import annotations

import asyncio
import signal

import pytest

from controlplane.scaling.history import History, history_key
from controlplane.scaling.plan import DAY, HOUR, HourRecord, forecast, hour_of_week
from controlplane.store.etcd import EtcdStore
from ferry.errors import Unavailable
from ferry.etcd import LocalEtcd

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
