"""Ferry's conventions against a real Triton Inference Server (tritonserver 2.51, Python backend, CPU).

The server runs ``tools/triton/serve.py`` under ``.venv-triton``; these tests talk
to it from the main environment with ``tritonclient.grpc.aio`` as the proxy and
the agent will: health, repository index, metadata, unary and decoupled
streaming inference, statistics and Prometheus metrics, and a crash (SIGKILL).
"""

from __future__ import annotations

import asyncio
import signal
import struct
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tools.triton import textgen
from tools.triton.launch import TritonProcess, pid_alive

pytestmark = [pytest.mark.triton, pytest.mark.timeout(60)]

MODELS = {"batchstring", "llm", "llm-unary"}


@pytest.fixture
async def client(triton_server: TritonProcess) -> AsyncIterator[aioclient.InferenceServerClient]:
    c = aioclient.InferenceServerClient(url=triton_server.grpc)
    try:
        yield c
    finally:
        await c.close()


def bytes_input(name: str, values: list[str]) -> grpcclient.InferInput:
    arr = np.array([[v.encode()] for v in values], dtype=np.object_)
    tensor = grpcclient.InferInput(name, list(arr.shape), "BYTES")
    tensor.set_data_from_numpy(arr)
    return tensor


def llm_inputs(prompt: str, max_tokens: int, stream: bool | None = None) -> list[grpcclient.InferInput]:
    tokens = grpcclient.InferInput("max_tokens", [1, 1], "INT32")
    tokens.set_data_from_numpy(np.array([[max_tokens]], dtype=np.int32))
    inputs = [bytes_input("text_input", [prompt]), tokens]
    if stream is not None:
        flag = grpcclient.InferInput("stream", [1, 1], "BOOL")
        flag.set_data_from_numpy(np.array([[stream]], dtype=np.bool_))
        inputs.append(flag)
    return inputs


def text_of(result: grpcclient.InferResult) -> list[str]:
    out = result.as_numpy("text_output")
    return [] if out is None else [v.decode() for v in out.reshape(-1)]


async def batchstring(client: aioclient.InferenceServerClient, text: str) -> list[str]:
    return text_of(await client.infer("batchstring", [bytes_input("text_input", [text])], client_timeout=20))


async def statistics_once(
    client: aioclient.InferenceServerClient, model: str, done: Callable[[Any], bool], deadline_s: float = 5.0
) -> Any:
    """The model's statistics once ``done(stats)`` holds: Triton records them just after it sends the response."""
    end = time.monotonic() + deadline_s
    while True:
        stats = (await client.get_inference_statistics(model)).model_stats[0]
        if done(stats) or time.monotonic() > end:
            return stats
        await asyncio.sleep(0.02)  # poll interval of a bounded wait


async def fetch_metrics(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The Prometheus exposition at ``url`` as {family name: {sorted labels: value}}.

    Keyed by family: prometheus_client's parser names the samples of a counter
    ``<name>_total`` although Triton's lines carry no such suffix.
    """

    def get() -> str:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return str(resp.read().decode())

    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(await asyncio.to_thread(get)):
        for s in family.samples:
            samples.setdefault(family.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


async def test_server_live_and_ready(client: aioclient.InferenceServerClient, triton_server: TritonProcess) -> None:
    assert await client.is_server_live()
    assert await client.is_server_ready()
    for model in MODELS:
        assert await client.is_model_ready(model)
    meta = await client.get_server_metadata()
    assert meta.name == "triton"
    assert set(triton_server.models) == MODELS


async def test_repository_index_lists_the_models(client: aioclient.InferenceServerClient) -> None:
    index = await client.get_model_repository_index()
    assert {(m.name, m.state) for m in index.models} == {(m, "READY") for m in MODELS}


async def test_model_metadata_follows_the_llm_convention(client: aioclient.InferenceServerClient) -> None:
    def tensors(items) -> dict[str, tuple[str, list[int]]]:
        return {t.name: (t.datatype, list(t.shape)) for t in items}

    batch = await client.get_model_metadata("batchstring")
    assert batch.platform == "python"
    assert tensors(batch.inputs) == {"text_input": ("BYTES", [-1, 1])}
    assert tensors(batch.outputs) == {"text_output": ("BYTES", [-1, 1])}
    for name in ("llm", "llm-unary"):
        llm = await client.get_model_metadata(name)
        assert tensors(llm.inputs) == {
            "text_input": ("BYTES", [-1, 1]),
            "max_tokens": ("INT32", [-1, 1]),
            "stream": ("BOOL", [-1, 1]),
        }
        assert tensors(llm.outputs) == {"text_output": ("BYTES", [-1, 1])}
    llm_config = (await client.get_model_config("llm")).config
    assert llm_config.model_transaction_policy.decoupled
    batch_config = (await client.get_model_config("batchstring")).config
    assert batch_config.max_batch_size == 100
    assert batch_config.dynamic_batching.max_queue_delay_microseconds == 50_000


async def test_batchstring_batches_100_concurrent_requests_in_order(client: aioclient.InferenceServerClient) -> None:
    before = (await client.get_inference_statistics("batchstring")).model_stats[0]
    texts = [f"req-{i}" for i in range(100)]
    outputs = await asyncio.gather(*(batchstring(client, t) for t in texts))
    assert outputs == [[t.upper()] for t in texts]  # one output each, each its own
    after = await statistics_once(client, "batchstring", lambda s: s.inference_count >= before.inference_count + 100)
    inferences = after.inference_count - before.inference_count
    executions = after.execution_count - before.execution_count
    assert inferences == 100
    assert 1 <= executions < inferences  # Triton's dynamic batcher grouped them
    assert executions <= 10


async def test_batchstring_one_request_of_several_rows(client: aioclient.InferenceServerClient) -> None:
    texts = ["a", "bb", "ccc"]
    result = await client.infer("batchstring", [bytes_input("text_input", texts)], client_timeout=20)
    assert text_of(result) == ["A", "BB", "CCC"]


async def test_llm_streams_one_response_per_word_then_a_final_one(triton_server: TritonProcess) -> None:
    """Over the raw stub: tritonclient's asyncio ``stream_infer`` cannot ask for the empty final response."""
    words = textgen.generate_words("the quick brown fox", 6)

    def tensor(name: str, datatype: str, raw: bytes) -> tuple[service_pb2.ModelInferRequest.InferInputTensor, bytes]:
        return service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=[1, 1]), raw

    request = service_pb2.ModelInferRequest(model_name="llm", id="stream-1")
    prompt = b"the quick brown fox"
    for t, raw in (
        tensor("text_input", "BYTES", struct.pack("<I", len(prompt)) + prompt),
        tensor("max_tokens", "INT32", np.array([[6]], dtype=np.int32).tobytes()),
        tensor("stream", "BOOL", np.array([[True]], dtype=np.bool_).tobytes()),
    ):
        request.inputs.append(t)
        request.raw_input_contents.append(raw)
    request.parameters["triton_enable_empty_final_response"].bool_param = True

    async def requests() -> AsyncIterator[service_pb2.ModelInferRequest]:
        yield request

    chunks: list[str] = []
    finals: list[bool] = []
    async with grpc.aio.insecure_channel(triton_server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        async for message in stub.ModelStreamInfer(requests(), timeout=20):
            assert message.error_message == ""
            response = message.infer_response
            assert response.id == "stream-1"  # Triton echoes the request id
            finals.append(response.parameters["triton_final_response"].bool_param)
            if response.outputs:
                chunks.extend(text_of(grpcclient.InferResult(response)))
            if finals[-1]:
                break
    assert chunks == textgen.stream_chunks(words)
    assert len(chunks) == 6
    assert finals == [False] * 6 + [True]  # several responses, then the empty final one
    assert "".join(chunks) == textgen.unary_text(words)


async def test_llm_stream_with_the_asyncio_client_ends_after_the_last_word(
    client: aioclient.InferenceServerClient,
) -> None:
    async def requests() -> AsyncIterator[dict[str, object]]:
        yield {"model_name": "llm", "inputs": llm_inputs("a b c", 4, stream=True), "request_id": "s2"}

    chunks: list[str] = []
    async for result, error in client.stream_infer(requests(), stream_timeout=20):
        assert error is None
        assert result.get_response().id == "s2"
        chunks.extend(text_of(result))
    # Without the final-response flag the stream simply closes once the request is complete.
    assert chunks == ["a", " b", " c", " a"]


async def test_llm_decoupled_without_stream_answers_once(client: aioclient.InferenceServerClient) -> None:
    async def requests() -> AsyncIterator[dict[str, object]]:
        yield {"model_name": "llm", "inputs": llm_inputs("hello world", 3, stream=False)}

    results = [text_of(r) async for r, e in client.stream_infer(requests(), stream_timeout=20) if e is None]
    assert results == [["hello world hello"]]


async def test_unary_infer_on_the_decoupled_model_is_refused(client: aioclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        await client.infer("llm", llm_inputs("hello", 2), client_timeout=20)
    assert "decoupled" in str(info.value)
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"


async def test_llm_unary_answers_the_whole_text(client: aioclient.InferenceServerClient) -> None:
    result = await client.infer("llm-unary", llm_inputs("hello world", 5), request_id="u-1", client_timeout=20)
    assert text_of(result) == ["hello world hello world hello"]
    assert result.get_response().id == "u-1"
    assert result.get_response().outputs[0].shape == [1, 1]


async def test_llm_unary_batches_concurrent_requests(client: aioclient.InferenceServerClient) -> None:
    before = (await client.get_inference_statistics("llm-unary")).model_stats[0]
    prompts = [(f"p{i} q{i}", 20 - i) for i in range(8)]
    results = await asyncio.gather(
        *(client.infer("llm-unary", llm_inputs(p, n), client_timeout=20) for p, n in prompts)
    )
    assert [text_of(r) for r in results] == [[textgen.unary_text(textgen.generate_words(p, n))] for p, n in prompts]
    after = await statistics_once(client, "llm-unary", lambda s: s.inference_count >= before.inference_count + 8)
    assert after.inference_count - before.inference_count == 8
    assert after.execution_count - before.execution_count < 8  # those that arrived while one ran went together


async def test_model_statistics_report_queue_compute_and_counts(client: aioclient.InferenceServerClient) -> None:
    before = (await client.get_inference_statistics("batchstring")).model_stats[0]
    await asyncio.gather(*(batchstring(client, f"s{i}") for i in range(10)))
    await client.infer("llm-unary", llm_inputs("x", 2), client_timeout=20)

    stats = await statistics_once(client, "batchstring", lambda s: s.inference_count >= before.inference_count + 10)
    assert stats.name == "batchstring" and stats.version == "1"
    assert stats.inference_count >= 10 and 1 <= stats.execution_count <= stats.inference_count
    assert stats.last_inference > 0
    infer = stats.inference_stats
    assert infer.success.count >= 10 and infer.fail.count == 0
    assert infer.queue.count >= 10 and infer.queue.ns > 0
    assert infer.compute_input.ns > 0 and infer.compute_output.ns > 0
    # about 100 ms per batch, charged to each request of the batch
    assert infer.compute_infer.ns / infer.compute_infer.count >= 80_000_000
    assert {b.batch_size for b in stats.batch_stats} and all(b.compute_infer.count for b in stats.batch_stats)

    everything = await client.get_inference_statistics()
    assert {s.name for s in everything.model_stats} == MODELS


async def test_metrics_endpoint_has_the_load_metrics(
    client: aioclient.InferenceServerClient, triton_server: TritonProcess
) -> None:
    await batchstring(client, "m")
    key = (("model", "batchstring"), ("version", "1"))
    end = time.monotonic() + 5.0
    metrics = await fetch_metrics(triton_server.metrics_url)
    while metrics["nv_inference_count"].get(key, 0) < 1 and time.monotonic() < end:  # recorded just after the reply
        metrics = await fetch_metrics(triton_server.metrics_url)
    for name in ("nv_inference_pending_request_count", "nv_inference_queue_duration_us", "nv_inference_count"):
        models = {dict(labels)["model"] for labels in metrics[name]}
        assert models == MODELS, name
    assert metrics["nv_inference_count"][key] >= 1
    # Also on this CPU build; GPU and TensorRT-LLM families are absent (see docs/triton.md).
    for name in (
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_exec_count",
        "nv_inference_request_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_cpu_utilization",
    ):
        assert name in metrics, name
    assert not [n for n in metrics if n.startswith(("nv_gpu_", "nv_trt_llm_"))]


async def test_pending_request_count_rises_while_requests_wait(
    client: aioclient.InferenceServerClient, triton_server: TritonProcess
) -> None:
    """150 at once: a full batch of 100 runs for about 100 ms while 50 wait; the gauge Ferry maps to ``queued``."""
    calls = [asyncio.ensure_future(batchstring(client, f"w{i}")) for i in range(150)]
    seen = 0.0
    while not all(c.done() for c in calls):  # bounded by the calls themselves (20 s client timeout)
        metrics = await fetch_metrics(triton_server.metrics_url)
        seen = max(seen, metrics["nv_inference_pending_request_count"][(("model", "batchstring"), ("version", "1"))])
        if seen:
            break
    outputs = await asyncio.gather(*calls)
    assert outputs == [[f"W{i}"] for i in range(150)]
    assert seen >= 1


async def test_sigkill_ends_one_server_and_the_other_keeps_answering(
    triton_factory: Callable[[], TritonProcess],
) -> None:
    first, second = await asyncio.gather(asyncio.to_thread(triton_factory), asyncio.to_thread(triton_factory))
    assert len({first.grpc, second.grpc, first.http, second.http, first.metrics_url, second.metrics_url}) == 6
    a = aioclient.InferenceServerClient(url=first.grpc)
    b = aioclient.InferenceServerClient(url=second.grpc)
    try:
        assert await a.is_server_ready() and await b.is_server_ready()
        await asyncio.to_thread(first.kill)
        assert not pid_alive(first.pid)
        assert not pid_alive(first.tritonserver_pid)
        with pytest.raises(InferenceServerException) as info:
            await a.is_server_live(client_timeout=5)
        assert info.value.status() == "StatusCode.UNAVAILABLE"
        assert await b.is_server_ready()
        result = await b.infer("batchstring", [bytes_input("text_input", ["still here"])], client_timeout=20)
        assert text_of(result) == ["STILL HERE"]
        assert await asyncio.to_thread(second.stop, 20.0, signal.SIGINT) == 0  # a clean stop on SIGINT too
        assert not pid_alive(second.tritonserver_pid)
    finally:
        await a.close()
        await b.close()
