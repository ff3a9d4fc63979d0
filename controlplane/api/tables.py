"""``Admin.GetTable`` and ``Admin.DiffTable``: translation only.

:class:`TableRpcs` holds the :class:`controlplane.services.tables.TableService`
(the current tables and the versions kept for a diff; the region filter
checked there); a :class:`ferry.errors.FerryError` becomes its status in
:mod:`controlplane.api.status`: INVALID_ARGUMENT naming the field, NOT_FOUND
for a version no longer kept.
"""

from __future__ import annotations

from typing import Any

from controlplane.api.status import answer
from controlplane.services.tables import TableService
from ferry.v1 import admin_pb2


class TableRpcs:
    """``Admin.GetTable`` and ``Admin.DiffTable``."""

    def __init__(self, tables: TableService) -> None:
        self._tables = tables

    async def GetTable(self, request: admin_pb2.GetTableRequest, context: Any) -> admin_pb2.GetTableResponse:
        return await answer(context, lambda: self._tables.get_table(request.region))

    async def DiffTable(self, request: admin_pb2.DiffTableRequest, context: Any) -> admin_pb2.DiffTableResponse:
        def call() -> admin_pb2.DiffTableResponse:
            return self._tables.diff_table(request.region, request.from_version, request.to_version)
        return await answer(context, call)
