"""Intent and membership in the store: the cache follows the store, members live under leases."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from controlplane.fleet.members import MemberLeases
from controlplane.intent.cache import IntentCache
from controlplane.store.base import drain_key, member_key
from controlplane.store.memory import MemoryStore
from ferry.errors import Unavailable
from ferry.v1 import fleet_pb2
from tests.controlplane.fakes import GRACE, FakeClock, Harness, fleet_with, register, replica, routed


@pytest.fixture
async def cache():
    store = MemoryStore(watch_queue=2)
    changes: list[int] = []
    cache = IntentCache(store, on_change=lambda: changes.append(1), retry_seconds=0.01)
    await store.put(drain_key("before"), b"{}")
    task = asyncio.create_task(cache.run())
    async with asyncio.timeout(5):
        await cache.synced.wait()
    yield store, cache, changes
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_the_cache_lists_then_follows_the_store(cache) -> None:
    store, intent, changes = cache
    assert intent.drains == {"before"} and changes == [1]
    revision = await intent.request_drain("r1", 1.0)
    await intent.wait(revision, 5)
    assert intent.drains == {"before", "r1"}
    await intent.wait(await store.delete(drain_key("before")), 5)  # a write by someone else
    assert intent.drains == {"r1"} and len(changes) == 3
    await intent.wait(await intent.request_drain("r1", 2.0), 5)  # no change of the set: no callback
    assert len(changes) == 3


async def test_the_cache_lists_again_when_its_watch_is_lost(cache) -> None:
    store, intent, _ = cache
    for i in range(6):  # more than the watch queue holds before the cache task runs
        await store.put(drain_key(f"r{i}"), b"{}")
    async with asyncio.timeout(5):
        await intent.wait(store.revision, 5)
    assert intent.drains == {"before", *(f"r{i}" for i in range(6))}


async def test_wait_gives_up_with_unavailable(cache) -> None:
    _, intent, _ = cache
    with pytest.raises(Unavailable):
        await intent.wait(intent.revision + 100, 0.01)


async def test_member_leases_write_refresh_and_expire() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    fleet, (member,) = fleet_with(clock, register("n1", replica("n1/r0")))
    leases = MemberLeases(store, clock=clock, ttl_seconds=GRACE)
    await leases.sync(fleet.members())
    stored = await store.get(member_key("n1"))
    assert stored is not None and stored.lease
    assert [r.replica_id for r in fleet_pb2.Register.FromString(stored.value).replicas] == ["n1/r0"]
    for _ in range(4):  # refreshed every third of the TTL while connected
        clock.advance(GRACE / 3 + 0.01)
        await leases.sync(fleet.members())
    assert await store.get(member_key("n1")) is not None
    fleet.disconnect(member)
    clock.advance(GRACE / 2)
    await leases.sync(fleet.members())  # no refresh for a node whose stream is gone
    clock.advance(GRACE / 2 + 0.01)
    assert await store.get(member_key("n1")) is None
    fleet.register(register("n1", replica("n1/r0"), replica("n1/r1")))  # back: a new lease
    leases.changed("n1")
    await leases.sync(fleet.members())
    stored = await store.get(member_key("n1"))
    assert stored is not None and len(fleet_pb2.Register.FromString(stored.value).replicas) == 2


async def test_a_drain_written_by_another_control_plane_reaches_the_table(clock: FakeClock) -> None:
    h = await Harness.start(clock)
    try:
        agent = h.agent()
        await agent.register(register("n1", replica("n1/r0"), replica("n1/r1")))
        proxy = h.proxy()
        await proxy.subscribe()
        await h.cp.store.put(drain_key("n1/r1"), b"{}")
        await proxy.until(lambda t: routed(t) == ["n1/r0"])
        assert (await h.replicas())["n1/r1"].drain_requested
    finally:
        await h.stop()
