"""Tenant isolation at the proxy: idempotent results, API keys in logs, per-tenant in-flight bounds."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from dataplane.admission.limits import TenantInflight
from dataplane.config import ProxySettings
from dataplane.server import Proxy
from ferry.config import Limits, TenantConfig, hash_api_key
from ferry.errors import ConfigError, Overloaded
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tests.dataplane.fakes import Behaviour, FakeControlPlane, FakeReplica, route, snapshot

KEYS = {"acme": "fk_acme_" + "a" * 24, "rival": "fk_rival_" + "b" * 24}
TENANTS = tuple(TenantConfig(name=name, api_key_sha256=hash_api_key(key), plan="paid") for name, key in KEYS.items())


def md(tenant: str) -> tuple[tuple[str, str], ...]:
    return (("x-api-key", KEYS[tenant]),)


def request(**fields: Any) -> inference_pb2.InferRequest:
    base: dict[str, Any] = {"model": "m", "prompt": "the same prompt", "max_tokens": 3,
                            "tier": common_pb2.TIER_STANDARD}
    return inference_pb2.InferRequest(**{**base, **fields})


class Rig:
    """A proxy with these tenants and limits, a fake control plane and one fake replica."""

    def __init__(self, limits: Limits, behaviour: Behaviour) -> None:
        self.limits, self.behaviour = limits, behaviour
        self.cp = FakeControlPlane()
        self.registry = CollectorRegistry()

    async def __aenter__(self) -> Rig:
        self.replica = await FakeReplica("r1", self.behaviour).start()
        self.cp.current = snapshot(1, [route(self.replica)])
        await self.cp.start()
        settings = ProxySettings.from_section({"proxy_id": "p-sec", "reconnect_initial_seconds": 0.05})
        self.proxy = Proxy(settings=settings, tenants=TENANTS,
                           limits=self.limits, control_planes=[self.cp.address], registry=self.registry,
                           rng=random.Random(3))
        port = await self.proxy.start("127.0.0.1:0")
        assert (await self.cp.next_ack()).applied
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.stub = inference_pb2_grpc.InferenceStub(self.channel)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()
        await self.proxy.stop(0)
        await self.cp.stop()
        await self.replica.stop()


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async with Rig(Limits(), Behaviour()) as r:
        yield r


SECOND = [
    ("same-body", request(idempotency_key="k-1")),
    ("other-body", request(idempotency_key="k-1", prompt="another prompt")),  # no conflict leaks the key's use
]


@pytest.mark.parametrize("second", [c[1] for c in SECOND], ids=[c[0] for c in SECOND])
async def test_a_tenant_cannot_read_another_tenants_idempotent_result(
        rig: Rig, second: inference_pb2.InferRequest) -> None:
    first = await rig.stub.Infer(request(idempotency_key="k-1"), metadata=md("acme"), timeout=5)
    again = await rig.stub.Infer(request(idempotency_key="k-1"), metadata=md("acme"), timeout=5)
    assert again.request_id == first.request_id and len(rig.replica.requests) == 1  # acme's own replay
    other = await rig.stub.Infer(second, metadata=md("rival"), timeout=5)
    assert other.request_id != first.request_id  # ran anew for the rival, not acme's result
    assert len(rig.replica.requests) == 2


async def test_an_api_key_never_reaches_logs_errors_or_metrics(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    wrong = "fk_wrong_" + "c" * 24
    caplog.set_level(logging.DEBUG)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await rig.stub.Infer(request(), metadata=(("x-api-key", wrong),), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    await rig.stub.Infer(request(), metadata=md("acme"), timeout=5)
    with pytest.raises(grpc.aio.AioRpcError):
        await rig.stub.Infer(request(), metadata=(("authorization", f"Bearer {wrong}"),), timeout=5)
    exposed = caplog.text + (refused.value.details() or "") + generate_latest(rig.registry).decode()
    assert caplog.records  # the proxy did log something about these calls
    for key in (wrong, KEYS["acme"]):
        assert key not in exposed
        assert key[8:] not in exposed  # not even its tail


async def test_one_tenant_cannot_take_every_slot() -> None:
    async with Rig(Limits(max_inflight_per_tenant=2), Behaviour(delay=0.5)) as rig:
        calls = [asyncio.ensure_future(rig.stub.Infer(request(), metadata=md("acme"), timeout=5))
                 for _ in range(2)]
        await _until(lambda: rig.proxy.router._tenants.count("acme") == 2)
        with pytest.raises(grpc.aio.AioRpcError) as third:
            await rig.stub.Infer(request(), metadata=md("acme"), timeout=5)
        assert third.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "tenant in-flight limit of 2" in (third.value.details() or "")
        trailing = dict(third.value.trailing_metadata() or ())
        assert float(trailing["retry-after"]) > 0
        assert (await rig.stub.Infer(request(), metadata=md("rival"), timeout=5)).completion_tokens > 0
        for call in calls:
            await call
        assert rig.proxy.router._tenants.count("acme") == 0


async def _until(predicate: Any, turns: int = 1000) -> None:
    """Wait, turn by turn of the loop, until ``predicate()`` holds (bounded by ``turns``)."""
    for _ in range(turns):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition never held")


STEPS = [
    ("within", 2, ["enter a", "enter a", "enter b"], None),
    ("over", 2, ["enter a", "enter a", "enter a"], "enter a"),
    ("freed", 1, ["enter a", "leave a", "enter a"], None),
]


@pytest.mark.parametrize(("limit", "steps", "refused"), [c[1:] for c in STEPS], ids=[c[0] for c in STEPS])
def test_tenant_inflight_table(limit: int, steps: list[str], refused: str | None) -> None:
    bound = TenantInflight(limit, retry_after=0.5)
    got = None
    for step in steps:
        verb, tenant = step.split()
        try:
            bound.enter(tenant) if verb == "enter" else bound.leave(tenant)
        except Overloaded as exc:
            assert exc.retry_after == 0.5
            got = step
    assert got == refused


def test_a_zero_tenant_limit_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        TenantInflight(0, 1.0)
    assert info.value.key == "limits.max_inflight_per_tenant"
