"""``Admin`` handlers for nodes, cordons, models, table diffs and allocations: translation only.

:class:`FleetRpcs` holds the services it calls (fleet, tables, allocations);
each handler calls one of their methods and wraps its answer; a
:class:`ferry.errors.FerryError` becomes the status
:func:`ferry.grpcutil.status_for` chooses, its message naming the field.
:class:`controlplane.api.servicers.AdminServicer` routes the RPCs here. The admin
token is checked before any of them (:mod:`controlplane.api.auth`).
"""

from __future__ import annotations

from typing import Any

from controlplane.services.allocation import AllocationService
from controlplane.services.fleet import FleetService
from controlplane.services.tables import TableService
from ferry.grpcutil import answer
from ferry.v1 import admin_pb2


class FleetRpcs:
    """The operator RPCs for nodes, models, table diffs and allocations (usage: :mod:`controlplane.api.usage`)."""

    def __init__(self, fleet: FleetService, tables: TableService, allocations: AllocationService) -> None:
        self._fleet = fleet
        self._tables = tables
        self._allocations = allocations

    async def ListNodes(self, request: admin_pb2.ListNodesRequest, context: Any) -> admin_pb2.ListNodesResponse:
        async def call() -> admin_pb2.ListNodesResponse:
            return admin_pb2.ListNodesResponse(nodes=self._fleet.list_nodes(request.region))
        return await answer(context, call)

    async def Cordon(self, request: admin_pb2.CordonRequest, context: Any) -> admin_pb2.CordonResponse:
        async def call() -> admin_pb2.CordonResponse:
            return admin_pb2.CordonResponse(node=await self._fleet.set_cordon(request.node, True))
        return await answer(context, call)

    async def Uncordon(self, request: admin_pb2.CordonRequest, context: Any) -> admin_pb2.CordonResponse:
        async def call() -> admin_pb2.CordonResponse:
            return admin_pb2.CordonResponse(node=await self._fleet.set_cordon(request.node, False))
        return await answer(context, call)

    async def ListModels(self, request: admin_pb2.ListModelsRequest, context: Any) -> admin_pb2.ListModelsResponse:
        async def call() -> admin_pb2.ListModelsResponse:
            return admin_pb2.ListModelsResponse(models=self._fleet.list_models())
        return await answer(context, call)

    async def DiffTable(self, request: admin_pb2.DiffTableRequest, context: Any) -> admin_pb2.DiffTableResponse:
        async def call() -> admin_pb2.DiffTableResponse:
            return self._tables.diff_table(request.region, request.from_version, request.to_version)
        return await answer(context, call)

    async def Allocate(self, request: admin_pb2.AllocateRequest, context: Any) -> admin_pb2.AllocateResponse:
        async def call() -> admin_pb2.AllocateResponse:
            return await self._allocations.allocate(request)
        return await answer(context, call)

    async def ListAllocations(
        self, request: admin_pb2.ListAllocationsRequest, context: Any,
    ) -> admin_pb2.ListAllocationsResponse:
        async def call() -> admin_pb2.ListAllocationsResponse:
            return self._allocations.list_allocations(request.model)
        return await answer(context, call)

    async def Release(self, request: admin_pb2.ReleaseRequest, context: Any) -> admin_pb2.ReleaseResponse:
        async def call() -> admin_pb2.ReleaseResponse:
            return await self._allocations.release(request.replica_id)
        return await answer(context, call)
