"""``Admin.RouterRollout``, ``Admin.GetRouter`` and ``Admin.RouterDecide``: translation only.

:class:`RouterRpcs` holds the :class:`controlplane.services.routerconfig.RouterService`
(validation, the store writes through the intent writer, the views) and maps
a :class:`ferry.errors.FerryError` to its status
(:mod:`controlplane.api.status`): INVALID_ARGUMENT naming the field
(``proxy.<key>`` of the candidate, ``canary_percent``, ``guard.<field>``),
NOT_FOUND, UNAVAILABLE while the store is unreachable.
"""

from __future__ import annotations

from typing import Any

from controlplane.api.status import answer
from controlplane.services.routerconfig import RouterService
from ferry.v1 import admin_pb2


class RouterRpcs:
    """The router config rpcs of ``Admin``."""

    def __init__(self, router: RouterService) -> None:
        self._router = router

    async def RouterRollout(self, request: admin_pb2.RouterRolloutRequest,
                            context: Any) -> admin_pb2.RouterRolloutResponse:
        async def call() -> admin_pb2.RouterRolloutResponse:
            return admin_pb2.RouterRolloutResponse(rollout=await self._router.rollout(request))
        return await answer(context, call)

    async def GetRouter(self, request: admin_pb2.GetRouterRequest, context: Any) -> admin_pb2.GetRouterResponse:
        return await answer(context, lambda: self._router.get(request))

    async def RouterDecide(self, request: admin_pb2.RouterDecideRequest,
                           context: Any) -> admin_pb2.RouterDecideResponse:
        async def call() -> admin_pb2.RouterDecideResponse:
            return admin_pb2.RouterDecideResponse(rollout=await self._router.decide(request))
        return await answer(context, call)
