"""The OpenAI-HTTP adapter: each engine's metric names read into load, a simulated replica's HTTP face adopted."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry

from agent.agent import Agent, AgentMetrics, Endpoint, NodeInfo
from agent.config import AgentSettings
from agent.main import build_parser, openai_endpoints
from agent.openai import KV_FRACTION_BLOCKS, OpenAIEndpoint, http_address, load_from_metrics
from agent.replica.server import SimulatedReplica
from agent.scrape import HttpError
from agent.triton import ModelLoad
from ferry.v1 import common_pb2
from tests.agent.helpers import FAST
from tests.agent.test_agent import FakeFleet, start_fleet
from tools.peers.replicaface import HttpFace

pytestmark = pytest.mark.timeout(15)
MODEL = "meta-llama/Llama-3.1-8B-Instruct"

VLLM = f"""\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} 5.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} 0.25
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",\
gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="2000",prefix_caching_hash_algo="builtin"}} 1.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{engine="0",finished_reason="stop",model_name="{MODEL}"}} 40.0
vllm:request_success_total{{engine="0",finished_reason="length",model_name="{MODEL}"}} 2.0
vllm:request_success_created{{engine="0",finished_reason="stop",model_name="{MODEL}"}} 1.7e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.001",model_name="{MODEL}"}} 0.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="{MODEL}"}} 42.0
vllm:time_to_first_token_seconds_count{{engine="0",model_name="{MODEL}"}} 42.0
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="{MODEL}"}} 3.5
"""

VLLM_OLDER = f"""\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="{MODEL}"}} 7.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{{model_name="{MODEL}"}} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="{MODEL}"}} 1.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{{model_name="{MODEL}"}} 0.5
"""

SGLANG = f"""\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{engine_type="unified",model_name="{MODEL}",pp_rank="0",tp_rank="0"}} 4.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{engine_type="unified",model_name="{MODEL}",pp_rank="0",tp_rank="0"}} 2.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{{engine_type="unified",model_name="{MODEL}",pp_rank="0",tp_rank="0"}} 0.28
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{{engine_type="unified",model_name="{MODEL}",pp_rank="0",tp_rank="0"}} 0.0075
# HELP sglang:num_requests_total Number of requests processed.
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{{model_name="{MODEL}"}} 9.0
"""

TRTLLM = """\
# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 6
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 64
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 6
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 3
# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 100
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="free",model="tensorrt_llm",version="1"} 900
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 1000
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="ensemble",version="1"} 12
"""

CASES = [
    ("vllm", "vllm", VLLM, ModelLoad(ready=True, queued=5, running=3, kv_blocks_total=2000, kv_blocks_free=1500,
                                     kv_block_tokens=16, requests_total=42)),
    ("vllm-gpu-cache-usage", "vllm", VLLM_OLDER,
     ModelLoad(ready=True, queued=1, running=7, kv_blocks_total=KV_FRACTION_BLOCKS, kv_blocks_free=500)),
    ("sglang", "sglang", SGLANG, ModelLoad(ready=True, queued=2, running=4, kv_blocks_total=KV_FRACTION_BLOCKS,
                                           kv_blocks_free=720, requests_total=9)),
    ("trtllm", "trtllm", TRTLLM, ModelLoad(ready=True, queued=3, running=6, kv_blocks_total=1000, kv_blocks_free=900,
                                           kv_block_tokens=64, requests_total=12, max_running=64)),
]


@pytest.mark.parametrize(("engine", "text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_engines_metric_names_become_the_load(engine: str, text: str, expected: ModelLoad) -> None:
    assert load_from_metrics(text, engine, MODEL, ready=True) == expected


def test_samples_of_the_model_are_preferred_over_other_models() -> None:
    other = VLLM_OLDER.replace(MODEL, "other").replace("} 7.0", "} 100.0")
    load = load_from_metrics(VLLM_OLDER + other.split("# HELP vllm:num_requests_swapped")[0].split("\n", 2)[2],
                             "vllm", MODEL, ready=True)
    assert load.running == 7


def test_a_malformed_exposition_or_an_unknown_engine_raises_value_error() -> None:
    with pytest.raises(ValueError):
        load_from_metrics("vllm:num_requests_running{model_name=} x\n", "vllm", MODEL, ready=True)
    with pytest.raises(ValueError, match="unknown engine"):
        load_from_metrics("", "llamacpp", MODEL, ready=True)


@pytest.mark.parametrize(("url", "expected"), [("http://h:8000", "h:8000"), ("http://h", "h:80"),
                                               ("http://[::1]:9/", "[::1]:9")], ids=["port", "default", "v6"])
def test_http_address_of_a_base_url(url: str, expected: str) -> None:
    assert http_address(url) == expected


def test_a_url_that_is_not_http_is_refused() -> None:
    with pytest.raises(ValueError):
        http_address("https://h:1")


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
async def test_a_simulated_replica_reads_the_same_under_each_engines_names(engine: str) -> None:
    async with SimulatedReplica("chat", params=FAST, face=HttpFace) as replica:
        assert replica.runner is not None
        ticket = replica.runner.submit(8, 64, [])  # one request running
        try:
            load = replica.runner.engine.load()
            seen = load_from_metrics(replica.render_metrics(), engine, "chat", ready=True)
            assert (seen.queued, seen.running) == (load.queued, load.running) and load.queued + load.running == 1
            assert (seen.kv_blocks_total, seen.kv_blocks_free) == (load.kv_blocks_total, load.kv_blocks_free) \
                if engine != "sglang" else seen.kv_blocks_free == round(load.kv_blocks_free / load.kv_blocks_total
                                                                        * KV_FRACTION_BLOCKS)
        finally:
            replica.runner.cancel(ticket)


async def test_the_endpoint_lists_polls_and_sees_the_server_go() -> None:
    replica = await SimulatedReplica("chat", params=FAST, face=HttpFace).start()
    endpoint = OpenAIEndpoint(replica.http_url, replica.metrics_url, engine="vllm", timeout_seconds=1.0)
    try:
        assert endpoint.address == f"127.0.0.1:{replica.http_port}"
        (entry,) = await endpoint.discover()
        assert (entry.name, entry.version) == ("chat", "v1")
        polled = await endpoint.poll([("chat", "v1")])
        assert polled.reachable and polled.error == ""
        load = polled.models[("chat", "v1")]
        assert load.ready and (load.kv_blocks_total, load.kv_block_tokens) == (FAST.kv_blocks_total,
                                                                               FAST.kv_block_tokens)
    finally:
        await replica.stop()
    gone = await endpoint.poll([("chat", "v1")])
    assert not gone.reachable and gone.error
    with pytest.raises(HttpError):
        await endpoint.discover()
    await endpoint.close()


async def test_health_503_while_loading_reads_not_ready_and_given_names_are_not_listed() -> None:
    async with SimulatedReplica("chat", params=FAST, face=HttpFace, warmup_seconds=30) as replica:
        endpoint = OpenAIEndpoint(replica.http_url, None, engine="sglang", models=("served-name",))
        try:
            assert [e.name for e in await endpoint.discover()] == ["served-name"]
            polled = await endpoint.poll([("served-name", "v1")])
            assert polled.reachable and not polled.models[("served-name", "v1")].ready
        finally:
            await endpoint.close()


async def test_the_agent_registers_an_openai_replica_with_its_http_address_and_no_kserve_address() -> None:
    fake = FakeFleet()
    server, port = await start_fleet(fake)
    async with SimulatedReplica("chat", params=FAST, face=HttpFace) as replica:
        agent = Agent(node=NodeInfo(node="n1"), control_planes=[f"127.0.0.1:{port}"],
                      endpoints=[Endpoint(openai_url=replica.http_url, metrics_url=replica.metrics_url,
                                          engine="vllm", adopt=True)],
                      settings=AgentSettings(telemetry_interval_seconds=0.25), rng=random.Random(1),
                      metrics=AgentMetrics(CollectorRegistry()))
        await agent.start()
        try:
            _, telemetry = await fake.next(
                "telemetry", lambda t: any(r.state == common_pb2.REPLICA_STATE_READY for r in t.replicas), within=5)
            infos = list(agent.inventory.replicas.values())
            assert [(t.spec.replica_id, t.spec.address, t.spec.http_address, t.spec.engine) for t in infos] == [
                ("n1-o0-chat-v1", "", f"127.0.0.1:{replica.http_port}", "vllm")]
            assert infos[0].spec.kv_block_tokens == FAST.kv_block_tokens  # from vllm:cache_config_info
            assert telemetry.replicas[0].kv_blocks_total == FAST.kv_blocks_total
        finally:
            await agent.stop()
            await server.stop(None)


FLAGS = [
    (["--openai", "http://h:1", "--engine", "vllm"], [("h:1", "vllm", None, ())]),
    (["--openai", "http://a:1", "--openai", "http://b:2", "--engine", "sglang", "--metrics", "http://a:9/metrics",
      "--metrics", "http://b:9/metrics", "--openai-model", "m"],
     [("a:1", "sglang", "http://a:9/metrics", ("m",)), ("b:2", "sglang", "http://b:9/metrics", ("m",))]),
]


@pytest.mark.parametrize(("argv", "expected"), FLAGS, ids=["one", "two-sharing-engine-and-model"])
def test_openai_flags_become_endpoints(argv: list[str], expected: list[tuple[object, ...]]) -> None:
    endpoints = openai_endpoints(build_parser().parse_args(argv))
    assert [(http_address(e.openai_url or ""), e.engine, e.metrics_url, e.openai_models) for e in endpoints] == expected
    assert all(e.adopt and not e.address for e in endpoints)


@pytest.mark.parametrize("argv", [
    ["--openai", "http://h:1"],
    ["--openai", "https://h:1", "--engine", "vllm"],
    ["--openai", "http://a:1", "--openai", "http://b:1", "--engine", "vllm", "--metrics", "http://a", "--metrics",
     "http://b", "--metrics", "http://c"],
    ["--engine", "vllm"],
], ids=["no-engine", "not-http", "metrics-count", "engine-without-openai"])
def test_openai_flags_that_do_not_fit_are_refused(argv: list[str]) -> None:
    with pytest.raises(ValueError):
        openai_endpoints(build_parser().parse_args(argv))
