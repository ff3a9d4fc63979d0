"""The global layer in the tables: each region's spill weights and the replicas it may spill to.

:class:`SpillPlanner` runs after the per-region tables are computed
(:func:`controlplane.tables.compute.compute_tables`). Per region it measures, from
the routable replicas of the table, the interactive capacity (the sum of
their ``max_concurrency`` slots) and the load (their queued + running
requests), and, from the proxies' usage reports (:mod:`controlplane.tables.usage`,
the leader's merged figures), the interactive offered rate, the rate
answered at home (requests less spilled), the requests waiting in the
proxies' queues and the spilled rate, summed over models; hands them to
:class:`controlplane.regions.control.SpillController` (the weights sized from those
rates, corrected on saturation, and the routes; its module doc has the
algorithm) and writes into each table that spills a
:class:`SpillRoute` per route: weight (0 for a route the proxies use only
to spill on queue), batch weight, configured round trip, whether it is for
batch alone (a region beyond the interactive budget with idle capacity),
and the target's routable replicas with their loads. Without reports (a
follower, or before the first), the saturation steps alone steer. Parameters: ``rtt_ms`` (the ``region_rtt_ms``
setting, ``"a:b" = ms``), ``budget_ms`` (500), ``headroom`` (0.9),
``service_ms`` (200, an interactive request's service time for the budget
test), and the controller's ``alpha``, ``step``, ``low``, ``high``,
``fill``, ``max_share``, ``route_share`` and ``hold``.

Pure apart from the controller's state between computations; no I/O, no
clock. Cost: O(replicas) per computation plus O(R^2 log R) for R regions,
and one copy of each target's model routes per route.
"""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.config import parse_rtt
from controlplane.regions.control import RegionSample, SpillController
from controlplane.tables.usage import Figures, Key
from ferry.v1 import tables_pb2

INTERACTIVE = "interactive"


class SpillPlanner:
    """The controller's state and settings; :meth:`attach` fills the tables' ``spill`` fields."""

    def __init__(self, rtt_ms: Mapping[str, float], *, budget_ms: float = 500.0, headroom: float = 0.9,
                 service_ms: float = 200.0, alpha: float = 0.5, step: float = 0.05, low: float = 0.8,
                 high: float = 0.95, fill: float = 0.9, max_share: float = 0.9, route_share: float = 0.5,
                 hold: int = 20, keep: float = 0.85, max_correction: float = 0.15) -> None:
        self.rtt = parse_rtt(rtt_ms)
        self.controller = SpillController(self.rtt, budget_ms=budget_ms, headroom=headroom, service_ms=service_ms,
                                          alpha=alpha, step=step, low=low, high=high, fill=fill, max_share=max_share,
                                          route_share=route_share, hold=hold, keep=keep,
                                          max_correction=max_correction)
        self.weights: dict[tuple[str, str], float] = {}
        self.batch: dict[tuple[str, str], float] = {}

    def attach(self, tables: Mapping[str, tables_pb2.TableSnapshot],
               usage: Mapping[Key, Figures] | None = None) -> dict[tuple[str, str], float]:
        """Compute the weights for this computation and add the SpillRoutes to ``tables``; returns the weights.

        ``usage``: the proxies' reports merged per model, region, tier (:class:`~controlplane.tables.usage.ProxyUsage`):
        with them each region's interactive offered and served rates size the weights."""
        if not self.rtt:
            return {}
        offered: dict[str, float] = {}
        served: dict[str, float] = {}
        waiting: dict[str, float] = {}
        spilled: dict[str, float] = {}
        for (_, region, tier), f in (usage or {}).items():
            if tier == INTERACTIVE:
                waiting[region] = waiting.get(region, 0.0) + f.queued
                spilled[region] = spilled.get(region, 0.0) + f.spilled_per_s
                offered[region] = offered.get(region, 0.0) + f.offered_rate
                served[region] = served.get(region, 0.0) + max(0.0, f.request_rate - f.spilled_per_s)
        measured = bool(usage)
        samples = []
        for region, table in sorted(tables.items()):
            replicas = [r for m in table.models for r in m.replicas]
            samples.append(RegionSample(region, slots=sum(max(1, r.max_concurrency) for r in replicas),
                                        load=float(sum(r.load.queued + r.load.running for r in replicas)),
                                        queued=float(sum(r.load.queued for r in replicas)),
                                        offered=offered.get(region, 0.0) if measured else None,
                                        served=served.get(region, 0.0) if measured else None,
                                        waiting=waiting.get(region, 0.0), spilled=spilled.get(region, 0.0)))
        plan = self.controller.update(samples)
        self.weights = plan.weights
        self.batch = plan.batch
        for source, target in sorted(set(plan.routes) | set(plan.batch)):
            models = [tables_pb2.ModelRoute(model=m.model, default_version=m.default_version, replicas=m.replicas)
                      for m in tables[target].models if m.replicas]
            tables[source].spill.append(tables_pb2.SpillRoute(
                region=target, weight=round(self.weights.get((source, target), 0.0), 4),
                rtt_ms=self.rtt[(source, target)], models=models,
                batch_weight=round(plan.batch.get((source, target), 0.0), 4),
                batch_only=(source, target) not in plan.routes))
        return self.weights
