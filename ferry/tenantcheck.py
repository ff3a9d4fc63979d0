"""Validation of a tenant, shared by the control plane (writes) and the proxy (pushed tables). Pure.

Each failure is an :class:`ferry.errors.InvalidArgument` naming the field
(``tenant.tiers[1]``, ``tenants[3].plan``): a name of 1 to
:data:`MAX_NAME_CHARS` (64) characters of ``[A-Za-z0-9._-]`` starting with a
letter or digit; a plan of ``ferry.config.PLANS``; known tiers, each once
(returned in priority order); rates finite and in ``[0, MAX_RATE]``;
``max_concurrency`` in ``[0, MAX_CONCURRENCY]``; a key hash of 64 hex
characters (returned lowercase); an API key of :data:`MIN_KEY_CHARS` (16) to
:data:`MAX_KEY_CHARS` (512) printable ASCII characters without spaces.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from ferry.config import PLANS, TIERS, TenantConfig, hash_api_key
from ferry.errors import InvalidArgument

MAX_NAME_CHARS = 64
MIN_KEY_CHARS = 16
MAX_KEY_CHARS = 512
MAX_RATE = 1e12
MAX_CONCURRENCY = 1_000_000
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
HEX64 = re.compile(r"[0-9a-fA-F]{64}")


def check_name(name: str, field: str = "tenant.name") -> None:
    if not name:
        raise InvalidArgument(field, "required")
    if len(name) > MAX_NAME_CHARS:
        raise InvalidArgument(field, f"longer than {MAX_NAME_CHARS} characters")
    if not NAME.fullmatch(name):
        raise InvalidArgument(field, "letters, digits, '.', '_' and '-' only, starting with a letter or digit")


def check_key_hash(digest: str, field: str = "tenant.api_key_sha256") -> str:
    """The hash in its stored form (lowercase); InvalidArgument unless 64 hex characters."""
    if not HEX64.fullmatch(digest):
        raise InvalidArgument(field, "must be a sha256 in hex (64 characters)")
    return digest.lower()


def check_api_key(key: str, field: str = "api_key") -> str:
    """The hash of an API key given in clear; the key itself is not kept."""
    if not MIN_KEY_CHARS <= len(key) <= MAX_KEY_CHARS:
        raise InvalidArgument(field, f"must be {MIN_KEY_CHARS} to {MAX_KEY_CHARS} characters")
    if not all(33 <= ord(c) <= 126 for c in key):
        raise InvalidArgument(field, "printable ASCII without spaces only")
    return hash_api_key(key)


def check_plan(plan: str, field: str = "tenant.plan") -> str:
    if plan not in PLANS:
        raise InvalidArgument(field, f"must be one of {', '.join(PLANS)}")
    return plan


def check_tiers(tiers: Sequence[str], field: str = "tenant.tiers") -> tuple[str, ...]:
    """Known tiers, each once, in priority order; InvalidArgument names the bad item."""
    seen: set[str] = set()
    for i, tier in enumerate(tiers):
        if tier not in TIERS:
            raise InvalidArgument(f"{field}[{i}]", f"unknown tier {tier!r} (known: {', '.join(TIERS)})")
        if tier in seen:
            raise InvalidArgument(f"{field}[{i}]", f"tier {tier!r} appears twice")
        seen.add(tier)
    return tuple(t for t in TIERS if t in seen)


def check_rate(value: float, field: str) -> float:
    if not math.isfinite(value) or not 0 <= value <= MAX_RATE:
        raise InvalidArgument(field, f"must be a finite number in [0, {MAX_RATE:g}] (0: no limit)")
    return float(value)


def check_concurrency(value: int, field: str = "tenant.max_concurrency") -> int:
    if not 0 <= value <= MAX_CONCURRENCY:
        raise InvalidArgument(field, f"must be in [0, {MAX_CONCURRENCY}] (0: no limit)")
    return int(value)


def check_tenant(tenant: TenantConfig, field: str = "tenant") -> TenantConfig:
    """``tenant`` with its key hash lowercased and tiers in priority order; InvalidArgument naming the field."""
    check_name(tenant.name, f"{field}.name")
    return TenantConfig(
        name=tenant.name,
        api_key_sha256=check_key_hash(tenant.api_key_sha256, f"{field}.api_key_sha256"),
        plan=check_plan(tenant.plan, f"{field}.plan"),
        tiers=check_tiers(tenant.tiers, f"{field}.tiers"),
        requests_per_second=check_rate(tenant.requests_per_second, f"{field}.requests_per_second"),
        tokens_per_second=check_rate(tenant.tokens_per_second, f"{field}.tokens_per_second"),
        max_concurrency=check_concurrency(tenant.max_concurrency, f"{field}.max_concurrency"),
    )
