"""Tenants kept in the store: validation and records (table by table), the Admin RPCs, the seed, the tables."""

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from controlplane.api.auth import AdminAuth
from controlplane.config import ControlPlaneSettings
from controlplane.server import ControlPlane
from controlplane.store.memory import MemoryStore
from controlplane.tenants import records as tenants
from ferry.config import TIERS, TenantConfig, hash_api_key
from ferry.errors import InvalidArgument, Overloaded
from ferry.v1 import admin_pb2, tables_pb2
from ferry_cli.ctl.client import AdminClient
from tests.controlplane.fakes import TOKEN, WAIT, FakeClock, FlakyStore, Harness

H1 = "a" * 64
H2 = "b" * 64
KEY = "k" * 20


def config(name: str = "acme", digest: str = H1, **kw: Any) -> TenantConfig:
    return TenantConfig(name=name, api_key_sha256=digest, **kw)


def put(name: str = "acme", *, api_key: str = "", fields: tuple[str, ...] = (), create_only: bool = False,
        **view: Any) -> admin_pb2.PutTenantRequest:
    return admin_pb2.PutTenantRequest(tenant=admin_pb2.TenantView(name=name, **view), api_key=api_key,
                                      fields=list(fields), create_only=create_only)


# -- validation, table by table

BAD_PUTS = [
    ("empty name", put(""), "tenant.name"),
    ("name with a space", put("a b", api_key=KEY), "tenant.name"),
    ("name starting with a dash", put("-a", api_key=KEY), "tenant.name"),
    ("name too long", put("a" * 65, api_key=KEY), "tenant.name"),
    ("no key on create", put("acme"), "tenant.api_key_sha256"),
    ("both key and hash", put(api_key=KEY, api_key_sha256=H1), "api_key"),
    ("short key", put(api_key="short"), "api_key"),
    ("key with a space", put(api_key="k" * 10 + " " + "k" * 10), "api_key"),
    ("key too long", put(api_key="k" * 513), "api_key"),
    ("hash not hex", put(api_key_sha256="z" * 64), "tenant.api_key_sha256"),
    ("hash too short", put(api_key_sha256="a" * 63), "tenant.api_key_sha256"),
    ("unknown plan", put(api_key=KEY, plan="gold"), "tenant.plan"),
    ("unknown tier", put(api_key=KEY, tiers=["standard", "premium"]), "tenant.tiers[1]"),
    ("repeated tier", put(api_key=KEY, tiers=["batch", "batch"]), "tenant.tiers[1]"),
    ("negative rps", put(api_key=KEY, requests_per_second=-1), "tenant.requests_per_second"),
    ("nan tps", put(api_key=KEY, tokens_per_second=math.nan), "tenant.tokens_per_second"),
    ("infinite rps", put(api_key=KEY, requests_per_second=math.inf), "tenant.requests_per_second"),
    ("concurrency too high", put(api_key=KEY, max_concurrency=2_000_000), "tenant.max_concurrency"),
    ("unknown field", put(fields=("colour",)), "fields[0]"),
]


@pytest.mark.parametrize(("request_", "named"), [c[1:] for c in BAD_PUTS], ids=[c[0] for c in BAD_PUTS])
def test_a_bad_put_names_the_field(request_: admin_pb2.PutTenantRequest, named: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        tenants.from_request(request_, None)
    assert err.value.field == named


GOOD_PUTS = [
    ("defaults", put(api_key=KEY), None,
     config(digest=hash_api_key(KEY), plan="paid", tiers=TIERS)),
    ("hash lowercased, tiers in priority order", put(api_key_sha256="A" * 64, plan="free",
                                                     tiers=["batch", "standard"]), None,
     config(digest="a" * 64, plan="free", tiers=("standard", "batch"))),
    ("replace keeps the stored key", put(plan="enterprise", max_concurrency=4), config(plan="free"),
     config(plan="enterprise", max_concurrency=4)),
    ("update changes only the fields named", put(plan="free", tiers=["batch"], requests_per_second=9,
                                                 fields=("tiers",)),
     config(plan="paid", requests_per_second=1.0), config(plan="paid", tiers=("batch",), requests_per_second=1.0)),
    ("update of the key", put(api_key=KEY, fields=("api_key_sha256",)), config(plan="free"),
     config(digest=hash_api_key(KEY), plan="free")),
    ("update of the limits", put(requests_per_second=5, tokens_per_second=6, max_concurrency=7,
                                 fields=("requests_per_second", "tokens_per_second", "max_concurrency")),
     config(), config(requests_per_second=5, tokens_per_second=6, max_concurrency=7)),
]


@pytest.mark.parametrize(("request_", "old", "want"), [c[1:] for c in GOOD_PUTS], ids=[c[0] for c in GOOD_PUTS])
def test_a_put_builds_the_record(request_: admin_pb2.PutTenantRequest, old: TenantConfig | None,
                                 want: TenantConfig) -> None:
    assert tenants.from_request(request_, old) == want


BAD_UPDATES = [
    ("empty tiers", put(fields=("tiers",)), "tenant.tiers"),
    ("key field without a key", put(fields=("api_key_sha256",)), "tenant.api_key_sha256"),
    ("a key without naming the field", put(api_key=KEY, fields=("plan",), plan="free"), "fields"),
    ("empty plan", put(fields=("plan",)), "tenant.plan"),
]


@pytest.mark.parametrize(("request_", "named"), [c[1:] for c in BAD_UPDATES], ids=[c[0] for c in BAD_UPDATES])
def test_a_bad_update_names_the_field(request_: admin_pb2.PutTenantRequest, named: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        tenants.from_request(request_, config())
    assert err.value.field == named


RECORDS = [
    ("not JSON", b"{", "not JSON"),
    ("not an object", b"[]", "not an object"),
    ("another name", json.dumps({"name": "other"}).encode(), "names 'other'"),
    ("bad hash", json.dumps({"name": "acme", "api_key_sha256": "x"}).encode(), "api_key_sha256"),
    ("bad plan", json.dumps({"name": "acme", "api_key_sha256": H1, "plan": "gold"}).encode(), "plan"),
    ("rps a string", json.dumps({"name": "acme", "api_key_sha256": H1, "requests_per_second": "1"}).encode(),
     "requests_per_second"),
    ("concurrency a bool", json.dumps({"name": "acme", "api_key_sha256": H1, "max_concurrency": True}).encode(),
     "max_concurrency"),
    ("tiers not a list", json.dumps({"name": "acme", "api_key_sha256": H1, "tiers": "batch"}).encode(), "tiers"),
]


@pytest.mark.parametrize(("value", "said"), [c[1:] for c in RECORDS], ids=[c[0] for c in RECORDS])
def test_a_bad_record_does_not_decode(value: bytes, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        tenants.decode("acme", value)


def test_a_record_round_trips_and_ignores_unknown_keys() -> None:
    tenant = config(plan="enterprise", tiers=("interactive",), requests_per_second=2.5, tokens_per_second=100,
                    max_concurrency=3)
    stored = tenants.decode("acme", tenants.encode(tenant, 12.5))
    assert stored == tenants.StoredTenant(tenant, 12.5)
    record = json.loads(tenants.encode(tenant, 1.0))
    record["colour"] = "blue"
    assert tenants.decode("acme", json.dumps(record).encode()).config == tenant
    assert "k" * 20 not in tenants.encode(config(digest=hash_api_key(KEY)), 0).decode()  # only the hash


def test_the_capacity_is_bounded() -> None:
    tenants.check_capacity(2, 3)
    with pytest.raises(Overloaded, match="limit is 3"):
        tenants.check_capacity(3, 3)


def test_a_key_conflict_names_the_other_tenant() -> None:
    others = [config("a", H1), config("b", H2)]
    assert tenants.key_conflict(config("c", H2), others) == "b"
    assert tenants.key_conflict(config("b", H2), others) is None  # itself
    assert tenants.key_conflict(config("c", "c" * 64), others) is None


# -- the book and the tables


def test_the_book_follows_keys_and_pushes_one_tenant_per_key() -> None:
    book = tenants.TenantBook()
    assert not book.managed and book.routes() == ()
    assert book.apply(tenants.tenant_key("b"), tenants.encode(config("b", H1), 1))
    assert book.managed and [r.name for r in book.routes()] == ["b"]
    assert not book.apply(tenants.tenant_key("b"), tenants.encode(config("b", H1), 1))  # same record
    assert book.apply(tenants.tenant_key("a"), tenants.encode(config("a", H1), 1))  # same key as b
    assert [r.name for r in book.routes()] == ["a"]  # the first by name wins
    assert book.apply(tenants.tenant_key("z"), b"garbage")  is False  # skipped, nothing changed
    assert book.apply(tenants.tenant_key("a"), b"garbage")  # a bad record replaces a good one: gone
    assert [r.name for r in book.routes()] == ["b"]
    assert book.apply(tenants.tenant_key("b"), None)
    assert not book.managed
    assert book.apply(tenants.MANAGED_KEY, b"{}")
    assert book.managed and book.routes() == ()
    assert not tenants.TenantBook.owns(tenants.tenant_key("x").replace("tenant/", "tier/"))


def test_attach_marks_every_region_only_when_managed() -> None:
    book = tenants.TenantBook()
    tables = {"a": tables_pb2.TableSnapshot(region="a"), "b": tables_pb2.TableSnapshot(region="b")}
    tenants.attach_tenants(tables, book)
    assert not tables["a"].tenants_managed and not tables["a"].tenants
    book.apply(tenants.tenant_key("acme"), tenants.encode(config(plan="free", tiers=("batch",)), 1))
    tenants.attach_tenants(tables, book)
    for snapshot in tables.values():
        assert snapshot.tenants_managed
        assert [(t.name, t.plan, list(t.tiers), t.api_key_sha256) for t in snapshot.tenants] == [
            ("acme", "free", ["batch"], H1)]


SEEDS = [
    ("nothing configured", [], False, [], 0),
    ("store already managed", [config()], True, [], 0),
    ("seeds the valid ones", [config("a", H1), config("bad name", H2), config("c", H1), config("d", H2)], False,
     ["a", "d"], 2),
]


@pytest.mark.parametrize(("configured", "managed", "chosen", "skipped"), [c[1:] for c in SEEDS],
                         ids=[c[0] for c in SEEDS])
def test_seed_plan(configured: list[TenantConfig], managed: bool, chosen: list[str], skipped: int) -> None:
    book = tenants.TenantBook()
    if managed:
        book.apply(tenants.MANAGED_KEY, b"{}")
    got, reasons = tenants.seed_plan(configured, book)
    assert [t.name for t in got] == chosen and len(reasons) == skipped


# -- over the Admin API, with a proxy watching


async def start(store: Any = None, configured: tuple[TenantConfig, ...] = (),
                **settings: Any) -> tuple[ControlPlane, AdminClient, grpc.aio.Channel]:
    merged: dict[str, Any] = {"tick_seconds": 0.1, "debounce_seconds": 0.001}
    merged.update(settings)
    cp = ControlPlane(ControlPlaneSettings(**merged), store=store, admin_auth=AdminAuth.with_token(TOKEN),
                      tenants=configured, clock=FakeClock(), wall=time.time)
    port = await cp.start("127.0.0.1:0")
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    return cp, AdminClient(channel, TOKEN), channel


@pytest.fixture
async def plane() -> AsyncIterator[Harness]:
    cp, _, channel = await start()
    h = Harness(cp, channel)
    try:
        yield h
    finally:
        await h.stop()


async def test_put_list_delete_and_each_change_is_a_new_table(plane: Harness) -> None:
    proxy = plane.proxy()
    first = await proxy.subscribe()
    assert not first.tenants_managed and not first.tenants
    listing = await plane.admin.ListTenants(admin_pb2.ListTenantsRequest(), timeout=WAIT)
    assert not listing.managed and not listing.tenants and listing.max_tenants == 10_000

    answer = await plane.admin.PutTenant(put(api_key=KEY, plan="free", tiers=["batch"], create_only=True),
                                         timeout=WAIT)
    assert answer.created and answer.tenant.api_key_sha256 == hash_api_key(KEY)
    table = await proxy.until(lambda s: s.tenants_managed and len(s.tenants) == 1)
    assert table.version > first.version and list(table.tenants[0].tiers) == ["batch"]
    stored = await plane.cp.store.get(tenants.tenant_key("acme"))
    assert stored is not None and KEY.encode() not in stored.value

    answer = await plane.admin.PutTenant(put(tiers=["interactive", "batch"], fields=("tiers",)), timeout=WAIT)
    assert not answer.created and answer.tenant.plan == "free"
    changed = await proxy.until(lambda s: list(s.tenants[0].tiers) == ["interactive", "batch"])
    assert changed.version > table.version

    listing = await plane.admin.ListTenants(admin_pb2.ListTenantsRequest(), timeout=WAIT)
    assert listing.managed and [t.name for t in listing.tenants] == ["acme"] and listing.tenants[0].updated_at > 0

    await plane.admin.DeleteTenant(admin_pb2.DeleteTenantRequest(name="acme"), timeout=WAIT)
    empty = await proxy.until(lambda s: not s.tenants)
    assert empty.tenants_managed  # removing the last one leaves an empty managed set
    assert empty.version > changed.version


REFUSALS = [
    ("create of an existing name", [put(api_key=KEY)], put(api_key="x" * 20, create_only=True),
     grpc.StatusCode.ALREADY_EXISTS, "tenant.name"),
    ("a key another tenant has", [put("other", api_key=KEY)], put(api_key=KEY), grpc.StatusCode.ALREADY_EXISTS,
     "tenant.api_key_sha256"),
    ("update of an unknown tenant", [], put(plan="free", fields=("plan",)), grpc.StatusCode.NOT_FOUND, "acme"),
    ("a bad field", [], put(api_key=KEY, plan="gold"), grpc.StatusCode.INVALID_ARGUMENT, "tenant.plan"),
]


@pytest.mark.parametrize(("before", "request_", "code", "named"), [c[1:] for c in REFUSALS],
                         ids=[c[0] for c in REFUSALS])
async def test_put_refusals(plane: Harness, before: list[admin_pb2.PutTenantRequest],
                            request_: admin_pb2.PutTenantRequest, code: grpc.StatusCode, named: str) -> None:
    for earlier in before:
        await plane.admin.PutTenant(earlier, timeout=WAIT)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await plane.admin.PutTenant(request_, timeout=WAIT)
    assert err.value.code() == code and named in (err.value.details() or "")


async def test_delete_of_an_unknown_tenant_and_a_bad_name(plane: Harness) -> None:
    for name, code in (("ghost", grpc.StatusCode.NOT_FOUND), ("", grpc.StatusCode.INVALID_ARGUMENT)):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await plane.admin.DeleteTenant(admin_pb2.DeleteTenantRequest(name=name), timeout=WAIT)
        assert err.value.code() == code


async def test_the_number_of_tenants_is_bounded() -> None:
    cp, admin, channel = await start(max_tenants=2)
    try:
        for i in range(2):
            await admin.PutTenant(put(f"t{i}", api_key_sha256=f"{i}" * 64), timeout=WAIT)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await admin.PutTenant(put("t2", api_key_sha256="2" * 64), timeout=WAIT)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        await admin.PutTenant(put("t1", api_key_sha256="3" * 64), timeout=WAIT)  # a replace still fits
    finally:
        await cp.stop(grace=0)
        await channel.close()


async def test_writes_are_refused_while_the_store_is_away(plane: Harness) -> None:
    flaky = FlakyStore(plane.cp.store)  # type: ignore[arg-type]
    plane.cp.controller.writer.store = flaky  # type: ignore[assignment]
    flaky.down = True
    for call, request_ in ((plane.admin.PutTenant, put(api_key=KEY)),
                           (plane.admin.DeleteTenant, admin_pb2.DeleteTenantRequest(name="acme"))):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(request_, timeout=WAIT)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "refused" in (err.value.details() or "")
    assert await plane.cp.store.get(tenants.tenant_key("acme")) is None
    listing = await plane.admin.ListTenants(admin_pb2.ListTenantsRequest(), timeout=WAIT)  # reads still answer
    assert not listing.tenants


async def test_the_config_file_seeds_an_empty_store_once() -> None:
    store = MemoryStore()
    configured = (config("a", H1, plan="free"), config("b", H2))
    cp, admin, channel = await start(store, configured)
    try:
        listing = await admin.ListTenants(admin_pb2.ListTenantsRequest(), timeout=WAIT)
        assert listing.managed and [(t.name, t.plan) for t in listing.tenants] == [("a", "free"), ("b", "paid")]
        await admin.DeleteTenant(admin_pb2.DeleteTenantRequest(name="a"), timeout=WAIT)
        await admin.DeleteTenant(admin_pb2.DeleteTenantRequest(name="b"), timeout=WAIT)
    finally:
        await cp.stop(grace=0)
        await channel.close()
    cp, admin, channel = await start(store, configured)  # the same store: not seeded again
    try:
        listing = await admin.ListTenants(admin_pb2.ListTenantsRequest(), timeout=WAIT)
        assert listing.managed and not listing.tenants
    finally:
        await cp.stop(grace=0)
        await channel.close()
    await store.close()
