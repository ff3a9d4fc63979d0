"""Region spill weights: where a saturated region sends the interactive work it cannot serve in time.

Algorithm (pure, per table computation). Inputs per region
(:class:`RegionLoad`): ``capacity`` (interactive requests per second its
ready replicas sustain), ``offered`` (interactive requests per second
arriving there), ``slots`` (concurrent requests it runs) and ``service_ms``
(a typical interactive request's service time); and the configured
round-trip times between regions (``region_rtt_ms``, symmetric, ``"a:b"``).

1. A region keeps local work up to ``headroom`` (default 0.9) of its
   capacity; what it is offered beyond that is its *excess*.
2. Its excess goes to the other regions in order of round-trip time (ties by
   name), each taking at most its *spare* capacity (``headroom x capacity -
   offered``, shrinking as sources take it), and only regions where a spilled
   request still fits the tier's latency budget (``budget_ms``, default
   500 ms interactive): ``rtt + expected queueing at headroom + service <=
   budget``. Queueing is the Sakasegawa approximation of an M/M/c queue,
   ``Wq = S * rho^(sqrt(2(c+1)) - 1) / (c (1 - rho))``.
3. The weight of (source, target) is the share of the source's interactive
   traffic to send there: taken / offered. Excess nothing can take stays
   local (admission sheds it there).
4. Batch has no latency budget: :func:`batch_weights` spreads it over the
   regions in proportion to their idle capacity.

Regions are served most saturated first (ties by name), so the result is
deterministic. Cost: O(R^2 log R) for R regions; R is a handful.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from ferry.errors import ConfigError

DEFAULT_BUDGET_MS = 500.0
DEFAULT_HEADROOM = 0.9


@dataclasses.dataclass(frozen=True, slots=True)
class RegionLoad:
    """One region's interactive capacity and demand (requests per second), slots and service time."""

    region: str
    capacity: float
    offered: float
    slots: int = 1
    service_ms: float = 0.0


def parse_rtt(config: Mapping[str, float]) -> dict[tuple[str, str], float]:
    """``{"a:b": 40}`` to a symmetric map ``{("a", "b"): 40, ("b", "a"): 40}``; raises ConfigError."""
    out: dict[tuple[str, str], float] = {}
    for key, value in config.items():
        a, sep, b = key.partition(":")
        if not sep or not a or not b or a == b:
            raise ConfigError("controlplane.region_rtt_ms", f"key {key!r}: expected 'region:region'")
        if not float(value) >= 0:
            raise ConfigError("controlplane.region_rtt_ms", f"{key}: must be >= 0 ms")
        out[(a, b)] = out[(b, a)] = float(value)
    return out


def queue_ms(service_ms: float, slots: int, rho: float) -> float:
    """Expected queueing (ms) at utilisation ``rho`` of ``slots`` servers (Sakasegawa's M/M/c approximation)."""
    if rho >= 1.0:
        return math.inf
    if rho <= 0.0:
        return 0.0
    c = max(1, slots)
    return float(service_ms * rho ** (math.sqrt(2 * (c + 1)) - 1) / (c * (1 - rho)))


def spill_weights(regions: Sequence[RegionLoad], rtt_ms: Mapping[tuple[str, str], float], *,
                  budget_ms: float = DEFAULT_BUDGET_MS,
                  headroom: float = DEFAULT_HEADROOM) -> dict[tuple[str, str], float]:
    """(source, target) -> share of the source's interactive traffic to send to target; see the module doc."""
    if not 0 < headroom <= 1:
        raise ConfigError("controlplane.spill_headroom", "must be in (0, 1]")
    spare = {r.region: max(0.0, headroom * r.capacity - r.offered) for r in regions}
    fits = {r.region: queue_ms(r.service_ms, r.slots, headroom) + r.service_ms for r in regions}
    weights: dict[tuple[str, str], float] = {}
    order = sorted(regions, key=lambda r: (-(r.offered - headroom * r.capacity), r.region))
    for source in order:
        excess = source.offered - headroom * source.capacity
        if excess <= 0 or source.offered <= 0:
            continue
        targets = sorted(
            (rtt_ms[(source.region, t.region)], t.region) for t in regions
            if t.region != source.region and (source.region, t.region) in rtt_ms
            and rtt_ms[(source.region, t.region)] + fits[t.region] <= budget_ms)
        for _, target in targets:
            take = min(excess, spare[target])
            if take <= 0:
                continue
            weights[(source.region, target)] = take / source.offered
            spare[target] -= take
            excess -= take
            if excess <= 0:
                break
    return weights


def batch_weights(regions: Sequence[RegionLoad]) -> dict[str, float]:
    """Region -> share of batch work, in proportion to idle capacity (all zero: empty, keep it local)."""
    idle = {r.region: max(0.0, r.capacity - r.offered) for r in regions}
    total = sum(idle.values())
    if total <= 0:
        return {}
    return {region: value / total for region, value in sorted(idle.items()) if value > 0}
