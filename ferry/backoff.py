"""Jittered exponential backoff before reconnecting (pure: the random generator is injected).

The delay before attempt ``n`` (from 0) is drawn uniformly from ``[d/2, d]``
where ``d = min(cap, initial * 2**n)``: the nominal delay grows 0.1, 0.2,
0.4 … up to ``cap`` (defaults 0.1 s and 5 s). :meth:`Backoff.reset` after an
exchange that worked starts over from ``initial``.

Equal jitter (uniform over the upper half) rather than full jitter (uniform
over ``[0, d]``), deliberately: the clients that back off here (agents,
proxies, follower control planes) are a few per control plane, not a crowd
contending for one lock, so spreading them over half the window already
keeps them out of step, while the lower bound of ``d/2`` makes the delay
really grow with the failures: with full jitter a client that draws low a
few times in a row retries a dead peer at near-zero intervals, and the
delay bounds a test or an operator can rely on ("at least 50 ms after the
first failure") vanish.

Cost: O(1) per delay.
"""

from __future__ import annotations

import random


class Backoff:
    """Delays before successive attempts: equal jitter over an exponential nominal delay capped at ``cap``."""

    def __init__(self, initial: float = 0.1, cap: float = 5.0, *, rng: random.Random | None = None) -> None:
        if not 0 < initial <= cap:
            raise ValueError(f"backoff needs 0 < initial <= cap, got initial={initial} cap={cap}")
        self.initial = initial
        self.cap = cap
        self._rng = rng if rng is not None else random.Random()
        self._attempt = 0

    def nominal(self) -> float:
        """The upper bound of the next delay: ``min(cap, initial * 2**attempt)``."""
        return min(self.cap, self.initial * 2.0 ** min(self._attempt, 62))

    def next_delay(self) -> float:
        """The delay before the next attempt, in seconds, within ``[nominal/2, nominal]``."""
        nominal = self.nominal()
        self._attempt += 1
        return nominal / 2 + self._rng.uniform(0.0, nominal / 2)

    def reset(self) -> None:
        """Start over from ``initial`` (after an exchange that worked)."""
        self._attempt = 0
