"""Fixtures of the control plane tests: a fake clock, an in-process control plane on loopback, a pair of them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.controlplane.fakes import FakeClock, Harness, Pair


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def harness(clock: FakeClock) -> AsyncIterator[Harness]:
    h = await Harness.start(clock)
    try:
        yield h
    finally:
        await h.stop()


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    """Two control planes on one shared embedded store (:class:`tests.controlplane.fakes.Pair`)."""
    p = await Pair().start()
    try:
        yield p
    finally:
        await p.stop()
