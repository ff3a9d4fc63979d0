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
   500 ms interactive): ``rtt + p99 of the queueing at headroom + service
   <= budget`` (the budget is a p99, so its tail, not its mean, must fit).
   Queueing is an M/M/c queue: the chance to wait is the closed-form
   ``P = rho^(sqrt(2(c+1)) - 1)`` and the wait beyond is exponential at
   rate ``c (1 - rho) / S``, so its quantile q is ``S / (c (1 - rho)) x
   ln(P / (1 - q))`` (:func:`queue_p99_ms`; the mean, ``P S / (c (1 - rho))``,
   is :func:`queue_ms`).
3. The weight of (source, target) is the share of the source's interactive
   traffic to send there: taken / offered. Excess nothing can take stays
   local (admission sheds it there).
4. :func:`reachable`: per source, the targets a spilled request may go to
   at all (within the budget), nearest first, whatever the weights and
   their spare capacity now: the proxies' spill on queue
   (:mod:`dataplane.regions.choice`) uses them for the bursts the weights are too
   slow for, within the room it sees in the target's pushed loads.
5. Batch has no latency budget: :func:`batch_weights` spreads it over the
   regions in proportion to their idle capacity. The controller gives a
   region busy past ``route_share`` a batch weight to every other region
   with idle slots, whatever the round trip (the proxies draw batch requests
   on it; routes beyond the interactive budget are for batch alone).

Options of :func:`spill_weights`: ``keep`` (default ``headroom``), the share
of its capacity a source keeps before it spills; ``balance_to`` (default
none): when a target's spare is short of a source's excess, the target takes
more, up to where the two utilisations are equal,
``(O_s C_t - O_t C_s) / (C_s + C_t)``, but not past ``balance_to`` of its
capacity, so an overload of both is shared rather than left whole at the
source.

Regions are served most saturated first (ties by name), so the result is
deterministic. Cost: O(R^2 log R) for R regions; R is a handful.

The closed loop that feeds these functions from the control plane's
samples, sizing and steering the weights between updates, is
:class:`controlplane.regions.control.SpillController`.
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


def queue_ms(service_ms: float, slots: int, rho: float) -> float:
    """Expected queueing (ms) at utilisation ``rho`` of ``slots`` servers (closed-form M/M/c approximation)."""
    if rho >= 1.0:
        return math.inf
    if rho <= 0.0:
        return 0.0
    c = max(1, slots)
    return float(service_ms * rho ** (math.sqrt(2 * (c + 1)) - 1) / (c * (1 - rho)))


def queue_p99_ms(service_ms: float, slots: int, rho: float, quantile: float = 0.99) -> float:
    """The ``quantile`` of the wait (ms) at utilisation ``rho`` of ``slots`` servers (M/M/c tail, module doc)."""
    if rho >= 1.0:
        return math.inf
    if rho <= 0.0:
        return 0.0
    c = max(1, slots)
    waits = rho ** (math.sqrt(2 * (c + 1)) - 1)  # P(wait > 0), closed-form approximation
    tail = 1.0 - quantile
    return 0.0 if waits <= tail else float(service_ms / (c * (1 - rho)) * math.log(waits / tail))


def spill_weights(regions: Sequence[RegionLoad], rtt_ms: Mapping[tuple[str, str], float], *,
                  budget_ms: float = DEFAULT_BUDGET_MS, headroom: float = DEFAULT_HEADROOM,
                  keep: float | None = None, balance_to: float | None = None) -> dict[tuple[str, str], float]:
    """(source, target) -> share of the source's interactive traffic to send to target; see the module doc.

    ``keep`` (default ``headroom``): the share of its capacity a source keeps before it spills.
    ``balance_to`` (default: none): when a target's spare is short of the excess, it takes more, up to where
    its utilisation equals the source's, ``(O_s C_t - O_t C_s) / (C_s + C_t)``, but not past ``balance_to``
    of its capacity (an overload is shared rather than left whole to the source, within a bound)."""
    keep = headroom if keep is None else keep
    if not 0 < headroom <= 1 or not 0 < keep <= headroom or not (balance_to is None or headroom <= balance_to <= 1):
        raise ConfigError("controlplane.spill_headroom", "need 0 < keep <= headroom <= balance_to <= 1")
    load = {r.region: r.offered for r in regions}
    capacity = {r.region: r.capacity for r in regions}
    spare = {r.region: max(0.0, headroom * r.capacity - r.offered) for r in regions}
    fits = {r.region: queue_p99_ms(r.service_ms, r.slots, headroom) + r.service_ms for r in regions}
    weights: dict[tuple[str, str], float] = {}
    order = sorted(regions, key=lambda r: (-(r.offered - keep * r.capacity), r.region))
    for source in order:
        excess = source.offered - keep * source.capacity
        if excess <= 0 or source.offered <= 0:
            continue
        targets = sorted(
            (rtt_ms[(source.region, t.region)], t.region) for t in regions
            if t.region != source.region and (source.region, t.region) in rtt_ms
            and t.offered <= keep * t.capacity  # a region that spills takes nothing
            and rtt_ms[(source.region, t.region)] + fits[t.region] <= budget_ms)
        for _, target in targets:
            take = min(excess, spare[target])
            if balance_to is not None and take < excess:
                c_s, c_t = capacity[source.region], capacity[target]
                level = (load[source.region] * c_t - load[target] * c_s) / (c_s + c_t) if c_s + c_t > 0 else 0.0
                take = min(excess, max(take, min(level, balance_to * c_t - load[target])))
            if take <= 0:
                continue
            weights[(source.region, target)] = take / source.offered
            spare[target] = max(0.0, spare[target] - take)
            load[source.region] -= take
            load[target] += take
            excess -= take
            if excess <= 0:
                break
    return weights


def reachable(regions: Sequence[RegionLoad], rtt_ms: Mapping[tuple[str, str], float], *,
              budget_ms: float = DEFAULT_BUDGET_MS,
              headroom: float = DEFAULT_HEADROOM) -> dict[str, tuple[str, ...]]:
    """Source -> targets a spilled request may reach within the budget, nearest first (spare or not)."""
    out: dict[str, tuple[str, ...]] = {}
    for source in regions:
        targets = sorted(
            (rtt_ms[(source.region, t.region)], t.region) for t in regions
            if t.region != source.region and (source.region, t.region) in rtt_ms
            and rtt_ms[(source.region, t.region)] + queue_p99_ms(t.service_ms, t.slots, headroom) + t.service_ms
            <= budget_ms)
        if targets:
            out[source.region] = tuple(region for _, region in targets)
    return out


def batch_weights(regions: Sequence[RegionLoad]) -> dict[str, float]:
    """Region -> share of batch work, in proportion to idle capacity (all zero: empty, keep it local)."""
    idle = {r.region: max(0.0, r.capacity - r.offered) for r in regions}
    total = sum(idle.values())
    if total <= 0:
        return {}
    return {region: value / total for region, value in sorted(idle.items()) if value > 0}
