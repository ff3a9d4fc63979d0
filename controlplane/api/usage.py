"""``Admin`` handlers for usage, tiers, spill and the cache: translation only (ferryctl ``top``, ``tiers``,
``spill``, ``cache``; the cache's rows through :mod:`controlplane.tables.cachestats`).

:class:`UsageRpcs` holds the services it reads (fleet, tables). Each handler
joins what the control plane holds (agent telemetry rows, the tables' tier
quotas and spill routes, the configured round trips) with the proxies' merged
usage reports (:meth:`controlplane.tables.usage.ProxyUsage.figures`), through the
pure functions of :mod:`controlplane.tables.usage`. The leader holds every proxy's
report (followers relay theirs), so ferryctl asks the leader; a follower
answers with the proxies that watch from it. A
:class:`ferry.errors.FerryError` becomes the status
:mod:`controlplane.api.status` chooses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controlplane import validate
from controlplane.api.status import answer
from controlplane.services.fleet import FleetService
from controlplane.services.tables import TableService
from controlplane.tables.cachestats import cache_views, merge_cache
from controlplane.tables.usage import spill_views, tier_views, usage_rows
from ferry.v1 import admin_pb2


class UsageRpcs:
    """``GetUsage`` (telemetry and the proxies' figures), ``GetTiers`` and ``GetSpill``."""

    def __init__(self, fleet: FleetService, tables: TableService, *, wall: Callable[[], float]) -> None:
        self._fleet = fleet
        self._tables = tables
        self._wall = wall

    async def GetUsage(self, request: admin_pb2.GetUsageRequest, context: Any) -> admin_pb2.GetUsageResponse:
        def call() -> admin_pb2.GetUsageResponse:
            base = self._fleet.usage()
            rows = usage_rows(base.rows, self._tables.proxy_usage.figures(), by_tier=request.by_tier)
            return admin_pb2.GetUsageResponse(rows=rows, sampled_at=base.sampled_at)
        return await answer(context, call)

    async def GetTiers(self, request: admin_pb2.GetTiersRequest, context: Any) -> admin_pb2.GetTiersResponse:
        def call() -> admin_pb2.GetTiersResponse:
            quotas = {name: list(s.tier_quotas) for name, s in self._tables.snapshots(request.region).items()}
            views = tier_views(quotas, self._tables.proxy_usage.figures(), region=request.region)
            return admin_pb2.GetTiersResponse(tiers=views, sampled_at=self._wall())
        return await answer(context, call)

    async def GetCache(self, request: admin_pb2.GetCacheRequest, context: Any) -> admin_pb2.GetCacheResponse:
        def call() -> admin_pb2.GetCacheResponse:
            validate.check_filter(request.model, "model", self._tables.settings.max_name_bytes)
            merged = merge_cache(self._tables.proxy_usage.entries())
            return admin_pb2.GetCacheResponse(rows=cache_views(merged, model=request.model,
                                                               by_tenant=request.by_tenant),
                                              sampled_at=self._wall())
        return await answer(context, call)

    async def GetSpill(self, request: admin_pb2.GetSpillRequest, context: Any) -> admin_pb2.GetSpillResponse:
        def call() -> admin_pb2.GetSpillResponse:
            routes = {name: list(s.spill) for name, s in self._tables.snapshots(request.region).items()}
            views = spill_views(routes, self._tables.spill.rtt, self._tables.proxy_usage.figures(),
                                region=request.region)
            return admin_pb2.GetSpillResponse(pairs=views, sampled_at=self._wall())
        return await answer(context, call)
