"""The proxy's tenant set: validation of a table's tenants, the swap, static stability, end to end in a proxy."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from dataplane.admission.tenantlimits import TenantLimits
from dataplane.intake.auth import Authenticator
from dataplane.table.local import TableParams, TableRejected, build_table
from dataplane.table.tenants import TenantSet, TenantsRejected, parse_tenants
from ferry.config import TenantConfig, hash_api_key
from ferry.errors import Unauthenticated
from ferry.v1 import common_pb2, tables_pb2
from tests.dataplane.conftest import KEYS, PAID, TENANTS, request
from tests.dataplane.fakes import Behaviour, route, snapshot

pytestmark = pytest.mark.timeout(20)

NEW_KEY = "key-new-tenant-789"


def troute(name: str = "newco", key: str = NEW_KEY, **kw: Any) -> tables_pb2.TenantRoute:
    fields: dict[str, Any] = {"plan": "paid", "tiers": ["interactive", "standard", "batch"]}
    fields.update(kw)
    return tables_pb2.TenantRoute(name=name, api_key_sha256=hash_api_key(key), **fields)


def managed(version: int, *routes: tables_pb2.TenantRoute, replicas: Any = ()) -> tables_pb2.TableSnapshot:
    snap = snapshot(version, list(replicas))
    snap.tenants.extend(routes)
    snap.tenants_managed = True
    return snap


BAD = [
    ("empty name", [troute(name="")], "tenants[0].name"),
    ("name with a space", [troute(name="a b")], "tenants[0].name"),
    ("name too long", [troute(name="n" * 65)], "tenants[0].name"),
    ("hash not hex", [tables_pb2.TenantRoute(name="x", api_key_sha256="z" * 64, plan="paid")],
     "tenants[0].api_key_sha256"),
    ("hash short", [tables_pb2.TenantRoute(name="x", api_key_sha256="a" * 10, plan="paid")],
     "tenants[0].api_key_sha256"),
    ("unknown plan", [troute(plan="gold")], "tenants[0].plan"),
    ("empty plan", [troute(plan="")], "tenants[0].plan"),
    ("unknown tier", [troute(tiers=["batch", "premium"])], "tenants[0].tiers[1]"),
    ("repeated tier", [troute(tiers=["batch", "batch"])], "tenants[0].tiers[1]"),
    ("negative rps", [troute(requests_per_second=-1.0)], "tenants[0].requests_per_second"),
    ("nan tps", [troute(tokens_per_second=math.nan)], "tenants[0].tokens_per_second"),
    ("infinite rps", [troute(requests_per_second=math.inf)], "tenants[0].requests_per_second"),
    ("name twice", [troute(), troute(key="other-key-0000")], "tenants[1].name"),
    ("key twice", [troute(), troute(name="other")], "tenants[1].api_key_sha256"),
]


@pytest.mark.parametrize(("routes", "named"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_a_bad_tenant_names_the_entry(routes: list[tables_pb2.TenantRoute], named: str) -> None:
    with pytest.raises(TenantsRejected) as err:
        parse_tenants(routes)
    assert err.value.reason.startswith(named)


def test_the_number_of_tenants_is_bounded() -> None:
    with pytest.raises(TenantsRejected, match="over the limit of 1"):
        parse_tenants([troute(), troute(name="b", key="b-key-0000000000")], max_tenants=1)


def test_good_tenants_parse_and_an_equal_list_is_reused() -> None:
    routes = [troute(plan="free", tiers=["batch"], requests_per_second=2, tokens_per_second=3, max_concurrency=4)]
    parsed = parse_tenants(routes)
    assert parsed[1] == (TenantConfig(name="newco", api_key_sha256=hash_api_key(NEW_KEY), plan="free",
                                      tiers=("batch",), requests_per_second=2, tokens_per_second=3,
                                      max_concurrency=4),)
    again = parse_tenants([troute(plan="free", tiers=["batch"], requests_per_second=2, tokens_per_second=3,
                                  max_concurrency=4)], previous=parsed)
    assert again is parsed
    assert parse_tenants([troute(plan="paid")], previous=parsed) is not parsed


TABLES: list[tuple[str, Callable[[], tables_pb2.TableSnapshot], str | None]] = [
    ("unmanaged: no tenants", lambda: snapshot(1, []), None),
    ("unmanaged: tenants ignored", lambda: snapshot(1, []), None),
    ("managed and empty", lambda: managed(1), ""),
    ("managed", lambda: managed(1, troute()), "newco"),
]


@pytest.mark.parametrize(("make", "names"), [c[1:] for c in TABLES], ids=[c[0] for c in TABLES])
def test_build_table_carries_the_managed_set(make: Callable[[], tables_pb2.TableSnapshot], names: str | None) -> None:
    table = build_table(make(), region="local", applied_at=0.0)
    if names is None:
        assert table.tenants is None
    else:
        assert table.tenants is not None and ",".join(t.name for t in table.tenants) == names


def test_a_bad_tenant_rejects_the_table_and_an_unchanged_list_is_reused() -> None:
    with pytest.raises(TableRejected, match=r"tenants\[0\]\.plan"):
        build_table(managed(2, troute(plan="gold")), region="local", applied_at=0.0)
    with pytest.raises(TableRejected, match="over the limit"):
        build_table(managed(2, troute()), region="local", applied_at=0.0, params=TableParams(max_tenants=0))
    first = build_table(managed(2, troute()), region="local", applied_at=0.0)
    second = build_table(managed(3, troute()), region="local", applied_at=1.0, previous=first)
    assert second.tenants is first.tenants


def test_the_set_swaps_and_goes_back_to_the_configured_tenants() -> None:
    auth = Authenticator(TENANTS)
    limits = TenantLimits()
    tenant_set = TenantSet(TENANTS, auth, limits)
    assert auth.authenticate(PAID).name == "acme"
    assert not tenant_set.apply(None)  # unmanaged: the configured ones, unchanged
    limited = TENANTS[0]
    limits.admit(TenantConfig(name="acme", api_key_sha256=limited.api_key_sha256, requests_per_second=5), 1, 0.0)
    new = parse_tenants([troute()])[1]
    assert tenant_set.apply(new) and tenant_set.managed
    assert auth.authenticate([("x-api-key", NEW_KEY)]).name == "newco"
    with pytest.raises(Unauthenticated):
        auth.authenticate(PAID)
    assert "acme" not in limits._requests  # the buckets of tenants that left are dropped
    assert not tenant_set.apply(new)
    assert tenant_set.apply(None) and not tenant_set.managed
    assert auth.authenticate([("x-api-key", KEYS["free"])]).name == "hobby"
    with pytest.raises(Unauthenticated):
        auth.authenticate([("x-api-key", NEW_KEY)])


# -- in a proxy watching a (fake) control plane


async def call(r: Any, key: str, tier: str = "standard") -> grpc.StatusCode:
    try:
        tier_value = common_pb2.Tier.Value(f"TIER_{tier.upper()}")
        await r.stub.Infer(request(tier=tier_value), metadata=(("x-api-key", key),), timeout=5)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def test_a_proxy_follows_the_managed_set_and_keeps_it_without_a_control_plane(rig) -> None:
    r = await rig({"r1": Behaviour()})
    replica = route(r.replicas["r1"])
    assert await call(r, KEYS["paid"]) == grpc.StatusCode.OK  # the config file's tenants, before any managed set
    assert await call(r, NEW_KEY) == grpc.StatusCode.UNAUTHENTICATED

    r.cp.push(managed(2, troute(tiers=["batch"]), replicas=[replica]))
    assert (await r.cp.next_ack()).applied
    assert await call(r, NEW_KEY, "batch") == grpc.StatusCode.OK
    assert await call(r, NEW_KEY, "interactive") == grpc.StatusCode.PERMISSION_DENIED
    assert await call(r, KEYS["paid"]) == grpc.StatusCode.UNAUTHENTICATED  # replaced, not merged

    r.cp.push(managed(3, troute(plan="nope"), replicas=[replica]))  # a bad tenant: NACK, the last good set stays
    ack = await r.cp.next_ack()
    assert not ack.applied and "tenants[0].plan" in ack.error
    assert await call(r, NEW_KEY, "batch") == grpc.StatusCode.OK

    await r.cp.stop()  # the control plane is gone: the proxy keeps the last set it applied
    assert await call(r, NEW_KEY, "batch") == grpc.StatusCode.OK
    assert await call(r, KEYS["paid"]) == grpc.StatusCode.UNAUTHENTICATED
