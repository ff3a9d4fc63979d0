"""Proxy and simulated replica agree on tokens and blocks when both use the model's tokenizer file.

The replica counts a prompt and cuts it into KV blocks with the same
tokenizer and the same chained hashes as the proxy's prefix blocks
(:meth:`ferry.tokens.Tokenizer.encode`), so the prefix the proxy routes by is
the prefix the engine caches; the cached tokens it reports are the model's
tokens, and the proxy's cached-token counter follows them.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from agent.replica.engine import Engine, EngineParams
from agent.replica.runner import EngineRunner
from agent.replica.server import SimulatedReplica
from dataplane.config import ProxySettings
from dataplane.intake.validate import validate_request
from dataplane.server import Proxy
from ferry.config import Limits
from ferry.tokens import BLOCK_TOKENS, Tokenizers
from ferry.v1 import inference_pb2_grpc
from tests.dataplane.conftest import FAST, PAID, TENANTS, Rig, request
from tests.dataplane.fakes import route, snapshot
from tests.test_tokens_hf import make_tokenizer

pytestmark = pytest.mark.timeout(30)
PROMPT = "hello, world! " * 300  # 1,200 tokens of the test tokenizer (600 words): 3 blocks of 512


@pytest.fixture
def tokenizers(tmp_path: Path) -> Tokenizers:
    return Tokenizers.load([("m", str(make_tokenizer(tmp_path / "tokenizer.json")))])


async def test_replica_blocks_are_the_proxys_blocks(tokenizers: Tokenizers) -> None:
    t = tokenizers.get("m")
    runner = EngineRunner(Engine(EngineParams()), tokenizer=t)
    seen: list[tuple[int, tuple[int, ...]]] = []

    def submit(prompt_tokens: int, max_tokens: int, hashes: tuple[int, ...], *answer: Any) -> Any:
        seen.append((prompt_tokens, hashes))
        return None

    runner.submit = submit  # type: ignore[method-assign]
    _, count = runner.submit_prompt(PROMPT, 4)
    valid = validate_request(request(prompt=PROMPT), Limits(), tokenizer=t)
    assert EngineParams().kv_block_tokens == BLOCK_TOKENS
    assert count == valid.prompt_tokens == 1200
    assert seen == [(1200, valid.prefix_hashes)] and len(valid.prefix_hashes) == 3


async def test_cached_tokens_are_the_models_tokens_end_to_end(tokenizers: Tokenizers) -> None:
    replica = await SimulatedReplica("m-kserve", "v1", replica_id="r1", tokenizer=tokenizers.get("m")).start()
    rig = Rig()
    try:
        rig.cp.current = snapshot(1, [route("r1", replica.address)])
        await rig.cp.start()
        registry = CollectorRegistry()
        rig.proxy = Proxy(settings=ProxySettings.from_section({"proxy_id": "p-blocks", **FAST}), tenants=TENANTS,
                          control_planes=[rig.cp.address], registry=registry, rng=random.Random(3),
                          tokenizers=tokenizers)
        port = await rig.proxy.start("127.0.0.1:0")
        assert (await rig.cp.next_ack()).applied
        rig.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stub = inference_pb2_grpc.InferenceStub(rig.channel)
        first = await stub.Infer(request(prompt=PROMPT, max_tokens=2), metadata=PAID, timeout=20)
        second = await stub.Infer(request(prompt=PROMPT, max_tokens=2), metadata=PAID, timeout=20)
        assert first.prompt_tokens == second.prompt_tokens == 1200
        assert first.cached_prompt_tokens == 0 and second.cached_prompt_tokens >= 2 * BLOCK_TOKENS
        labels = {"model": "m", "tier": "interactive"}
        assert rig.proxy.metrics.value("proxy_prompt_tokens_total", **labels) == 2400
        assert rig.proxy.metrics.value("proxy_cached_prompt_tokens_total", **labels) == second.cached_prompt_tokens
    finally:
        await rig.stop()
        await replica.stop()
