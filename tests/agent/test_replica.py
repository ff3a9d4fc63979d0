"""The simulated replica over real loopback gRPC, with tritonclient's asyncio client."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import pytest
import tritonclient.grpc.aio as triton
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from agent.replica import tensors
from agent.replica.server import ReplicaServicer, SimulatedReplica
from agent.scrape import HttpError, Samples, get_text, parse
from tests.agent.helpers import FAST, llm_inputs, params_of, text_of, until, with_natural


@pytest.fixture
async def replica():
    async with SimulatedReplica("chat", "v1", params=FAST, replica_id="n-r0") as rep:
        yield rep


@pytest.fixture
async def client(replica):
    async with triton.InferenceServerClient(replica.address) as c:
        yield c


@pytest.fixture
async def stub(replica):
    async with grpc.aio.insecure_channel(replica.address) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


async def requests(*items):
    for item in items:
        yield item


async def test_unary_infer_returns_the_whole_text_and_summary(client):
    result = await client.infer("chat", llm_inputs("hello there world", 7), request_id="req-1")
    text, params = text_of(result), params_of(result)
    assert result.get_response().id == "req-1"
    assert len(text.split()) == 7 and text == tensors.generated_text(0, 7)
    assert params["ferry_prompt_tokens"] == 3 and params["ferry_completion_tokens"] == 7
    assert params["ferry_cached_tokens"] == 0
    assert params["ferry_queue_seconds"] >= 0 and params["ferry_service_seconds"] > 0


async def test_repeated_prompt_is_served_from_the_prefix_cache(client):
    prompt = " ".join(f"w{i}" for i in range(40))  # 3 blocks of 16 tokens
    first = await client.infer("chat", llm_inputs(prompt, 2))
    second = await client.infer("chat", llm_inputs(prompt, 2))
    assert params_of(first)["ferry_cached_tokens"] == 0
    assert params_of(second)["ferry_cached_tokens"] == 40


async def test_stream_sends_one_delta_per_step_and_a_final_response(client):
    responses = []
    async for result, error in client.stream_infer(requests(
            {"model_name": "chat", "inputs": llm_inputs("a b c", 6, stream=True), "request_id": "s-1"})):
        assert error is None
        responses.append(result)
        if params_of(result)["triton_final_response"]:
            break
    params = [params_of(r) for r in responses]
    assert len(responses) >= 2
    assert [p["triton_final_response"] for p in params] == [False] * (len(params) - 1) + [True]
    assert sum(p["ferry_completion_tokens"] for p in params) == 6
    assert "".join(text_of(r) for r in responses) == tensors.generated_text(0, 6)
    assert all(r.get_response().id == "s-1" for r in responses)
    assert params[-1]["ferry_prompt_tokens"] == 3 and "ferry_prompt_tokens" not in params[0]


async def test_stream_false_on_a_stream_gives_one_final_response(client):
    results = []
    async for result, error in client.stream_infer(requests(
            {"model_name": "chat", "inputs": llm_inputs("a b", 5, stream=False)})):
        assert error is None
        results.append(result)
        break
    assert params_of(results[0])["triton_final_response"] is True
    assert len(text_of(results[0]).split()) == 5


async def test_several_requests_share_one_stream(client):
    finals = {}
    async for result, _ in client.stream_infer(requests(
            {"model_name": "chat", "inputs": llm_inputs("x", 3, stream=True), "request_id": "a"},
            {"model_name": "chat", "inputs": llm_inputs("y", 4, stream=True), "request_id": "b"})):
        params = params_of(result)
        if params["triton_final_response"]:
            finals[result.get_response().id] = params
        if len(finals) == 2:
            break
    assert set(finals) == {"a", "b"}


async def test_statistics_metadata_config_and_index(client):
    for _ in range(3):
        await client.infer("chat", llm_inputs("p q", 2))
    stats = (await client.get_inference_statistics("chat")).model_stats[0]
    assert (stats.name, stats.version, stats.inference_count) == ("chat", "v1", 3)
    assert stats.inference_stats.success.count == 3 and stats.inference_stats.compute_infer.ns > 0
    assert await client.is_model_ready("chat") and await client.is_model_ready("chat", "v1")
    assert not await client.is_model_ready("other") and not await client.is_model_ready("chat", "v2")
    meta = await client.get_model_metadata("chat")
    assert [i.name for i in meta.inputs] == ["text_input", "max_tokens", "stream", "ignore_eos"]
    config = (await client.get_model_config("chat")).config
    assert config.max_batch_size == FAST.max_running and config.model_transaction_policy.decoupled
    assert config.parameters["ferry_kv_block_tokens"].string_value == "16"
    index = await client.get_model_repository_index()
    assert [(m.name, m.version, m.state) for m in index.models] == [("chat", "v1", "READY")]


async def test_metrics_endpoint_uses_triton_names(client, replica):
    await client.infer("chat", llm_inputs(" ".join(["tok"] * 20), 3))
    samples = Samples(parse(await get_text(replica.metrics_url)))
    base = {"model": "chat", "version": "v1"}
    assert samples.get("nv_inference_request_success", **base) == 1
    assert samples.get("nv_inference_count", **base) == 1
    assert samples.get("nv_inference_pending_request_count", **base) == 0
    assert samples.get("nv_inference_queue_duration_us", **base) is not None
    assert samples.get("nv_inference_compute_infer_duration_us", **base) > 0
    assert samples.get("nv_inference_request_failure", **base) == 0
    assert samples.get("nv_trt_llm_request_metrics", request_type="max", **base) == FAST.max_running
    for kind in ("active", "scheduled", "context", "waiting"):
        assert samples.get("nv_trt_llm_request_metrics", request_type=kind, **base) == 0
    assert samples.get("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="max", **base) == 256
    assert samples.get("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="free", **base) == 256
    assert samples.get("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="used", **base) == 0
    assert samples.get("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="tokens_per", **base) == 16
    assert samples.get("ferry_replica_prefix_lookup_blocks_total", **base) == 2
    assert samples.get("ferry_replica_prefix_hit_blocks_total", **base) == 0
    with pytest.raises(HttpError, match="404"):
        await get_text(replica.metrics_url.replace("/metrics", "/nothing"))


def raw_request(**overrides) -> pb.ModelInferRequest:
    """A valid raw-content request, then one field changed."""
    req = pb.ModelInferRequest(model_name="chat", id="bad")
    for name, dtype in (("text_input", "BYTES"), ("max_tokens", "INT32")):
        tensor = req.inputs.add()
        tensor.name, tensor.datatype = name, dtype
        tensor.shape.extend([1, 1])
    req.raw_input_contents.extend([tensors.encode_bytes(b"hello world"), (4).to_bytes(4, "little")])
    for key, value in overrides.items():
        value(req) if callable(value) else setattr(req, key, value)
    return req


def _set(index: int, **fields):
    def change(req):
        for key, value in fields.items():
            if key == "shape":
                req.inputs[index].ClearField("shape")
                req.inputs[index].shape.extend(value)
            else:
                setattr(req.inputs[index], key, value)
    return change


def _raw(index: int, data: bytes):
    def change(req):
        req.raw_input_contents[index] = data
    return change


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda r: (r.inputs.pop(0), r.raw_input_contents.pop(0)), "text_input"),
        (lambda r: (r.inputs.pop(1), r.raw_input_contents.pop(1)), "max_tokens"),
        (_set(1, datatype="FP32"), "max_tokens"),
        (_set(0, shape=[2]), "text_input"),
        (_set(0, name="prompt"), "prompt"),
        (_raw(1, (0).to_bytes(4, "little")), "max_tokens"),
        (_raw(1, b"\x01\x00"), "max_tokens"),
        (_raw(0, b"\x10\x00\x00\x00abc"), "text_input"),
        (_raw(0, tensors.encode_bytes(b"\xff\xfe")), "text_input"),
        (_raw(0, tensors.encode_bytes(b"   ")), "text_input"),
        (_raw(0, tensors.encode_bytes(b"a") * 2), "text_input"),
        (lambda r: r.raw_input_contents.pop(), "raw_input_contents"),
        (lambda r: r.outputs.add(name="logits"), "logits"),
        (_raw(1, (5000).to_bytes(4, "little")), "max_tokens"),
    ],
    ids=["no-text_input", "no-max_tokens", "max_tokens-fp32", "shape-2", "unknown-input", "max_tokens-zero",
         "int32-truncated", "bytes-overrun", "not-utf8", "empty-prompt", "two-elements", "raw-count-mismatch",
         "unknown-output", "over-context"],
)
async def test_bad_tensors_are_invalid_argument_naming_the_tensor(stub, change, field):
    req = raw_request()
    change(req)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelInfer(req)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(field)


async def test_typed_contents_are_accepted(stub):
    req = pb.ModelInferRequest(model_name="chat")
    text = req.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    text.contents.bytes_contents.append(b"one two")
    limit = req.inputs.add(name="max_tokens", datatype="INT32", shape=[1])
    limit.contents.int_contents.append(3)
    flag = req.inputs.add(name="stream", datatype="BOOL", shape=[1, 1])
    flag.contents.bool_contents.append(False)
    response = await stub.ModelInfer(req)
    assert response.parameters["ferry_completion_tokens"].int64_param == 3


@pytest.mark.parametrize(("model", "version"), [("other", ""), ("chat", "v9")], ids=["unknown-model", "wrong-version"])
async def test_unknown_model_is_not_found(stub, model, version):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelInfer(raw_request(model_name=model, model_version=version))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_full_queue_is_resource_exhausted():
    params = dataclasses.replace(FAST, max_running=1, max_queue=1)
    async with SimulatedReplica("chat", params=params) as rep, triton.InferenceServerClient(rep.address) as c:
        runner = rep.runner
        assert runner is not None
        runner.submit(1, 2000, ())
        await until(lambda: runner.engine.load().running == 1)
        runner.submit(1, 2000, ())
        assert runner.engine.load().queued == 1
        with pytest.raises(InferenceServerException) as info:
            await c.infer("chat", llm_inputs("x", 1))
        assert "RESOURCE_EXHAUSTED" in str(info.value.status()) and "queue full" in info.value.message()


async def test_client_cancel_frees_the_request_in_the_engine(replica, client):
    assert replica.runner is not None
    engine = replica.runner.engine
    stream = client.stream_infer(requests({"model_name": "chat", "inputs": llm_inputs("x y", 1000, stream=True)}))
    await stream.__anext__()
    assert engine.load().running == 1 and engine.load().kv_blocks_free < 256
    stream.cancel()
    await until(lambda: engine.load().running == 0)
    assert engine.load().cancelled == 1 and engine.load().kv_blocks_free == 256
    with pytest.raises(InferenceServerException, match="Deadline"):
        await client.infer("chat", llm_inputs("x y", 1000), client_timeout=0.05)
    await until(lambda: engine.load().cancelled == 2)
    assert engine.load().running == 0 and replica.runner.stats.cancelled == 2


@pytest.mark.parametrize(
    "call",
    [lambda c: c.get_server_metadata(), lambda c: c.load_model("chat"), lambda c: c.get_log_settings()],
    ids=["ServerMetadata", "RepositoryModelLoad", "LogSettings"],
)
async def test_other_rpcs_are_unimplemented(client, call):
    with pytest.raises(InferenceServerException) as info:
        await call(client)
    assert "UNIMPLEMENTED" in str(info.value.status()) and "not served" in info.value.message()


def test_every_rpc_of_the_service_has_a_handler():
    methods = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
    missing = [m.name for m in methods if m.name not in ReplicaServicer.__dict__]
    assert missing == []


async def test_stop_is_clean_with_a_request_in_flight():
    rep = await SimulatedReplica("chat", params=FAST).start()
    async with triton.InferenceServerClient(rep.address) as c:
        task = asyncio.create_task(c.infer("chat", llm_inputs("x", 1000)))
        assert rep.runner is not None
        await until(lambda: rep.runner is not None and rep.runner.engine.load().running == 1)
        await rep.stop(grace=0.05)
        with pytest.raises(InferenceServerException):
            await task


async def test_a_warming_replica_is_not_ready_and_refuses_inference_until_its_model_is_loaded() -> None:
    async with SimulatedReplica("chat", "v1", params=FAST, warmup_seconds=0.6) as rep, \
            triton.InferenceServerClient(rep.address) as c:
        assert await c.is_server_live() and not await c.is_model_ready("chat")
        assert (await c.get_model_repository_index()).models[0].state == "LOADING"
        with pytest.raises(InferenceServerException, match="loading"):
            await c.infer("chat", llm_inputs("p q", 2))
        await asyncio.sleep(0.7)  # the configured warm-up, then the model is loaded
        assert await c.is_model_ready("chat")
        result = await c.infer("chat", llm_inputs("p q", 2))
        assert text_of(result)


# -- where answers end (agent.replica.answer) ---------------------------------------------------------------------

ANSWERS = dataclasses.replace(FAST, answer_tokens=12, answer_min_tokens=4)


@pytest.fixture
async def answering_client():
    async with (SimulatedReplica("chat", "v1", params=ANSWERS, replica_id="n-r1") as rep,
                triton.InferenceServerClient(rep.address) as c):
        yield c


async def test_an_answer_ends_at_its_natural_length_with_stop_unary_and_streamed(answering_client):
    prompt, n = with_natural(ANSWERS, 6, 30)
    result = await answering_client.infer("chat", llm_inputs(prompt, 200))
    assert text_of(result) == tensors.generated_text(0, n)
    assert params_of(result)["ferry_completion_tokens"] == n and params_of(result)["ferry_finish_reason"] == "stop"
    responses = []
    async for streamed, error in answering_client.stream_infer(requests(
            {"model_name": "chat", "inputs": llm_inputs(prompt, 200, stream=True)})):
        assert error is None
        responses.append(streamed)
        if params_of(streamed)["triton_final_response"]:
            break
    assert "".join(text_of(r) for r in responses) == tensors.generated_text(0, n)
    assert sum(params_of(r)["ferry_completion_tokens"] for r in responses) == n
    assert params_of(responses[-1])["ferry_finish_reason"] == "stop"


async def test_max_tokens_first_is_length_and_the_ignore_eos_tensor_runs_to_it(answering_client):
    prompt, n = with_natural(ANSWERS, 6, 30)
    short = params_of(await answering_client.infer("chat", llm_inputs(prompt, 5)))
    assert (short["ferry_completion_tokens"], short["ferry_finish_reason"]) == (5, "length")
    full = params_of(await answering_client.infer("chat", llm_inputs(prompt, n + 9, ignore_eos=True)))
    assert (full["ferry_completion_tokens"], full["ferry_finish_reason"]) == (n + 9, "length")
    same = params_of(await answering_client.infer("chat", llm_inputs(prompt, 200, ignore_eos=False)))
    assert (same["ferry_completion_tokens"], same["ferry_finish_reason"]) == (n, "stop")


async def test_ignore_eos_is_declared_optional_and_checked(client, stub):
    config = (await client.get_model_config("chat")).config
    assert {i.name: i.optional for i in config.input}["ignore_eos"] is True
    assert {i.name: i.optional for i in config.input}["max_tokens"] is False
    req = raw_request()
    flag = req.inputs.add(name="ignore_eos", datatype="INT32", shape=[1, 1])
    req.raw_input_contents.append((1).to_bytes(4, "little"))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelInfer(req)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and info.value.details().startswith("ignore_eos")
    flag.datatype = "BOOL"
    req.raw_input_contents[-1] = b"\x01"
    assert (await stub.ModelInfer(req)).parameters["ferry_finish_reason"].string_param == "length"
