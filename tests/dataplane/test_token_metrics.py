"""Token metrics at the proxy: prompt, generation and cached prompt tokens, time per output token, build info.

A real proxy in process over loopback, fake control plane and replicas;
each test reads the proxy's own registry after its requests returned.
"""

from __future__ import annotations

import platform
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

import ferry
from ferry.metrics import register_build_info
from tests.dataplane.conftest import PAID, request
from tests.dataplane.fakes import Behaviour

pytestmark = pytest.mark.timeout(20)
LABELS = {"model": "m", "tier": "interactive"}


async def test_unary_requests_add_their_tokens(rig: Any) -> None:
    r = await rig({"r1": Behaviour()})
    for _ in range(2):
        reply = await r.stub.Infer(request(prompt="one two three four", max_tokens=3), metadata=PAID, timeout=5)
        assert (reply.prompt_tokens, reply.completion_tokens, reply.cached_prompt_tokens) == (4, 3, 1)
    m = r.proxy.metrics
    assert m.value("proxy_prompt_tokens_total", **LABELS) == 8
    assert m.value("proxy_generation_tokens_total", **LABELS) == 6
    assert m.value("proxy_cached_prompt_tokens_total", **LABELS) == 2  # what the replica reported
    assert m.value("proxy_tpot_seconds_count", **LABELS) == 0  # a unary answer has no inter-token time
    assert m.value("proxy_ttft_seconds_count", **LABELS) == 2


async def test_streams_add_tokens_and_time_per_output_token(rig: Any) -> None:
    r = await rig({"r1": Behaviour(chunks=3)})
    chunks = [c async for c in r.stub.InferStream(request(prompt="a b", max_tokens=3), metadata=PAID, timeout=5)]
    summary = chunks[-1].summary
    assert summary.completion_tokens == 3
    m = r.proxy.metrics
    assert m.value("proxy_prompt_tokens_total", **LABELS) == 2
    assert m.value("proxy_generation_tokens_total", **LABELS) == 3
    assert m.value("proxy_tpot_seconds_count", **LABELS) == 1
    assert 0 <= m.value("proxy_tpot_seconds_sum", **LABELS) <= m.value("proxy_request_duration_seconds_sum",
                                                                         **LABELS)


async def test_a_replica_that_reports_nothing_adds_no_cached_tokens(rig: Any) -> None:
    r = await rig({"r1": Behaviour(report=False)})
    await r.stub.Infer(request(prompt="one two three", max_tokens=2), metadata=PAID, timeout=5)
    m = r.proxy.metrics
    assert m.value("proxy_prompt_tokens_total", **LABELS) == 3  # the proxy's own count
    assert m.value("proxy_generation_tokens_total", **LABELS) == 2
    assert m.value("proxy_cached_prompt_tokens_total", **LABELS) == 0


async def test_failed_requests_add_no_tokens(rig: Any) -> None:
    r = await rig({"r1": Behaviour(kind="fail")})
    with pytest.raises(grpc.aio.AioRpcError):
        await r.stub.Infer(request(prompt="one two", max_tokens=2), metadata=PAID, timeout=5)
    assert r.proxy.metrics.value("proxy_prompt_tokens_total", **LABELS) == 0


async def test_every_registry_carries_build_info(rig: Any) -> None:
    r = await rig({"r1": Behaviour()})
    labels = {"version": ferry.__version__, "python": platform.python_version()}
    assert r.proxy.metrics.value("build_info", **labels) == 1
    registry = CollectorRegistry()
    assert register_build_info(registry) is register_build_info(registry)  # once per registry
    assert registry.get_sample_value("ferry_build_info", labels) == 1
