"""The embedded store backend: keys and revisions, leases on a fake clock, watches and their bounds."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.memstore import MemoryStore
from controlplane.store import DRAIN_PREFIX, EventKind, LeaseNotFound, WatchEvent, WatchLost, drain_key, member_key
from ferry.errors import Overloaded
from tests.controlplane.fakes import FakeClock


async def _events(watch, n: int) -> list[tuple[EventKind, str, int]]:
    got: list[WatchEvent] = []
    async with asyncio.timeout(2):
        async for event in watch:
            got.append(event)
            if len(got) == n:
                break
    return [(e.kind, e.key, e.revision) for e in got]


def test_key_layout() -> None:
    assert member_key("n1") == "/ferry/members/n1"
    assert drain_key("n1/r0") == "/ferry/intent/drain/n1/r0"


async def test_put_get_list_delete_with_revisions() -> None:
    store = MemoryStore()
    assert await store.put("/ferry/members/b", b"B") == 1
    assert await store.put("/ferry/members/a", b"A") == 2
    assert await store.put("/ferry/intent/drain/x", b"") == 3
    assert await store.put("/ferry/members/b", b"B2") == 4
    kv = await store.get("/ferry/members/b")
    assert kv is not None and (kv.value, kv.revision, kv.lease) == (b"B2", 4, 0)
    listing = await store.list("/ferry/members/")
    assert [(kv.key, kv.value) for kv in listing.items] == [("/ferry/members/a", b"A"), ("/ferry/members/b", b"B2")]
    assert listing.revision == 4
    assert await store.delete("/ferry/members/a") == 5
    assert await store.delete("/ferry/members/a") == 0  # nothing to delete
    assert await store.get("/ferry/members/a") is None
    assert store.revision == 5


LEASES = [
    # id, seconds before the check, refresh half-way, key still there
    ("within-ttl", 0.9, False, True),
    ("past-ttl", 1.1, False, False),
    ("refreshed", 1.4, True, True),
    ("refreshed-then-past-ttl", 1.6, True, False),
]


@pytest.mark.parametrize(("after", "refresh", "kept"), [c[1:] for c in LEASES], ids=[c[0] for c in LEASES])
async def test_lease_expiry(after: float, refresh: bool, kept: bool) -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    lease = await store.grant_lease(1.0)
    await store.put("/ferry/members/n1", b"x", lease=lease)
    await store.put("/ferry/members/n2", b"y")  # no lease: stays
    if refresh:
        clock.advance(0.5)
        await store.refresh_lease(lease)
        clock.advance(after - 0.5)
    else:
        clock.advance(after)
    assert (await store.get("/ferry/members/n1") is not None) is kept
    assert await store.get("/ferry/members/n2") is not None
    if not kept:
        with pytest.raises(LeaseNotFound):
            await store.refresh_lease(lease)
        with pytest.raises(LeaseNotFound):
            await store.put("/ferry/members/n1", b"x", lease=lease)


async def test_revoke_deletes_the_keys_and_watches_see_it() -> None:
    store = MemoryStore()
    watch = await store.watch("/ferry/members/")
    lease = await store.grant_lease(10.0)
    await store.put("/ferry/members/n1", b"x", lease=lease)
    await store.put("/ferry/members/n2", b"y", lease=lease)
    await store.put("/ferry/members/n2", b"z")  # rewritten without the lease: detached from it
    await store.revoke_lease(lease)
    await store.revoke_lease(lease)  # already gone: no error
    assert await store.get("/ferry/members/n1") is None
    assert await store.get("/ferry/members/n2") is not None
    assert await _events(watch, 4) == [
        (EventKind.PUT, "/ferry/members/n1", 1),
        (EventKind.PUT, "/ferry/members/n2", 2),
        (EventKind.PUT, "/ferry/members/n2", 3),
        (EventKind.DELETE, "/ferry/members/n1", 4),
    ]


async def test_watch_sees_only_its_prefix_in_order() -> None:
    store = MemoryStore()
    watch = await store.watch(DRAIN_PREFIX)
    await store.put(member_key("n1"), b"")
    await store.put(drain_key("a"), b"1")
    await store.delete(drain_key("a"))
    await store.put(drain_key("b"), b"1")
    assert await _events(watch, 3) == [
        (EventKind.PUT, drain_key("a"), 2), (EventKind.DELETE, drain_key("a"), 3), (EventKind.PUT, drain_key("b"), 4),
    ]


async def test_a_watch_that_falls_behind_is_lost() -> None:
    store = MemoryStore(watch_queue=3)
    watch = await store.watch("/ferry/")
    for i in range(5):
        await store.put(f"/ferry/k{i}", b"")
    assert await _events(watch, 3) == [(EventKind.PUT, f"/ferry/k{i}", i + 1) for i in range(3)]
    with pytest.raises(WatchLost):
        await _events(watch, 1)
    await store.put("/ferry/k9", b"")  # the lost watch is no longer fed


async def test_a_closed_watch_ends_with_watch_lost() -> None:
    store = MemoryStore()
    watch = await store.watch("/ferry/")
    await watch.close()
    with pytest.raises(WatchLost):
        await _events(watch, 1)


@pytest.mark.parametrize("what", ["keys", "watches"], ids=["max-keys", "max-watches"])
async def test_bounds_answer_overloaded(what: str) -> None:
    store = MemoryStore(max_keys=2, max_watches=1)
    if what == "keys":
        await store.put("/a", b"")
        await store.put("/b", b"")
        await store.put("/a", b"again")  # an existing key is not a new one
        with pytest.raises(Overloaded):
            await store.put("/c", b"")
    else:
        await store.watch("/")
        with pytest.raises(Overloaded):
            await store.watch("/")
