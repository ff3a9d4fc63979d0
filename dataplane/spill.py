"""The proxy's region choice: step 3 of the request path (DESIGN.md), applying the table's spill weights.

Algorithm: the table gives, for the proxy's region, the share of its
interactive traffic to send to each other region (computed by the control
plane: :mod:`controlplane.spill`). With one uniform draw ``u`` in [0, 1)
per request, the request goes to the first region whose cumulative weight
exceeds ``u``, in the table's order; past the sum of the weights it stays
local. Only the tiers in ``tiers`` (default: interactive) spill: standard
and batch stay local here (batch placement across regions is the control
plane's, :func:`controlplane.spill.batch_weights`). A region whose replicas
the proxy cannot use for this model (none routable) is skipped, so the
request stays local rather than failing.

Returns a :class:`RegionChoice` (region, rtt_ms, branch ``local`` or
``spilled``); the branch is a metric label and a test assertion.

Pure: the random draw is an argument. Cost: O(targets), a handful.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Collection, Sequence


class RegionBranch(enum.StrEnum):
    """How the region was chosen."""

    LOCAL = "local"
    SPILLED = "spilled"


@dataclasses.dataclass(frozen=True, slots=True)
class SpillTarget:
    """Another region this proxy may send a share of its interactive traffic to."""

    region: str
    weight: float  # share of the local region's interactive traffic, 0..1
    rtt_ms: float  # configured round trip to it


@dataclasses.dataclass(frozen=True, slots=True)
class RegionChoice:
    """Where a request goes: its region, the round trip it costs, and why."""

    region: str
    rtt_ms: float
    branch: RegionBranch


def choose_region(local: str, targets: Sequence[SpillTarget], *, tier: str, u: float,
                  usable: Collection[str] = (), tiers: Collection[str] = ("interactive",)) -> RegionChoice:
    """The region for one request; ``usable``: the regions with a routable replica of its model."""
    if tier in tiers:
        edge = 0.0
        for target in targets:
            edge += target.weight
            if u < edge:
                if target.region in usable:
                    return RegionChoice(target.region, target.rtt_ms, RegionBranch.SPILLED)
                break
    return RegionChoice(local, 0.0, RegionBranch.LOCAL)
