"""Random and malformed messages at the Inference, Fleet and Tables servers over real loopback connections.

No crash (the processes still serve afterwards), no hang (every call has a
deadline and none may hit it), and every refusal is a fitting status whose
message names the field.
"""

from __future__ import annotations

from collections import Counter

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferry.v1 import common_pb2, fleet_pb2, fleet_pb2_grpc, inference_pb2, tables_pb2, tables_pb2_grpc
from tools.process_fleet import Fleet

SETTINGS = settings(max_examples=700, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
FIELDS = ("model", "version", "tier", "prompt", "max_tokens", "prefix_key", "idempotency_key")

texts = st.one_of(st.text(max_size=40), st.sampled_from(["", "chat", "v1", "x" * 300, "\x00", "é" * 50]),
                  st.text(min_size=200, max_size=600))
prompts = st.one_of(st.text(max_size=200), st.just("x " * 3000), st.just(""))
infer_requests = st.builds(
    inference_pb2.InferRequest,
    model=st.one_of(st.just("chat"), st.just("chat"), texts), version=st.one_of(st.just(""), st.just("v1"), texts),
    tier=st.integers(-3, 8), prompt=prompts, max_tokens=st.one_of(st.integers(0, 40), st.integers(0, 2**32 - 1)),
    prefix_key=texts, idempotency_key=texts)

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12)
valid_requests = st.builds(
    inference_pb2.InferRequest, model=st.just("chat"), version=st.sampled_from(["", "v1"]),
    tier=st.integers(0, 3), prompt=st.text(min_size=1, max_size=300).filter(str.strip),
    max_tokens=st.integers(1, 16), prefix_key=names, idempotency_key=st.one_of(st.just(""), names))


def _record(statuses: dict[str, Counter[str]], target: str, code: str) -> None:
    statuses.setdefault(target, Counter())[code] += 1


@pytest.fixture(scope="module")
def channel(fuzz_fleet: Fleet):
    with grpc.insecure_channel(fuzz_fleet.data_plane) as ch:
        yield ch


@SETTINGS
@given(request=st.one_of(valid_requests, infer_requests),
       key=st.sampled_from(["ent", "ent", "ent", "free", "", "garbage", None]), stream=st.booleans())
def test_inference_answers_every_request_with_a_fitting_status(fuzz_fleet, channel, statuses, request, key, stream):
    stub = fuzz_fleet.inference(channel)
    metadata = () if key is None else (("x-api-key", fuzz_fleet.keys.get(key, key)),)
    try:
        if stream:
            chunks = list(stub.InferStream(request, metadata=metadata, timeout=10))
            assert chunks and chunks[-1].final
        else:
            stub.Infer(request, metadata=metadata, timeout=10)
        code = "OK"
    except grpc.RpcError as exc:
        code = exc.code().name
        details = exc.details() or ""
        assert code in {"INVALID_ARGUMENT", "UNAUTHENTICATED", "PERMISSION_DENIED", "NOT_FOUND",
                        "RESOURCE_EXHAUSTED"}, (code, details)
        if code == "INVALID_ARGUMENT":
            assert any(details.startswith(f) for f in FIELDS), details
    _record(statuses, "inference", code)


@SETTINGS
@given(payload=st.binary(max_size=200))
def test_inference_survives_raw_bytes(fuzz_fleet, channel, statuses, payload):
    call = channel.unary_unary("/ferry.v1.Inference/Infer")
    try:
        call(payload, metadata=(("x-api-key", fuzz_fleet.keys["ent"]),), timeout=10)
        code = "OK"
    except grpc.RpcError as exc:
        code = exc.code().name
        assert code in {"INVALID_ARGUMENT", "NOT_FOUND", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED"}, (
            code, exc.details())
        if code == "INVALID_ARGUMENT":
            assert any((exc.details() or "").startswith(f) for f in (*FIELDS, "request")), exc.details()
    _record(statuses, "inference-raw", code)


replica_infos = st.builds(
    fleet_pb2.ReplicaInfo, replica_id=texts, model=texts, version=texts,
    address=st.one_of(texts, st.just("127.0.0.1:1")), kserve_model=texts, gpus=st.integers(0, 2**32 - 1),
    max_concurrency=st.integers(0, 2**32 - 1), kv_block_tokens=st.integers(0, 2**32 - 1),
    max_context_tokens=st.integers(0, 2**32 - 1), state=st.integers(-1, 9))
loads = st.builds(
    common_pb2.ReplicaLoad, replica_id=texts, state=st.integers(-1, 9), queued=st.integers(0, 2**32 - 1),
    running=st.integers(0, 2**32 - 1), kv_blocks_free=st.integers(0, 2**32 - 1),
    kv_blocks_total=st.integers(0, 2**32 - 1),
    gpu_utilization=st.floats(allow_nan=True, allow_infinity=True, width=64))
valid_replicas = st.builds(
    fleet_pb2.ReplicaInfo, replica_id=names.map(lambda n: "fz-" + n), model=st.sampled_from(["fuzz-a", "fuzz-b"]),
    version=st.just("v1"), address=st.integers(1024, 65535).map(lambda p: f"127.0.0.1:{p}"),
    kserve_model=st.just("fuzz-a"), gpus=st.integers(1, 8), max_concurrency=st.integers(1, 100),
    kv_block_tokens=st.just(512), max_context_tokens=st.integers(1, 131072),
    state=st.sampled_from([common_pb2.REPLICA_STATE_READY, common_pb2.REPLICA_STATE_WARMING]))
valid_register = st.builds(fleet_pb2.AgentMessage, register=st.builds(
    fleet_pb2.Register, node=names.map(lambda n: "fz-node-" + n), region=st.just("local"), gpus=st.integers(1, 8),
    replicas=st.lists(valid_replicas, max_size=3, unique_by=lambda r: r.replica_id)))
agent_messages = st.one_of(
    st.builds(fleet_pb2.AgentMessage, register=st.builds(
        fleet_pb2.Register, node=texts, region=texts, gpus=st.integers(0, 2**32 - 1),
        replicas=st.lists(replica_infos, max_size=4), agent_version=texts)),
    st.builds(fleet_pb2.AgentMessage, telemetry=st.builds(
        fleet_pb2.Telemetry, seq=st.integers(0, 2**64 - 1), replicas=st.lists(loads, max_size=4),
        changed=st.lists(replica_infos, max_size=2), removed=st.lists(texts, max_size=2))),
    st.builds(fleet_pb2.AgentMessage, result=st.builds(fleet_pb2.CommandResult, command_id=texts, ok=st.booleans(),
                                                       message=texts)),
    st.just(fleet_pb2.AgentMessage()))


def _drain(responses) -> str:
    try:
        for _ in responses:
            pass
        return "OK"
    except grpc.RpcError as exc:
        return exc.code().name + "|" + (exc.details() or "")


@SETTINGS
@given(messages=st.one_of(
    st.tuples(valid_register, st.lists(agent_messages, max_size=3)).map(lambda t: [t[0], *t[1]]),
    st.lists(agent_messages, min_size=1, max_size=4)))
def test_fleet_connect_refuses_malformed_agents_cleanly(fuzz_fleet, statuses, messages):
    with grpc.insecure_channel(fuzz_fleet.cp_address) as ch:
        outcome = _drain(fleet_pb2_grpc.FleetStub(ch).Connect(iter(messages), timeout=10))
    code, _, details = outcome.partition("|")
    assert code in {"OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "ABORTED", "ALREADY_EXISTS",
                    "FAILED_PRECONDITION", "CANCELLED"}, outcome
    if code == "INVALID_ARGUMENT":
        assert details and details.split(":")[0].split(".")[0].split("[")[0] in (
            "register", "telemetry", "result", "message", "body"), details
    _record(statuses, "fleet", code)


valid_subscribe = st.builds(tables_pb2.WatchRequest, subscribe=st.builds(
    tables_pb2.Subscribe, proxy_id=names.map(lambda n: "fz-proxy-" + n), region=st.just("local"),
    have_version=st.integers(0, 2**64 - 1)))
watch_messages = st.one_of(
    st.builds(tables_pb2.WatchRequest, subscribe=st.builds(tables_pb2.Subscribe, proxy_id=texts, region=texts,
                                                           have_version=st.integers(0, 2**64 - 1))),
    st.builds(tables_pb2.WatchRequest, ack=st.builds(tables_pb2.Ack, version=st.integers(0, 2**64 - 1), nonce=texts,
                                                     applied=st.booleans(), error=texts)),
    st.just(tables_pb2.WatchRequest()))


@SETTINGS
@given(messages=st.one_of(
    st.tuples(valid_subscribe, st.lists(watch_messages, max_size=3)).map(lambda t: [t[0], *t[1]]),
    st.lists(watch_messages, min_size=1, max_size=4)))
def test_tables_watch_refuses_malformed_proxies_cleanly(fuzz_fleet, statuses, messages):
    with grpc.insecure_channel(fuzz_fleet.cp_address) as ch:
        responses = tables_pb2_grpc.TablesStub(ch).Watch(iter(messages), timeout=10)
        try:
            first = next(responses)
            assert first.version > 0
            code = "SNAPSHOT"
            responses.cancel()
        except grpc.RpcError as exc:
            code = exc.code().name
            details = exc.details() or ""
            assert code in {"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"}, (code, details)
            if code == "INVALID_ARGUMENT":
                assert details.split(".")[0].split(":")[0] in ("subscribe", "ack", "message", "body"), details
        except StopIteration:
            code = "CLOSED"
    _record(statuses, "tables", code)


def test_servers_still_serve_after_the_fuzzing(fuzz_fleet, channel):
    assert all(child.alive() for child in fuzz_fleet.children)
    reply = fuzz_fleet.inference(channel).Infer(
        inference_pb2.InferRequest(model="chat", prompt="still here", max_tokens=3, tier=common_pb2.TIER_STANDARD),
        metadata=(("x-api-key", fuzz_fleet.keys["ent"]),), timeout=10)
    assert reply.completion_tokens == 3
