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


async def test_after_a_burst_it_trims_again_while_trims_give_memory_back() -> None:
    # start 100; a trim mid-burst (300 -> 280, buffers still in use); settling: 250 -> 110 (freed 140);
    # 110 is near the floor: done. Then a settle trim that frees almost nothing stops the settling.
    sizes = iter([100 * MIB, 300 * MIB, 280 * MIB, 250 * MIB, 110 * MIB, 110 * MIB,
                  400 * MIB, 390 * MIB, 390 * MIB, 389 * MIB, 389 * MIB])
    memory = MemoryTrim(32 * MIB, rss=lambda: next(sizes), trim=lambda: 1)
    assert await memory.check() and memory.settling  # 300: growth, 280 after
    assert await memory.check() and memory.baseline == 110 * MIB  # 250: settling, 110 after
    assert not await memory.check()  # 110: near the floor (100)
    assert await memory.check() and memory.settling  # 400: growth, 390 after
    assert await memory.check() and not memory.settling  # 390: settle trim gives back 1 MiB: done
    assert not await memory.check()  # 389: no growth, not settling: a steady proxy is left alone
    assert memory.trims == 4 and memory.floor == 100 * MIB
