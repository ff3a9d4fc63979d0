"""Tenants kept in the store: records, validation, the set the tables carry (pure, no I/O).

Keys (all under ``/ferry/intent/``, see :mod:`controlplane.store.base`):

- ``tenant/{name}``: JSON ``{"name", "api_key_sha256", "plan", "tiers",
  "requests_per_second", "tokens_per_second", "max_concurrency",
  "updated_at"}``, one per tenant. Only the sha256 of the API key is ever
  stored or shown; a key given to ``Admin.PutTenant`` is hashed on arrival.
  Unknown JSON keys are ignored (a newer writer may add some);
- ``tenants``: JSON ``{"since", "source"}``, the marker that the store holds
  the tenant set (written once by the seed from the config file, or by the
  first ``PutTenant`` / ``DeleteTenant``), so that removing every tenant
  leaves an empty managed set rather than bringing back the config file's.

Validation is :mod:`ferry.tenantcheck`'s (the proxy checks pushed tenants
with the same rules), each failure an :class:`ferry.errors.InvalidArgument`
naming the field (``tenant.tiers[1]``); an empty tier list on a put means
every tier, and a put names its changed ``fields`` (:func:`check_fields`).

:class:`TenantBook` is the set as the store shows it, fed key by key by
:class:`controlplane.intent.cache.IntentCache`; a record that does not decode, or
whose name differs from its key, is skipped and logged. The set is bounded
by ``controlplane.max_tenants`` at the writer (:func:`check_capacity`).
:meth:`TenantBook.routes` gives the table's ``TenantRoute`` list, sorted by
name; when two records carry the same key hash (two control planes raced)
only the first by name is pushed, so a proxy never sees a duplicate key.
:func:`attach_tenants` puts that list and ``tenants_managed`` on every
region's snapshot, so a tenant change is a content change and gets a new
table version.

Cost: O(tenants) to rebuild the routes after a change (cached per
generation), O(tenants x regions) to attach them to a computation.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from controlplane.store.base import INTENT_PREFIX
from ferry.config import TIERS, TenantConfig
from ferry.errors import InvalidArgument, Overloaded
from ferry.tenantcheck import (
    check_api_key,
    check_concurrency,
    check_key_hash,
    check_name,
    check_plan,
    check_rate,
    check_tenant,
    check_tiers,
)
from ferry.v1 import admin_pb2, tables_pb2

log = logging.getLogger(__name__)

TENANT_PREFIX = INTENT_PREFIX + "tenant/"
MANAGED_KEY = INTENT_PREFIX + "tenants"
FIELDS = ("plan", "tiers", "requests_per_second", "tokens_per_second", "max_concurrency", "api_key_sha256")


def tenant_key(name: str) -> str:
    """Key of a tenant's record."""
    return TENANT_PREFIX + name


def managed_value(since: float, source: str) -> bytes:
    """Value of the marker that the store holds the tenant set."""
    return json.dumps({"since": since, "source": source}).encode()


@dataclasses.dataclass(frozen=True, slots=True)
class StoredTenant:
    """A tenant as kept in the store, and when it was last written (unix seconds)."""

    config: TenantConfig
    updated_at: float = 0.0


def check_fields(fields: Sequence[str]) -> frozenset[str]:
    """The field names of an update, each known."""
    for i, name in enumerate(fields):
        if name not in FIELDS:
            raise InvalidArgument(f"fields[{i}]", f"unknown field {name!r} (known: {', '.join(FIELDS)})")
    return frozenset(fields)


def check_capacity(count: int, max_tenants: int) -> None:
    """A new tenant fits only while fewer than ``max_tenants`` are kept."""
    if count >= max_tenants:
        raise Overloaded(f"tenants: {count} kept, the limit is {max_tenants} (controlplane.max_tenants)", 60.0)


# -- requests


def _key_hash(request: admin_pb2.PutTenantRequest) -> str:
    """The key hash a put names ("" when none): from ``api_key`` or ``tenant.api_key_sha256``, not both."""
    if request.api_key and request.tenant.api_key_sha256:
        raise InvalidArgument("api_key", "give api_key or tenant.api_key_sha256, not both")
    if request.api_key:
        return check_api_key(request.api_key)
    if request.tenant.api_key_sha256:
        return check_key_hash(request.tenant.api_key_sha256)
    return ""


def from_request(request: admin_pb2.PutTenantRequest, old: TenantConfig | None) -> TenantConfig:
    """The record a ``PutTenant`` asks for, given the stored one (None when absent).

    Without ``fields`` the whole record is (re)placed: an empty plan means
    ``paid``, empty tiers every tier, and a key (or its hash) is required unless
    the tenant exists (its hash is kept). With ``fields`` only those change.
    """
    view = request.tenant
    check_name(view.name)
    fields = check_fields(request.fields)
    digest = _key_hash(request)
    if fields:
        if old is None:
            raise ValueError("an update needs the stored record")
        if "api_key_sha256" in fields and not digest:
            raise InvalidArgument("tenant.api_key_sha256", "required when fields names it (or give api_key)")
        if digest and "api_key_sha256" not in fields:
            raise InvalidArgument("fields", "name api_key_sha256 to change the key")
        if "plan" in fields:
            check_plan(view.plan)
        tiers = check_tiers(view.tiers) if "tiers" in fields else old.tiers
        if "tiers" in fields and not tiers:
            raise InvalidArgument("tenant.tiers", "at least one tier")
        return TenantConfig(
            name=old.name,
            api_key_sha256=digest or old.api_key_sha256,
            plan=view.plan if "plan" in fields else old.plan,
            tiers=tiers,
            requests_per_second=(check_rate(view.requests_per_second, "tenant.requests_per_second")
                                 if "requests_per_second" in fields else old.requests_per_second),
            tokens_per_second=(check_rate(view.tokens_per_second, "tenant.tokens_per_second")
                               if "tokens_per_second" in fields else old.tokens_per_second),
            max_concurrency=(check_concurrency(view.max_concurrency)
                             if "max_concurrency" in fields else old.max_concurrency),
        )
    if not digest:
        if old is None:
            raise InvalidArgument("tenant.api_key_sha256", "required for a new tenant (or give api_key)")
        digest = old.api_key_sha256
    return TenantConfig(
        name=view.name,
        api_key_sha256=digest,
        plan=check_plan(view.plan or "paid"),
        tiers=check_tiers(view.tiers) if view.tiers else TIERS,
        requests_per_second=check_rate(view.requests_per_second, "tenant.requests_per_second"),
        tokens_per_second=check_rate(view.tokens_per_second, "tenant.tokens_per_second"),
        max_concurrency=check_concurrency(view.max_concurrency),
    )


def key_conflict(tenant: TenantConfig, others: Iterable[TenantConfig]) -> str | None:
    """The name of another tenant with the same key hash, if any."""
    return next((o.name for o in others if o.name != tenant.name and o.api_key_sha256 == tenant.api_key_sha256),
                None)


# -- records


def encode(tenant: TenantConfig, updated_at: float) -> bytes:
    record: dict[str, Any] = {
        "name": tenant.name, "api_key_sha256": tenant.api_key_sha256, "plan": tenant.plan,
        "tiers": list(tenant.tiers), "requests_per_second": tenant.requests_per_second,
        "tokens_per_second": tenant.tokens_per_second, "max_concurrency": tenant.max_concurrency,
        "updated_at": updated_at,
    }
    return json.dumps(record, sort_keys=True).encode()


def decode(name: str, value: bytes) -> StoredTenant:
    """The record of tenant ``name``; ValueError saying what is wrong with it."""
    try:
        record = json.loads(value)
    except ValueError as exc:
        raise ValueError(f"tenant record {name!r}: not JSON") from exc
    if not isinstance(record, dict):
        raise ValueError(f"tenant record {name!r}: not an object")
    if record.get("name") != name:
        raise ValueError(f"tenant record {name!r}: names {record.get('name')!r}")
    try:
        tiers = record.get("tiers", list(TIERS))
        tenant = check_tenant(TenantConfig(
            name=name,
            api_key_sha256=_typed(record, "api_key_sha256", str, ""),
            plan=_typed(record, "plan", str, "paid"),
            tiers=tuple(tiers) if isinstance(tiers, list) and all(isinstance(t, str) for t in tiers) else ("?",),
            requests_per_second=float(_typed(record, "requests_per_second", (int, float), 0.0)),
            tokens_per_second=float(_typed(record, "tokens_per_second", (int, float), 0.0)),
            max_concurrency=_typed(record, "max_concurrency", int, 0),
        ))
        updated_at = float(_typed(record, "updated_at", (int, float), 0.0))
    except (InvalidArgument, TypeError) as exc:
        raise ValueError(f"tenant record {name!r}: {exc}") from exc
    except Exception as exc:  # TenantConfig's own checks raise ConfigError
        raise ValueError(f"tenant record {name!r}: {exc}") from exc
    return StoredTenant(tenant, updated_at)


def _typed(record: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = record.get(key, default)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{key} has the wrong type")
    return value


def to_view(stored: StoredTenant) -> admin_pb2.TenantView:
    t = stored.config
    return admin_pb2.TenantView(
        name=t.name, api_key_sha256=t.api_key_sha256, plan=t.plan, tiers=list(t.tiers),
        requests_per_second=t.requests_per_second, tokens_per_second=t.tokens_per_second,
        max_concurrency=t.max_concurrency, updated_at=stored.updated_at,
    )


def to_route(t: TenantConfig) -> tables_pb2.TenantRoute:
    return tables_pb2.TenantRoute(
        name=t.name, api_key_sha256=t.api_key_sha256, plan=t.plan, tiers=list(t.tiers),
        requests_per_second=t.requests_per_second, tokens_per_second=t.tokens_per_second,
        max_concurrency=t.max_concurrency,
    )


def seed_plan(configured: Sequence[TenantConfig], book: TenantBook) -> tuple[list[TenantConfig], list[str]]:
    """What to write on a start: (tenants of the config file to seed, reasons for those skipped).

    Nothing when the store already holds the set (the marker or any tenant),
    or when the config file names no tenant.
    """
    if book.managed or not configured:
        return [], []
    chosen: list[TenantConfig] = []
    skipped: list[str] = []
    hashes: set[str] = set()
    for i, tenant in enumerate(configured):
        try:
            tenant = check_tenant(tenant, f"tenants[{i}]")
        except InvalidArgument as exc:
            skipped.append(str(exc))
            continue
        if tenant.api_key_sha256 in hashes:
            skipped.append(f"tenants[{i}].api_key_sha256: same key as another tenant")
            continue
        hashes.add(tenant.api_key_sha256)
        chosen.append(tenant)
    return chosen, skipped


class TenantBook:
    """The tenants the store holds, fed one key at a time; see the module docstring."""

    def __init__(self) -> None:
        self.tenants: dict[str, StoredTenant] = {}
        self.marked = False
        self.generation = 0
        self._routes: tuple[int, tuple[tables_pb2.TenantRoute, ...]] = (-1, ())

    @property
    def managed(self) -> bool:
        """The store holds the tenant set: the marker is there, or any tenant is."""
        return self.marked or bool(self.tenants)

    @staticmethod
    def owns(key: str) -> bool:
        return key == MANAGED_KEY or key.startswith(TENANT_PREFIX)

    def apply(self, key: str, value: bytes | None) -> bool:
        """Take one key's change (``value`` None: deleted); True when the set or the marker changed."""
        if key == MANAGED_KEY:
            changed = self.marked != (value is not None)
            self.marked = value is not None
        else:
            name = key.removeprefix(TENANT_PREFIX)
            if value is None:
                changed = self.tenants.pop(name, None) is not None
            else:
                try:
                    stored = decode(name, value)
                except ValueError as exc:
                    log.warning("%s; skipped", exc)
                    changed = self.tenants.pop(name, None) is not None
                else:
                    changed = self.tenants.get(name) != stored
                    self.tenants[name] = stored
        if changed:
            self.generation += 1
        return changed

    def configs(self) -> list[TenantConfig]:
        return [self.tenants[n].config for n in sorted(self.tenants)]

    def routes(self) -> tuple[tables_pb2.TenantRoute, ...]:
        """The table's tenants, sorted by name, one per key hash (the first by name)."""
        generation, routes = self._routes
        if generation != self.generation:
            hashes: set[str] = set()
            built = []
            for tenant in self.configs():
                if tenant.api_key_sha256 in hashes:
                    log.warning("tenant %s has the key of another tenant: left out of the tables", tenant.name)
                    continue
                hashes.add(tenant.api_key_sha256)
                built.append(to_route(tenant))
            routes = tuple(built)
            self._routes = (self.generation, routes)
        return routes


def attach_tenants(tables: Mapping[str, tables_pb2.TableSnapshot], book: TenantBook) -> None:
    """Put the tenant set on every region's snapshot (none, unmanaged, when the store holds no set)."""
    if not book.managed:
        return
    routes = book.routes()
    for snapshot in tables.values():
        snapshot.tenants.extend(routes)
        snapshot.tenants_managed = True
