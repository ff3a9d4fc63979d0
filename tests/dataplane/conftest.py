"""Fixtures for the proxy's tests: tenants and keys, in-process proxies, fake replicas and control planes.

GRPC_VERBOSITY=ERROR is set by tests/conftest.py for the whole suite.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from dataplane.config import ProxySettings
from dataplane.server import Proxy
from ferry.config import GuardrailConfig, ModelConfig, TenantConfig, hash_api_key
from ferry.tokens import Tokenizers
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tests.dataplane.fakes import Behaviour, FakeControlPlane, FakeReplica, route, snapshot

KEYS = {"paid": "key-paid-123", "free": "key-free-456"}
TENANTS = (
    TenantConfig(name="acme", api_key_sha256=hash_api_key(KEYS["paid"]), plan="paid"),
    TenantConfig(name="hobby", api_key_sha256=hash_api_key(KEYS["free"]), plan="free", tiers=("standard", "batch")),
)
PAID = (("x-api-key", KEYS["paid"]),)
FAST = {"reconnect_initial_seconds": 0.05, "reconnect_max_seconds": 0.2}


def request(**fields: Any) -> inference_pb2.InferRequest:
    """A valid interactive request for model ``m``, fields overridden."""
    base: dict[str, Any] = {"model": "m", "prompt": "hello there world", "max_tokens": 4,
                            "tier": common_pb2.TIER_INTERACTIVE}
    return inference_pb2.InferRequest(**{**base, **fields})


class Rig:
    """A proxy watching a fake control plane, fake replicas, and a client stub."""

    def __init__(self) -> None:
        self.replicas: dict[str, FakeReplica] = {}
        self.cp = FakeControlPlane()
        self.proxy: Proxy | None = None
        self.channel: grpc.aio.Channel | None = None
        self.stub: Any = None

    async def start(self, behaviours: dict[str, Behaviour], *, settings: dict[str, Any] | None = None,
                    loads: dict[str, dict[str, Any]] | None = None, tokenizers: Tokenizers | None = None,
                    guardrails: Sequence[GuardrailConfig] = (), models: Sequence[ModelConfig] = ()) -> Rig:
        for rid, behaviour in behaviours.items():
            self.replicas[rid] = await FakeReplica(rid, behaviour).start()
        routes = [route(r, **(loads or {}).get(rid, {})) for rid, r in self.replicas.items()]
        self.cp.current = snapshot(1, routes, extra_models=("empty",))
        await self.cp.start()
        proxy_settings = ProxySettings.from_section({"proxy_id": "p-test", **FAST, **(settings or {})})
        self.proxy = Proxy(settings=proxy_settings, tenants=TENANTS, control_planes=[self.cp.address],
                           registry=CollectorRegistry(), rng=random.Random(7), tokenizers=tokenizers,
                           guardrails=guardrails, models=models)
        port = await self.proxy.start("127.0.0.1:0")
        ack = await self.cp.next_ack()
        assert ack.applied, ack.error
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.stub = inference_pb2_grpc.InferenceStub(self.channel)
        return self

    async def stop(self) -> None:
        if self.channel is not None:
            await self.channel.close()
        if self.proxy is not None:
            await self.proxy.stop(0)
        await self.cp.stop()
        for replica in self.replicas.values():
            await replica.stop()

    def served(self) -> dict[str, int]:
        """Requests each fake replica received."""
        return {rid: len(r.requests) for rid, r in self.replicas.items()}


@pytest.fixture
async def rig() -> AsyncIterator[Callable[..., Awaitable[Rig]]]:
    rigs: list[Rig] = []

    async def make(behaviours: dict[str, Behaviour], **kwargs: Any) -> Rig:
        r = Rig()
        rigs.append(r)
        return await r.start(behaviours, **kwargs)

    yield make
    for r in rigs:
        await r.stop()
