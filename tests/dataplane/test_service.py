"""The Inference servicer in process over loopback: fake control plane, fake KServe v2 replicas."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from ferry.v1 import common_pb2
from tests.dataplane.conftest import KEYS, PAID, request
from tests.dataplane.fakes import Behaviour, parse

pytestmark = pytest.mark.timeout(20)

# r1 looks idle and r2 busy, so with two candidates the first pick is always r1.
FIRST_R1 = {"r1": {}, "r2": {"queued": 3}}
INTERACTIVE, STANDARD = common_pb2.TIER_INTERACTIVE, common_pb2.TIER_STANDARD


async def eventually(condition: Callable[[], bool], within: float = 5.0) -> None:
    """Wait until ``condition()`` holds (polls the loop; for state that has no event)."""
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def collect(stub: Any, req: Any, **kw: Any) -> list[Any]:
    return [chunk async for chunk in stub.InferStream(req, **kw)]


async def test_unary_fills_the_response(rig) -> None:
    r = await rig({"r1": Behaviour()}, )
    call = r.stub.Infer(request(max_tokens=3), metadata=PAID, timeout=5)
    reply = await call
    assert reply.text == "r1w0 r1w1 r1w2" and reply.completion_tokens == 3 and reply.prompt_tokens == 3
    assert (reply.replica_id, reply.region, reply.model_version, reply.attempts) == ("r1", "local", "v1", 1)
    assert reply.cached_prompt_tokens == 1 and reply.service_seconds == 0.5
    assert reply.queue_seconds >= 0.25 and reply.ttft_seconds > 0
    assert dict(await call.initial_metadata())["x-request-id"] == reply.request_id
    sent = r.replicas["r1"].requests[0]
    assert sent.id == reply.request_id and sent.model_name == "m-kserve"
    assert parse(sent) == ("hello there world", 3, False)
    assert {k: sent.parameters[k].string_param for k in ("ferry_tier", "ferry_tenant", "ferry_plan")} == {
        "ferry_tier": "interactive", "ferry_tenant": "acme", "ferry_plan": "paid"}
    assert sent.parameters["priority"].uint64_param == 1
    m = r.proxy.metrics
    assert m.value("proxy_requests_total", model="m", tier="interactive", status="OK") == 1
    assert m.value("proxy_picks_total", model="m", branch="single") == 1
    assert m.value("proxy_telemetry_age_seconds_count") == 1


@pytest.mark.parametrize(
    ("given", "code"),
    [
        ("trace-42.a:b_c", None),
        ("x" * 64, None),
        ("x" * 65, grpc.StatusCode.INVALID_ARGUMENT),
        ("has space", grpc.StatusCode.INVALID_ARGUMENT),
        ("", grpc.StatusCode.INVALID_ARGUMENT),
    ],
    ids=["kept", "longest", "too-long", "bad-character", "empty"],
)
async def test_the_callers_request_id_reaches_the_replica_or_is_refused_by_name(rig, given: str, code) -> None:
    r = await rig({"r1": Behaviour()})
    call = r.stub.Infer(request(max_tokens=2), metadata=(*PAID, ("x-request-id", given)), timeout=5)
    if code is None:
        reply = await call
        assert reply.request_id == given and r.replicas["r1"].requests[0].id == given
        assert dict(await call.initial_metadata())["x-request-id"] == given
    else:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
        assert info.value.code() == code and "x-request-id" in (info.value.details() or "")
        assert r.served() == {"r1": 0}


async def test_stream_passes_chunks_then_a_summary(rig) -> None:
    r = await rig({"r1": Behaviour(chunks=4)})
    call = r.stub.InferStream(request(max_tokens=8), metadata=(("authorization", f"Bearer {KEYS['paid']}"),),
                              timeout=5)
    chunks = [c async for c in call]
    assert [c.text for c in chunks[:-1]] == ["r1c0 ", "r1c1 ", "r1c2 ", "r1c3 "]
    assert [c.tokens for c in chunks[:-1]] == [1, 1, 1, 1] and not any(c.final for c in chunks[:-1])
    final = chunks[-1]
    assert final.final and final.text == "" and final.summary.completion_tokens == 4
    assert final.summary.replica_id == "r1" and final.summary.attempts == 1 and final.summary.ttft_seconds > 0
    assert dict(await call.initial_metadata())["x-request-id"] == final.summary.request_id
    assert parse(r.replicas["r1"].requests[0])[2] is True  # the stream flag


async def test_a_real_triton_without_ferry_parameters_gets_measured_values(rig) -> None:
    r = await rig({"r1": Behaviour(report=False, chunks=3)})
    reply = await r.stub.Infer(request(prompt="a b c d e", max_tokens=5), metadata=PAID, timeout=5)
    assert reply.prompt_tokens == 5 and reply.completion_tokens == 5 and reply.cached_prompt_tokens == 0
    assert reply.service_seconds > 0
    chunks = await collect(r.stub, request(max_tokens=5), metadata=PAID, timeout=5)
    assert [c.tokens for c in chunks[:-1]] == [1, 1, 1] and chunks[-1].summary.completion_tokens == 3


async def test_stream_ends_with_the_replica_stream_when_no_final_flag_comes(rig) -> None:
    r = await rig({"r1": Behaviour(chunks=2, final_flag=False, report=False)})
    chunks = await collect(r.stub, request(), metadata=PAID, timeout=5)
    assert [c.text for c in chunks[:-1]] == ["r1c0 ", "r1c1 "] and chunks[-1].final


RETRIED = [
    ("unavailable", Behaviour(kind="fail", code=grpc.StatusCode.UNAVAILABLE), "unavailable"),
    ("internal", Behaviour(kind="fail", code=grpc.StatusCode.INTERNAL), "internal"),
    ("resource-exhausted", Behaviour(kind="fail", code=grpc.StatusCode.RESOURCE_EXHAUSTED), "resource_exhausted"),
]


@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize(("failing", "reason"), [c[1:] for c in RETRIED], ids=[c[0] for c in RETRIED])
async def test_interactive_failure_before_output_is_retried_elsewhere(rig, failing: Behaviour, reason: str,
                                                                      streaming: bool) -> None:
    r = await rig({"r1": failing, "r2": Behaviour()}, loads=FIRST_R1)
    if streaming:
        chunks = await collect(r.stub, request(), metadata=PAID, timeout=5)
        reply = chunks[-1].summary
        assert "".join(c.text for c in chunks[:-1]).startswith("r2c0")
    else:
        reply = await r.stub.Infer(request(), metadata=PAID, timeout=5)
    assert reply.replica_id == "r2" and reply.attempts == 2
    assert r.served() == {"r1": 1, "r2": 1}
    assert r.replicas["r1"].requests[0].id == r.replicas["r2"].requests[0].id == reply.request_id
    assert r.proxy.metrics.value("proxy_retries_total", model="m", reason=reason) == 1


@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "stream"])
async def test_unreachable_replica_is_retried(rig, streaming: bool) -> None:
    r = await rig({"r1": Behaviour(), "r2": Behaviour()}, loads=FIRST_R1)
    await r.replicas["r1"].stop()
    if streaming:
        reply = (await collect(r.stub, request(), metadata=PAID, timeout=5))[-1].summary
    else:
        reply = await r.stub.Infer(request(), metadata=PAID, timeout=5)
    assert reply.replica_id == "r2" and reply.attempts == 2


async def test_a_dead_node_costs_no_interactive_request(rig) -> None:
    # Both replicas of node "na" are gone; a retry must go to the other node, not to the dead twin.
    r = await rig({"a1": Behaviour(), "a2": Behaviour(), "b1": Behaviour()},
                  loads={"a1": {"node": "na"}, "a2": {"node": "na"}, "b1": {"node": "nb", "queued": 2}})
    await r.replicas["a1"].stop()
    await r.replicas["a2"].stop()
    replies = [await r.stub.Infer(request(), metadata=PAID, timeout=5) for _ in range(12)]
    assert {reply.replica_id for reply in replies} == {"b1"}
    assert max(reply.attempts for reply in replies) == 2


@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "stream"])
async def test_standard_tier_is_not_retried(rig, streaming: bool) -> None:
    r = await rig({"r1": Behaviour(kind="fail"), "r2": Behaviour()}, loads=FIRST_R1)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        if streaming:
            await collect(r.stub, request(tier=STANDARD), metadata=PAID, timeout=5)
        else:
            await r.stub.Infer(request(tier=STANDARD), metadata=PAID, timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "r1" in info.value.details()
    assert r.served() == {"r1": 1, "r2": 0}


async def test_bad_request_to_replica_is_not_retried(rig) -> None:
    r = await rig({"r1": Behaviour(kind="fail", code=grpc.StatusCode.INVALID_ARGUMENT), "r2": Behaviour()},
                  loads=FIRST_R1)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await r.stub.Infer(request(), metadata=PAID, timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and r.served() == {"r1": 1, "r2": 0}


async def test_retries_stop_after_max_attempts(rig) -> None:
    r = await rig({"r1": Behaviour(kind="fail"), "r2": Behaviour(kind="fail"), "r3": Behaviour(kind="fail")})
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await r.stub.Infer(request(), metadata=PAID, timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert sum(r.served().values()) == 2


@pytest.mark.parametrize("as_error_message", [False, True], ids=["aborted", "error-response"])
async def test_stream_dying_after_output_ends_with_unavailable_and_no_retry(rig, as_error_message: bool) -> None:
    # With continuations off (tests/dataplane/test_continuation.py covers them on).
    r = await rig({"r1": Behaviour(kind="die", chunks=4, die_with_error_message=as_error_message),
                   "r2": Behaviour()}, loads=FIRST_R1, settings={"max_continuations": 0})
    got: list[str] = []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for chunk in r.stub.InferStream(request(max_tokens=8), metadata=PAID, timeout=5):
            got.append(chunk.text)
    assert got == ["r1c0 "]
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "r1" in info.value.details()
    assert "after 1 token(s) delivered" in info.value.details()
    assert r.served() == {"r1": 1, "r2": 0}


async def test_client_deadline_gives_deadline_exceeded_and_frees_the_replica(rig) -> None:
    r = await rig({"r1": Behaviour(kind="hang")})
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await r.stub.Infer(request(), metadata=PAID, timeout=0.3)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.wait_for(r.replicas["r1"].cancelled.wait(), 5)


@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "stream"])
async def test_proxy_default_deadline_applies_without_a_client_deadline(rig, streaming: bool) -> None:
    r = await rig({"r1": Behaviour(kind="hang")}, settings={"default_deadline_seconds": 0.2})
    with pytest.raises(grpc.aio.AioRpcError) as info:
        if streaming:
            await collect(r.stub, request(), metadata=PAID)
        else:
            await r.stub.Infer(request(), metadata=PAID)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "deadline" in info.value.details()
    assert r.proxy.metrics.value("proxy_requests_total", model="m", tier="interactive",
                                 status="DEADLINE_EXCEEDED") == 1


@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "stream"])
async def test_client_cancel_reaches_the_replica(rig, streaming: bool) -> None:
    r = await rig({"r1": Behaviour(kind="hang")})
    if streaming:
        call = r.stub.InferStream(request(), metadata=PAID, timeout=10)
        task = asyncio.ensure_future(collect_call(call))
    else:
        call = r.stub.Infer(request(), metadata=PAID, timeout=10)
        task = asyncio.ensure_future(call)
    await asyncio.wait_for(r.replicas["r1"].received.wait(), 5)
    assert r.proxy.router.local_load.get("r1") == 1
    call.cancel()
    await asyncio.wait_for(r.replicas["r1"].cancelled.wait(), 5)
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: r.proxy.router.inflight == 0 and len(r.proxy.router.local_load) == 0)


async def collect_call(call: Any) -> list[Any]:
    return [c async for c in call]


async def test_over_max_inflight_gets_resource_exhausted_with_retry_after(rig) -> None:
    r = await rig({"r1": Behaviour(kind="hang")}, settings={"max_inflight": 1, "retry_after_seconds": 2.5})
    first = r.stub.Infer(request(), metadata=PAID, timeout=10)
    waiting = asyncio.ensure_future(first)
    await asyncio.wait_for(r.replicas["r1"].received.wait(), 5)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await r.stub.Infer(request(), metadata=PAID, timeout=5)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert float(dict(info.value.trailing_metadata())["retry-after"]) == 2.5
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


BAD = [
    # id, request fields, metadata, status, text the message must contain
    ("no-key", {}, (), "UNAUTHENTICATED", "x-api-key"),
    ("wrong-key", {}, (("x-api-key", "nope"),), "UNAUTHENTICATED", "unknown API key"),
    ("oversized-key", {}, (("x-api-key", "k" * 600),), "UNAUTHENTICATED", "x-api-key: the API key is longer"),
    ("no-model", {"model": ""}, PAID, "INVALID_ARGUMENT", "model"),
    ("long-model", {"model": "m" * 200}, PAID, "INVALID_ARGUMENT", "model"),
    ("long-version", {"version": "v" * 100}, PAID, "INVALID_ARGUMENT", "version"),
    ("unknown-tier", {"tier": 42}, PAID, "INVALID_ARGUMENT", "tier"),
    ("no-prompt", {"prompt": ""}, PAID, "INVALID_ARGUMENT", "prompt"),
    ("too-many-tokens", {"max_tokens": 10**6}, PAID, "INVALID_ARGUMENT", "max_tokens"),
    ("long-prefix-key", {"prefix_key": "p" * 300}, PAID, "INVALID_ARGUMENT", "prefix_key"),
    ("long-idempotency-key", {"idempotency_key": "k" * 300}, PAID, "INVALID_ARGUMENT", "idempotency_key"),
    ("tier-not-in-plan", {}, (("x-api-key", KEYS["free"]),), "PERMISSION_DENIED", "interactive"),
    ("unknown-model", {"model": "nope"}, PAID, "NOT_FOUND", "nope"),
    ("unknown-version", {"version": "v9"}, PAID, "NOT_FOUND", "v9"),
    ("no-ready-replica", {"model": "empty"}, PAID, "UNAVAILABLE", "empty"),
]


@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize(("fields", "metadata", "status", "named"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
async def test_bad_input_gets_its_status_naming_the_field(rig, fields: dict[str, Any], metadata: Any, status: str,
                                                          named: str, streaming: bool) -> None:
    r = await rig({"r1": Behaviour()})
    with pytest.raises(grpc.aio.AioRpcError) as info:
        if streaming:
            await collect(r.stub, request(**fields), metadata=metadata, timeout=5)
        else:
            await r.stub.Infer(request(**fields), metadata=metadata, timeout=5)
    assert info.value.code().name == status
    assert named in info.value.details()
    assert r.served() == {"r1": 0}
    assert KEYS["paid"] not in info.value.details()


async def test_failed_request_logs_one_json_line_without_key_or_prompt(rig, caplog) -> None:
    r = await rig({"r1": Behaviour(kind="fail")})
    with pytest.raises(grpc.aio.AioRpcError):
        await r.stub.Infer(request(prompt="secret words", tier=STANDARD), metadata=PAID, timeout=5)
    lines = [rec.getMessage() for rec in caplog.records if "request_failed" in rec.getMessage()]
    assert len(lines) == 1
    assert '"status": "UNAVAILABLE"' in lines[0] and '"replica_id": "r1"' in lines[0]
    assert "secret" not in lines[0] and KEYS["paid"] not in lines[0]


async def test_every_proxy_metric_is_exposed(rig) -> None:
    r = await rig({"r1": Behaviour()})
    await r.stub.Infer(request(), metadata=PAID, timeout=5)
    names = {metric.name for metric in r.proxy.metrics.registry.collect()}
    expected = {"requests", "request_duration_seconds", "ttft_seconds", "picks", "retries", "inflight",
                "table_version", "table_age_seconds", "table_rejections", "telemetry_age_seconds"}
    assert {f"ferry_proxy_{n}" for n in expected} <= names
    m = r.proxy.metrics
    assert m.value("proxy_table_version") == 1 and m.value("proxy_inflight") == 0
    assert 0 <= m.value("proxy_table_age_seconds") < 60
    assert m.value("proxy_ttft_seconds_count", model="m", tier="interactive") == 1


async def test_a_conversation_sticks_to_its_replica_and_the_branch_is_counted(rig) -> None:
    # Turns of one conversation (their first two blocks shared) go to one replica by affinity, whatever the proxy's
    # rng; the pick is counted under its branch.
    r = await rig({"r1": Behaviour(), "r2": Behaviour(), "r3": Behaviour()})
    head = " ".join(f"w{i}" for i in range(1100))  # two full 512-word blocks and a bit
    served = set()
    for turn in range(4):
        reply = await r.stub.Infer(request(prompt=f"{head} turn {turn} " + "x " * (40 * turn), max_tokens=2),
                                   metadata=PAID, timeout=5)
        served.add(reply.replica_id)
    assert len(served) == 1
    m = r.proxy.metrics
    assert m.value("proxy_picks_total", model="m", branch="affinity") == 4
