"""``Admin`` handlers for usage, tiers and spill: translation only (ferryctl ``top``, ``tiers``, ``spill``).

A mixin of :class:`controlplane.servicers.AdminServicer` (which sets ``_c``,
the controller). Each handler joins what the control plane holds (agent
telemetry rows, the tables' tier quotas and spill routes, the configured
round trips) with the proxies' merged usage reports
(:meth:`controlplane.usage.ProxyUsage.figures`), through the pure functions
of :mod:`controlplane.usage`. The leader holds every proxy's report
(followers relay theirs), so ferryctl asks the leader; a follower answers
with the proxies that watch from it. A :class:`ferry.errors.FerryError`
becomes the status :func:`ferry.grpcutil.status_for` chooses.
"""

from __future__ import annotations

from typing import Any

from controlplane import validate
from controlplane.controller import Controller
from controlplane.usage import spill_views, tier_views, usage_rows
from ferry.grpcutil import answer
from ferry.v1 import admin_pb2, tables_pb2


class UsageRpcs:
    """``GetUsage`` (telemetry and the proxies' figures), ``GetTiers`` and ``GetSpill``."""

    _c: Controller

    def _snapshots(self, region: str) -> dict[str, tables_pb2.TableSnapshot]:
        validate.check_filter(region, "region", self._c.settings.max_region_bytes)
        out = {}
        for name in self._c.tables.regions():
            published = self._c.tables.get(name)
            if published is not None and (not region or name == region):
                out[name] = published.snapshot
        return out

    async def GetUsage(self, request: admin_pb2.GetUsageRequest, context: Any) -> admin_pb2.GetUsageResponse:
        def call() -> admin_pb2.GetUsageResponse:
            base = self._c.usage()
            rows = usage_rows(base.rows, self._c.proxy_usage.figures(), by_tier=request.by_tier)
            return admin_pb2.GetUsageResponse(rows=rows, sampled_at=base.sampled_at)
        return await answer(context, call)

    async def GetTiers(self, request: admin_pb2.GetTiersRequest, context: Any) -> admin_pb2.GetTiersResponse:
        def call() -> admin_pb2.GetTiersResponse:
            quotas = {name: list(s.tier_quotas) for name, s in self._snapshots(request.region).items()}
            views = tier_views(quotas, self._c.proxy_usage.figures(), region=request.region)
            return admin_pb2.GetTiersResponse(tiers=views, sampled_at=self._c._wall())
        return await answer(context, call)

    async def GetSpill(self, request: admin_pb2.GetSpillRequest, context: Any) -> admin_pb2.GetSpillResponse:
        def call() -> admin_pb2.GetSpillResponse:
            routes = {name: list(s.spill) for name, s in self._snapshots(request.region).items()}
            views = spill_views(routes, self._c.spill.rtt, self._c.proxy_usage.figures(), region=request.region)
            return admin_pb2.GetSpillResponse(pairs=views, sampled_at=self._c._wall())
        return await answer(context, call)
