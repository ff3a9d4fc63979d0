"""Start-up and replacement times measured from what the fleet reports (pure: observations in, estimates out).

- **Start-up** (per region): from the first report of a replica in state
  ``warming`` to its first report in ``ready``: the time to stream a model's
  weights onto a machine and warm it. A replica first seen ``ready`` gives no
  sample.
- **Replacement** (per region): from a node leaving the fleet (no longer
  live) to the next node of its region that registers for the first time:
  the time the provider takes to replace a machine. Losses wait in a queue
  of at most ``max_losses`` per region (the oldest dropped beyond it).

Each estimate is an exponentially weighted mean with weight ``alpha`` for
the newest sample (the first sample sets it); before any sample the
configured default holds. Bounds: ``max_tracked`` replicas warming and
``max_regions`` regions (beyond, new ones are ignored); nodes are those the
caller passes (the fleet's bound). Cost: O(replicas + nodes) per
:meth:`Timings.observe`.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable


def ewma(previous: float | None, sample: float, alpha: float) -> float:
    """The exponentially weighted mean after ``sample`` (weight ``alpha``); the first sample sets it."""
    return sample if previous is None else (1 - alpha) * previous + alpha * sample


class Timings:
    """Start-up and replacement estimates per region; fed by :meth:`observe` with the fleet as it is now.

    Parameters: ``startup_default`` and ``replacement_default`` (seconds, before any sample), ``alpha``
    (0..1], ``max_tracked``, ``max_regions``, ``max_losses`` (the bounds of the module docstring).
    """

    def __init__(self, *, startup_default: float, replacement_default: float, alpha: float = 0.3,
                 max_tracked: int = 4096, max_regions: int = 64, max_losses: int = 64) -> None:
        self.startup_default = startup_default
        self.replacement_default = replacement_default
        self._alpha = alpha
        self._max_tracked = max_tracked
        self._max_regions = max_regions
        self._max_losses = max_losses
        self._warming: dict[str, tuple[str, float]] = {}  # replica id -> (region, first seen warming)
        self._startup: dict[str, float] = {}
        self._replacement: dict[str, float] = {}
        self._nodes: dict[str, str] | None = None  # node -> region, as last observed (None: never)
        self._losses: dict[str, collections.deque[float]] = {}

    def startup(self, region: str) -> float:
        """Seconds to bring a replica up in ``region`` (measured, else the default)."""
        return self._startup.get(region, self.startup_default)

    def replacement(self, region: str) -> float:
        """Seconds to replace a machine in ``region`` (measured, else the default)."""
        return self._replacement.get(region, self.replacement_default)

    def measured(self) -> dict[str, tuple[float | None, float | None]]:
        """Per region with a sample: (start-up, replacement), None where not measured."""
        regions = set(self._startup) | set(self._replacement)
        return {r: (self._startup.get(r), self._replacement.get(r)) for r in regions}

    def restore(self, region: str, *, startup: float | None, replacement: float | None) -> None:
        """Take estimates kept from an earlier run (the store's), where none is measured here yet."""
        if startup is not None and self._room(self._startup, region):
            self._startup.setdefault(region, startup)
        if replacement is not None and self._room(self._replacement, region):
            self._replacement.setdefault(region, replacement)

    def _room(self, table: dict[str, float], region: str) -> bool:
        return region in table or len(table) < self._max_regions

    def observe(self, now: float, replicas: Iterable[tuple[str, str, bool]], nodes: Iterable[tuple[str, str]]) -> None:
        """The fleet at ``now``: ``replicas`` as (replica id, region, ready), only those warming or ready;
        ``nodes`` as (node, region), only the live ones."""
        seen: set[str] = set()
        for replica_id, region, ready in replicas:
            seen.add(replica_id)
            started = self._warming.get(replica_id)
            if not ready:
                if started is None and len(self._warming) < self._max_tracked:
                    self._warming[replica_id] = (region, now)
            elif started is not None:
                del self._warming[replica_id]
                if self._room(self._startup, started[0]):
                    self._startup[started[0]] = ewma(self._startup.get(started[0]), now - started[1], self._alpha)
        for gone in set(self._warming) - seen:
            del self._warming[gone]
        current = dict(nodes)
        if self._nodes is not None:
            for node, region in self._nodes.items():
                if node not in current and (region in self._losses or len(self._losses) < self._max_regions):
                    self._losses.setdefault(region, collections.deque(maxlen=self._max_losses)).append(now)
            for node, region in current.items():
                losses = self._losses.get(region)
                if node not in self._nodes and losses:
                    lost_at = losses.popleft()
                    if self._room(self._replacement, region):
                        self._replacement[region] = ewma(self._replacement.get(region), now - lost_at, self._alpha)
        self._nodes = current
