"""The tenants a proxy serves: its config file's, or the set the control plane pushes in the table.

:func:`parse_tenants` checks a table's ``TenantRoute`` list before anything
uses it and raises :class:`TenantsRejected` with the first reason found,
naming the entry (``tenants[3].plan``): more than ``max_tenants`` entries, a
name or a key hash seen twice, or a tenant that fails the control plane's
own rules (:mod:`ferry.tenantcheck`: name, key hash, plan, tiers, limits).
:func:`dataplane.table.local.build_table` turns that into a rejected table: the
proxy NACKs it with the reason and keeps its last good table, tenants
included. A table whose tenant list equals the previous
table's reuses the parsed tuple (no work per table when tenants did not change).

:class:`TenantSet` applies the tenants of each accepted table (an
``on_applied`` listener of :class:`dataplane.table.local.TableHolder`): with
``tenants_managed`` the table's set replaces the one the authenticator
(:class:`dataplane.intake.auth.Authenticator`) finds tenants in, in one assignment,
so a request sees the old set or the new one, never a mix; without it the
proxy serves its config file's tenants. A proxy that never heard from a
control plane, or whose control plane does not manage tenants, therefore
still authenticates from its config file (static stability), and one that
lost its control plane keeps the last set it applied. Rate buckets of
tenants that left the set are dropped (:meth:`dataplane.admission.tenantlimits.TenantLimits.retain`);
requests in flight finish under the tenant they started with.

Cost: O(tenants) for a table whose tenant list changed, O(tenants) compares
otherwise; nothing per request.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

from ferry.config import TenantConfig
from ferry.errors import FerryError, InvalidArgument
from ferry.tenantcheck import check_concurrency, check_key_hash, check_name, check_plan, check_rate, check_tiers
from ferry.v1 import tables_pb2

MAX_TENANTS = 100_000

Parsed = tuple[tuple[tables_pb2.TenantRoute, ...], tuple[TenantConfig, ...]]


class TenantsRejected(FerryError):
    """A table's tenant list failed validation; ``reason`` names the entry and field."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _tenant(i: int, route: tables_pb2.TenantRoute) -> TenantConfig:
    where = f"tenants[{i}]"
    try:
        check_name(route.name, f"{where}.name")
        return TenantConfig(
            name=route.name, api_key_sha256=check_key_hash(route.api_key_sha256, f"{where}.api_key_sha256"),
            plan=check_plan(route.plan, f"{where}.plan"), tiers=check_tiers(route.tiers, f"{where}.tiers"),
            requests_per_second=check_rate(route.requests_per_second, f"{where}.requests_per_second"),
            tokens_per_second=check_rate(route.tokens_per_second, f"{where}.tokens_per_second"),
            max_concurrency=check_concurrency(route.max_concurrency, f"{where}.max_concurrency"),
        )
    except InvalidArgument as exc:
        raise TenantsRejected(str(exc)) from None


def parse_tenants(
    routes: Sequence[tables_pb2.TenantRoute], *, max_tenants: int = MAX_TENANTS, previous: Parsed | None = None,
) -> Parsed:
    """(the routes, their tenants) of a table; raises TenantsRejected. ``previous`` is reused when equal."""
    kept = tuple(routes)
    if previous is not None and previous[0] == kept:
        return previous
    if len(kept) > max_tenants:
        raise TenantsRejected(f"tenants: {len(kept)} tenants, over the limit of {max_tenants}")
    names: set[str] = set()
    hashes: set[str] = set()
    tenants = []
    for i, route in enumerate(kept):
        tenant = _tenant(i, route)
        if tenant.name in names:
            raise TenantsRejected(f"tenants[{i}].name: {tenant.name!r} appears twice")
        if tenant.api_key_sha256 in hashes:
            raise TenantsRejected(f"tenants[{i}].api_key_sha256: same key as another tenant")
        names.add(tenant.name)
        hashes.add(tenant.api_key_sha256)
        tenants.append(tenant)
    return kept, tuple(tenants)


class Authenticates(Protocol):
    """Where requests find their tenant (:class:`dataplane.intake.auth.Authenticator`)."""

    def replace(self, tenants: Sequence[TenantConfig]) -> None:
        """Find tenants in ``tenants`` from now on."""


class Limits(Protocol):
    """The tenants' rate buckets (:class:`dataplane.admission.tenantlimits.TenantLimits`)."""

    def retain(self, names: Collection[str]) -> None:
        """Forget the buckets of tenants not in ``names``."""


class TenantSet:
    """Which tenants the proxy authenticates: the configured ones, or the managed set of the last table."""

    def __init__(self, configured: Sequence[TenantConfig], authenticator: Authenticates,
                 limits: Limits | None = None) -> None:
        self.configured = tuple(configured)
        self._auth = authenticator
        self._limits = limits
        self.current: tuple[TenantConfig, ...] = self.configured
        self.managed = False

    def apply(self, tenants: tuple[TenantConfig, ...] | None) -> bool:
        """Serve ``tenants`` (None: the configured ones); True when the set changed."""
        chosen = self.configured if tenants is None else tenants
        if chosen is self.current:
            return False
        self._auth.replace(chosen)
        self.current = chosen
        self.managed = tenants is not None
        if self._limits is not None:
            self._limits.retain({t.name for t in chosen})
        return True
