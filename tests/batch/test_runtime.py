"""The asyncio runtime: batches on simulated GPUs, a GPU killed mid-batch, failing backends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from agent.batch.batcher import QueueFull
from agent.batch.dispatch import ModelContract
from agent.batch.gpusched import SchedulerConfig
from agent.batch.reference import transform
from agent.batch.runtime import BatchRuntime, HostedModel
from ferry.errors import NoReplica, ReplicaFailed, Unavailable
from tests.batch.fakes import GatedBackend, async_backend, broken_backend

pytestmark = pytest.mark.timeout(30)


@asynccontextmanager
async def runtime(fn: Callable[[list[str]], Any], *, gpus: int = 2, max_batch: int = 4, max_wait_s: float = 30.0,
                  max_pending: int = 100) -> AsyncIterator[BatchRuntime]:
    contract = ModelContract(name="m", max_batch=max_batch, max_wait_s=max_wait_s, max_pending=max_pending)
    rt = BatchRuntime([HostedModel(contract, fn)], SchedulerConfig(gpus=gpus))
    await rt.start()
    try:
        yield rt
    finally:
        if isinstance(fn, GatedBackend):
            fn.gate.set()
        await rt.stop()


async def test_gpu_killed_mid_batch_every_request_answered_once() -> None:
    backend = GatedBackend()
    async with runtime(backend, gpus=2, max_batch=4) as rt:
        texts = [f"r{i}" for i in range(8)]
        calls = [asyncio.create_task(rt.infer("m", t)) for t in texts]
        await backend.wait_started(2)
        killed = backend.calls[0]
        report = rt.kill_gpu(0)
        assert report.batch_id == 1 and len(report.requeued) == 4 and report.failed == ()
        backend.gate.set()
        answers = await asyncio.gather(*calls)
        assert [a.text for a in answers] == [transform(t) for t in texts]
        assert rt.counters["m"].answered == 8 and rt.counters["m"].failed == 0
        assert rt.node.stats.requeued == 4 and rt.node.stats.flushes["retry"] == 1
        assert len(backend.calls) == 3 and backend.calls[2] == killed  # re-run once, same order
        assert {a.attempts for a in answers if a.text in {transform(t) for t in killed}} == {2}
        assert rt.node.scheduler.failed_gpus == (0,)


async def test_killing_the_last_gpu_makes_the_model_unavailable_until_restore() -> None:
    backend = GatedBackend()
    async with runtime(backend, gpus=1, max_batch=2, max_wait_s=0.0) as rt:
        calls = [asyncio.create_task(rt.infer("m", t)) for t in ("a", "b")]
        await backend.wait_started(1)
        report = rt.kill_gpu()
        assert report.unavailable == ("m",) and report.requeued == ()
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, NoReplica) for r in results)
        assert rt.model_status("m") == (False, "needs 1 GPUs per batch, 0 of 1 healthy on this node")
        backend.gate.set()
        assert rt.restore_gpu(0) and rt.model_status("m") == (True, "")
        assert (await rt.infer("m", "c")).text == transform("c")
        assert rt.node.stats.stale_results == 0 and rt.counters["m"].answered == 1


@pytest.mark.parametrize(
    ("fn", "error"),
    [pytest.param(broken_backend, ReplicaFailed, id="contract-broken"),
     pytest.param(lambda inputs: 1 / 0, ReplicaFailed, id="backend-raises")],
)
async def test_a_failing_backend_fails_its_batch_not_the_runtime(fn: Callable[[list[str]], Any],
                                                                  error: type[Exception]) -> None:
    async with runtime(fn, max_batch=2) as rt:
        results = await asyncio.gather(rt.infer("m", "a"), rt.infer("m", "b"), return_exceptions=True)
        assert all(isinstance(r, error) for r in results)
        assert rt.node.scheduler.failed_gpus == () and not rt.node.in_flight()


async def test_coroutine_backend_and_time_flush() -> None:
    async with runtime(async_backend, max_batch=100, max_wait_s=0.0) as rt:
        answer = await rt.infer("m", "abc")
        assert answer.text == transform("abc") and answer.attempts == 1
        assert rt.node.stats.flushes["time"] == 1


async def test_cancelled_pending_request_leaves_the_queue() -> None:
    async with runtime(async_backend, max_batch=10) as rt:
        call = asyncio.create_task(rt.infer("m", "x"))
        await asyncio.sleep(0)
        assert rt.node.pending("m") == 1
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert rt.node.pending("m") == 0


async def test_paid_request_evicts_a_free_one_when_full() -> None:
    backend = GatedBackend()
    async with runtime(backend, gpus=1, max_batch=1, max_pending=1, max_wait_s=0.0) as rt:
        running = asyncio.create_task(rt.infer("m", "first"))
        await backend.wait_started(1)
        free = asyncio.create_task(rt.infer("m", "free", plan="free"))
        await asyncio.sleep(0)
        paid = asyncio.create_task(rt.infer("m", "paid", plan="paid"))
        with pytest.raises(QueueFull):
            await free
        with pytest.raises(QueueFull):
            await rt.infer("m", "another", plan="paid")
        backend.gate.set()
        assert (await running).text == transform("first")
        assert (await paid).text == transform("paid")


async def test_stop_fails_waiting_requests() -> None:
    rt = BatchRuntime([HostedModel(ModelContract(name="m", max_wait_s=30.0), async_backend)], SchedulerConfig())
    await rt.start()
    call = asyncio.create_task(rt.infer("m", "x"))
    await asyncio.sleep(0)
    await rt.stop()
    with pytest.raises(Unavailable):
        await call
    with pytest.raises(Unavailable):
        await rt.infer("m", "y")
