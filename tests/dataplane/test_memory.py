"""The proxy's bounded collect-and-trim (dataplane.memory); a real proxy's RSS: tests/e2e/test_memory_figures.py."""

from __future__ import annotations

import pytest

from dataplane.memory import MIB, MemoryTrim

pytestmark = pytest.mark.timeout(30)


async def test_it_trims_only_after_growth_and_from_the_new_baseline() -> None:
    sizes = iter([100 * MIB, 120 * MIB, 140 * MIB, 90 * MIB, 90 * MIB, 110 * MIB, 130 * MIB, 95 * MIB])
    trims: list[int] = []
    memory = MemoryTrim(32 * MIB, rss=lambda: next(sizes), trim=lambda: trims.append(1) or 1)
    assert memory.enabled and memory.baseline == 100 * MIB
    assert not await memory.check()  # 120: +20, under the growth
    assert await memory.check() and memory.baseline == 90 * MIB  # 140: +40, trimmed, 90 after
    assert not await memory.check()  # 90
    assert not await memory.check()  # 110: +20 over the new baseline
    assert await memory.check() and memory.baseline == 95 * MIB  # 130: +40
    assert len(trims) == memory.trims == 2
    assert not MemoryTrim(0, rss=lambda: MIB, trim=lambda: 0).enabled  # 0: off
