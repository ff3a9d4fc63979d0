"""How fast a model's queue drains, and the ``retry-after`` a refused request is told (pure).

Algorithm: :class:`DrainMeter` keeps the completions of recent batches,
``(time, requests)``, in a ring of at most ``max_events`` entries, and
measures the drain rate as the requests completed in the last ``window_s``
seconds divided by the span observed (the window, or less while the meter is
younger than it). With nothing completed in the window (just started, or
every GPU stalled) the caller's capacity estimate stands in: batch slots ×
``max_batch`` / ``batch_s``.

:func:`retry_after_s` is the time the backlog now in the queue takes to drain
at that rate, ``pending / rate``, clamped to [``floor_s``, ``cap_s``]. A
client that waits that long finds the requests ahead of it gone, instead of
a queue as full as the one that refused it; the floor (one batch time) keeps
a burst of refused clients from coming back before even one batch left.

Defaults: window 2 s, ring of 1,024 batches (at 100 ms per batch that is
over 12 s on eight GPUs), floor 0.1 s, cap 30 s. Cost: ``record`` O(1)
amortised, ``rate`` O(events in the window).
"""

from __future__ import annotations

from collections import deque

DEFAULT_WINDOW_S = 2.0
DEFAULT_CAP_S = 30.0


class DrainMeter:
    """Requests completed per second over a sliding window; times are the caller's clock."""

    def __init__(self, *, window_s: float = DEFAULT_WINDOW_S, max_events: int = 1024) -> None:
        if window_s <= 0 or max_events < 1:
            raise ValueError("window_s must be > 0 and max_events >= 1")
        self.window_s = window_s
        self._events: deque[tuple[float, int]] = deque(maxlen=max_events)
        self._origin: float | None = None

    def start(self, now: float) -> None:
        """Mark when the meter began to watch (the first request); later calls keep the first mark."""
        if self._origin is None:
            self._origin = now

    def record(self, now: float, requests: int) -> None:
        """A batch of ``requests`` completed at ``now``."""
        self.start(now)
        self._events.append((now, requests))

    def rate(self, now: float) -> float:
        """Requests per second completed over the window; 0.0 when none completed in it."""
        since = now - self.window_s
        events = self._events
        while events and events[0][0] <= since:
            events.popleft()
        done = sum(n for _t, n in events)
        if done == 0 or self._origin is None:
            return 0.0
        span = min(self.window_s, now - self._origin)
        return done / span if span > 0 else 0.0


def retry_after_s(pending: int, rate: float, *, floor_s: float, cap_s: float = DEFAULT_CAP_S) -> float:
    """Seconds for ``pending`` requests to drain at ``rate`` per second, within [floor_s, cap_s]."""
    if rate <= 0:
        return cap_s
    return min(cap_s, max(floor_s, pending / rate))
