"""Replica failures to Ferry errors, retry policy, and the client pool's lifetime rules."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from tritonclient.utils import InferenceServerException

from dataplane.admission.limits import InflightLimit
from dataplane.failover.recover import retry_reason
from dataplane.forward.clients import ClientPool
from dataplane.forward.kserve import ForwardFailed, failure
from dataplane.pick.p2c import LocalLoad
from ferry.errors import DeadlineExceeded, NoReplica, Overloaded


def grpc_error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="boom")


FAILURES = [
    # id, exception, output started, kind (None: DeadlineExceeded), retryable
    ("unavailable", grpc_error(grpc.StatusCode.UNAVAILABLE), False, "unavailable", True),
    ("internal", grpc_error(grpc.StatusCode.INTERNAL), False, "internal", True),
    ("resource-exhausted", grpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED), False, "resource_exhausted", True),
    ("invalid-argument", grpc_error(grpc.StatusCode.INVALID_ARGUMENT), False, "invalid_argument", False),
    ("after-output", grpc_error(grpc.StatusCode.UNAVAILABLE), True, "unavailable", False),
    ("deadline", grpc_error(grpc.StatusCode.DEADLINE_EXCEEDED), False, None, False),
    ("client-exception", InferenceServerException("x", status="StatusCode.UNAVAILABLE"), False, "unavailable", True),
    ("client-deadline", InferenceServerException("x", status="StatusCode.DEADLINE_EXCEEDED"), False, None, False),
    ("stream-error-message", InferenceServerException("died"), False, "stream_error", True),
]


@pytest.mark.parametrize(("exc", "started", "kind", "retryable"), [f[1:] for f in FAILURES],
                         ids=[f[0] for f in FAILURES])
def test_failure_mapping(exc: BaseException, started: bool, kind: str | None, retryable: bool) -> None:
    error = failure("r1", exc, output_started=started)
    if kind is None:
        assert isinstance(error, DeadlineExceeded)
        return
    assert isinstance(error, ForwardFailed)
    assert (error.kind, error.retryable, error.output_started) == (kind, retryable, started)
    assert "r1" in str(error)


def failed(retryable: bool = True, started: bool = False) -> ForwardFailed:
    return ForwardFailed("r1", "unavailable", "x", output_started=started, retryable=retryable)


RETRY = [
    ("interactive-first-failure", failed(), "interactive", 1, "unavailable"),
    ("standard-not-retried", failed(), "standard", 1, None),
    ("attempts-used-up", failed(), "interactive", 2, None),
    ("not-retryable", failed(retryable=False), "interactive", 1, None),
    ("output-started", failed(started=True), "interactive", 1, None),
    ("not-a-replica-failure", NoReplica("m", "none"), "interactive", 1, None),
]


@pytest.mark.parametrize(("error", "tier", "attempts", "expect"), [r[1:] for r in RETRY], ids=[r[0] for r in RETRY])
def test_retry_policy(error, tier: str, attempts: int, expect: str | None) -> None:
    assert retry_reason(error, tier=tier, attempts=attempts, max_attempts=2, retry_tiers=("interactive",)) == expect


def test_inflight_limit_and_local_load_are_bounded() -> None:
    limit = InflightLimit(2, 1.5)
    limit.enter()
    limit.enter()
    with pytest.raises(Overloaded) as info:
        limit.enter()
    assert info.value.retry_after == 1.5
    limit.leave()
    limit.enter()
    load = LocalLoad()
    load.add("a")
    load.add("a")
    load.done("a")
    assert load.get("a") == 1 and len(load) == 1
    load.done("a")
    assert len(load) == 0 and load.get("a") == 0


class FakeClient:
    def __init__(self, address: str) -> None:
        self.address = address
        self.closed = asyncio.Event()

    async def close(self) -> None:
        self.closed.set()


async def test_pool_closes_clients_that_left_the_table_once_idle() -> None:
    made: dict[str, FakeClient] = {}

    def factory(address: str) -> FakeClient:
        made[address] = FakeClient(address)
        return made[address]

    pool = ClientPool(factory)
    pool.retain({"a:1", "b:1"})
    async with pool.use("a:1") as a, pool.use("b:1"):
        assert a is made["a:1"]
        pool.retain({"b:1"})  # a left the table while a call uses it: not closed yet
        assert not made["a:1"].closed.is_set() and pool.addresses() == {"a:1", "b:1"}
    await asyncio.wait_for(made["a:1"].closed.wait(), 1)
    assert pool.addresses() == {"b:1"}
    async with pool.use("c:1"):  # picked just before a table change: served, then closed
        pass
    await asyncio.wait_for(made["c:1"].closed.wait(), 1)
    async with pool.use("b:1") as b:
        assert b is made["b:1"]  # reused, not created again
    await pool.close()
    assert made["b:1"].closed.is_set() and len(pool) == 0
