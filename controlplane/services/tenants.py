"""Tenants kept in the store: seed them from the config file once, list, put and remove them.

:class:`TenantService`:

- :meth:`TenantService.seed`: on start, when the config file names tenants
  and the store holds no tenant set (no tenant, no marker), write them (each
  with ``put_if(revision=0)``, so control planes starting together agree) and
  then the marker, once: later starts leave the store's set alone. A failed
  seed is logged; the proxies keep their config files' tenants;
- :meth:`TenantService.list_tenants`, :meth:`TenantService.put_tenant`,
  :meth:`TenantService.delete_tenant`: ``Admin.ListTenants``, ``PutTenant``,
  ``DeleteTenant``. Writes go through the
  :class:`controlplane.intent.writer.IntentWriter`: refused with
  ``Unavailable`` while the store is unreachable, ``put_if`` on the revision
  read (bounded retries), so two operators never lose one another's change,
  then the marker of the managed set when it is not there yet; each returns
  once the leader's tables carry the store's tenant set. An API key given in
  clear is hashed here and never stored.

Records, validation and the set the tables carry: :mod:`controlplane.tenants.records`.
State: the config file's tenants (to seed). Dependencies: the settings, the
store (the seed alone; operator writes go through the writer), the wall
clock, the intent cache, the intent writer and the table versions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from controlplane.config import ControlPlaneSettings
from controlplane.intent.cache import IntentCache
from controlplane.intent.writer import KEEP, Edit, IntentWriter
from controlplane.store.base import KeyValue, Store
from controlplane.tables.compute import TableVersions
from controlplane.tenants import records as tenants
from ferry.config import TenantConfig
from ferry.errors import AlreadyExists, NotFound, Unavailable
from ferry.tenantcheck import check_name
from ferry.v1 import admin_pb2

log = logging.getLogger(__name__)


class TenantService:
    """Seeds, lists, puts and removes the tenants of the store.

    State: the config file's tenants. Dependencies: settings, the store (the seed), the wall clock,
    the intent cache, the intent writer, the table versions.
    """

    def __init__(
        self,
        settings: ControlPlaneSettings,
        *,
        store: Store,
        configured: Sequence[TenantConfig],
        intent: IntentCache,
        writer: IntentWriter,
        tables: TableVersions,
        wall: Callable[[], float],
    ) -> None:
        self.settings = settings
        self._store = store
        self._configured = tuple(configured)  # the config file's, seeded once
        self._intent = intent
        self._writer = writer
        self._tables = tables
        self._wall = wall

    async def seed(self) -> int:
        """Write the config file's tenants when the store holds no tenant set; returns how many were written."""
        chosen, skipped = tenants.seed_plan(self._configured, self._intent.tenants)
        for reason in skipped:
            log.warning("tenant of the config file not seeded: %s", reason)
        if not chosen:
            return 0
        written, revision = 0, 0
        try:
            for tenant in chosen:
                done = await self._store.put_if(tenants.tenant_key(tenant.name),
                                                tenants.encode(tenant, self._wall()), revision=0)
                written += bool(done)
                revision = max(revision, done)
            revision = max(revision, await self._store.put_if(
                tenants.MANAGED_KEY, tenants.managed_value(self._wall(), "config"), revision=0))
            if revision:
                await self._intent.wait(revision, self.settings.store_timeout_seconds)
        except Unavailable as exc:
            log.warning("could not seed the store with the config file's tenants (%s); the proxies keep their "
                        "own until a tenant is written", exc)
            return written
        log.info("seeded the store with %d tenants of the config file", written)
        return written

    def list_tenants(self) -> admin_pb2.ListTenantsResponse:
        book = self._intent.tenants
        return admin_pb2.ListTenantsResponse(
            tenants=[tenants.to_view(book.tenants[n]) for n in sorted(book.tenants)],
            managed=book.managed, max_tenants=self.settings.max_tenants,
        )

    async def put_tenant(self, request: admin_pb2.PutTenantRequest) -> admin_pb2.PutTenantResponse:
        name = request.tenant.name
        check_name(name)
        tenants.check_fields(request.fields)
        put: list[tuple[TenantConfig, float]] = []

        def edit(kv: KeyValue | None) -> Edit:
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
            other = tenants.key_conflict(tenant, self._intent.tenants.configs())
            if other is not None:
                raise AlreadyExists("tenant.api_key_sha256", f"tenant {other!r} has the same API key")
            if kv is None:
                tenants.check_capacity(len(self._intent.tenants.tenants), self.settings.max_tenants)
            wall = self._wall()
            put.append((tenant, wall))
            return tenants.encode(tenant, wall)

        what = f"tenant {name}"
        written = await self._writer.change(what, tenants.tenant_key(name), edit)
        await self._settle(what)
        tenant, wall = put[-1]
        return admin_pb2.PutTenantResponse(tenant=tenants.to_view(tenants.StoredTenant(tenant, wall)),
                                           created=written.before is None)

    async def delete_tenant(self, request: admin_pb2.DeleteTenantRequest) -> admin_pb2.DeleteTenantResponse:
        check_name(request.name, "name")

        def edit(kv: KeyValue | None) -> Edit:
            if kv is None:
                raise NotFound("tenant", request.name)
            return None

        what = f"removal of tenant {request.name}"
        await self._writer.change(what, tenants.tenant_key(request.name), edit)
        await self._settle(what)
        return admin_pb2.DeleteTenantResponse(deleted=True)

    async def _settle(self, what: str) -> None:
        """After a tenant write: mark the set managed (unless it is), then wait for the leader's tables."""
        if not self._intent.tenants.marked:
            def mark(kv: KeyValue | None) -> Edit:
                return KEEP if kv is not None else tenants.managed_value(self._wall(), "admin")
            await self._writer.change(what, tenants.MANAGED_KEY, mark)
        await self._writer.settle(self._reflects)

    def _reflects(self) -> bool:
        """Every region's table carries the store's tenant set."""
        book = self._intent.tenants
        routes = list(book.routes())
        for region in self._tables.regions():
            published = self._tables.get(region)
            if published is None:
                continue
            snapshot = published.snapshot
            if snapshot.tenants_managed != book.managed or list(snapshot.tenants) != routes:
                return False
        return True
