"""Stream continuity: a stream cut mid-way is continued on another replica, or ends saying what was delivered."""

from __future__ import annotations

import grpc
import pytest

from dataplane.failover.continuation import Delivered, continuable, continuation, cut_error, cut_message
from dataplane.forward.kserve import Call, ForwardFailed, Outcome, Piece
from ferry.errors import DeadlineExceeded, FerryError, Unavailable
from tests.dataplane.conftest import PAID, request
from tests.dataplane.fakes import Behaviour, parse

CALL = Call(request_id="q1", prompt=b"hello world", prompt_tokens=2, max_tokens=10, tier="interactive",
            priority=1, tenant="t", plan="paid")


def _cut(kind: str, *, started: bool = True, retryable: bool = False) -> ForwardFailed:
    return ForwardFailed("r1", kind, f"{kind.upper()}: boom", output_started=started, retryable=retryable)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (_cut("unavailable"), True),
        (_cut("internal"), True),
        (_cut("stream_error"), True),
        (_cut("cancelled"), True),
        (_cut("invalid_argument"), False),
        (_cut("bad_response", retryable=True, started=False), True),
        (DeadlineExceeded("late"), False),
    ],
    ids=["unavailable", "internal", "stream-error", "cancelled", "bad-request", "retryable-before-output", "deadline"],
)
def test_only_replica_failures_are_continued(error: FerryError, expected: bool) -> None:
    assert continuable(error) is expected


def test_the_continuation_resumes_after_the_delivered_tokens() -> None:
    delivered = Delivered()
    for text in ("x0", " x1", " x2"):
        delivered.add(Piece(text, 1))
    call = continuation(CALL, delivered)
    assert call is not None
    assert (call.prompt, call.prompt_tokens, call.max_tokens, call.request_id) == (
        b"hello worldx0 x1 x2", 5, 7, "q1-c1")
    last = Outcome(text=" y", prompt_tokens=5, completion_tokens=7)
    merged = delivered.merge(last, CALL)
    assert (merged.completion_tokens, merged.prompt_tokens) == (10, 2)
    assert "after 3 token(s) delivered" in cut_message(delivered, _cut("unavailable"), "no other replica")


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (DeadlineExceeded("deadline exceeded waiting for replica r1"), DeadlineExceeded),
        (_cut("unavailable"), Unavailable),
        (_cut("invalid_argument"), Unavailable),
    ],
    ids=["deadline-stays-deadline", "replica-failure", "request-error"],
)
def test_a_stream_that_cannot_continue_ends_with_the_code_of_its_cause(error: FerryError, expected: type) -> None:
    delivered = Delivered()
    delivered.add(Piece("x0", 1))
    cut = cut_error(delivered, error, "why")
    assert type(cut) is expected and "after 1 token(s) delivered" in str(cut)


def test_nothing_left_to_generate_needs_no_continuation() -> None:
    delivered = Delivered()
    delivered.add(Piece("all of it", 10))
    assert continuation(CALL, delivered) is None


async def test_a_stream_whose_replica_dies_is_continued_with_the_full_token_count(rig) -> None:
    r = await rig({"r1": Behaviour(kind="die", chunks=3), "r2": Behaviour(chunks=3)},
                  loads={"r1": {}, "r2": {"queued": 3}})
    chunks = [c async for c in r.stub.InferStream(request(max_tokens=3), metadata=PAID, timeout=5)]
    texts = [c.text for c in chunks if not c.final]
    assert texts == ["r1c0 ", "r2c0 ", "r2c1 "]
    summary = chunks[-1].summary
    assert chunks[-1].final and summary.completion_tokens == 3 and summary.replica_id == "r2"
    assert summary.attempts == 2
    prompt, max_tokens, _ = parse(r.replicas["r2"].requests[0])
    assert (prompt, max_tokens) == ("hello there worldr1c0 ", 2)
    assert r.proxy is not None
    metrics = r.proxy.metrics
    assert metrics.value("proxy_stream_continuations_total", model="m", outcome="continued") == 1


async def test_a_stream_with_no_replica_left_ends_unavailable_naming_the_tokens_delivered(rig) -> None:
    r = await rig({"r1": Behaviour(kind="die", chunks=3)})
    got: list[str] = []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for chunk in r.stub.InferStream(request(max_tokens=3), metadata=PAID, timeout=5):
            got.append(chunk.text)
    assert got == ["r1c0 "]
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "stream cut after 1 token(s) delivered" in info.value.details()


async def test_an_empty_retry_budget_cuts_the_stream(rig) -> None:
    r = await rig({"r1": Behaviour(kind="die", chunks=3), "r2": Behaviour(chunks=3)},
                  loads={"r1": {}, "r2": {"queued": 3}},
                  settings={"retry_budget_min_per_second": 0, "retry_budget_ratio": 0.0})
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in r.stub.InferStream(request(max_tokens=3), metadata=PAID, timeout=5):
            pass
    assert "retry budget exhausted" in info.value.details()
    assert r.served() == {"r1": 1, "r2": 0}


async def test_a_stream_outliving_its_deadline_ends_deadline_exceeded_not_unavailable(rig) -> None:
    # The proxy's deadline (its default, the client sends none) fires while the replica stalls mid-stream.
    r = await rig({"r1": Behaviour(kind="stall", chunks=3), "r2": Behaviour(chunks=3)},
                  loads={"r1": {}, "r2": {"queued": 3}}, settings={"default_deadline_seconds": 0.5})
    got: list[str] = []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for chunk in r.stub.InferStream(request(max_tokens=3), metadata=PAID):
            got.append(chunk.text)
    assert got == ["r1c0 "]
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert r.served()["r2"] == 0
