"""``Admin.ListTenants``, ``PutTenant`` and ``DeleteTenant``: translation only.

:class:`TenantRpcs` holds the :class:`controlplane.services.tenants.TenantService`;
each handler calls one of its methods and maps a
:class:`ferry.errors.FerryError` to its status (:mod:`controlplane.api.status`):
INVALID_ARGUMENT naming the field, NOT_FOUND, ALREADY_EXISTS (the name with
``create_only``, or a key another tenant has), RESOURCE_EXHAUSTED
(``max_tenants``), UNAVAILABLE.
"""

from __future__ import annotations

from typing import Any

from controlplane.api.status import answer
from controlplane.services.tenants import TenantService
from ferry.v1 import admin_pb2


class TenantRpcs:
    """``Admin.ListTenants``, ``PutTenant`` and ``DeleteTenant``."""

    def __init__(self, tenants: TenantService) -> None:
        self._tenants = tenants

    async def ListTenants(
        self, request: admin_pb2.ListTenantsRequest, context: Any,
    ) -> admin_pb2.ListTenantsResponse:
        async def call() -> admin_pb2.ListTenantsResponse:
            return self._tenants.list_tenants()
        return await answer(context, call)

    async def PutTenant(self, request: admin_pb2.PutTenantRequest, context: Any) -> admin_pb2.PutTenantResponse:
        async def call() -> admin_pb2.PutTenantResponse:
            return await self._tenants.put_tenant(request)
        return await answer(context, call)

    async def DeleteTenant(
        self, request: admin_pb2.DeleteTenantRequest, context: Any,
    ) -> admin_pb2.DeleteTenantResponse:
        async def call() -> admin_pb2.DeleteTenantResponse:
            return await self._tenants.delete_tenant(request)
        return await answer(context, call)
