"""The etcd backend against a real etcd: the shared store behaviour, then what only etcd does."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest

from controlplane.store.base import LeaseNotFound
from controlplane.store.etcd import EtcdStore, parse_endpoint
from ferry.errors import Overloaded, Unavailable
from harness.etcd import LocalEtcd
from tests.controlplane.store_suite import *  # noqa: F403  (the shared behaviour, run on this backend)
from tests.controlplane.store_suite import Backend, until


@pytest.fixture
async def backend(etcd: LocalEtcd) -> AsyncIterator[Backend]:
    def make(**bounds: Any) -> EtcdStore:
        return EtcdStore(f"etcd://{etcd.endpoint}", timeout=2.0, **bounds)

    # etcd counts TTLs in whole seconds and sweeps expired leases every 0.5 s.
    b = Backend("etcd", make, asyncio.sleep, expiry_slack=0.7)
    yield b
    await b.close()


ENDPOINTS = [
    ("url", "etcd://127.0.0.1:2379", "127.0.0.1:2379"),
    ("bare", "127.0.0.1:2379", "127.0.0.1:2379"),
    ("trailing-slash", "etcd://127.0.0.1:2379/", "127.0.0.1:2379"),
]


@pytest.mark.parametrize(("url", "endpoint"), [c[1:] for c in ENDPOINTS], ids=[c[0] for c in ENDPOINTS])
def test_endpoints(url: str, endpoint: str) -> None:
    assert parse_endpoint(url) == endpoint


@pytest.mark.parametrize("url", ["etcd://", "etcd://host", "etcd://host:port"])
def test_bad_endpoints_are_named(url: str) -> None:
    with pytest.raises(ValueError, match="address"):
        parse_endpoint(url)


async def test_watches_are_bounded(etcd: LocalEtcd) -> None:
    store = EtcdStore(etcd.endpoint, max_watches=1)
    try:
        await store.watch("/ferry/")
        with pytest.raises(Overloaded):
            await store.watch("/ferry/")
    finally:
        await store.close()


async def test_ttls_are_whole_seconds(etcd: LocalEtcd) -> None:
    store = EtcdStore(etcd.endpoint)
    try:
        lease = await store.grant_lease(0.2)  # rounded up to 1 s: still there after 0.5 s
        await store.put("/ferry/members/n1", b"", lease=lease)
        await asyncio.sleep(0.5)
        assert await store.get("/ferry/members/n1") is not None
    finally:
        await store.close()


async def test_an_unreachable_etcd_is_unavailable_then_the_store_recovers(etcd: LocalEtcd) -> None:
    store = EtcdStore(etcd.endpoint, timeout=0.5)
    try:
        lease = await store.grant_lease(5.0)
        await store.put("/ferry/members/n1", b"x", lease=lease)
        watch = await store.watch("/ferry/")
        etcd.signal(signal.SIGKILL)
        with pytest.raises(Unavailable) as err:
            await store.put("/ferry/intent/drain/r1", b"{}")
        assert etcd.endpoint in str(err.value)
        health = store.health()
        assert not health.ok and etcd.endpoint in health.error and health.backend == "etcd"
        with pytest.raises(Unavailable):
            await store.refresh_lease(lease)
        with pytest.raises(Unavailable):  # the watch stream broke with the server
            async with asyncio.timeout(5):
                async for _ in watch:
                    pass
        etcd.start()  # same data dir and port
        await until(lambda: etcd.healthy(), 5)
        for _ in range(50):  # the channel reconnects within about a second
            try:
                await store.refresh_lease(lease)  # etcd extends every lease when it becomes leader again
                break
            except Unavailable:
                await asyncio.sleep(0.1)
        assert store.health().ok
        kv = await store.get("/ferry/members/n1")
        assert kv is not None and kv.value == b"x"
    finally:
        await store.close()


async def test_a_paused_etcd_times_out_and_expired_leases_go_when_it_resumes(etcd: LocalEtcd) -> None:
    store = EtcdStore(etcd.endpoint, timeout=0.3)
    try:
        lease = await store.grant_lease(1.0)
        await store.put("/ferry/members/n1", b"x", lease=lease)
        etcd.signal(signal.SIGSTOP)
        try:
            with pytest.raises(Unavailable, match="unreachable"):
                await store.get("/ferry/members/n1")
            assert not store.health().ok
            await asyncio.sleep(1.2)
        finally:
            etcd.signal(signal.SIGCONT)
        await until(lambda: etcd.healthy(), 5)
        for _ in range(40):  # the lease ran out while etcd slept: it goes within a sweep of its resuming
            if await store.get("/ferry/members/n1") is None:
                break
            await asyncio.sleep(0.05)
        assert await store.get("/ferry/members/n1") is None
        with pytest.raises(LeaseNotFound):
            await store.refresh_lease(lease)
        assert store.health().ok
    finally:
        await store.close()
