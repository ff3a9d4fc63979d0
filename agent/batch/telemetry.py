"""What the batch runtime reports about its load, as plain data (pure: times are the caller's clock).

- :class:`BusyWindow`: per GPU, the intervals it ran a batch, kept for the
  last ``window_s`` seconds; :meth:`BusyWindow.utilization` is each GPU's
  busy share of that window, running batches counted up to ``now``.
- :class:`ModelView` and :class:`RuntimeLoad`: one snapshot of the runtime,
  which :mod:`agent.batch.metrics` exposes under Triton's names so the agent
  reads the runtime as it reads any KServe v2 endpoint.

The figures the agent turns into ``ReplicaLoad`` (docs/batch.md):

| field | from |
| --- | --- |
| queued | requests pending in the model's batcher |
| running | requests in the model's batches on GPUs now |
| max_concurrency | ``BATCHES_IN_FLIGHT`` × ``max_batch`` × batch slots (healthy GPUs // GPUs per batch) |
| gpu_utilization | mean busy share of the healthy GPUs over the last second |

Defaults: window 1 s, at most 64 intervals kept per GPU (a 1 s window of
100 ms batches needs 10). Cost: ``record`` O(GPUs of the batch),
``utilization`` O(GPUs × intervals kept + running batches).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable


class BusyWindow:
    """When each of ``gpus`` GPUs ran batches during the last ``window_s`` seconds."""

    def __init__(self, gpus: int, *, window_s: float = 1.0, max_intervals: int = 64) -> None:
        if gpus < 1 or window_s <= 0 or max_intervals < 1:
            raise ValueError("gpus >= 1, window_s > 0 and max_intervals >= 1 are required")
        self.window_s = window_s
        self._done: list[deque[tuple[float, float]]] = [deque(maxlen=max_intervals) for _ in range(gpus)]

    def record(self, gpus: Iterable[int], start: float, end: float) -> None:
        """A batch ran on ``gpus`` from ``start`` to ``end`` (finished, failed or aborted)."""
        for gpu in gpus:
            self._done[gpu].append((start, end))

    def utilization(self, now: float, running: Iterable[tuple[tuple[int, ...], float]] = ()) -> list[float]:
        """Each GPU's busy share of ``[now - window_s, now]``; ``running`` is (GPUs, start) of batches on them."""
        since = now - self.window_s
        busy = [0.0] * len(self._done)
        for gpu, intervals in enumerate(self._done):
            busy[gpu] = sum(max(0.0, min(end, now) - max(start, since)) for start, end in intervals)
        for gpus, start in running:
            for gpu in gpus:
                busy[gpu] += max(0.0, now - max(start, since))
        return [min(1.0, b / self.window_s) for b in busy]


@dataclasses.dataclass(frozen=True, slots=True)
class ModelView:
    """One hosted model's load and totals."""

    model: str
    version: str
    ready: bool
    pending: int
    running: int
    max_concurrency: int
    answered: int
    failed: int
    batches: int
    aborted: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeLoad:
    """A snapshot of the runtime: its models, and its GPUs (``None`` for a failed GPU)."""

    models: tuple[ModelView, ...]
    gpu_utilization: tuple[float | None, ...]
    gpus_in_use: int
    drain_idle_gpu_s: float

    @property
    def gpus_failed(self) -> int:
        return sum(1 for u in self.gpu_utilization if u is None)

    @property
    def mean_utilization(self) -> float:
        """Mean busy share of the healthy GPUs (0.0 when none is healthy)."""
        healthy = [u for u in self.gpu_utilization if u is not None]
        return sum(healthy) / len(healthy) if healthy else 0.0
