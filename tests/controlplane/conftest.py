"""Fixtures of the control plane tests: a fake clock and an in-process control plane on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.controlplane.fakes import FakeClock, Harness


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
