"""``Admin`` handlers for replicas, drains, nodes, cordons, models and allocations: translation only.

:class:`FleetRpcs` holds the services it calls (fleet, allocations); each
handler calls one of their methods and wraps its answer; a
:class:`ferry.errors.FerryError` becomes its status in
:mod:`controlplane.api.status`, its message naming the field.
:class:`controlplane.api.servicers.AdminServicer` is composed from this and the
other concerns' handlers. The admin token is checked before any of them
(:mod:`controlplane.api.auth`).
"""

from __future__ import annotations

from typing import Any

from controlplane.api.status import answer
from controlplane.services.allocation import AllocationService
from controlplane.services.fleet import FleetService
from ferry.v1 import admin_pb2


class FleetRpcs:
    """The operator RPCs for replicas, drains, nodes, models and allocations (usage: :mod:`controlplane.api.usage`)."""

    def __init__(self, fleet: FleetService, allocations: AllocationService) -> None:
        self._fleet = fleet
        self._allocations = allocations

    async def ListReplicas(
        self, request: admin_pb2.ListReplicasRequest, context: Any,
    ) -> admin_pb2.ListReplicasResponse:
        def call() -> admin_pb2.ListReplicasResponse:
            return admin_pb2.ListReplicasResponse(replicas=self._fleet.list_replicas(request.model, request.region))
        return await answer(context, call)

    async def Drain(self, request: admin_pb2.DrainRequest, context: Any) -> admin_pb2.DrainResponse:
        async def call() -> admin_pb2.DrainResponse:
            return admin_pb2.DrainResponse(replica=await self._fleet.set_drain(request.replica_id, True))
        return await answer(context, call)

    async def Undrain(self, request: admin_pb2.DrainRequest, context: Any) -> admin_pb2.DrainResponse:
        async def call() -> admin_pb2.DrainResponse:
            return admin_pb2.DrainResponse(replica=await self._fleet.set_drain(request.replica_id, False))
        return await answer(context, call)

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
