"""``Admin.GetEngines``: translation only (``ferryctl engines``).

:class:`EngineRpcs` holds the :class:`controlplane.services.engines.EngineService`
and whether this control plane leads (the leader fits every node's samples;
a follower only its own nodes'). The model filter is checked like every
name (INVALID_ARGUMENT naming ``model``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controlplane import validate
from controlplane.api.status import answer
from controlplane.services.engines import EngineService
from ferry.v1 import admin_pb2


class EngineRpcs:
    """``Admin.GetEngines``."""

    def __init__(self, engines: EngineService, *, leading: Callable[[], bool], max_name_bytes: int) -> None:
        self._engines = engines
        self._leading = leading
        self._max_name_bytes = max_name_bytes

    async def GetEngines(self, request: admin_pb2.GetEnginesRequest, context: Any) -> admin_pb2.GetEnginesResponse:
        def call() -> admin_pb2.GetEnginesResponse:
            validate.check_filter(request.model, "model", self._max_name_bytes)
            return self._engines.engines(request.model, leading=self._leading())
        return await answer(context, call)
