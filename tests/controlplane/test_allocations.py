"""GPU allocation intent: the pure record changes, compare-and-put under contention, and the intent mirror."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from controlplane.allocation.records import (
    Allocation,
    AllocationConflict,
    NodeAllocations,
    allocate,
    decode,
    place,
    release,
    with_allocation,
    with_placement,
    without,
)
from controlplane.intent.cache import IntentCache
from controlplane.store.base import alloc_key
from controlplane.store.memory import MemoryStore

SMALL = Allocation("n1/r0", "chat-small", "v1", (0,))
GANG = Allocation("n1/big", "chat-large", "v1", tuple(range(8)))

ADD = [
    # id, record before, slot, error naming (None: accepted), GPUs held after
    ("first-small", (), SMALL, None, {0: "n1/r0"}),
    ("gang-on-free-node", (), GANG, None, {g: "n1/big" for g in range(8)}),
    ("gang-blocked-by-small", (SMALL,), GANG, "GPU 0 is held by replica 'n1/r0'", None),
    ("small-beside-small", (SMALL,), Allocation("n1/r1", "chat-small", "v1", (1,)), None, {0: "n1/r0", 1: "n1/r1"}),
    ("same-replica-moves", (SMALL,), Allocation("n1/r0", "chat-small", "v1", (3,)), None, {3: "n1/r0"}),
    ("gpu-out-of-range", (), Allocation("x", "m", "v1", (8,)), "GPU 8 does not exist", None),
    ("no-gpu", (), Allocation("x", "m", "v1", ()), "asks for no GPU", None),
    ("gpu-twice", (), Allocation("x", "m", "v1", (1, 1)), "names a GPU twice", None),
]


@pytest.mark.parametrize(("before", "slot", "error", "held"), [c[1:] for c in ADD], ids=[c[0] for c in ADD])
def test_with_allocation(before: tuple[Allocation, ...], slot: Allocation, error: str | None,
                         held: dict[int, str] | None) -> None:
    record = NodeAllocations("n1", before)
    if error is not None:
        with pytest.raises(AllocationConflict, match=error):
            with_allocation(record, slot, node_gpus=8)
        return
    after = with_allocation(record, slot, node_gpus=8)
    assert after.held() == held
    assert decode("n1", after.encode()) == after  # the stored form round-trips


def test_without_and_malformed_records() -> None:
    record = NodeAllocations("n1", (SMALL,))
    assert without(record, "n1/r0").slots == () and without(record, "other") == record
    with pytest.raises(ValueError, match="n1"):
        decode("n1", b'{"slots": [{"gpus": [0]}]}')


async def test_two_allocators_racing_for_one_node_cannot_both_win() -> None:
    store = MemoryStore()
    big = [Allocation(f"n1/big{i}", "chat-large", "v1", tuple(range(8))) for i in range(2)]
    outcomes = await asyncio.gather(*(allocate(store, "n1", a, node_gpus=8) for a in big), return_exceptions=True)
    assert sum(isinstance(o, int) for o in outcomes) == 1
    assert sum(isinstance(o, AllocationConflict) for o in outcomes) == 1
    stored = await store.get(alloc_key("n1"))
    assert stored is not None and len(decode("n1", stored.value).slots) == 1
    winner = decode("n1", stored.value).slots[0].replica_id
    assert await release(store, "n1", winner) > 0
    assert await release(store, "n1", winner) == 0  # nothing left to release
    assert await allocate(store, "n1", SMALL, node_gpus=8) > 0


async def test_the_intent_cache_mirrors_allocations() -> None:
    store = MemoryStore()
    await allocate(store, "n1", GANG, node_gpus=8)
    changes: list[int] = []
    cache = IntentCache(store, on_change=lambda: changes.append(1), retry_seconds=0.01)
    task = asyncio.create_task(cache.run())
    try:
        async with asyncio.timeout(5):
            await cache.synced.wait()
        assert cache.allocations["n1"].held() == {g: "n1/big" for g in range(8)}
        await cache.wait(await allocate(store, "n2", SMALL, node_gpus=8), 5)
        await cache.wait(await release(store, "n1", "n1/big"), 5)
        assert cache.allocations["n1"].slots == () and cache.allocations["n2"].held() == {0: "n1/r0"}
        await cache.wait(await store.put(alloc_key("n3"), b"not json"), 5)  # logged and skipped
        assert "n3" not in cache.allocations and len(changes) == 3
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_placement_removes_the_displaced_slots_in_the_same_transaction() -> None:
    store = MemoryStore()
    await allocate(store, "n1", SMALL, node_gpus=8)
    revision = (await store.get(alloc_key("n1"))).revision  # type: ignore[union-attr]
    gang = Allocation("n1/big", "chat-large", "v1", tuple(range(8)), displaces=("n1/r0",), placed_at=5.0, cost=10.0)
    written = await place(store, "n1", gang, ("n1/r0",), node_gpus=8)
    assert written == revision + 1  # one write: the small slot gone and the gang in, together
    stored = decode("n1", (await store.get(alloc_key("n1"))).value)  # type: ignore[union-attr]
    assert stored.slots == (gang,)
    with pytest.raises(AllocationConflict):  # without removing it, the small slot blocks the gang
        with_placement(NodeAllocations("n1", (SMALL,)), gang, (), node_gpus=8)


def test_records_written_before_the_gang_fields_still_decode() -> None:
    old = b'{"node": "n1", "slots": [{"replica_id": "r", "model": "m", "version": "v1", "gpus": [0]}]}'
    assert decode("n1", old).slots == (Allocation("r", "m", "v1", (0,)),)
