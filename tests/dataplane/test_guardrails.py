"""Guardrail hooks on the request path: a real proxy, fake replicas and the reference hook (tools.guardrail) over gRPC.

Prompt hooks: a denied prompt is PERMISSION_DENIED with the hook's reason and
never reaches a replica; a redacted prompt reaches it redacted; a hook that
is late follows ``on_error`` (open: answered; closed: UNAVAILABLE naming the
hook); the replica's deadline is what the hook left. Output hooks: a unary
answer redacted; a stream released a checked window at a time with its
chunking, redacted in place, or stopped PERMISSION_DENIED at the denied
window; the hooks' time is in the metrics and the usage report.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from dataplane.guard.hooks import NONE, selected, settle
from ferry.config import GuardrailConfig, parse
from ferry.errors import ConfigError
from ferry.v1 import guardrail_pb2
from tests.dataplane.conftest import PAID, Rig, request
from tests.dataplane.fakes import Behaviour
from tools.guardrail import Classifier, serve

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def hook() -> AsyncIterator[Callable[..., Awaitable[tuple[Classifier, str]]]]:
    servers: list[Any] = []

    async def make(deny: tuple[str, ...] = (), redact: tuple[str, ...] = (), delay: float = 0.0) -> tuple[
            Classifier, str]:
        classifier = Classifier(deny, redact, delay=delay)
        server, port = await serve(classifier, "127.0.0.1:0")
        servers.append(server)
        return classifier, f"127.0.0.1:{port}"

    yield make
    for server in servers:
        await server.stop(0)


def guard(address: str, **fields: Any) -> GuardrailConfig:
    return GuardrailConfig(**{"name": "kw", "address": address, "timeout_ms": 5000.0, **fields})


def verdicts(rig: Rig, stage: str, verdict: str) -> float:
    assert rig.proxy is not None
    return float(rig.proxy.metrics.guard_verdicts.labels("kw", stage, verdict)._value.get())


async def test_a_denied_prompt_is_refused_with_the_reason_and_never_reaches_a_replica(rig: Any, hook: Any) -> None:
    classifier, address = await hook(deny=("forbidden",))
    r = await rig({"r1": Behaviour()}, guardrails=[guard(address)])
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await r.stub.Infer(request(prompt="a forbidden thing"), metadata=PAID, timeout=5)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert info.value.details() == "guardrail 'kw' refused the prompt: matched deny rule 1"
    with pytest.raises(grpc.aio.AioRpcError) as streamed:
        async for _ in r.stub.InferStream(request(prompt="FORBIDDEN too"), metadata=PAID, timeout=5):
            pass
    assert streamed.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert r.served() == {"r1": 0}
    reply = await r.stub.Infer(request(prompt="a fine thing"), metadata=PAID, timeout=5)
    assert reply.completion_tokens == 4 and r.served() == {"r1": 1}
    assert classifier.verdicts == {"deny": 2, "allow": 1}
    assert verdicts(r, "prompt", "deny") == 2 and verdicts(r, "prompt", "allow") == 1


async def test_a_redacted_prompt_reaches_the_replica_redacted(rig: Any, hook: Any) -> None:
    _, address = await hook(redact=(r"\d{3}-\d{4}",))
    r = await rig({"r1": Behaviour()}, guardrails=[guard(address)])
    await r.stub.Infer(request(prompt="call 555-0199 now"), metadata=PAID, timeout=5)
    (sent,) = r.replicas["r1"].requests
    assert b"call [redacted] now" in sent.raw_input_contents[0]
    assert verdicts(r, "prompt", "redact") == 1


@pytest.mark.parametrize("on_error", ["open", "closed"])
async def test_a_late_hook_follows_on_error(rig: Any, hook: Any, on_error: str) -> None:
    _, address = await hook(delay=1.0)
    r = await rig({"r1": Behaviour()}, guardrails=[guard(address, timeout_ms=50.0, on_error=on_error)])
    if on_error == "open":
        reply = await r.stub.Infer(request(), metadata=PAID, timeout=5)
        assert reply.completion_tokens == 4
        assert verdicts(r, "prompt", "failed_open") == 1
        return
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await r.stub.Infer(request(), metadata=PAID, timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert info.value.details() == "guardrail 'kw' (prompt) failed: no answer within 50 ms; on_error is closed"
    assert r.served() == {"r1": 0} and verdicts(r, "prompt", "failed_closed") == 1


async def test_the_replica_gets_the_deadline_the_prompt_hook_left(rig: Any, hook: Any) -> None:
    _, slow = await hook(delay=0.6)
    r = await rig({"r1": Behaviour()}, guardrails=[guard(slow, timeout_ms=2000.0)])
    await r.stub.Infer(request(), metadata=PAID, timeout=3)
    (left,) = r.replicas["r1"].deadlines
    assert left is not None and left < 3 - 0.5  # the hook's 0.6 s came out of the request's 3 s (less rounding)
    assert r.proxy is not None
    seconds = r.proxy.router.usage.report(1e9).usage[0].guard_seconds
    assert seconds >= 0.6  # the usage report (ferryctl top's guard_ms) carries the hook's time


async def test_a_unary_answer_is_checked_and_redacted(rig: Any, hook: Any) -> None:
    _, address = await hook(redact=("r1w2",))
    r = await rig({"r1": Behaviour()}, guardrails=[guard(address, stage="output")])
    reply = await r.stub.Infer(request(max_tokens=4), metadata=PAID, timeout=5)
    assert reply.text == "r1w0 r1w1 [redacted] r1w3" and reply.completion_tokens == 4


async def test_a_stream_is_released_a_checked_window_at_a_time(rig: Any, hook: Any) -> None:
    classifier, address = await hook(redact=("r1c2",))
    r = await rig({"r1": Behaviour(chunks=6)}, guardrails=[guard(address, stage="output", every_tokens=2)])
    chunks = [c async for c in r.stub.InferStream(request(max_tokens=6), metadata=PAID, timeout=5)]
    texts = [c.text for c in chunks if not c.final]
    # Windows of two tokens: the allowed ones keep their chunks; the redacted one is one chunk of two tokens.
    assert texts == ["r1c0 ", "r1c1 ", "[redacted] r1c3 ", "r1c4 ", "r1c5 "]
    assert [c.tokens for c in chunks if not c.final] == [1, 1, 2, 1, 1]
    assert chunks[-1].final and chunks[-1].summary.completion_tokens == 6
    assert classifier.verdicts == {"allow": 3, "redact": 1}  # three windows and the empty final one


async def test_a_denied_window_stops_the_stream_there(rig: Any, hook: Any) -> None:
    _, address = await hook(deny=("r1c3",))
    r = await rig({"r1": Behaviour(chunks=6)}, guardrails=[guard(address, stage="output", every_tokens=2)])
    got: list[str] = []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for chunk in r.stub.InferStream(request(max_tokens=6), metadata=PAID, timeout=5):
            got.append(chunk.text)
    assert got == ["r1c0 ", "r1c1 "]  # the window with r1c3 was withheld
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "guardrail 'kw' refused the output" in (info.value.details() or "")
    assert verdicts(r, "output", "deny") == 1


async def test_hooks_apply_to_their_models_and_tiers_only(rig: Any, hook: Any) -> None:
    classifier, address = await hook(deny=("hello",))
    r = await rig({"r1": Behaviour()}, guardrails=[guard(address, tiers=("batch",))])
    reply = await r.stub.Infer(request(), metadata=PAID, timeout=5)  # interactive: no hook
    assert reply.completion_tokens == 4 and not classifier.verdicts


def test_selection_and_verdicts_are_pure() -> None:
    prompt = guard("a:1", name="p", models=("m",))
    output = guard("a:1", name="o", stage="output", tiers=("batch",), every_tokens=8)
    wide = guard("a:1", name="w", stage="output", every_tokens=16)
    assert selected([prompt, output, wide], "m", "batch").prompt == (prompt,)
    assert selected([prompt, output, wide], "m", "batch").window == 8
    assert selected([prompt, output], "other", "interactive") == NONE
    deny = guardrail_pb2.CheckResponse(action=guardrail_pb2.GUARD_ACTION_DENY, reason="no")
    redact = guardrail_pb2.CheckResponse(action=guardrail_pb2.GUARD_ACTION_REDACT, text="x")
    assert settle(prompt, "t", deny).verdict == "deny"
    assert settle(prompt, "t", redact).text == "x"
    assert settle(prompt, "t", guardrail_pb2.CheckResponse()).verdict == "allow"  # unspecified reads as allow
    assert settle(prompt, "t", None, "late").verdict == "failed_closed"
    assert settle(guard("a:1", on_error="open"), "t", None, "late").verdict == "failed_open"


@pytest.mark.parametrize(("entry", "field"), [
    ({"name": "g", "address": "a:1", "stage": "during"}, "guardrails.g.stage"),
    ({"name": "g", "address": "a:1", "on_error": "maybe"}, "guardrails.g.on_error"),
    ({"name": "g", "address": "a:1", "timeout_ms": 0}, "guardrails.g.timeout_ms"),
    ({"name": "g", "address": "a:1", "every_tokens": 0}, "guardrails.g.every_tokens"),
    ({"name": "g", "address": "a:1", "tiers": ["gold"]}, "guardrails.g.tiers"),
    ({"name": "g", "address": ""}, "guardrails.g.address"),
    ({"name": "g", "address": "a:1", "colour": "red"}, "guardrails[0].colour"),
])
def test_bad_guardrail_config_is_refused_naming_the_field(entry: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse({"guardrails": [entry]})
    assert info.value.key == field


def test_hook_names_are_unique_and_bounded() -> None:
    with pytest.raises(ConfigError, match="unique"):
        parse({"guardrails": [{"name": "g", "address": "a:1"}, {"name": "g", "address": "b:1"}]})
    with pytest.raises(ConfigError, match="at most 16"):
        parse({"guardrails": [{"name": f"g{i}", "address": "a:1"} for i in range(17)]})
