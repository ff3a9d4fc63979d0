"""``Admin`` handlers for nodes, cordons, models, table diffs and allocations: translation only.

A mixin of :class:`controlplane.servicers.AdminServicer` (which sets ``_c``,
the controller). Each handler calls one :class:`controlplane.fleetops.FleetOps`
method and wraps its answer; a :class:`ferry.errors.FerryError` becomes the
status :func:`ferry.grpcutil.status_for` chooses, its message naming the
field. The admin token is checked before any of them
(:mod:`controlplane.adminauth`).
"""

from __future__ import annotations

from typing import Any

from controlplane.controller import Controller
from ferry.grpcutil import answer
from ferry.v1 import admin_pb2


class FleetRpcs:
    """The operator RPCs added for nodes, models and allocations (usage: :mod:`controlplane.usagerpc`)."""

    _c: Controller

    async def ListNodes(self, request: admin_pb2.ListNodesRequest, context: Any) -> admin_pb2.ListNodesResponse:
        async def call() -> admin_pb2.ListNodesResponse:
            return admin_pb2.ListNodesResponse(nodes=self._c.list_nodes(request.region))
        return await answer(context, call)

    async def Cordon(self, request: admin_pb2.CordonRequest, context: Any) -> admin_pb2.CordonResponse:
        async def call() -> admin_pb2.CordonResponse:
            return admin_pb2.CordonResponse(node=await self._c.set_cordon(request.node, True))
        return await answer(context, call)

    async def Uncordon(self, request: admin_pb2.CordonRequest, context: Any) -> admin_pb2.CordonResponse:
        async def call() -> admin_pb2.CordonResponse:
            return admin_pb2.CordonResponse(node=await self._c.set_cordon(request.node, False))
        return await answer(context, call)

    async def ListModels(self, request: admin_pb2.ListModelsRequest, context: Any) -> admin_pb2.ListModelsResponse:
        async def call() -> admin_pb2.ListModelsResponse:
            return admin_pb2.ListModelsResponse(models=self._c.list_models())
        return await answer(context, call)

    async def DiffTable(self, request: admin_pb2.DiffTableRequest, context: Any) -> admin_pb2.DiffTableResponse:
        async def call() -> admin_pb2.DiffTableResponse:
            return self._c.diff_table(request.region, request.from_version, request.to_version)
        return await answer(context, call)

    async def Allocate(self, request: admin_pb2.AllocateRequest, context: Any) -> admin_pb2.AllocateResponse:
        async def call() -> admin_pb2.AllocateResponse:
            return await self._c.allocate(request)
        return await answer(context, call)

    async def ListAllocations(
        self, request: admin_pb2.ListAllocationsRequest, context: Any,
    ) -> admin_pb2.ListAllocationsResponse:
        async def call() -> admin_pb2.ListAllocationsResponse:
            return self._c.list_allocations(request.model)
        return await answer(context, call)

    async def Release(self, request: admin_pb2.ReleaseRequest, context: Any) -> admin_pb2.ReleaseResponse:
        async def call() -> admin_pb2.ReleaseResponse:
            return await self._c.release(request.replica_id)
        return await answer(context, call)
