"""The global layer in the tables: each region's spill weights and the replicas it may spill to.

:class:`SpillPlanner` runs after the per-region tables are computed
(:func:`controlplane.table.compute_tables`). Per region it measures, from
the routable replicas of the table, the interactive capacity (the sum of
their ``max_concurrency`` slots) and the demand (their queued + running
requests), then asks :func:`controlplane.spill.spill_weights` for the
weights and writes into each table that spills a :class:`SpillRoute` per
target: weight, configured round trip, and the target's routable replicas.

Demand, not load: a region that already spills a share ``w`` keeps only
``1 - w`` of its demand at home, so its demand is estimated as its load /
(1 - w), and the load a target carries for others (the source's demand x w)
is taken off the target's own. While a region stays saturated (its proxies
queue what its replicas cannot take, out of the control plane's sight) this
estimate grows its weight at every computation, like an integral
controller, until the region drops below its headroom; a region whose
replicas are all busy (load >= slots) is assumed to hide at least
``hidden`` (default 25 %) more demand in its proxies' queues, so that the
weight grows fast enough to matter within seconds; an optional
smoothing of the estimates (weight ``alpha`` of the new one, default 1: none)
trades that speed for calm. Parameters: ``rtt_ms`` (the
``region_rtt_ms`` setting, ``"a:b" = ms``), ``budget_ms`` (500),
``headroom`` (0.9), ``service_ms`` (200, an interactive request's service
time for the budget test).

Pure apart from the state it keeps between computations (previous weights
and smoothed demand); no I/O, no clock. Cost: O(replicas) per computation
plus O(R^2 log R) for R regions, and one copy of each target's model routes
per spilling source.
"""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.spill import RegionLoad, parse_rtt, spill_weights
from ferry.v1 import tables_pb2


class SpillPlanner:
    """Keeps the previous weights and smoothed demand; :meth:`attach` fills the tables' ``spill`` fields."""

    def __init__(self, rtt_ms: Mapping[str, float], *, budget_ms: float = 500.0, headroom: float = 0.9,
                 service_ms: float = 200.0, alpha: float = 1.0, hidden: float = 0.25) -> None:
        self.rtt = parse_rtt(rtt_ms)
        self.budget_ms = budget_ms
        self.headroom = headroom
        self.service_ms = service_ms
        self.alpha = alpha
        self.hidden = hidden
        self.weights: dict[tuple[str, str], float] = {}
        self._demand: dict[str, float] = {}

    def _loads(self, tables: Mapping[str, tables_pb2.TableSnapshot]) -> list[RegionLoad]:
        slots: dict[str, int] = {}
        load: dict[str, float] = {}
        for region, table in tables.items():
            replicas = [r for m in table.models for r in m.replicas]
            slots[region] = sum(max(1, r.max_concurrency) for r in replicas)
            load[region] = float(sum(r.load.queued + r.load.running for r in replicas))
        demand = {}
        for region in tables:
            kept = 1.0 - sum(w for (s, _), w in self.weights.items() if s == region)
            own = load[region] / max(kept, 0.05) * (1 + self.hidden if load[region] >= slots[region] > 0 else 1.0)
            carried = sum(self._demand.get(s, 0.0) * w for (s, t), w in self.weights.items() if t == region)
            estimate = max(0.0, own - carried if kept >= 1.0 else own)
            before = self._demand.get(region)
            demand[region] = estimate if before is None else self.alpha * estimate + (1 - self.alpha) * before
        self._demand = demand
        return [RegionLoad(region, capacity=float(slots[region]), offered=demand[region], slots=slots[region],
                           service_ms=self.service_ms) for region in sorted(tables)]

    def attach(self, tables: Mapping[str, tables_pb2.TableSnapshot]) -> dict[tuple[str, str], float]:
        """Compute the weights for this computation and add the SpillRoutes to ``tables``; returns the weights."""
        if not self.rtt:
            return {}
        loads = [r for r in self._loads(tables) if r.capacity > 0]
        self.weights = spill_weights(loads, self.rtt, budget_ms=self.budget_ms, headroom=self.headroom)
        for (source, target), weight in sorted(self.weights.items()):
            routes = [tables_pb2.ModelRoute(model=m.model, default_version=m.default_version, replicas=m.replicas)
                      for m in tables[target].models if m.replicas]
            tables[source].spill.append(tables_pb2.SpillRoute(
                region=target, weight=round(weight, 4), rtt_ms=self.rtt[(source, target)], models=routes))
        return self.weights
