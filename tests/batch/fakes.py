"""Fakes for the batch runtime tests: batch functions whose timing the test controls."""

from __future__ import annotations

import asyncio
import threading

from agent.batch.reference import transform


class GatedBackend:
    """A synchronous batch function that blocks until the test opens the gate.

    Records every call's inputs and signals each start, so a test waits on a
    signal (never a sleep) for batches to be in flight.
    """

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.calls: list[list[str]] = []
        self._started = threading.Semaphore(0)
        self._lock = threading.Lock()

    def __call__(self, inputs: list[str]) -> list[str]:
        with self._lock:
            self.calls.append(list(inputs))
        self._started.release()
        if not self.gate.wait(timeout=20):
            raise TimeoutError("gate never opened")
        return [transform(s) for s in inputs]

    async def wait_started(self, batches: int) -> None:
        """Wait until ``batches`` more calls have started."""
        for _ in range(batches):
            acquired = await asyncio.to_thread(self._started.acquire, True, 10)
            assert acquired, "batch never started"


def broken_backend(inputs: list[str]) -> list[str]:
    """Breaks the contract: one output short."""
    return [transform(s) for s in inputs[1:]]


async def async_backend(inputs: list[str]) -> list[str]:
    """A coroutine backend: awaited by the runtime, no thread."""
    await asyncio.sleep(0)
    return [transform(s) for s in inputs]
