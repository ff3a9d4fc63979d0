"""Time on one event loop that leaves out the loop's own lateness, so a busy process never blames the store.

A deadline measured with the plain clock cannot tell "etcd did not answer"
from "the answer came, but this loop was busy computing tables and read it
late". :class:`LoopClock` counts only the time the loop was free to notice an
answer: a ticker task wakes every ``tick`` seconds (0.1 s), and an interval
between two wakes counts at most ``tick + allowance`` (``allowance`` 0.1 s);
the rest is *lateness* (the loop, or the process holding the GIL, was busy)
and is not counted. :meth:`LoopClock.counted` interpolates between wakes with
the same cap. :meth:`LoopClock.wait` waits for a future at most ``seconds`` of
counted time; :meth:`LoopClock.late_between` says how much of a span was
lateness (a call that failed on a deadline while the loop was late is not
counted against the store); :meth:`LoopClock.stalled_for` is how long ago the
ticker last ran, readable from another thread (how the lease keeper,
:mod:`controlplane.store.etcdkeeper`, tells that its owner's loop is busy).

State: the last wake, the counted time, the worst and total lateness. Cost:
one timer wake per ``tick``; O(1) per call. Bounded: one ticker task per
clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class LoopClock:
    """Counted seconds of the event loop it was started on (see the module docstring).

    Parameters: ``tick`` (seconds between the ticker's wakes), ``allowance`` (how late a wake may be
    and still count whole), ``clock`` (monotonic seconds).
    """

    def __init__(self, *, tick: float = 0.1, allowance: float = 0.1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if tick <= 0 or allowance < 0:
            raise ValueError("tick must be > 0 and allowance >= 0")
        self._tick = tick
        self._cap = tick + allowance
        self._clock = clock
        self._last = clock()  # when the ticker last ran (plain clock)
        self._counted = self._last  # counted time at that wake
        self.lateness = 0.0  # seconds of lateness seen in all
        self.worst = 0.0  # the longest single lateness seen
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the ticker on the running loop (no-op when it runs)."""
        if self.running:
            return
        self._last = self._clock()
        self._counted = self._last
        self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-clock")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._tick)
            self._advance()

    def _advance(self) -> None:
        now = self._clock()
        elapsed = now - self._last
        late = max(0.0, elapsed - self._cap)
        self._counted += elapsed - late
        self._last = now
        self.lateness += late
        self.worst = max(self.worst, late)

    def counted(self) -> float:
        """Counted seconds now: the plain clock minus the lateness seen (a wake's gap counts at most the cap)."""
        return self._counted + min(self._clock() - self._last, self._cap)

    def stalled_for(self) -> float:
        """Seconds since the ticker last ran (about ``tick`` on a free loop); safe to read from another thread."""
        return self._clock() - self._last

    def late_between(self, plain_start: float, counted_start: float) -> float:
        """Seconds of lateness since (``plain_start``, ``counted_start``), read together from this clock."""
        return max(0.0, (self._clock() - plain_start) - (self.counted() - counted_start))

    def mark(self) -> tuple[float, float]:
        """(plain, counted) now: the start of a span for :meth:`late_between`."""
        return self._clock(), self.counted()

    async def wait(self, future: asyncio.Future[T], seconds: float) -> T:
        """``future``'s result, waiting at most ``seconds`` of counted time (TimeoutError); not cancelled then."""
        deadline = self.counted() + seconds
        while not future.done():
            remaining = deadline - self.counted()
            if remaining <= 0:
                raise TimeoutError
            await asyncio.wait((future,), timeout=remaining)
        return future.result()

    async def stop(self) -> None:
        """Stop the ticker."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
