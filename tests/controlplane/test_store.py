"""The embedded store backend: the shared store behaviour (store_suite) on a fake clock, and its own bounds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from controlplane.store.base import alloc_key, controlplane_key, drain_key, member_key, table_key
from controlplane.store.memory import MemoryStore
from ferry.errors import Overloaded
from tests.controlplane.fakes import FakeClock
from tests.controlplane.store_suite import *  # noqa: F403  (the shared behaviour, run on this backend)
from tests.controlplane.store_suite import Backend


@pytest.fixture
async def backend() -> AsyncIterator[Backend]:
    clock = FakeClock()
    shared = MemoryStore(clock=clock)

    def make(**bounds: Any) -> MemoryStore:
        return MemoryStore(clock=clock, **bounds) if bounds else shared  # one store: every client sees it

    async def advance(seconds: float) -> None:
        clock.advance(seconds)

    b = Backend("memory", make, advance, expiry_slack=0.0)
    yield b
    await b.close()


def test_key_layout() -> None:
    assert member_key("n1") == "/ferry/members/n1"
    assert drain_key("n1/r0") == "/ferry/intent/drain/n1/r0"
    assert alloc_key("n1") == "/ferry/intent/alloc/n1"
    assert controlplane_key("cp-1") == "/ferry/controlplanes/cp-1"
    assert table_key("eu") == "/ferry/tables/eu"


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
