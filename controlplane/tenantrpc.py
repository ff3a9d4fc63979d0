"""Tenants kept in the store: the controller's operations and the ``Admin`` handlers (translation only).

:class:`TenantOps` is a mixin of :class:`controlplane.controller.Controller`:

- :meth:`TenantOps.seed_tenants`: on start, when the config file names
  tenants and the store holds no tenant set (no tenant, no marker), write them
  (each with ``put_if(revision=0)``, so control planes starting together
  agree) and then the marker, once: later starts leave the store's set alone.
  A failed seed is logged; the proxies keep their config files' tenants;
- :meth:`TenantOps.list_tenants`, :meth:`TenantOps.put_tenant`,
  :meth:`TenantOps.delete_tenant`: ``Admin.ListTenants``, ``PutTenant``,
  ``DeleteTenant``. Writes are refused with ``Unavailable`` while the store is
  unreachable, as a drain is. A put reads the record and writes it back with
  ``put_if`` on the revision it read (three tries, then ``Unavailable``), so
  two operators never lose one another's change. An API key given in clear
  is hashed here and never stored. A write returns once the store echoed it
  to this control plane's cache and, leading, the tables were recomputed and
  offered to the proxies (a follower's leader does so within a tick).

:class:`TenantRpcs` is a mixin of :class:`controlplane.servicers.AdminServicer`:
each handler calls one of those and maps a :class:`ferry.errors.FerryError`
to its status (:func:`ferry.grpcutil.status_for`): INVALID_ARGUMENT naming
the field, NOT_FOUND, ALREADY_EXISTS (the name with ``create_only``, or a key
another tenant has), RESOURCE_EXHAUSTED (``max_tenants``), UNAVAILABLE.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from controlplane import tenants
from controlplane.config import ControlPlaneSettings
from controlplane.intent import IntentCache
from controlplane.store import Store
from controlplane.table import Published
from ferry.config import TenantConfig
from ferry.errors import AlreadyExists, NotFound, Unavailable
from ferry.grpcutil import answer
from ferry.tenantcheck import check_name
from ferry.v1 import admin_pb2

if TYPE_CHECKING:
    from controlplane.controller import Controller

log = logging.getLogger(__name__)

TRIES = 3


class TenantOps:
    """Seed, list, put and delete the tenants of the store."""

    settings: ControlPlaneSettings
    store: Store
    intent: IntentCache
    leading: bool
    _wall: Callable[[], float]
    _configured_tenants: tuple[TenantConfig, ...]

    # Provided by Controller and Operator (annotations only, so that they do not shadow them).
    recompute: Callable[[], list[Published]]
    _check_store: Callable[[str], None]
    _refusal: Callable[[str, str], str]

    async def seed_tenants(self) -> int:
        """Write the config file's tenants when the store holds no tenant set; returns how many were written."""
        chosen, skipped = tenants.seed_plan(self._configured_tenants, self.intent.tenants)
        for reason in skipped:
            log.warning("tenant of the config file not seeded: %s", reason)
        if not chosen:
            return 0
        written, revision = 0, 0
        try:
            for tenant in chosen:
                done = await self.store.put_if(tenants.tenant_key(tenant.name),
                                               tenants.encode(tenant, self._wall()), revision=0)
                written += bool(done)
                revision = max(revision, done)
            revision = max(revision, await self.store.put_if(
                tenants.MANAGED_KEY, tenants.managed_value(self._wall(), "config"), revision=0))
            if revision:
                await self.intent.wait(revision, self.settings.store_timeout_seconds)
        except Unavailable as exc:
            log.warning("could not seed the store with the config file's tenants (%s); the proxies keep their "
                        "own until a tenant is written", exc)
            return written
        log.info("seeded the store with %d tenants of the config file", written)
        return written

    def list_tenants(self) -> admin_pb2.ListTenantsResponse:
        book = self.intent.tenants
        return admin_pb2.ListTenantsResponse(
            tenants=[tenants.to_view(book.tenants[n]) for n in sorted(book.tenants)],
            managed=book.managed, max_tenants=self.settings.max_tenants,
        )

    async def put_tenant(self, request: admin_pb2.PutTenantRequest) -> admin_pb2.PutTenantResponse:
        name = request.tenant.name
        check_name(name)
        tenants.check_fields(request.fields)
        what = f"tenant {name}"
        self._check_store(what)
        key = tenants.tenant_key(name)
        try:
            for _ in range(TRIES):
                kv = await self.store.get(key)
                old: TenantConfig | None = None
                if kv is not None:
                    try:
                        old = tenants.decode(name, kv.value).config
                    except ValueError as exc:
                        log.warning("%s; replaced by the put", exc)
                if kv is not None and request.create_only:
                    raise AlreadyExists("tenant.name", f"tenant {name!r} exists (ferryctl tenants set changes it)")
                if request.fields and old is None:
                    raise NotFound("tenant", name)
                tenant = tenants.from_request(request, old)
                other = tenants.key_conflict(tenant, self.intent.tenants.configs())
                if other is not None:
                    raise AlreadyExists("tenant.api_key_sha256", f"tenant {other!r} has the same API key")
                if kv is None:
                    tenants.check_capacity(len(self.intent.tenants.tenants), self.settings.max_tenants)
                wall = self._wall()
                revision = await self.store.put_if(key, tenants.encode(tenant, wall),
                                                   revision=kv.revision if kv is not None else 0)
                if revision:
                    break
            else:
                raise Unavailable(f"{what}: the record changed under {TRIES} tries; try again")
            await self._settle(revision)
        except Unavailable as exc:
            raise Unavailable(self._refusal(what, str(exc))) from exc
        if self.leading:
            self.recompute()
        return admin_pb2.PutTenantResponse(tenant=tenants.to_view(tenants.StoredTenant(tenant, wall)),
                                           created=kv is None)

    async def delete_tenant(self, request: admin_pb2.DeleteTenantRequest) -> admin_pb2.DeleteTenantResponse:
        check_name(request.name, "name")
        what = f"removal of tenant {request.name}"
        self._check_store(what)
        try:
            revision = await self.store.delete(tenants.tenant_key(request.name))
            if not revision:
                raise NotFound("tenant", request.name)
            await self._settle(revision)
        except Unavailable as exc:
            raise Unavailable(self._refusal(what, str(exc))) from exc
        if self.leading:
            self.recompute()
        return admin_pb2.DeleteTenantResponse(deleted=True)

    async def _settle(self, revision: int) -> None:
        """After a tenant write at ``revision``: mark the set managed, then wait until the mirror shows both."""
        revision = max(revision, await self._mark_managed())
        await self.intent.wait(revision, self.settings.store_timeout_seconds)

    async def _mark_managed(self) -> int:
        """Write the marker that the store holds the tenant set, unless it is there; its revision (0: was)."""
        if self.intent.tenants.marked:
            return 0
        return await self.store.put_if(tenants.MANAGED_KEY, tenants.managed_value(self._wall(), "admin"),
                                       revision=0)



class TenantRpcs:
    """``Admin.ListTenants``, ``PutTenant`` and ``DeleteTenant``."""

    _c: Controller

    async def ListTenants(
        self, request: admin_pb2.ListTenantsRequest, context: Any,
    ) -> admin_pb2.ListTenantsResponse:
        async def call() -> admin_pb2.ListTenantsResponse:
            return self._c.list_tenants()
        return await answer(context, call)

    async def PutTenant(self, request: admin_pb2.PutTenantRequest, context: Any) -> admin_pb2.PutTenantResponse:
        async def call() -> admin_pb2.PutTenantResponse:
            return await self._c.put_tenant(request)
        return await answer(context, call)

    async def DeleteTenant(
        self, request: admin_pb2.DeleteTenantRequest, context: Any,
    ) -> admin_pb2.DeleteTenantResponse:
        async def call() -> admin_pb2.DeleteTenantResponse:
            return await self._c.delete_tenant(request)
        return await answer(context, call)
