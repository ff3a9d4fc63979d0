"""The loop clock: lateness of the loop is not counted, and an answer read late is not a timeout."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from controlplane.store.loopclock import LoopClock
from tests.controlplane.fakes import FakeClock


def test_a_late_wake_counts_at_most_the_tick_and_its_allowance() -> None:
    clock = FakeClock()
    lc = LoopClock(tick=0.1, allowance=0.1, clock=clock)
    start = lc.counted()
    clock.advance(0.1)
    lc._advance()
    assert lc.counted() == pytest.approx(start + 0.1)
    clock.advance(3.0)  # the loop was held for 3 s
    assert lc.counted() == pytest.approx(start + 0.3)  # between wakes: capped as well
    assert lc.stalled_for() == pytest.approx(3.0)
    lc._advance()
    assert lc.counted() == pytest.approx(start + 0.3)
    assert lc.lateness == pytest.approx(2.8) and lc.worst == pytest.approx(2.8)
    assert lc.stalled_for() == 0.0


def test_a_span_says_how_late_the_loop_was() -> None:
    clock = FakeClock()
    lc = LoopClock(tick=0.1, allowance=0.1, clock=clock)
    mark = lc.mark()
    clock.advance(2.0)
    assert lc.late_between(*mark) == pytest.approx(1.8)


@pytest.mark.parametrize(("tick", "allowance"), [(0.0, 0.1), (-1.0, 0.1), (0.1, -0.1)])
def test_bad_parameters_are_refused(tick: float, allowance: float) -> None:
    with pytest.raises(ValueError, match="tick"):
        LoopClock(tick=tick, allowance=allowance)


async def test_an_answer_that_came_while_the_loop_was_held_is_not_a_timeout() -> None:
    lc = LoopClock(tick=0.05, allowance=0.05)
    lc.start()
    try:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str] = loop.create_future()
        answer = threading.Timer(0.1, lambda: loop.call_soon_threadsafe(future.set_result, "answer"))
        answer.start()
        waiting = asyncio.ensure_future(lc.wait(future, 0.3))
        await asyncio.sleep(0)
        end = time.monotonic() + 1.0
        while time.monotonic() < end:  # the loop is held past the 0.3 s the wait allows; the answer came at 0.1 s
            sum(range(200))
        assert await waiting == "answer"
        assert lc.worst >= 0.5
    finally:
        await lc.stop()


async def test_silence_is_a_timeout_in_counted_time() -> None:
    lc = LoopClock(tick=0.05, allowance=0.05)
    lc.start()
    try:
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        with pytest.raises(TimeoutError):
            await lc.wait(future, 0.2)
        assert not future.cancelled()  # the caller owns it
    finally:
        await lc.stop()
