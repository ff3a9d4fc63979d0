"""Background tasks started together and stopped together: start, then cancel all and await them.

:class:`TaskGroup` keeps the tasks it started; :meth:`TaskGroup.stop` cancels
every one, then awaits each, swallowing its ``CancelledError`` and logging any
other exception it ended with (a stop never raises what a task raised).
:func:`cancel_and_wait` does the same for tasks held elsewhere. Unlike
:class:`asyncio.TaskGroup`, a task that fails does not cancel the others:
each loop of a server outlives a bug in another.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable
from typing import Any

log = logging.getLogger(__name__)


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]], *, logger: logging.Logger = log) -> None:
    """Cancel every task, then await each: ``CancelledError`` swallowed, any other exception logged."""
    pending = list(tasks)
    for task in pending:
        task.cancel()
    for task in pending:
        try:
            await task
        except asyncio.CancelledError:
            pass
        except Exception:
            name = task.get_name() if isinstance(task, asyncio.Task) else repr(task)
            logger.exception("task %s ended with an error", name)


class TaskGroup:
    """The tasks one owner started; :meth:`stop` cancels and awaits them all."""

    def __init__(self, *, logger: logging.Logger = log) -> None:
        self._tasks: list[asyncio.Task[Any]] = []
        self._log = logger

    def start(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run ``coro`` as a task of this group."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.append(task)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    async def stop(self) -> None:
        """Cancel every task, then await each (see :func:`cancel_and_wait`); the group is empty after."""
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(tasks, logger=self._log)
