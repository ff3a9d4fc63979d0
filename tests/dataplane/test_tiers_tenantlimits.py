"""Per-tenant rate limits and concurrency cap (dataplane.admission.tenantlimits), and plan weights in the fair share."""

from __future__ import annotations

from collections import Counter

import pytest

from dataplane.admission.fairshare import DeficitRoundRobin
from dataplane.admission.tenantlimits import TenantLimits
from ferry.config import TenantConfig
from ferry.errors import ConfigError, Overloaded

KEY = "0" * 64


@pytest.mark.parametrize(("limits", "calls", "admitted", "named"), [
    ({}, [(0.0, 100)] * 50, 50, ""),
    ({"requests_per_second": 2.0}, [(0.0, 1), (0.0, 1), (0.0, 1), (0.5, 1), (1.0, 1)], 4, "requests_per_second"),
    ({"tokens_per_second": 1000.0}, [(0.0, 600), (0.0, 600), (0.6, 600)], 2, "tokens_per_second"),
    ({"max_concurrency": 2}, [(0.0, 1)] * 3, 2, "max_concurrency"),
], ids=["none", "requests", "tokens", "concurrency"])
def test_tenant_limits(limits: dict[str, float], calls: list[tuple[float, int]], admitted: int, named: str) -> None:
    tenant = TenantConfig(name="t", api_key_sha256=KEY, **limits)  # type: ignore[arg-type]
    lim = TenantLimits()
    ok, errors = 0, []
    for now, tokens in calls:
        try:
            lim.admit(tenant, tokens, now)
            ok += 1
        except Overloaded as exc:
            errors.append(exc)
    assert ok == admitted
    assert all(named in str(e) and e.retry_after > 0 for e in errors)


def test_concurrency_released() -> None:
    tenant = TenantConfig(name="t", api_key_sha256=KEY, max_concurrency=1)
    lim = TenantLimits()
    assert lim.admit(tenant, 1, 0.0)
    with pytest.raises(Overloaded):
        lim.admit(tenant, 1, 0.0)
    lim.release(tenant)
    assert lim.admit(tenant, 1, 0.0)


def test_negative_limit_names_the_field() -> None:
    with pytest.raises(ConfigError, match="tokens_per_second"):
        TenantConfig(name="t", api_key_sha256=KEY, tokens_per_second=-1.0)


def test_plan_weights_share_tokens() -> None:
    drr: DeficitRoundRobin[tuple[str, int]] = DeficitRoundRobin(quantum=100)
    for i in range(40):
        drr.push("paid", ("paid", i), 100, weight=4.0)
        drr.push("free", ("free", i), 100, weight=1.0)
    served = Counter(item[0] for item in (drr.pop() for _ in range(25)) if item is not None)
    assert served == {"paid": 20, "free": 5}
