"""``Admin.GetScale``: the scaling plan (:mod:`controlplane.services.scaling`), translation only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controlplane.api.status import answer
from ferry.v1 import admin_pb2


class ScaleRpcs:
    """``Admin.GetScale`` over the scaling service's ``scale`` (the leader's last plan)."""

    def __init__(self, scale: Callable[[admin_pb2.GetScaleRequest], admin_pb2.GetScaleResponse]) -> None:
        self._scale = scale

    async def GetScale(self, request: admin_pb2.GetScaleRequest, context: Any) -> admin_pb2.GetScaleResponse:
        return await answer(context, lambda: self._scale(request))
