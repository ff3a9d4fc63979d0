"""Tier quotas with lending and reclaim: one pure function shared by both planes.

:func:`compute_quotas` splits ``capacity`` concurrency slots among the tiers
(``interactive`` > ``standard`` > ``batch``). Each tier has a reserved share
(default 0.7 / 0.2 / 0.1: the lower tiers keep a floor
that overload cannot take, interactive keeps most). Algorithm, in three passes over the tiers:

1. guaranteed: each tier keeps ``min(demand, reserved slots)``;
2. borrowing: in priority order, a tier whose demand exceeds its reserve
   takes what is still free (idle reserve of other tiers, lent to it);
3. filling: whatever is still idle goes to the lowest tier (batch fills idle
   capacity).

When a higher tier's demand rises, pass 1 gives it back its reserve and pass
2 serves it first, so the lower tiers' quotas shrink at the next computation:
that is the reclaim. ``demand`` counts running plus waiting requests of a
tier. A tier may always use its own reserve (:func:`allowance`), whatever its
quota says, so a first interactive request is never blocked by a stale quota.

The interactive reserve is never lent whole: :func:`interactive_headroom`
is the number of slots the lower tiers leave free at a proxy, sized from the
interactive dispatch rate (``rate x seconds``, at most a share of the
capacity), so interactive arrivals find a free slot instead of waiting for a
preemption.

The control plane carries the reserved shares and its quotas in the table
(``controlplane.tables.quotas``); each proxy recomputes the quotas with this same
function from its own observed demand at every dispatch, so a reclaim takes
effect at the proxy's next dispatch and, fleet-wide, at the next push.

Cost: O(tiers) = O(1).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from ferry.config import TIERS

DEFAULT_RESERVED: Mapping[str, float] = {"interactive": 0.7, "standard": 0.2, "batch": 0.1}


@dataclasses.dataclass(frozen=True, slots=True)
class Quotas:
    """Per tier: reserved slots, quota in slots, and slots lent to other tiers."""

    capacity: int
    reserved: Mapping[str, int]
    quota: Mapping[str, int]
    lent: Mapping[str, int]


def reserved_slots(capacity: int, shares: Mapping[str, float]) -> dict[str, int]:
    """Slots each tier reserves: floor(share x capacity), the rounding remainder to the highest tier."""
    total = sum(max(shares.get(t, 0.0), 0.0) for t in TIERS) or 1.0
    slots = {t: math.floor(capacity * max(shares.get(t, 0.0), 0.0) / total) for t in TIERS}
    slots[TIERS[0]] += capacity - sum(slots.values())
    return slots


def compute_quotas(capacity: int, demand: Mapping[str, int],
                   shares: Mapping[str, float] = DEFAULT_RESERVED) -> Quotas:
    """Quotas in slots for ``capacity`` given each tier's ``demand``; see the module docstring."""
    capacity = max(capacity, 0)
    reserved = reserved_slots(capacity, shares)
    quota = {t: min(max(demand.get(t, 0), 0), reserved[t]) for t in TIERS}
    free = capacity - sum(quota.values())
    for t in TIERS:
        extra = min(max(demand.get(t, 0), 0) - quota[t], free)
        if extra > 0:
            quota[t] += extra
            free -= extra
    quota[TIERS[-1]] += free
    lent = {t: max(reserved[t] - min(quota[t], reserved[t]), 0) for t in TIERS}
    return Quotas(capacity=capacity, reserved=reserved, quota=quota, lent=lent)


def allowance(quotas: Quotas, tier: str) -> int:
    """Slots ``tier`` may run now: its quota, and never less than its own reserve."""
    return max(quotas.quota.get(tier, 0), quotas.reserved.get(tier, 0))


def interactive_headroom(capacity: int, rate: float, seconds: float, max_share: float) -> int:
    """Slots lower tiers leave free for interactive arrivals: ``ceil(rate x seconds)``, at most ``max_share``.

    ``rate``: interactive requests dispatched per second (observed);
    ``seconds``: how long a freed slot takes to come back to interactive
    (a preempted or finishing request); ``max_share``: the bound as a share
    of ``capacity``. The reserve is never lent whole: with these slots free
    an interactive arrival starts at once, without waiting for a preemption,
    and the preemptions (a re-prefill each) mostly stop.
    """
    if capacity <= 0 or rate <= 0 or seconds <= 0 or max_share <= 0:
        return 0
    return min(math.ceil(rate * seconds), math.floor(max_share * capacity))
