"""Jittered exponential backoff for reconnecting (pure: the random generator is injected).

Delay ``n`` (from 0) is drawn uniformly from ``[d/2, d]`` where
``d = min(cap, initial * 2**n)`` ("equal jitter"): it grows 0.1, 0.2, 0.4 …
up to ``cap`` (defaults 0.1 s and 5 s), never drops below half the nominal
value, and agents that lost the same control plane do not come back in step.
:meth:`Backoff.reset` after a successful connection starts over. Cost: O(1).
"""

from __future__ import annotations

import random


class Backoff:
    """Delays before successive reconnection attempts."""

    def __init__(self, initial: float = 0.1, cap: float = 5.0, rng: random.Random | None = None) -> None:
        if initial <= 0 or cap < initial:
            raise ValueError("backoff needs 0 < initial <= cap")
        self.initial, self.cap = initial, cap
        self._rng = rng or random.Random()
        self._attempt = 0

    def next_delay(self) -> float:
        """The delay before the next attempt, in seconds."""
        nominal = min(self.cap, self.initial * 2.0 ** min(self._attempt, 62))
        self._attempt += 1
        return nominal / 2 + self._rng.uniform(0.0, nominal / 2)

    def reset(self) -> None:
        """Start over from ``initial`` (after a connection that worked)."""
        self._attempt = 0
