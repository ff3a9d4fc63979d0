"""The versions warming in the table: each with its replicas warming and since when (pure: the clock passed in).

The table holder (:mod:`dataplane.table.local`) keeps, per model, a
:class:`Warming` entry for each version the control plane lists warming
(``ModelRoute.warming``), its start carried from the previous table while
the version stays warming (:func:`carry`); the cold-start rule
(:mod:`dataplane.admission.coldstart`) reads them.

Cost: O(warming versions) per table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True, slots=True)
class Warming:
    """A version warming in the region: its replicas warming, and since when (the proxy's monotonic seconds)."""

    replicas: int
    since: float


def carry(previous: Mapping[str, Warming], current: Mapping[str, int], now: float) -> dict[str, Warming]:
    """The versions warming in a new table (``current``: version -> replicas), each keeping its start.

    A version that was warming in the previous table keeps its ``since``; a new one starts at ``now``.
    """
    out: dict[str, Warming] = {}
    for version, replicas in current.items():
        before = previous.get(version)
        out[version] = Warming(replicas, before.since if before is not None else now)
    return out
