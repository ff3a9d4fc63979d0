"""The Triton adapter against a simulated replica, a fake TensorRT-LLM-style repository, and pure parsing."""

from __future__ import annotations

import asyncio
import socket

import pytest
import tritonclient.grpc.aio as triton
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from agent.replica.server import SimulatedReplica
from agent.scrape import HttpError, Samples, get_text, parse
from agent.triton import ModelEntry, TritonEndpoint, from_metrics, pinned_gpus
from ferry.grpcutil import start_server
from tests.agent.helpers import FAST, llm_inputs, until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def replica():
    async with SimulatedReplica("chat", "v1", params=FAST) as rep:
        yield rep


async def test_discover_a_simulated_replica(replica):
    endpoint = TritonEndpoint(replica.address, replica.metrics_url)
    try:
        assert await endpoint.discover() == [ModelEntry(name="chat", version="v1", ready=True, max_batch_size=8,
                                                        kv_block_tokens=16, max_context_tokens=2048)]
    finally:
        await endpoint.close()


async def test_poll_reads_load_from_metrics(replica):
    endpoint = TritonEndpoint(replica.address, replica.metrics_url)
    async with triton.InferenceServerClient(replica.address) as client:
        task = asyncio.create_task(client.infer("chat", llm_inputs("a b c", 1000)))
        await until(lambda: replica.runner.engine.load().running == 1)
        result = await endpoint.poll([("chat", "v1"), ("other", "v1")])
        task.cancel()
    await endpoint.close()
    load = result.models[("chat", "v1")]
    assert result.reachable and load.ready and load.source == "metrics"
    assert (load.queued, load.running, load.kv_blocks_total, load.kv_block_tokens) == (0, 1, 256, 16)
    assert load.kv_blocks_free == 256 - 63  # (3 + 1000) tokens in blocks of 16
    assert 0.0 <= load.gpu_utilization <= 1.0
    assert not result.models[("other", "v1")].ready


@pytest.mark.parametrize("metrics", ["none", "unreachable"])
async def test_poll_falls_back_to_statistics(replica, metrics):
    url = None if metrics == "none" else f"http://127.0.0.1:{free_port()}/metrics"
    endpoint = TritonEndpoint(replica.address, url)
    async with triton.InferenceServerClient(replica.address) as client:
        await client.infer("chat", llm_inputs("a", 2))
        await client.infer("chat", llm_inputs("a", 2))
    result = await endpoint.poll([("chat", "v1")])
    await endpoint.close()
    load = result.models[("chat", "v1")]
    assert result.reachable and load.source == "statistics" and load.requests_total == 2
    assert (result.error != "") is (metrics == "unreachable")


async def test_unreachable_endpoint_is_reported_not_raised():
    endpoint = TritonEndpoint(f"127.0.0.1:{free_port()}", None, timeout_seconds=0.5)
    result = await endpoint.poll([("chat", "v1")])
    await endpoint.close()
    assert not result.reachable and result.models == {}


async def test_a_replica_that_stops_becomes_unreachable(replica):
    endpoint = TritonEndpoint(replica.address, replica.metrics_url, timeout_seconds=0.5)
    assert (await endpoint.poll([("chat", "v1")])).reachable
    await replica.stop()
    assert not (await endpoint.poll([("chat", "v1")])).reachable
    await endpoint.close()


class FakeRepository(service_pb2_grpc.GRPCInferenceServiceServicer):
    """A TensorRT-LLM-style repository beside a fixed-batch model: only ``ensemble`` is an LLM."""

    MODELS = {"preprocessing": (("QUERY",), "INPUT_ID"), "tensorrt_llm": (("input_ids",), "output_ids"),
              "batchstring": (("text_input",), "text_output"),
              "ensemble": (("text_input", "max_tokens"), "text_output")}

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def RepositoryIndex(self, request, context):
        return pb.RepositoryIndexResponse(models=[
            pb.RepositoryIndexResponse.ModelIndex(name=n, version="1", state="READY") for n in self.MODELS])

    async def ModelMetadata(self, request, context):
        inputs, out = self.MODELS[request.name]
        t = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(name=request.name, versions=["1"], inputs=[t(name=i) for i in inputs],
                                        outputs=[t(name=out)])

    async def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=request.name in self.MODELS)

    async def ModelConfig(self, request, context):
        return pb.ModelConfigResponse(config=mc.ModelConfig(name=request.name, max_batch_size=64))


async def test_discover_adopts_only_text_models():
    add = service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server
    server, port = await start_server([(add, FakeRepository(), "inference.GRPCInferenceService")], "127.0.0.1:0")
    endpoint = TritonEndpoint(f"127.0.0.1:{port}")
    try:
        assert await endpoint.discover() == [ModelEntry(name="ensemble", version="1", ready=True, max_batch_size=64)]
    finally:
        await endpoint.close()
        await server.stop(None)


class PinnedRepository(FakeRepository):
    """The same repository, its ``ensemble`` pinned to GPUs 2 and 3 by two instance groups."""

    async def ModelConfig(self, request, context):
        group = mc.ModelInstanceGroup
        return pb.ModelConfigResponse(config=mc.ModelConfig(name=request.name, max_batch_size=64, instance_group=[
            group(kind=group.KIND_GPU, count=2, gpus=[2]), group(kind=group.KIND_GPU, count=1, gpus=[3, 2])]))


async def test_discover_reads_the_gpus_a_models_instance_groups_pin():
    add = service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server
    server, port = await start_server([(add, PinnedRepository(), "inference.GRPCInferenceService")], "127.0.0.1:0")
    endpoint = TritonEndpoint(f"127.0.0.1:{port}")
    try:
        assert await endpoint.discover() == [ModelEntry(name="ensemble", version="1", ready=True, max_batch_size=64,
                                                        gpus=2)]
    finally:
        await endpoint.close()
        await server.stop(None)


GROUP = mc.ModelInstanceGroup


@pytest.mark.parametrize(("groups", "pinned"), [
    ([], 0),
    ([GROUP(kind=GROUP.KIND_GPU, count=4)], 0),  # no ids: an instance on every GPU Triton sees
    ([GROUP(kind=GROUP.KIND_GPU, gpus=[0])], 1),
    ([GROUP(kind=GROUP.KIND_GPU, gpus=[0, 1]), GROUP(kind=GROUP.KIND_GPU, gpus=[1, 2])], 3),
    ([GROUP(kind=GROUP.KIND_AUTO, gpus=[5])], 1),
    ([GROUP(kind=GROUP.KIND_CPU, gpus=[0])], 0),  # a CPU group's ids are not GPUs it holds
    ([GROUP(kind=GROUP.KIND_MODEL, count=1)], 0),  # the backend places itself (TensorRT-LLM)
], ids=["none", "gpu-unpinned", "one", "union", "auto-with-ids", "cpu", "model"])
def test_pinned_gpus_counts_the_distinct_ids_of_gpu_groups(groups, pinned):
    assert pinned_gpus(mc.ModelConfig(name="m", instance_group=groups)) == pinned


TRTLLM = """
# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="ensemble",version="1"} 2
nv_inference_request_success{model="ensemble",version="1"} 41
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 5
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 7
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="free",model="tensorrt_llm",version="1"} 6000
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 6239
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
nv_gpu_utilization{gpu_uuid="GPU-a"} 0.5
nv_gpu_utilization{gpu_uuid="GPU-b"} 1.0
"""


@pytest.mark.parametrize(
    ("text", "model", "expected"),
    [
        (TRTLLM, "ensemble", dict(queued=5, running=7, kv_blocks_free=6000, kv_blocks_total=6239, kv_block_tokens=64,
                                  requests_total=41, gpu_utilization=0.75)),
        (TRTLLM.replace("waiting", "other"), "ensemble", dict(queued=2, running=7)),
        (TRTLLM + 'nv_trt_llm_request_metrics{model="second",request_type="active",version="1"} 1\n', "ensemble",
         dict(queued=2, running=0, kv_blocks_total=0)),
        ('nv_inference_pending_request_count{model="m",version="1"} 3\n', "m", dict(queued=3, running=0)),
        ("", "m", dict(queued=0, running=0, gpu_utilization=0.0)),
    ],
    ids=["ensemble-uses-its-engine", "pending-when-no-waiting", "two-engines-ambiguous", "plain-triton", "empty"],
)
def test_load_from_metrics(text, model, expected):
    load = from_metrics(Samples(parse(text)), model, "1", ready=True)
    assert {k: getattr(load, k) for k in expected} == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("up 1", ("up", {}, 1.0)),
        ('m{a="x",b="y"} 2.5 1700000000', ("m", {"a": "x", "b": "y"}, 2.5)),
        (r'm{a="q\"uote",b="back\\slash",c="new\nline"} 3',
         ("m", {"a": 'q"uote', "b": "back\\slash", "c": "new\nline"}, 3.0)),
        ('m{a="x",} +Inf', ("m", {"a": "x"}, float("inf"))),
        ('m{a="x"} NaN', ("m", {"a": "x"}, None)),
        ("m{a=x} 1", None),
        ("m{a=\"x\" 1", None),
        ("lonely", None),
        ("m notanumber", None),
    ],
    ids=["plain", "labels-timestamp", "escapes", "trailing-comma-inf", "nan", "unquoted", "unclosed", "no-value",
         "bad-value"],
)
def test_prometheus_text_parser(line, expected):
    samples = parse(f"# HELP m help\n# TYPE m gauge\n\n{line}\n")
    if expected is None:
        assert samples == []
        return
    (sample,) = samples
    assert (sample.name, dict(sample.labels)) == expected[:2]
    if expected[2] is None:
        assert sample.value != sample.value
    else:
        assert sample.value == expected[2]


@pytest.mark.parametrize(
    ("response", "body"),
    [
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nup 1\r\n3;x=y\r\n\nb \r\n2\r\n2\n\r\n0\r\n\r\n",
         "up 1\nb 2\n"),
        (b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nup 1\n", "up 1\n"),
        (b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n", None),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n", None),
    ],
    ids=["chunked", "close-delimited", "status-500", "over-limit"],
)
async def test_http_get_text(response, body):
    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(response)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/metrics"
    try:
        if body is None:
            with pytest.raises(HttpError):
                await get_text(url, max_bytes=1024)
        else:
            assert await get_text(url) == body
    finally:
        server.close()
        await server.wait_closed()


async def test_http_get_text_rejects_other_schemes():
    with pytest.raises(HttpError, match="only http"):
        await get_text("https://127.0.0.1:1/metrics")

