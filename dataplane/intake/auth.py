"""API-key authentication: request metadata to a tenant.

The key travels as ``authorization: Bearer KEY`` or in ``x-api-key`` (a
gRPC metadata entry or an HTTP header: the message says neither, so it reads
right on both fronts). Tenants are stored by the sha256 of their key
(:func:`ferry.config.hash_api_key`), so the proxy never holds a key; it looks
the hash up in a dict built once. A request without a key, or with one that
names no tenant, raises :class:`ferry.errors.Unauthenticated` with a message
saying how to pass the key. Keys never appear in messages or logs.

With ``allow_anonymous`` a request that carries no key at all is served as the
tenant ``anonymous`` (plan ``paid``, every tier); a wrong key is still refused.
Meant for a proxy on one machine, off by default.

Cost: one sha256 of the key and one dict lookup per request.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ferry.config import TIERS, TenantConfig, hash_api_key
from ferry.errors import ConfigError, Unauthenticated

API_KEY_HEADER = "x-api-key"
AUTHORIZATION_HEADER = "authorization"
HOW = "pass the API key as 'Authorization: Bearer KEY' or in 'x-api-key'"
MAX_KEY_CHARS = 512

ANONYMOUS = TenantConfig(name="anonymous", api_key_sha256="0" * 64, plan="paid", tiers=TIERS)

Metadata = Iterable[tuple[str, str | bytes]]


def api_key_from(metadata: Metadata) -> str | None:
    """The API key in ``metadata`` (``x-api-key`` first, then a Bearer authorization), or None."""
    bearer: str | None = None
    for key, value in metadata:
        name = key.lower()
        if name == API_KEY_HEADER:
            text = value.decode(errors="replace") if isinstance(value, bytes) else value
            return text.strip() or None
        if name == AUTHORIZATION_HEADER and bearer is None:
            text = value.decode(errors="replace") if isinstance(value, bytes) else value
            scheme, _, credential = text.strip().partition(" ")
            if scheme.lower() == "bearer" and credential.strip():
                bearer = credential.strip()
    return bearer


class Authenticator:
    """Finds the tenant of a request from its metadata."""

    def __init__(self, tenants: Sequence[TenantConfig], *, allow_anonymous: bool = False) -> None:
        self._by_hash: dict[str, TenantConfig] = {}
        self.replace(tenants)
        self._allow_anonymous = allow_anonymous

    def replace(self, tenants: Sequence[TenantConfig]) -> None:
        """Find tenants in ``tenants`` from now on (one assignment: a request sees the old set or the new)."""
        by_hash: dict[str, TenantConfig] = {}
        for tenant in tenants:
            digest = tenant.api_key_sha256.lower()
            if digest in by_hash:
                raise ConfigError(f"tenants.{tenant.name}.api_key_sha256", "same key as another tenant")
            by_hash[digest] = tenant
        self._by_hash = by_hash

    def authenticate(self, metadata: Metadata) -> TenantConfig:
        """The tenant whose key the metadata carries; raises Unauthenticated."""
        key = api_key_from(metadata)
        if key is None:
            if self._allow_anonymous:
                return ANONYMOUS
            raise Unauthenticated(f"missing API key: {HOW}")
        if len(key) > MAX_KEY_CHARS:
            raise Unauthenticated(f"x-api-key: the API key is longer than {MAX_KEY_CHARS} characters; {HOW}")
        tenant = self._by_hash.get(hash_api_key(key))
        if tenant is None:
            raise Unauthenticated(f"unknown API key: {HOW}")
        return tenant
