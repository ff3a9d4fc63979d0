"""What the control plane's streaming RPCs share: the first message within a deadline, a reader beside a writer.

- :func:`first_message`: the stream's first message within ``first_message_seconds``
  (``DeadlineExceeded`` otherwise; None when the peer closed without one);
- :func:`duplex`: a reader task beside a writer loop; True when the writer's
  source ended (the stream was closed on this side), the reader's error
  otherwise;
- :func:`body_error`: the ``InvalidArgument`` for a message of the wrong kind.

Used by ``Fleet.Connect``, ``Tables.Watch`` (:mod:`controlplane.api.servicers`)
and ``Admin.Follow`` (:mod:`controlplane.api.cluster`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from controlplane.tasks import cancel_and_wait
from ferry.errors import DeadlineExceeded, InvalidArgument

T = TypeVar("T")
M = TypeVar("M")


async def first_message(stream: AsyncIterator[M], expected: str, seconds: float) -> M | None:
    """The stream's first message; None when the peer closed without one."""
    try:
        async with asyncio.timeout(seconds):
            return await anext(stream)
    except StopAsyncIteration:
        return None
    except TimeoutError as exc:
        raise DeadlineExceeded(f"{expected}: no first message within {seconds:g} s") from exc


async def duplex(
    reader: Awaitable[None], next_out: Callable[[], Awaitable[T | None]], write: Callable[[T], Awaitable[None]],
) -> bool:
    """Run ``reader`` while writing what ``next_out`` gives; True when ``next_out`` ended it (closed)."""
    read_task = asyncio.ensure_future(reader)
    try:
        while not read_task.done():
            out_task = asyncio.ensure_future(next_out())
            await asyncio.wait({read_task, out_task}, return_when=asyncio.FIRST_COMPLETED)
            if not out_task.done():
                out_task.cancel()
                break
            item = out_task.result()
            if item is None:
                return True
            await write(item)
        read_task.result()  # the reader's error, if any
        return False
    finally:
        if not read_task.done():
            await cancel_and_wait([read_task])


def body_error(kind: str | None, first: str) -> InvalidArgument:
    if kind is None:
        return InvalidArgument("body", "empty message")
    return InvalidArgument(kind, f"only the first message of a stream may be {first}")
