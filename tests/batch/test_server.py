"""The KServe v2 server over loopback, driven by tritonclient's asyncio client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc.aio as triton
from tritonclient.grpc import InferInput
from tritonclient.utils import InferenceServerException

from agent.batch import metrics
from agent.batch.dispatch import ModelContract
from agent.batch.gpusched import SchedulerConfig
from agent.batch.reference import batchstring, transform
from agent.batch.runtime import BatchRuntime, HostedModel
from agent.batch.server import FAULT_MODEL, serve
from agent.scrape import get_text
from tests.batch.fakes import GatedBackend

pytestmark = pytest.mark.timeout(30)


@dataclass
class Served:
    runtime: BatchRuntime
    client: Any
    address: str


@asynccontextmanager
async def served(fn: Callable[[list[str]], Any] = batchstring, *, gpus: int = 2, max_batch: int = 100,
                 max_wait_s: float = 30.0, max_pending: int = 2000, gang: bool = False,
                 allow_faults: bool = True) -> AsyncIterator[Served]:
    common = {"max_batch": max_batch, "max_wait_s": max_wait_s, "max_pending": max_pending}
    models = [HostedModel(ModelContract(name="batchstring", **common), fn)]  # type: ignore[arg-type]
    if gang:
        models.append(HostedModel(ModelContract(name="big", gpus_per_batch=gpus, **common), fn))  # type: ignore[arg-type]
    runtime = BatchRuntime(models, SchedulerConfig(gpus=gpus))
    await runtime.start()
    server, port = await serve(runtime, "127.0.0.1:0", allow_faults=allow_faults)
    client = triton.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        yield Served(runtime, client, f"127.0.0.1:{port}")
    finally:
        if isinstance(fn, GatedBackend):
            fn.gate.set()
        await client.close()
        await server.stop(grace=None)
        await runtime.stop()


def text_input(text: str) -> InferInput:
    tensor = InferInput("text_input", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
    return tensor


async def infer(client: Any, text: str, model: str = "batchstring", **params: str) -> str:
    result = await client.infer(model, [text_input(text)], parameters=params or None)
    return str(result.as_numpy("text_output")[0][0].decode())


async def test_unary_infer_of_the_reference_backend() -> None:
    async with served(max_wait_s=0.0) as s:
        assert await s.client.is_server_live() and await s.client.is_server_ready()
        assert await s.client.is_model_ready("batchstring")
        result = await s.client.infer("batchstring", [text_input("hello")], request_id="req-1",
                                      parameters={"ferry_tenant": "acme", "ferry_plan": "free"})
        assert result.as_numpy("text_output").tolist() == [[transform("hello").encode()]]
        response = result.get_response()
        assert response.id == "req-1"
        assert response.parameters["ferry_service_seconds"].double_param >= 0.1  # one 100 ms batch
        stats = (await s.client.get_inference_statistics("batchstring")).model_stats[0]
        assert stats.inference_count == 1 and stats.execution_count == 1


async def test_concurrent_requests_are_batched_full() -> None:
    async with served(gpus=2, max_batch=100, max_wait_s=30.0) as s:
        texts = [f"req-{i}" for i in range(200)]
        answers = await asyncio.gather(*(infer(s.client, t, ferry_tenant=f"t{i % 7}") for i, t in enumerate(texts)))
        assert answers == [transform(t) for t in texts]
        stats = s.runtime.node.stats
        assert (stats.batches, stats.dispatched, dict(stats.flushes)) == (2, 200, {"size": 2})
        assert stats.mean_fill == 100


async def test_gpu_killed_mid_batch_every_request_answered_exactly_once() -> None:
    backend = GatedBackend()
    async with served(backend, gpus=2, max_batch=100) as s:
        texts = [f"q{i}" for i in range(200)]
        calls = [asyncio.create_task(infer(s.client, t)) for t in texts]
        await backend.wait_started(2)
        report = json.loads(await infer(s.client, "kill 0", FAULT_MODEL))
        assert report == {"gpu": 0, "batch_id": 1, "model": "batchstring", "requeued": 100, "failed": 0,
                          "unavailable": []}
        backend.gate.set()
        answers = await asyncio.gather(*calls)
        assert answers == [transform(t) for t in texts]
        counters, stats = s.runtime.counters["batchstring"], s.runtime.node.stats
        assert (counters.answered, counters.failed) == (200, 0)
        assert (stats.requeued, stats.completed, stats.stale_results) == (100, 200, 0)
        assert len(backend.calls) == 3 and backend.calls[2] == backend.calls[0]  # re-run at the head, in order


async def test_gang_model_unavailable_after_a_gpu_dies_small_model_keeps_serving() -> None:
    async with served(gpus=2, max_wait_s=0.0, gang=True) as s:
        assert await infer(s.client, "big one", "big") == transform("big one")
        await infer(s.client, "kill 1", FAULT_MODEL)
        assert not await s.client.is_model_ready("big")
        index = {m.name: (m.state, m.reason) for m in (await s.client.get_model_repository_index()).models}
        assert index["big"][0] == "UNAVAILABLE" and "1 of 2 healthy" in index["big"][1]
        with pytest.raises(InferenceServerException) as exc:
            await infer(s.client, "x", "big")
        assert exc.value.status() == "StatusCode.UNAVAILABLE"
        assert await infer(s.client, "small", "batchstring") == transform("small")
        assert json.loads(await infer(s.client, "restore 1", FAULT_MODEL)) == {"gpu": 1, "restored": True}
        assert await s.client.is_model_ready("big")


@pytest.mark.parametrize(
    ("model", "text", "params", "allow_faults", "status"),
    [
        pytest.param("nope", "x", {}, True, "NOT_FOUND", id="unknown-model"),
        pytest.param("batchstring", "x", {"ferry_plan": "gold"}, True, "INVALID_ARGUMENT", id="unknown-plan"),
        pytest.param("batchstring", "x", {"ferry_tenant": "t" * 200}, True, "INVALID_ARGUMENT", id="long-tenant"),
        pytest.param(FAULT_MODEL, "kill", {}, False, "PERMISSION_DENIED", id="faults-off"),
        pytest.param(FAULT_MODEL, "kill 9", {}, True, "INVALID_ARGUMENT", id="no-such-gpu"),
        pytest.param(FAULT_MODEL, "explode", {}, True, "INVALID_ARGUMENT", id="unknown-fault"),
    ],
)
async def test_refusals_map_to_statuses(model: str, text: str, params: dict[str, str], allow_faults: bool,
                                        status: str) -> None:
    async with served(max_wait_s=0.0, allow_faults=allow_faults) as s:
        with pytest.raises(InferenceServerException) as exc:
            await infer(s.client, text, model, **params)
        assert exc.value.status() == f"StatusCode.{status}"


async def test_full_queue_is_resource_exhausted() -> None:
    backend = GatedBackend()
    async with served(backend, gpus=1, max_batch=1, max_pending=1, max_wait_s=0.0) as s:
        first = asyncio.create_task(infer(s.client, "a"))
        await backend.wait_started(1)
        second = asyncio.create_task(s.runtime.infer("batchstring", "b"))  # in-process: pending at once
        await asyncio.sleep(0)
        assert s.runtime.node.pending("batchstring") == 1
        with pytest.raises(InferenceServerException) as exc:
            await infer(s.client, "c")
        assert exc.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        backend.gate.set()
        assert [await first, (await second).text] == [transform("a"), transform("b")]


async def test_metadata_and_unimplemented_rpcs() -> None:
    async with served() as s:
        meta = await s.client.get_model_metadata("batchstring")
        assert [(t.name, t.datatype) for t in meta.inputs] == [("text_input", "BYTES")]
        assert [(t.name, t.datatype) for t in meta.outputs] == [("text_output", "BYTES")]
        with pytest.raises(InferenceServerException) as exc:
            await s.client.get_model_config("batchstring")
        assert exc.value.status() == "StatusCode.UNIMPLEMENTED"
        async with grpc.aio.insecure_channel(s.address) as channel:
            from tritonclient.grpc import service_pb2, service_pb2_grpc

            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as rpc:
                await stub.TraceSetting(service_pb2.TraceSettingRequest())
            assert rpc.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_metrics_endpoint_exposes_batch_metrics() -> None:
    async with served(max_wait_s=0.0) as s:
        await infer(s.client, "m")
        server, port = await metrics.serve("127.0.0.1:0", s.runtime.metrics)
        try:
            body = await get_text(f"http://127.0.0.1:{port}/metrics")
        finally:
            await server.cleanup()
    for name in ("nv_inference_pending_request_count", "ferry_batch_size_bucket", "ferry_batch_flushes_total",
                 "ferry_gpu_idle_drain_seconds_total", "ferry_gpus_in_use", "ferry_batch_running_requests",
                 "ferry_batch_aborted_total", "nv_gpu_utilization"):
        assert name in body, name
    assert 'ferry_batch_flushes_total{model="batchstring",reason="time"}' in body
    assert 'nv_inference_request_success{model="batchstring",version="1"} 1.0' in body
    assert 'ferry_batch_max_concurrency{model="batchstring",version="1"} 400.0' in body  # 2 batches x 100 x 2 GPUs


def proxy_request(text: str, model: str = "batchstring", **params: str) -> Any:
    """A ModelInferRequest shaped as the proxy sends it: text_input and max_tokens [1, 1], ferry_* parameters."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model, id="proxy-1")
    for name, datatype in (("text_input", "BYTES"), ("max_tokens", "INT32")):
        tensor = request.inputs.add()
        tensor.name, tensor.datatype = name, datatype
        tensor.shape.extend([1, 1])
    request.outputs.add().name = "text_output"
    data = text.encode()
    request.raw_input_contents.extend([len(data).to_bytes(4, "little") + data,
                                       np.array([[64]], dtype=np.int32).tobytes()])
    for key, value in {"ferry_tier": "interactive", "ferry_tenant": "acme", "ferry_plan": "free", **params}.items():
        request.parameters[key].string_param = value
    request.parameters["priority"].uint64_param = 1
    return request


async def test_accepts_the_proxys_request_and_ignores_max_tokens() -> None:
    from tritonclient.grpc import service_pb2_grpc

    async with served(max_wait_s=0.0) as s, grpc.aio.insecure_channel(s.address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response = await stub.ModelInfer(proxy_request("hello"), timeout=10)
        assert response.id == "proxy-1" and response.model_version == "1"
        assert response.raw_output_contents[0][4:].decode() == transform("hello")


async def test_queue_full_carries_retry_after_from_the_drain_rate() -> None:
    from tritonclient.grpc import service_pb2_grpc

    backend = GatedBackend()
    async with served(backend, gpus=1, max_batch=10, max_pending=50, max_wait_s=0.0) as s:
        first = asyncio.create_task(s.runtime.infer("batchstring", "first"))
        await backend.wait_started(1)  # the only GPU is busy: everything else waits
        waiting = [asyncio.create_task(s.runtime.infer("batchstring", f"w{i}")) for i in range(50)]
        await asyncio.sleep(0)
        assert s.runtime.node.pending("batchstring") == 50
        async with grpc.aio.insecure_channel(s.address) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as rpc:
                await stub.ModelInfer(proxy_request("refused", ferry_plan="paid"), timeout=10)
        assert rpc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        trailing = dict(rpc.value.trailing_metadata() or ())
        # nothing completed yet: the capacity drains it, 1 slot x 10 per 0.1 s = 100/s; 50 pending -> 0.5 s
        assert trailing["retry-after"] == "0.5"
        backend.gate.set()
        assert len(await asyncio.gather(first, *waiting)) == 51


async def test_version_is_the_runtimes() -> None:
    runtime = BatchRuntime([HostedModel(ModelContract(name="m", max_wait_s=0.0), batchstring)], SchedulerConfig(gpus=1),
                           version="v1")
    await runtime.start()
    server, port = await serve(runtime, "127.0.0.1:0")
    try:
        async with triton.InferenceServerClient(f"127.0.0.1:{port}") as client:
            assert await client.is_model_ready("m", "v1") and await client.is_model_ready("m")
            assert not await client.is_model_ready("m", "1")
            assert await infer(client, "x", "m") == transform("x")
    finally:
        await server.stop(grace=None)
        await runtime.stop()
