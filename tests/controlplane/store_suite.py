"""The behaviour every store backend shares, run against each (memory here; etcd in tests/etcd/).

Test modules import these functions and define a ``backend`` fixture giving a
:class:`Backend`. Revisions are compared relative to the store's revision at
the start (etcd starts at 1, the memory store at 0), and lease expiry is
checked with the backend's own slack (etcd sweeps expired leases every 0.5 s
and counts TTLs in whole seconds; the memory store expires on its fake clock).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from controlplane.intent.cache import IntentCache
from controlplane.rollout.plan import CANARY, PROMOTED, Rollout
from controlplane.store.base import (
    DRAIN_PREFIX,
    MAX_TXN_WRITES,
    EventKind,
    LeaseNotFound,
    Store,
    WatchEvent,
    WatchLost,
    drain_key,
    rollout_key,
)
from controlplane.store.mirror import Mirror

MEMBERS = "/ferry/members/"


@dataclass
class Backend:
    """A way to make stores of one kind, and to let time pass for their leases."""

    name: str
    make: Callable[..., Store]  # keyword bounds: watch_queue, max_watches
    advance: Callable[[float], Awaitable[None]]
    expiry_slack: float  # seconds past the TTL after which the keys of an expired lease are surely gone
    stores: list[Store] = field(default_factory=list)

    def store(self, **bounds: Any) -> Store:
        store = self.make(**bounds)
        self.stores.append(store)
        return store

    async def close(self) -> None:
        for store in self.stores:
            await store.close()


async def until(predicate: Callable[[], object], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def events(watch: Any, n: int, base: int = 0) -> list[tuple[EventKind, str, int]]:
    got: list[WatchEvent] = []
    async with asyncio.timeout(5):
        async for event in watch:
            got.append(event)
            if len(got) == n:
                break
    return [(e.kind, e.key, e.revision - base) for e in got]


async def base_revision(store: Store) -> int:
    return (await store.list("/nothing/")).revision


async def test_put_get_list_delete_with_revisions(backend: Backend) -> None:
    store = backend.store()
    base = await base_revision(store)
    assert await store.put(MEMBERS + "b", b"B") == base + 1
    assert await store.put(MEMBERS + "a", b"A") == base + 2
    assert await store.put("/ferry/intent/drain/x", b"") == base + 3
    assert await store.put(MEMBERS + "b", b"B2") == base + 4
    kv = await store.get(MEMBERS + "b")
    assert kv is not None and (kv.value, kv.revision - base, kv.lease) == (b"B2", 4, 0)
    listing = await store.list(MEMBERS)
    assert [(kv.key, kv.value) for kv in listing.items] == [(MEMBERS + "a", b"A"), (MEMBERS + "b", b"B2")]
    assert listing.revision == base + 4
    assert await store.delete(MEMBERS + "a") == base + 5
    assert await store.delete(MEMBERS + "a") == 0  # nothing to delete
    assert await store.get(MEMBERS + "a") is None
    assert store.health().ok


PUT_IF = [
    # id, key exists before (with value "old"), expected revision relative to the last write (None: absent), wins
    ("create-if-absent", False, None, True),
    ("create-but-present", True, None, False),
    ("compare-and-put", True, 0, True),
    ("compare-stale", True, -1, False),
    ("compare-but-absent", False, 0, False),
]


@pytest.mark.parametrize(("exists", "expected", "wins"), [c[1:] for c in PUT_IF], ids=[c[0] for c in PUT_IF])
async def test_put_if(backend: Backend, exists: bool, expected: int | None, wins: bool) -> None:
    store = backend.store()
    key = "/ferry/intent/alloc/n1"
    last = await store.put(key, b"old") if exists else await store.put("/ferry/other", b"")
    revision = 0 if expected is None else last + expected
    written = await store.put_if(key, b"new", revision=revision)
    current = await store.get(key)
    if wins:
        assert written == last + 1 and current is not None and current.value == b"new"
    else:
        assert written == 0
        assert (current.value if current is not None else None) == (b"old" if exists else None)


async def test_put_if_is_atomic_under_contention(backend: Backend) -> None:
    stores = [backend.store(), backend.store()]
    wins = await asyncio.gather(*(s.put_if("/ferry/election/leader", f"cp{i}".encode(), revision=0)
                                  for i, s in enumerate(stores) for _ in range(5)))
    assert sum(1 for w in wins if w) == 1


async def test_put_all_if_writes_all_or_none(backend: Backend) -> None:
    store = backend.store()
    taken = await store.put("/ferry/claims/replica/b", b"other")
    lease = await store.grant_lease(5.0)
    stale = [("/ferry/claims/replica/a", b"mine", 0), ("/ferry/claims/replica/b", b"mine", 0)]
    assert await store.put_all_if(stale, lease=lease) == 0  # b exists: nothing written, a neither
    assert await store.get("/ferry/claims/replica/a") is None
    fresh = [("/ferry/claims/replica/a", b"mine", 0), ("/ferry/claims/replica/b", b"mine", taken)]
    revision = await store.put_all_if(fresh, lease=lease)
    assert revision > taken
    for key in ("/ferry/claims/replica/a", "/ferry/claims/replica/b"):
        kv = await store.get(key)
        assert kv is not None and kv.value == b"mine" and kv.lease == lease
    await store.revoke_lease(lease)  # both went under the lease
    assert await store.get("/ferry/claims/replica/a") is None and await store.get("/ferry/claims/replica/b") is None


async def test_put_all_if_refuses_an_unknown_lease_and_bad_batches(backend: Backend) -> None:
    store = backend.store()
    with pytest.raises(LeaseNotFound):
        await store.put_all_if([("/ferry/claims/node/n1", b"x", 0)], lease=987654321)
    assert await store.get("/ferry/claims/node/n1") is None
    with pytest.raises(ValueError, match="writes"):
        await store.put_all_if([])
    with pytest.raises(ValueError, match="writes"):
        await store.put_all_if([(f"/ferry/claims/node/n{i}", b"", 0) for i in range(MAX_TXN_WRITES + 1)])
    with pytest.raises(ValueError, match="twice"):
        await store.put_all_if([("/ferry/claims/node/n1", b"", 0), ("/ferry/claims/node/n1", b"", 0)])


LEASES = [
    # id, seconds before the check (past the TTL: plus the backend's slack), refresh half-way, key still there
    ("within-ttl", 0.8, False, True),
    ("past-ttl", 1.1, False, False),
    ("refreshed", 1.3, True, True),
    ("refreshed-then-past-ttl", 1.6, True, False),
]


@pytest.mark.parametrize(("after", "refresh", "kept"), [c[1:] for c in LEASES], ids=[c[0] for c in LEASES])
async def test_lease_expiry(backend: Backend, after: float, refresh: bool, kept: bool) -> None:
    store = backend.store()
    lease = await store.grant_lease(1.0)
    await store.put(MEMBERS + "n1", b"x", lease=lease)
    await store.put(MEMBERS + "n2", b"y")  # no lease: stays
    wait = after if kept else after + backend.expiry_slack
    if refresh:
        await backend.advance(0.5)
        await store.refresh_lease(lease)
        await backend.advance(wait - 0.5)
    else:
        await backend.advance(wait)
    assert (await store.get(MEMBERS + "n1") is not None) is kept
    assert await store.get(MEMBERS + "n2") is not None
    if not kept:
        with pytest.raises(LeaseNotFound):
            await store.refresh_lease(lease)
        with pytest.raises(LeaseNotFound):
            await store.put(MEMBERS + "n1", b"x", lease=lease)
        with pytest.raises(LeaseNotFound):
            await store.put_if(MEMBERS + "n3", b"x", revision=0, lease=lease)


async def test_refresh_leases_answers_each_lease_in_order(backend: Backend) -> None:
    """Many leases in one call (etcd: one hand-off to the keeper, spread over its streams): each kept alive,
    a gone one answered LeaseNotFound in its place, the others unaffected."""
    store = backend.store()
    leases = [await store.grant_lease(1.0) for _ in range(40)]
    for i, lease in enumerate(leases):
        await store.put(f"{MEMBERS}n{i}", b"x", lease=lease)
    await store.revoke_lease(leases[7])
    await backend.advance(0.6)
    outcomes = await store.refresh_leases(leases)
    assert [type(o) for o in outcomes] == [LeaseNotFound if i == 7 else type(None) for i in range(len(leases))]
    await backend.advance(0.6)  # 1.2 s after the grants: only the refresh kept them
    kept = [await store.get(f"{MEMBERS}n{i}") is not None for i in range(len(leases)) if i != 7]
    assert all(kept)
    assert await store.get(f"{MEMBERS}n7") is None
    assert await store.refresh_leases([]) == []


async def test_revoke_deletes_the_keys_and_watches_see_it(backend: Backend) -> None:
    store = backend.store()
    watch = await store.watch(MEMBERS)
    base = await base_revision(store)
    lease = await store.grant_lease(10.0)
    await store.put(MEMBERS + "n1", b"x", lease=lease)
    await store.put(MEMBERS + "n2", b"y", lease=lease)
    await store.put(MEMBERS + "n2", b"z")  # rewritten without the lease: detached from it
    await store.revoke_lease(lease)
    await store.revoke_lease(lease)  # already gone: no error
    assert await store.get(MEMBERS + "n1") is None
    assert await store.get(MEMBERS + "n2") is not None
    assert await events(watch, 4, base) == [
        (EventKind.PUT, MEMBERS + "n1", 1),
        (EventKind.PUT, MEMBERS + "n2", 2),
        (EventKind.PUT, MEMBERS + "n2", 3),
        (EventKind.DELETE, MEMBERS + "n1", 4),
    ]
    await watch.close()


async def test_watch_sees_only_its_prefix_in_order(backend: Backend) -> None:
    store = backend.store()
    watch = await store.watch(DRAIN_PREFIX)
    base = await base_revision(store)
    await store.put(MEMBERS + "n1", b"")
    await store.put(drain_key("a"), b"1")
    await store.delete(drain_key("a"))
    await store.put(drain_key("b"), b"1")
    assert await events(watch, 3, base) == [
        (EventKind.PUT, drain_key("a"), 2), (EventKind.DELETE, drain_key("a"), 3), (EventKind.PUT, drain_key("b"), 4),
    ]
    await watch.close()


async def test_a_watch_that_falls_behind_is_lost(backend: Backend) -> None:
    store = backend.store(watch_queue=3)
    watch = await store.watch("/ferry/")
    base = await base_revision(store)
    for i in range(5):
        await store.put(f"/ferry/k{i}", b"")
    await until(lambda: watch.lost)  # type: ignore[attr-defined]
    assert await events(watch, 3, base) == [(EventKind.PUT, f"/ferry/k{i}", i + 1) for i in range(3)]
    with pytest.raises(WatchLost):
        await events(watch, 1)
    await store.put("/ferry/k9", b"")  # the lost watch is no longer fed


async def test_a_closed_watch_ends_with_watch_lost(backend: Backend) -> None:
    store = backend.store()
    watch = await store.watch("/ferry/")
    await watch.close()
    with pytest.raises(WatchLost):
        await events(watch, 1)


async def test_a_mirror_follows_writes_of_another_client(backend: Backend) -> None:
    reader, writer = backend.store(), backend.store()
    await writer.put(drain_key("before"), b"1")
    changes: list[tuple[str, bool]] = []
    mirror = Mirror(reader, DRAIN_PREFIX, on_change=lambda k, kv: changes.append((k, kv is not None)))
    task = asyncio.create_task(mirror.run())
    try:
        async with asyncio.timeout(5):
            await mirror.synced.wait()
        assert mirror.names() == ["before"]
        await mirror.wait(await writer.put(drain_key("r1"), b"1"), 5)
        await mirror.wait(await writer.delete(drain_key("before")), 5)
        assert mirror.names() == ["r1"]
        assert changes == [(drain_key("before"), True), (drain_key("r1"), True), (drain_key("before"), False)]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_rollout_record_is_written_conditionally_and_mirrored(backend: Backend) -> None:
    reader, writer = backend.store(), backend.store()
    cache = IntentCache(reader, on_change=lambda: None, retry_seconds=0.01)
    task = asyncio.create_task(cache.run())
    try:
        async with asyncio.timeout(5):
            await cache.synced.wait()
        canary = Rollout("chat", "v1", "v2", 0.05, CANARY, 1.0)
        first = await writer.put_if(rollout_key("chat"), canary.encode(), revision=0)
        assert first and await writer.put_if(rollout_key("chat"), canary.encode(), revision=0) == 0
        await cache.wait(first, 5)
        assert cache.rollouts == {"chat": canary}
        promoted = Rollout("chat", "v1", "v2", 0.05, PROMOTED, 2.0)
        second = await writer.put_if(rollout_key("chat"), promoted.encode(), revision=first)
        assert second and await writer.put_if(rollout_key("chat"), canary.encode(), revision=first) == 0
        await cache.wait(second, 5)
        assert cache.rollouts == {"chat": promoted}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
