"""The intent writer: refuse while the store is away, conditional put with bounded retries, echo, then the tables."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from controlplane.intent.cache import IntentCache
from controlplane.intent.writer import KEEP, TRIES, IntentWriter
from controlplane.store.base import KeyValue, cordon_key, drain_key
from controlplane.store.memory import MemoryStore
from ferry.errors import NotFound, Unavailable
from tests.controlplane.fakes import FlakyStore


class Tables:
    """Stands for the table service: records the waits, answers with the predicate."""

    def __init__(self) -> None:
        self.waits: list[bool] = []

    async def reflect(self, reflected: Callable[[], bool], seconds: float) -> bool:
        self.waits.append(reflected())
        return self.waits[-1]


@pytest.fixture
async def parts() -> AsyncIterator[tuple[MemoryStore, IntentCache, Tables, IntentWriter]]:
    store = MemoryStore()
    intent = IntentCache(store, on_change=lambda: None, retry_seconds=0.01)
    task = asyncio.create_task(intent.run())
    async with asyncio.timeout(5):
        await intent.synced.wait()
    tables = Tables()
    yield store, intent, tables, IntentWriter(store, intent, tables.reflect, timeout=2.0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_a_write_is_echoed_then_waits_for_the_tables(parts: Any) -> None:
    store, intent, tables, writer = parts
    written = await writer.write("drain of r1", drain_key("r1"), lambda kv: b"{}",
                                 reflected=lambda: "r1" in intent.drains)
    assert written.before is None and written.revision == store.revision
    assert tables.waits == [True]  # the cache had the write before the tables were asked
    await writer.write("undrain of r1", drain_key("r1"), lambda kv: None, reflected=lambda: "r1" not in intent.drains)
    assert "r1" not in intent.drains and tables.waits == [True, True]


async def test_keep_writes_nothing_and_an_edit_may_refuse(parts: Any) -> None:
    store, _, _, writer = parts
    await store.put(cordon_key("n1"), b"{}")
    revision = store.revision
    written = await writer.change("cordon", cordon_key("n1"), lambda kv: KEEP)
    assert store.revision == revision and written.before is not None

    def refuse(kv: KeyValue | None) -> bytes:
        raise NotFound("node", "n2")

    with pytest.raises(NotFound):
        await writer.change("cordon", cordon_key("n2"), refuse)
    assert await store.get(cordon_key("n2")) is None


async def test_a_record_changed_under_every_try_is_refused(parts: Any) -> None:
    store, _, _, writer = parts
    await store.put(cordon_key("n1"), b"0")
    tries = []

    def racing(kv: KeyValue | None) -> bytes:
        tries.append(1)
        asyncio.get_running_loop().create_task(store.put(cordon_key("n1"), b"other"))
        return b"mine"

    async def edit_then_race() -> None:
        await writer.change("cordon", cordon_key("n1"), racing)

    original = store.put_if

    async def put_if(key: str, value: bytes, *, revision: int, lease: int = 0) -> int:
        await asyncio.sleep(0)  # the racing write lands first
        return await original(key, value, revision=revision, lease=lease)

    store.put_if = put_if  # type: ignore[method-assign]
    with pytest.raises(Unavailable) as err:
        await edit_then_race()
    assert len(tries) == TRIES and "changed under" in str(err.value)


async def test_refused_while_the_store_is_away_before_anything_is_written(parts: Any) -> None:
    store, intent, tables, _ = parts
    flaky = FlakyStore(store)
    writer = IntentWriter(flaky, intent, tables.reflect, timeout=2.0)  # type: ignore[arg-type]
    flaky.down = True
    with pytest.raises(Unavailable) as err:
        await writer.write("drain of r1", drain_key("r1"), lambda kv: b"{}", reflected=lambda: True)
    assert "drain of r1 refused" in str(err.value) and "store (memory)" in str(err.value)
    assert await store.get(drain_key("r1")) is None and tables.waits == []
