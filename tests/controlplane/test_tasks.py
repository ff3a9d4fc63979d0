"""controlplane.tasks: start tasks, cancel all and await them, CancelledError swallowed, other errors logged."""

from __future__ import annotations

import asyncio
import logging

import pytest

from controlplane.tasks import TaskGroup, cancel_and_wait


async def test_stop_cancels_and_awaits_every_task() -> None:
    group = TaskGroup()
    cleaned: list[str] = []

    async def loop(name: str) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned.append(name)

    tasks = [group.start(loop(n), name=n) for n in ("a", "b")]
    await asyncio.sleep(0)
    assert len(group) == 2
    await group.stop()
    assert sorted(cleaned) == ["a", "b"] and all(t.cancelled() for t in tasks)
    assert len(group) == 0
    await group.stop()  # twice is fine


async def test_an_error_is_logged_not_raised_and_the_others_are_still_awaited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    group = TaskGroup()

    async def fails() -> None:
        raise RuntimeError("boom")

    async def sleeps() -> None:
        await asyncio.sleep(3600)

    group.start(fails(), name="fails")
    slow = group.start(sleeps(), name="sleeps")
    await asyncio.sleep(0)
    with caplog.at_level(logging.ERROR, logger="controlplane.tasks"):
        await group.stop()
    assert slow.cancelled()
    assert any("fails" in r.getMessage() and r.exc_info for r in caplog.records)


async def test_a_task_that_swallows_cancel_still_ends() -> None:
    done = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            done.set()

    task = asyncio.ensure_future(stubborn())
    await asyncio.sleep(0)
    await cancel_and_wait([task])
    assert done.is_set() and task.done()


async def test_cancel_and_wait_of_finished_tasks_is_quiet() -> None:
    async def quick() -> int:
        return 1

    task = asyncio.ensure_future(quick())
    await task
    await cancel_and_wait([task])
    await cancel_and_wait([])
