"""``Admin.Rollout`` and ``Admin.ListRollouts``: translation only.

:class:`RolloutRpcs` holds the :class:`controlplane.services.rollout.RolloutService`
(validation, the store write through the intent writer, the per-region view)
and maps a :class:`ferry.errors.FerryError` to its status
(:mod:`controlplane.api.status`): INVALID_ARGUMENT naming the field,
NOT_FOUND, UNAVAILABLE while the store is unreachable.
"""

from __future__ import annotations

from typing import Any

from controlplane.api.status import answer
from controlplane.services.rollout import RolloutService
from ferry.v1 import admin_pb2


class RolloutRpcs:
    """``Admin.Rollout`` and ``Admin.ListRollouts``."""

    def __init__(self, rollouts: RolloutService) -> None:
        self._rollouts = rollouts

    async def Rollout(self, request: admin_pb2.RolloutRequest, context: Any) -> admin_pb2.RolloutResponse:
        async def call() -> admin_pb2.RolloutResponse:
            return admin_pb2.RolloutResponse(rollout=await self._rollouts.rollout(request))
        return await answer(context, call)

    async def ListRollouts(
        self, request: admin_pb2.ListRolloutsRequest, context: Any,
    ) -> admin_pb2.ListRolloutsResponse:
        async def call() -> admin_pb2.ListRolloutsResponse:
            return admin_pb2.ListRolloutsResponse(rollouts=self._rollouts.list_rollouts(request.model))
        return await answer(context, call)
