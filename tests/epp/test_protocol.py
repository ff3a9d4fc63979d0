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
import json
import random
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry
from tritonclient.grpc import service_pb2 as pb

from dataplane.config import ProxySettings
from dataplane.epp import protocol
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


def destination(answer: ext.ProcessingResponse) -> tuple[str, str]:
    """(header value, metadata value) of a destination answer."""
    common = answer.request_body.response if answer.HasField("request_body") else answer.request_headers.response
    header = next(h.header.raw_value.decode() for h in common.header_mutation.set_headers
                  if h.header.key == protocol.DESTINATION)
    meta = answer.dynamic_metadata.fields[protocol.LB_NAMESPACE].struct_value.fields[protocol.DESTINATION]
    return header, meta.string_value


async def routed(p: Picker, data: Any | None = None, *extra: tuple[str, str]) -> tuple[Any, list[str]]:
    call = p.open()
    answer = await ask(call, headers("/v1/completions", *extra), body(data or completion()))
    header, meta = destination(answer)
    assert header == meta  # the protocol: header and metadata agree
    return call, header.split(",")


async def finish(call: Any, status: int = 200, served: str = "") -> None:
    await call.write(response_headers(status, served))
    assert (await call.read()).WhichOneof("response") == "response_headers"
    await call.done_writing()
    assert await call.code() == grpc.StatusCode.OK  # the stream ends: the request is over


async def idle(p: Picker) -> None:
    """Wait (bounded) for every stream to be closed by the picker, then check nothing stays accounted."""
    assert p.proxy is not None and p.proxy.picker is not None
    picker = p.proxy.picker
    await eventually(lambda: not picker.streams)
    assert p.proxy.router.inflight == 0
    assert sum(p.proxy.router.local_load.get(rid) for rid in HTTP) == 0


async def test_destination_lists_the_choice_then_fallbacks_in_header_and_metadata_alike(picker) -> None:
    p = await picker()
    call, endpoints = await routed(p)
    assert len(endpoints) == 3 and len(set(endpoints)) == 3  # picker_fallbacks = 2 by default
    assert set(endpoints) <= set(HTTP.values())
    await finish(call)
    await idle(p)


async def test_the_same_prefix_lands_on_the_same_endpoint(picker) -> None:
    p = await picker()
    prompt = "shared system prompt " * 200
    firsts = []
    for i in range(6):
        call, endpoints = await routed(p, completion(prompt + f"question {i}"))
        firsts.append(endpoints[0])
        await finish(call)
    assert len(set(firsts)) == 1


async def test_the_subset_hint_is_honoured_and_an_empty_one_is_503(picker) -> None:
    p = await picker()
    allowed = [HTTP["r2"], HTTP["r3"]]
    call = p.open()
    answer = await ask(call, with_subset(headers(), allowed), body(completion()))
    header, _ = destination(answer)
    assert set(header.split(",")) == set(allowed)
    await finish(call)
    call = p.open()
    answer = await ask(call, with_subset(headers(), []), body(completion()))
    assert answer.immediate_response.status.code == 503
    assert json.loads(answer.immediate_response.body)["error"]["type"] == "server_error"
    await idle(p)


async def test_kserve_model_infer_routes_to_the_grpc_address(picker) -> None:
    p = await picker()
    message = pb.ModelInferRequest(model_name="m", id="x")
    message.inputs.add(name="text_input", datatype="BYTES", shape=(1, 1))
    message.inputs.add(name="max_tokens", datatype="INT32", shape=(1, 1))
    prompt = b"hello over kserve"
    message.raw_input_contents.extend([struct.pack("<I", len(prompt)) + prompt, struct.pack("<i", 8)])
    raw = message.SerializeToString()
    framed = struct.pack(">BI", 0, len(raw)) + raw
    call = p.open()
    answer = await ask(call, headers("/inference.GRPCInferenceService/ModelInfer", ("x-api-key", KEYS["paid"])),
                       body(framed))
    header, _ = destination(answer)
    assert set(header.split(",")) <= set(GRPC.values())
    await finish(call)
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


async def test_models_and_health_are_answered_by_the_picker(picker) -> None:
    p = await picker()
    answer = await ask(p.open(), headers("/v1/models", method="GET", end=True))
    assert answer.immediate_response.status.code == 200
    assert [m["id"] for m in json.loads(answer.immediate_response.body)["data"]] == ["m"]
    answer = await ask(p.open(), headers("/health", method="GET", end=True))
    assert answer.immediate_response.status.code == 200
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
    held, _ = await routed(p)
    answer = await ask(p.open(), headers(), body(completion()))
    assert answer.immediate_response.status.code == 429
    names = {h.header.key: h.header.raw_value for h in answer.immediate_response.headers.set_headers}
    assert int(names["retry-after"]) >= 1
    assert json.loads(answer.immediate_response.body)["error"]["code"] == "rate_limit_exceeded"
    await finish(held)
    await idle(p)


async def test_a_queued_request_waits_in_the_picker_and_is_refused_at_its_deadline(picker) -> None:
    table = snapshot(1, routes(1, max_concurrency=1))
    p = await picker(table)
    held, _ = await routed(p, completion(), ("x-ferry-tier", "standard"))
    started = time.monotonic()
    answer = await ask(p.open(), headers("/v1/completions", ("x-ferry-tier", "standard"), ("x-ferry-timeout", "0.5")),
                       body(completion()))
    waited = time.monotonic() - started
    assert answer.WhichOneof("response") == "immediate_response"
    assert answer.immediate_response.status.code in (429, 503, 504)
    assert waited >= 0.4  # it waited in the tier queue for its deadline
    await finish(held)
    await idle(p)


async def test_a_queued_request_goes_when_the_slot_frees(picker) -> None:
    table = snapshot(1, routes(1, max_concurrency=1))
    p = await picker(table)
    held, _ = await routed(p, completion(), ("x-ferry-tier", "standard"))
    waiting = p.open()
    await waiting.write(headers("/v1/completions", ("x-ferry-tier", "standard")))
    await waiting.read()
    await waiting.write(body(completion()))
    extended = await asyncio.wait_for(waiting.read(), 5)  # it waits: the forwarder is told to wait with it
    assert extended.HasField("override_message_timeout") and extended.override_message_timeout.seconds >= 1
    pending = asyncio.ensure_future(waiting.read())
    await asyncio.sleep(0.2)
    assert not pending.done()  # queued behind the held one
    await finish(held)
    answer = await asyncio.wait_for(pending, 5)
    assert destination(answer)[0].split(",")[0] == HTTP["r0"]
    await finish(waiting)
    await idle(p)


async def test_a_fallback_that_served_moves_the_attempt_and_frees_the_first(picker) -> None:
    p = await picker()
    call, endpoints = await routed(p)
    await finish(call, served=endpoints[1])
    await idle(p)
    assert p.proxy is not None
    assert p.proxy.metrics.value("proxy_retries_total", model="m", reason="unreached") == 1


async def test_inflight_returns_to_zero_when_the_client_leaves_mid_stream(picker) -> None:
    p = await picker()
    calls = [(await routed(p))[0] for _ in range(5)]
    assert p.proxy is not None and p.proxy.router.inflight == 5
    for call in calls[:3]:
        call.cancel()  # Envoy resets the stream when the downstream goes away
    for call in calls[3:]:
        await call.write(response_headers(200))
        await call.read()
        call.cancel()
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
    await finish(call)
    await idle(p)
