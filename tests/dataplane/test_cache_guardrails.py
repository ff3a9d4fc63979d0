"""The response cache behind the guardrail hooks: an answer from the cache is checked like any other.

A real proxy, a fake replica and the reference hook (tools.guardrail) over
gRPC. The cache is kept ahead of the tier queue but after the prompt hooks,
and what it keeps is the replica's answer before the output hooks: a hit is
checked by them again (redacted the same way), and a prompt the hook denies
is refused before the cache is asked.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from agent.replica.tensors import SAMPLING_INPUTS
from ferry.config import GuardrailConfig
from tests.dataplane.conftest import PAID, Rig, request
from tests.dataplane.fakes import Behaviour, route, snapshot
from tools.guardrail import Classifier, serve

pytestmark = pytest.mark.timeout(30)

CACHE = {"cache_min_requests": 2, "cache_enable_above": 0.0, "cache_disable_below": 0.0}


@pytest.fixture
async def hooked(rig: Any) -> AsyncIterator[tuple[Rig, Classifier]]:
    classifier = Classifier(("forbidden",), ("r1w2",))
    server, port = await serve(classifier, "127.0.0.1:0")
    guards = [GuardrailConfig(name="kw", address=f"127.0.0.1:{port}", timeout_ms=5000.0, stage=stage)
              for stage in ("prompt", "output")]
    r = await rig({"r1": Behaviour()}, settings=CACHE, guardrails=guards)
    routed = route(r.replicas["r1"])
    routed.inputs.extend(SAMPLING_INPUTS)  # the replica accepts temperature
    r.cp.push(snapshot(2, [routed]))
    assert (await r.cp.next_ack()).applied
    try:
        yield r, classifier
    finally:
        await server.stop(0)


async def test_an_answer_from_the_cache_passes_the_output_hooks_again(hooked: Any) -> None:
    r, classifier = hooked
    replies = [await r.stub.Infer(request(max_tokens=4, temperature=0.0), metadata=PAID, timeout=5)
               for _ in range(3)]
    assert r.served() == {"r1": 2}  # the third was answered from the cache
    assert [reply.replica_id for reply in replies] == ["r1", "r1", ""]
    assert {reply.text for reply in replies} == {"r1w0 r1w1 [redacted] r1w3"}
    assert classifier.verdicts["redact"] == 3  # the hit was checked too


async def test_a_denied_prompt_is_refused_before_the_cache_is_asked(hooked: Any) -> None:
    r, _ = hooked
    for _ in range(3):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await r.stub.Infer(request(prompt="a forbidden thing", temperature=0.0), metadata=PAID, timeout=5)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert r.served() == {"r1": 0}
    assert r.proxy is not None and r.proxy._usage_report().cache == []  # never measured, never kept


async def test_a_replayed_stream_is_released_in_the_same_checked_windows(rig: Any) -> None:
    classifier = Classifier((), ("r1c2",))
    server, port = await serve(classifier, "127.0.0.1:0")
    try:
        guards = [GuardrailConfig(name="kw", address=f"127.0.0.1:{port}", timeout_ms=5000.0, stage="output",
                                  every_tokens=2)]
        r = await rig({"r1": Behaviour(chunks=6)}, settings=CACHE, guardrails=guards)
        routed = route(r.replicas["r1"])
        routed.inputs.extend(SAMPLING_INPUTS)
        r.cp.push(snapshot(2, [routed]))
        assert (await r.cp.next_ack()).applied

        async def chunks() -> tuple[list[tuple[str, int]], str]:
            out, replica = [], "?"
            async for chunk in r.stub.InferStream(request(max_tokens=6, temperature=0.0), metadata=PAID, timeout=5):
                if chunk.final:
                    replica = chunk.summary.replica_id
                else:
                    out.append((chunk.text, chunk.tokens))
            return out, replica

        # the second turns the cache on as it ends (a stream is taped only if the cache was on when it began),
        # the third is kept, the fourth replayed
        runs = [await chunks() for _ in range(4)]
        assert [replica for _, replica in runs] == ["r1", "r1", "r1", ""]
        assert runs[0][0] == runs[2][0] == runs[3][0]  # the same checked windows, the same redaction
        assert any("[redacted]" in text for text, _ in runs[3][0])
        assert r.served() == {"r1": 3} and classifier.verdicts["redact"] == 4
    finally:
        await server.stop(0)
