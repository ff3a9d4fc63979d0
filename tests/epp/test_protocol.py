"""The endpoint picker alone against the endpoint-picker protocol's rules, over a real gRPC ext_proc stream.

An in-process proxy serving ``ExternalProcessor`` (``Proxy.start(picker=True)``)
watches a fake control plane; each test plays Envoy's side of one or more
``Process`` streams with the ext_proc stubs and checks the answers: the
destination header and the ``envoy.lb`` metadata agree and list the chosen
endpoint then its fallbacks, the subset hint is honoured, refusals are
immediate with OpenAI-shaped bodies, the health services are the protocol's,
and the in-flight accounting returns to zero however a stream ends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry
from tritonclient.grpc import service_pb2 as pb

from dataplane.config import ProxySettings
from dataplane.epp import protocol
from dataplane.epp.ends import DOWNSTREAM_END, UPSTREAM_END
from dataplane.server import Proxy
from tests.dataplane.conftest import FAST, KEYS, TENANTS
from tests.dataplane.fakes import FakeControlPlane, route, snapshot
from tests.dataplane.test_service import eventually

pytestmark = pytest.mark.timeout(30)

HTTP = {f"r{i}": f"127.0.0.{i + 1}:{8000 + i}" for i in range(4)}
GRPC = {f"r{i}": f"127.0.0.{i + 1}:{9000 + i}" for i in range(4)}
AUTH = ("authorization", f"Bearer {KEYS['paid']}")


def routes(n: int = 4, **load: Any) -> list[Any]:
    out = []
    for i in range(n):
        rid = f"r{i}"
        r = route(rid, GRPC[rid], node=f"n{i}", **load)
        r.http_address = HTTP[rid]
        r.kserve_model = "m"
        out.append(r)
    return out


class Picker:
    """An in-process picker on a fake control plane, and Envoy's side of its streams."""

    def __init__(self) -> None:
        self.cp = FakeControlPlane()
        self.proxy: Proxy | None = None
        self.channel: grpc.aio.Channel | None = None

    async def start(self, table: Any = None, **settings: Any) -> Picker:
        self.cp.current = table if table is not None else snapshot(1, routes())
        await self.cp.start()
        self.proxy = Proxy(settings=ProxySettings.from_section({"proxy_id": "epp", **FAST, **settings}),
                           tenants=TENANTS, control_planes=[self.cp.address], registry=CollectorRegistry(),
                           rng=random.Random(3))
        port = await self.proxy.start("127.0.0.1:0", picker=True)
        if table is not False:
            assert (await self.cp.next_ack()).applied
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.stub = ext_grpc.ExternalProcessorStub(self.channel)
        self.reports = als_pb2_grpc.AccessLogServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        return self

    async def stop(self) -> None:
        if self.channel is not None:
            await self.channel.close()
        if self.proxy is not None:
            await self.proxy.stop(0)
        await self.cp.stop()

    def open(self) -> Any:
        return self.stub.Process()


@pytest.fixture
async def picker() -> AsyncIterator[Any]:
    made: list[Picker] = []

    async def make(table: Any = None, **settings: Any) -> Picker:
        p = Picker()
        made.append(p)
        return await p.start(table, **settings)

    yield make
    for p in made:
        await p.stop()


def headers(path: str = "/v1/completions", *extra: tuple[str, str], method: str = "POST",
            end: bool = False) -> ext.ProcessingRequest:
    pairs = [(":method", method), (":path", path), ("content-type", "application/json"), AUTH, *extra]
    message = ext.ProcessingRequest()
    message.request_headers.end_of_stream = end
    for name, value in pairs:
        message.request_headers.headers.headers.append(base_pb2.HeaderValue(key=name, raw_value=value.encode()))
    return message


def body(data: Any, *, end: bool = True) -> ext.ProcessingRequest:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return ext.ProcessingRequest(request_body=ext.HttpBody(body=raw, end_of_stream=end))


def completion(prompt: str = "hello there world", **fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": prompt, "max_tokens": 4, **fields}


def with_subset(message: ext.ProcessingRequest, endpoints: list[str]) -> ext.ProcessingRequest:
    hint = struct_pb2.Struct()
    hint.update({protocol.SUBSET: endpoints})
    message.metadata_context.filter_metadata[protocol.SUBSET_NAMESPACE].CopyFrom(hint)
    return message


def response_headers(status: int = 200, served: str = "") -> ext.ProcessingRequest:
    message = ext.ProcessingRequest()
    message.response_headers.headers.headers.append(base_pb2.HeaderValue(key=":status", raw_value=str(status).encode()))
    if served:
        message.metadata_context.filter_metadata[protocol.LB_NAMESPACE].update({protocol.SERVED: served})
    return message


async def ask(call: Any, *messages: ext.ProcessingRequest) -> ext.ProcessingResponse:
    """Write the request's messages; the answer that decides (the body's, or the headers' when no body)."""
    for message in messages:
        await call.write(message)
    answer = await call.read()
    while (answer.WhichOneof("response") == "request_headers"
           and not answer.request_headers.response.header_mutation.set_headers) or answer.HasField(
               "override_message_timeout"):
        answer = await call.read()
    return answer


def set_headers(answer: ext.ProcessingResponse) -> dict[str, str]:
    """The request headers a destination answer sets."""
    common = answer.request_body.response if answer.HasField("request_body") else answer.request_headers.response
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}


def destination(answer: ext.ProcessingResponse) -> tuple[str, str]:
    """(header value, metadata value) of a destination answer."""
    header = set_headers(answer)[protocol.DESTINATION]
    meta = answer.dynamic_metadata.fields[protocol.LB_NAMESPACE].struct_value.fields[protocol.DESTINATION]
    return header, meta.string_value


class Routed:
    """A decided request: its processor stream, request id, endpoints and the request headers the answer sets."""

    def __init__(self, call: Any, request_id: str, endpoints: list[str], headers: dict[str, str] | None = None) -> None:
        self.call, self.request_id, self.endpoints, self.headers = call, request_id, endpoints, headers or {}


async def routed(p: Picker, data: Any | None = None, *extra: tuple[str, str]) -> Routed:
    call = p.open()
    answer = await ask(call, headers("/v1/completions", *extra), body(data or completion()))
    header, meta = destination(answer)
    assert header == meta  # the protocol: header and metadata agree
    mutation = set_headers(answer)
    return Routed(call, mutation["x-request-id"], header.split(","), mutation)


def entry(request_id: str, kind: int, status: int = 200, served: str = "") -> Any:
    """One report entry as Envoy's access-log service sends it."""
    out = accesslog_pb2.HTTPAccessLogEntry()
    out.request.request_id = request_id
    out.common_properties.access_log_type = kind
    out.common_properties.start_time.GetCurrentTime()
    if status:
        out.response.response_code.value = status
    if served:
        host, _, port = served.rpartition(":")
        out.common_properties.upstream_remote_address.socket_address.address = host
        out.common_properties.upstream_remote_address.socket_address.port_value = int(port)
    return out


async def report(p: Picker, *entries: Any) -> None:
    """Send ``entries`` in one report batch, as Envoy does at each flush."""
    message = als_pb2.StreamAccessLogsMessage()
    message.identifier.log_name = "ferry_reports"
    message.http_logs.log_entry.extend(entries)
    await p.reports.StreamAccessLogs(iter([message]))


async def finish(p: Picker, request: Routed, status: int = 200, served: str = "") -> None:
    """Envoy's side after a decision: the processor stream ends, then the replica's and the client's ends come."""
    await request.call.done_writing()
    assert await request.call.code() == grpc.StatusCode.OK
    served = served or request.endpoints[0]
    await report(p, entry(request.request_id, UPSTREAM_END, status, served),
                 entry(request.request_id, DOWNSTREAM_END, status, served))


async def idle(p: Picker) -> None:
    """Wait (bounded) for every stream to be closed by the picker, then check nothing stays accounted."""
    assert p.proxy is not None and p.proxy.picker is not None
    picker = p.proxy.picker
    await eventually(lambda: not picker.streams)
    assert not picker.ends.pending
    assert p.proxy.router.inflight == 0
    assert sum(p.proxy.router.local_load.get(rid) for rid in HTTP) == 0


async def test_destination_lists_the_choice_then_fallbacks_in_header_and_metadata_alike(picker) -> None:
    p = await picker()
    request = await routed(p)
    endpoints = request.endpoints
    assert len(endpoints) == 3 and len(set(endpoints)) == 3  # picker_fallbacks = 2 by default
    assert set(endpoints) <= set(HTTP.values())
    await finish(p, request)
    await idle(p)


async def test_the_same_prefix_lands_on_the_same_endpoint(picker) -> None:
    p = await picker()
    prompt = "shared system prompt " * 200
    firsts = []
    for i in range(6):
        request = await routed(p, completion(prompt + f"question {i}"))
        firsts.append(request.endpoints[0])
        await finish(p, request)
    assert len(set(firsts)) == 1


async def test_the_subset_hint_is_honoured_and_an_empty_one_is_503(picker) -> None:
    p = await picker()
    allowed = [HTTP["r2"], HTTP["r3"]]
    call = p.open()
    answer = await ask(call, with_subset(headers(), allowed), body(completion()))
    header, _ = destination(answer)
    assert set(header.split(",")) == set(allowed)
    await finish(p, Routed(call, set_headers(answer)["x-request-id"], header.split(",")))
    call = p.open()
    answer = await ask(call, with_subset(headers(), []), body(completion()))
    assert answer.immediate_response.status.code == 503
    assert json.loads(answer.immediate_response.body)["error"]["type"] == "server_error"
    await idle(p)


def model_infer(model: str = "m") -> bytes:
    """One framed ModelInferRequest as tritonclient sends it."""
    message = pb.ModelInferRequest(model_name=model, id="x")
    message.inputs.add(name="text_input", datatype="BYTES", shape=(1, 1))
    message.inputs.add(name="max_tokens", datatype="INT32", shape=(1, 1))
    prompt = b"hello over kserve"
    message.raw_input_contents.extend([struct.pack("<I", len(prompt)) + prompt, struct.pack("<i", 8)])
    raw = message.SerializeToString()
    return struct.pack(">BI", 0, len(raw)) + raw


async def test_kserve_model_infer_routes_to_the_grpc_address(picker) -> None:
    p = await picker()
    framed = model_infer()
    call = p.open()
    answer = await ask(call, headers("/inference.GRPCInferenceService/ModelInfer", ("x-api-key", KEYS["paid"])),
                       body(framed))
    header, _ = destination(answer)
    assert set(header.split(",")) <= set(GRPC.values())
    await finish(p, Routed(call, set_headers(answer)["x-request-id"], header.split(",")))
    await idle(p)


@pytest.mark.parametrize(("key", "model", "code"), [
    ("wrong", "m", grpc.StatusCode.UNAUTHENTICATED), (KEYS["paid"], "nope", grpc.StatusCode.NOT_FOUND)],
    ids=["bad-key", "unknown-model"])
async def test_a_grpc_caller_is_refused_with_a_grpc_status(picker, key, model, code) -> None:
    p = await picker()
    grpc_headers = headers("/inference.GRPCInferenceService/ModelInfer", ("x-api-key", key))
    del grpc_headers.request_headers.headers.headers[2:4]  # no JSON content type, no bearer key
    grpc_headers.request_headers.headers.headers.append(
        base_pb2.HeaderValue(key="content-type", raw_value=b"application/grpc"))
    answer = await ask(p.open(), grpc_headers, body(model_infer(model)))
    refusal = answer.immediate_response
    assert refusal.status.code == 200 and refusal.grpc_status.status == code.value[0]
    assert refusal.details and not refusal.body
    await idle(p)


@pytest.mark.parametrize(("extra", "data", "status", "param"), [
    ((("authorization", "Bearer wrong"),), completion(), 401, None),
    ((), {"model": "nope", "prompt": "x", "max_tokens": 1}, 404, "model"),
    ((), {"model": "m", "prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ((), b"{not json", 400, "body"),
], ids=["bad-key", "unknown-model", "bad-field", "bad-json"])
async def test_bad_requests_are_refused_at_once_naming_the_field(picker, extra, data, status, param) -> None:
    p = await picker()
    call = p.open()
    message = headers()
    if extra:
        del message.request_headers.headers.headers[:]
        for name, value in ((":method", "POST"), (":path", "/v1/completions"), *extra):
            message.request_headers.headers.headers.append(base_pb2.HeaderValue(key=name, raw_value=value.encode()))
    answer = await ask(call, message, body(data))
    assert answer.immediate_response.status.code == status
    error = json.loads(answer.immediate_response.body)["error"]
    if param is not None:
        assert error["param"] == param
    await idle(p)


async def test_sampling_parameters_are_the_replicas_to_judge(picker) -> None:
    p = await picker()  # the table's replicas declare no sampling inputs
    request = await routed(p, completion(temperature=0.2, top_p=0.9, seed=3))
    await finish(p, request)
    await idle(p)


async def test_models_and_health_are_answered_by_the_picker(picker) -> None:
    p = await picker()
    answer = await ask(p.open(), headers("/v1/models", method="GET", end=True))
    assert answer.immediate_response.status.code == 200
    assert [m["id"] for m in json.loads(answer.immediate_response.body)["data"]] == ["m"]
    answer = await ask(p.open(), headers("/health", method="GET", end=True))
    assert answer.immediate_response.status.code == 200
    answer = await ask(p.open(), headers("/v1/models/m", method="GET", end=True))
    assert answer.immediate_response.status.code == 200
    assert json.loads(answer.immediate_response.body)["id"] == "m"
    answer = await ask(p.open(), headers("/v1/models/nope", method="GET", end=True))
    error = json.loads(answer.immediate_response.body)["error"]
    assert answer.immediate_response.status.code == 404 and error["code"] == "model_not_found"
    await idle(p)


async def limited(picker: Any, requests_per_second: float) -> Picker:
    """A picker whose paid tenant (``acme``) has a requests-per-second bucket."""
    p: Picker = await picker()
    assert p.proxy is not None
    p.proxy.authenticator.replace([dataclasses.replace(t, requests_per_second=requests_per_second)
                                   if t.name == "acme" else t for t in TENANTS])
    return p


async def test_a_refusal_carries_the_tenants_rate_limit_headers(picker) -> None:
    p = await limited(picker, 1.0)
    request = await routed(p)  # takes the one request of the bucket
    first = await ask(p.open(), headers(), body(completion()))  # the bucket (1 deep) is empty: refused at once
    await finish(p, request)
    answer = first.immediate_response
    assert answer.status.code == 429
    names = {h.header.key: h.header.raw_value.decode() for h in answer.headers.set_headers}
    assert names["x-ratelimit-limit-requests"] == "1" and names["x-ratelimit-remaining-requests"] == "0"
    assert names["x-ratelimit-reset-requests"].endswith("s") and "x-ratelimit-limit-tokens" not in names
    await idle(p)


async def test_a_decision_carries_the_rate_limit_headers_in_metadata(picker) -> None:
    p = await limited(picker, 5.0)
    call = p.open()
    answer = await ask(call, headers("/v1/completions"), body(completion()))
    extra = answer.dynamic_metadata.fields[protocol.ANSWER_NAMESPACE].struct_value.fields
    assert extra["x-ratelimit-limit-requests"].string_value == "5"
    assert extra["x-ratelimit-remaining-requests"].string_value == "4"
    assert set(extra) <= set(protocol.ANSWER_HEADERS)
    request_id = set_headers(answer)["x-request-id"]
    await finish(p, Routed(call, request_id, destination(answer)[0].split(",")))
    await idle(p)


async def test_a_route_not_served_is_refused_before_its_body(picker) -> None:
    p = await picker()  # a KServe stream (tritonclient's stream_infer) stays open: its body would never end
    call = p.open()
    grpc_headers = headers("/inference.GRPCInferenceService/ModelStreamInfer", ("x-api-key", KEYS["paid"]))
    del grpc_headers.request_headers.headers.headers[2:4]  # no JSON content type, no bearer key
    grpc_headers.request_headers.headers.headers.append(
        base_pb2.HeaderValue(key="content-type", raw_value=b"application/grpc"))
    await call.write(grpc_headers)
    answer = await asyncio.wait_for(call.read(), 5)
    assert answer.immediate_response.grpc_status.status == grpc.StatusCode.UNIMPLEMENTED.value[0]
    await idle(p)


async def test_an_unknown_route_is_404_and_a_get_of_completions_405(picker) -> None:
    p = await picker()
    answer = await ask(p.open(), headers("/v2/other", method="GET", end=True))
    assert answer.immediate_response.status.code == 404
    answer = await ask(p.open(), headers("/v1/completions", method="GET", end=True))
    assert answer.immediate_response.status.code == 405
    await idle(p)


async def test_over_the_inflight_bound_is_429_with_retry_after(picker) -> None:
    p = await picker(max_inflight=1)
    held = await routed(p)
    answer = await ask(p.open(), headers(), body(completion()))
    assert answer.immediate_response.status.code == 429
    names = {h.header.key: h.header.raw_value for h in answer.immediate_response.headers.set_headers}
    assert int(names["retry-after"]) >= 1
    assert json.loads(answer.immediate_response.body)["error"]["code"] == "rate_limit_exceeded"
    await finish(p, held)
    await idle(p)


async def test_a_queued_request_waits_in_the_picker_and_is_refused_at_its_deadline(picker) -> None:
    table = snapshot(1, routes(1, max_concurrency=1))
    p = await picker(table)
    held = await routed(p, completion(), ("x-ferry-tier", "standard"))
    started = time.monotonic()
    answer = await ask(p.open(), headers("/v1/completions", ("x-ferry-tier", "standard"), ("x-ferry-timeout", "0.5")),
                       body(completion()))
    waited = time.monotonic() - started
    assert answer.WhichOneof("response") == "immediate_response"
    assert answer.immediate_response.status.code in (429, 503, 504)
    assert waited >= 0.4  # it waited in the tier queue for its deadline
    await finish(p, held)
    await idle(p)


async def test_a_queued_request_goes_when_the_slot_frees(picker) -> None:
    table = snapshot(1, routes(1, max_concurrency=1))
    p = await picker(table)
    held = await routed(p, completion(), ("x-ferry-tier", "standard"))
    waiting = p.open()
    await waiting.write(headers("/v1/completions", ("x-ferry-tier", "standard")))
    await waiting.read()
    await waiting.write(body(completion()))
    extended = await asyncio.wait_for(waiting.read(), 5)  # it waits: the forwarder is told to wait with it
    assert extended.HasField("override_message_timeout") and extended.override_message_timeout.seconds >= 1
    pending = asyncio.ensure_future(waiting.read())
    await asyncio.sleep(0.2)
    assert not pending.done()  # queued behind the held one
    await finish(p, held)  # its report frees the slot
    answer = await asyncio.wait_for(pending, 5)
    assert destination(answer)[0].split(",")[0] == HTTP["r0"]
    await finish(p, Routed(waiting, set_headers(answer)["x-request-id"], destination(answer)[0].split(",")))
    await idle(p)


async def test_a_fallback_that_served_moves_the_attempt_and_frees_the_first(picker) -> None:
    p = await picker()
    request = await routed(p)
    await request.call.done_writing()
    await report(p, entry(request.request_id, UPSTREAM_END, 0, request.endpoints[0]))  # refused: Envoy goes on
    assert p.proxy is not None and p.proxy.router.inflight == 1
    await report(p, entry(request.request_id, UPSTREAM_END, 200, request.endpoints[1]))
    await idle(p)
    assert p.proxy.metrics.value("proxy_retries_total", model="m", reason="unreached") == 1
    assert p.proxy is not None
    assert p.proxy.metrics.value("proxy_retries_total", model="m", reason="unreached") == 1


async def test_inflight_returns_to_zero_however_a_request_ends(picker) -> None:
    p = await picker()
    requests = [await routed(p) for _ in range(6)]
    assert p.proxy is not None and p.proxy.router.inflight == 6
    for request in requests:
        request.call.cancel()  # Envoy ends the processor stream once it has the decision: nothing is released yet
    await report(p, entry("not-ours", UPSTREAM_END, 200, HTTP["r0"]))  # another picker's request: ignored
    assert p.proxy.router.inflight == 6
    first, second, third, *rest = requests
    await report(p, entry(first.request_id, UPSTREAM_END, 200, first.endpoints[0]),  # the replica finished
                 entry(second.request_id, DOWNSTREAM_END, 0),  # the client left before any answer
                 entry(third.request_id, DOWNSTREAM_END, 503))  # nothing could be reached
    await eventually(lambda: p.proxy is not None and p.proxy.router.inflight == 3)
    await report(p, entry(first.request_id, DOWNSTREAM_END, 200, first.endpoints[0]),  # already ended: ignored
                 *(entry(r.request_id, UPSTREAM_END, 200, r.endpoints[0]) for r in rest))
    await idle(p)
    lag = p.proxy.metrics.registry.get_sample_value("ferry_picker_report_lag_seconds_count", {"end": "upstream"})
    assert lag == 4


async def test_a_request_never_reported_is_closed_after_its_deadline(picker) -> None:
    p = await picker()
    assert p.proxy is not None and p.proxy.picker is not None
    ends = p.proxy.picker.ends
    ends.grace = 0.0
    request = await routed(p, completion(), ("x-ferry-timeout", "0.3"))
    await request.call.done_writing()
    assert ends.sweep() == 0 and p.proxy.router.inflight == 1
    await asyncio.sleep(0.35)
    assert ends.sweep() == 1
    await idle(p)
    assert p.proxy.metrics.registry.get_sample_value("ferry_picker_report_expired_total") == 1


async def test_the_forwarder_holds_the_request_deadline(picker) -> None:
    p = await picker()
    call = p.open()
    answer = await ask(call, headers("/v1/completions", ("x-ferry-timeout", "2")), body(completion()))
    assert 1000 < int(set_headers(answer)["x-envoy-upstream-rq-timeout-ms"]) <= 2000


async def test_without_reports_the_end_of_the_processor_stream_ends_the_request(picker) -> None:
    p = await picker(picker_end="stream")
    request = await routed(p)
    assert p.proxy is not None and p.proxy.router.inflight == 1
    await request.call.write(response_headers(200))
    await request.call.read()
    await request.call.done_writing()
    await idle(p)


async def test_health_services_follow_the_protocol(picker) -> None:
    p = await picker(table=False)  # no table yet: alive, not ready

    async def status(service: str) -> int:
        return int((await p.health.Check(health_pb2.HealthCheckRequest(service=service))).status)

    assert await status("liveness") == health_pb2.HealthCheckResponse.SERVING
    assert await status("readiness") == health_pb2.HealthCheckResponse.NOT_SERVING
    assert await status("envoy.service.ext_proc.v3.ExternalProcessor") == health_pb2.HealthCheckResponse.NOT_SERVING
    p.cp.push(snapshot(1, routes()))
    assert p.proxy is not None
    readiness = p.proxy.readiness
    await eventually(lambda: readiness.status == health_pb2.HealthCheckResponse.SERVING)
    assert await status("readiness") == health_pb2.HealthCheckResponse.SERVING
    assert await status("envoy.service.ext_proc.v3.ExternalProcessor") == health_pb2.HealthCheckResponse.SERVING


async def test_full_duplex_streamed_bodies_route_and_come_back_whole(picker) -> None:
    p = await picker()
    call = p.open()
    first = headers()
    first.protocol_config.request_body_mode = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
    raw = json.dumps(completion()).encode()
    await call.write(first)
    await call.write(body(raw[:10], end=False))
    await call.write(body(raw[10:], end=True))
    answer = await call.read()
    header, meta = destination(answer)
    assert header == meta and answer.HasField("request_headers")
    chunk = await call.read()
    streamed = chunk.request_body.response.body_mutation.streamed_response
    assert streamed.body == raw and streamed.end_of_stream
    await finish(p, Routed(call, set_headers(answer)["x-request-id"], header.split(",")))
    await idle(p)
