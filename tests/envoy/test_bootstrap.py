"""Envoy as the data plane: the rendered bootstrap, and a real Envoy 1.40 routing by a picker's answer.

The e2e tests start the wheel's Envoy in front of tiny aiohttp replicas and a
test double of the endpoint picker (an ext_proc server answering with a fixed
endpoint list in ``envoy.lb`` / ``x-gateway-destination-endpoint``). Everything
binds 127.0.0.1 (ports chosen by the kernel) and every process and server a
test starts is stopped in ``finally``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from envoy.config.core.v3 import base_pb2
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from google.protobuf import struct_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dataplane.envoy.bootstrap import (
    BODY_MODES,
    DECIDED,
    ENDPOINT_KEY,
    EXT_PROC_SERVICE,
    KSERVE_CLUSTER,
    LB_NAMESPACE,
    PICKER_CLUSTER,
    REPLICA_CLUSTER,
    ROUTINGS,
    SERVED_KEY,
    UPSTREAM_PROTOCOLS,
    EnvoySettings,
    TlsFiles,
    render_bootstrap,
    render_endpoints,
    split_address,
)
from dataplane.envoy.process import EnvoyProcess, envoy_binary, start_envoy, write_endpoints
from dataplane.epp.protocol import ANSWER_NAMESPACE
from ferry.errors import ConfigError
from harness import tlsgen
from tests.security.test_client_reload import SecretMount

PICKERS = ["127.0.0.1:9001", "127.0.0.1:9002"]


def _render(**overrides: Any) -> dict[str, Any]:
    tls = overrides.pop("tls", None)
    pickers = overrides.pop("pickers", PICKERS)
    return render_bootstrap(EnvoySettings(**overrides), listen_port=8480, admin_port=8481, pickers=pickers,
                            endpoints_path="/run/ferry/endpoints.json", tls=tls)


def _manager(config: dict[str, Any]) -> dict[str, Any]:
    manager: dict[str, Any] = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]
    return manager


def _ext_proc(config: dict[str, Any]) -> dict[str, Any]:
    filt: dict[str, Any] = _manager(config)["http_filters"][0]["typed_config"]
    return filt


def _cluster(config: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in config["static_resources"]["clusters"] if c["name"] == name)


# ---------------------------------------------------------------- rendering


def test_listener_and_admin_bind_loopback_with_exact_balance() -> None:
    config = _render()
    listener = config["static_resources"]["listeners"][0]
    assert listener["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 8480}
    assert config["admin"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 8481}
    assert listener["enable_reuse_port"] is False
    assert listener["connection_balance_config"] == {"exact_balance": {}}
    assert listener["per_connection_buffer_limit_bytes"] == 1 << 20
    manager = _manager(config)
    assert manager["codec_type"] == "AUTO"
    assert manager["http2_protocol_options"] == {"initial_stream_window_size": 65536,
                                                 "initial_connection_window_size": 1 << 20}
    assert [f["name"] for f in manager["http_filters"]] == ["envoy.filters.http.ext_proc", "envoy.filters.http.router"]


@pytest.mark.parametrize(("mode", "trailers"), [("BUFFERED", "SKIP"), ("FULL_DUPLEX_STREAMED", "SEND")],
                         ids=["buffered", "full-duplex"])
def test_ext_proc_filter(mode: str, trailers: str) -> None:
    filt = _ext_proc(_render(request_body_mode=mode))
    assert filt["grpc_service"]["envoy_grpc"] == {"cluster_name": PICKER_CLUSTER}
    assert filt["failure_mode_allow"] is True  # safe: only a decided request matches a forwarding route
    assert filt["message_timeout"] == "1.000s"
    assert filt["max_message_timeout"] == "30.000s"
    assert filt["allow_mode_override"] is False
    assert filt["processing_mode"] == {
        "request_header_mode": "SEND", "request_body_mode": mode, "request_trailer_mode": trailers,
        "response_header_mode": "SKIP", "response_body_mode": "NONE", "response_trailer_mode": "SKIP"}
    assert filt["metadata_options"] == {
        "forwarding_namespaces": {"untyped": ["envoy.lb", "envoy.lb.subset_hint"]},
        "receiving_namespaces": {"untyped": ["envoy.lb", "ferry.answer"]}}


@pytest.mark.parametrize(("balance", "groups"), [("failover", [(0, [9001]), (1, [9002])]),
                                                 ("round_robin", [(0, [9001, 9002])])], ids=["failover", "round-robin"])
def test_picker_cluster_is_health_checked_and_ejects(balance: str, groups: list[tuple[int, list[int]]]) -> None:
    cluster = _cluster(_render(picker_balance=balance), PICKER_CLUSTER)
    assert [(group.get("priority", 0), [e["endpoint"]["address"]["socket_address"]["port_value"]
                                        for e in group["lb_endpoints"]])
            for group in cluster["load_assignment"]["endpoints"]] == groups
    assert cluster["health_checks"][0]["grpc_health_check"] == {"service_name": EXT_PROC_SERVICE}
    assert cluster["health_checks"][0]["interval"] == "1.000s"
    assert cluster["outlier_detection"]["consecutive_local_origin_failure"] == 2
    options = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert "http2_protocol_options" in options["explicit_http_config"]


@pytest.mark.parametrize(("protocol", "key"), [("http1", "http_protocol_options"), ("h2c", "http2_protocol_options")],
                         ids=["http1", "h2c"])
def test_replica_cluster_protocol(protocol: str, key: str) -> None:
    config = _render(upstream_protocol=protocol)
    options = _cluster(config, REPLICA_CLUSTER)["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert key in options["explicit_http_config"]
    kserve = _cluster(config, KSERVE_CLUSTER)["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert "http2_protocol_options" in kserve["explicit_http_config"]  # gRPC: always h2c
    routes = _manager(config)["route_config"]["virtual_hosts"][0]["routes"]
    assert [(r["match"]["prefix"], r["route"]["cluster"]) for r in routes[:2]] == [
        ("/inference.GRPCInferenceService/", KSERVE_CLUSTER), ("/", REPLICA_CLUSTER)]
    # only a request a picker decided (its destination in Envoy's metadata) is forwarded; the rest get a 503
    assert all(r["match"]["dynamic_metadata"] == [DECIDED] for r in routes[:2])
    assert routes[2]["match"] == {"prefix": "/"} and routes[2]["direct_response"]["status"] == 503


def test_circuit_breakers_leave_admission_to_the_pickers() -> None:
    config = _render()
    for name in (REPLICA_CLUSTER, KSERVE_CLUSTER, PICKER_CLUSTER):
        thresholds = _cluster(config, name)["circuit_breakers"]["thresholds"]
        assert all(t["max_retries"] >= 1_000_000 and t["max_requests"] >= 1_000_000 for t in thresholds)


def test_override_host_reads_the_metadata_and_reports_the_served_endpoint() -> None:
    config = _render()
    cluster = _cluster(config, REPLICA_CLUSTER)
    assert cluster["type"] == "EDS"
    assert cluster["eds_cluster_config"]["eds_config"]["path_config_source"] == {
        "path": "/run/ferry/endpoints.json", "watched_directory": {"path": "/run/ferry"}}
    policy = cluster["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    assert policy["name"] == "envoy.load_balancing_policies.override_host"
    key = {"key": LB_NAMESPACE, "path": [{"key": ENDPOINT_KEY}]}
    assert policy["typed_config"]["override_host_sources"] == [{"metadata": key}]
    assert policy["typed_config"]["selected_host_key"] == {"key": LB_NAMESPACE, "path": [{"key": SERVED_KEY}]}
    assert _cluster(config, KSERVE_CLUSTER)["eds_cluster_config"]["eds_config"]["path_config_source"][
        "path"] == "/run/ferry/endpoints-kserve.json"
    route = _manager(config)["route_config"]["virtual_hosts"][0]["routes"][1]["route"]
    assert route["timeout"] == "0.000s"
    assert route["retry_policy"]["retry_on"] == "connect-failure,refused-stream,reset"
    assert route["retry_policy"]["num_retries"] == 2


def test_original_dst_routing() -> None:
    cluster = _cluster(_render(upstream_routing="original_dst"), REPLICA_CLUSTER)
    assert cluster["type"] == "ORIGINAL_DST"
    assert cluster["lb_policy"] == "CLUSTER_PROVIDED"
    assert cluster["original_dst_lb_config"]["metadata_key"] == {"key": LB_NAMESPACE, "path": [{"key": ENDPOINT_KEY}]}


@pytest.mark.parametrize(("access_log", "logger"), [("stdout", "envoy.access_loggers.stdout"),
                                                    ("/var/log/ferry.json", "envoy.access_loggers.file"),
                                                    ("", None)], ids=["stdout", "file", "none"])
def test_access_log(access_log: str, logger: str | None) -> None:
    logs = _manager(_render(access_log=access_log))["access_log"]
    reports = ["envoy.access_loggers.http_grpc"] * len(PICKERS)  # one report logger per picker
    assert [entry["name"] for entry in logs] == [*([logger] if logger else []), *reports]
    if logger:
        assert "json_format" in logs[0]["typed_config"]["log_format"]


def test_every_picker_hears_of_every_request_end() -> None:
    config = _render(pickers=["127.0.0.1:1", "127.0.0.1:2"], report_flush_ms=20)
    manager = _manager(config)
    reports = [e for e in manager["access_log"] if e["name"] == "envoy.access_loggers.http_grpc"]
    router = next(f for f in manager["http_filters"] if f["name"] == "envoy.filters.http.router")
    assert router["typed_config"]["upstream_log"] == reports  # the replica's end as well as the client's
    clusters = [r["typed_config"]["common_config"]["grpc_service"]["envoy_grpc"]["cluster_name"] for r in reports]
    assert clusters == [f"{PICKER_CLUSTER}_report_0", f"{PICKER_CLUSTER}_report_1"]
    assert {r["typed_config"]["common_config"]["buffer_flush_interval"] for r in reports} == {"0.020s"}
    for k, address in enumerate(["127.0.0.1:1", "127.0.0.1:2"]):
        endpoint = _cluster(config, clusters[k])["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
        assert endpoint["endpoint"]["address"]["socket_address"]["port_value"] == int(address[-1])


def test_tls_listener() -> None:
    chain = _render(tls=TlsFiles(cert_path="/c.pem", key_path="/k.pem"))["static_resources"]["listeners"][0][
        "filter_chains"][0]
    context = chain["transport_socket"]["typed_config"]["common_tls_context"]
    assert context["tls_certificates"] == [{"certificate_chain": {"filename": "/c.pem"},
                                            "private_key": {"filename": "/k.pem"}}]
    assert context["alpn_protocols"] == ["h2", "http/1.1"]
    assert "transport_socket" not in _render()["static_resources"]["listeners"][0]["filter_chains"][0]


@pytest.mark.parametrize("overrides", [
    {"request_body_mode": "STREAMED"}, {"upstream_routing": "maglev"}, {"upstream_protocol": "h3"},
    {"message_timeout_ms": 0}, {"max_message_timeout_ms": 100}, {"initial_stream_window_size": 1024},
    {"num_retries": -1}, {"retry_on": " "},
], ids=["body-mode", "routing", "protocol", "message-timeout", "max-below-message", "window", "retries", "retry-on"])
def test_settings_refuse_bad_values(overrides: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        EnvoySettings(**overrides)


def test_render_needs_pickers_and_an_endpoint_file() -> None:
    with pytest.raises(ValueError):
        render_bootstrap(EnvoySettings(), listen_port=1, admin_port=2, pickers=[], endpoints_path="/e.json")
    with pytest.raises(ValueError):
        render_bootstrap(EnvoySettings(), listen_port=1, admin_port=2, pickers=PICKERS)


@pytest.mark.parametrize(("address", "parsed"), [("10.0.0.5:8080", ("10.0.0.5", 8080)),
                                                 ("[2600:4040::1]:80", ("2600:4040::1", 80))], ids=["v4", "v6"])
def test_split_address(address: str, parsed: tuple[str, int]) -> None:
    assert split_address(address) == parsed
    assert render_endpoints([address])["resources"][0]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
        "socket_address"] == {"address": parsed[0], "port_value": parsed[1]}


def test_envoy_binary_is_the_wheels() -> None:
    assert Path(envoy_binary()).is_file()


# ---------------------------------------------------------------- test doubles


class StubPicker(ext_proc_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """An ext_proc server that picks a fixed endpoint list (``endpoints``) for every request.

    It answers as the endpoint-picker protocol says: the list in dynamic metadata
    ``envoy.lb`` / ``x-gateway-destination-endpoint`` and in the request header of
    that name (``raw_value``). BUFFERED body mode: it picks on the headers when
    they end the request, else on the (whole) body. It records the endpoint
    Envoy reports as served (``metadata_context`` of the response headers).
    """

    def __init__(self, endpoints: str, answer: dict[str, str] | None = None) -> None:
        self.endpoints = endpoints
        self.answer = answer or {}  # headers for Envoy to add to the answer (the picker's ANSWER_NAMESPACE)
        self.requests = 0
        self.served: list[str] = []  # the upstream that answered, from the reports' upstream ends
        self.ends: list[tuple[str, float]] = []  # (kind of end, when it was heard) from the report stream
        self.bodies: list[bytes] = []
        self.streams_ended: list[float] = []  # when each processor stream ended

    async def StreamAccessLogs(self, request_iterator: Any, context: Any) -> als_pb2.StreamAccessLogsResponse:
        async for message in request_iterator:
            for entry in message.http_logs.log_entry:
                common = entry.common_properties
                kind = accesslog_pb2.AccessLogType.Name(common.access_log_type)
                self.ends.append((kind, time.monotonic()))
                if kind == "UpstreamEnd" and entry.response.response_code.value:
                    socket = common.upstream_remote_address.socket_address
                    self.served.append(f"{socket.address}:{socket.port_value}")
        return als_pb2.StreamAccessLogsResponse()

    def _pick(self) -> ext_proc.CommonResponse:
        header = base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=ENDPOINT_KEY,
                                                                        raw_value=self.endpoints.encode()))
        return ext_proc.CommonResponse(header_mutation=ext_proc.HeaderMutation(set_headers=[header]),
                                       clear_route_cache=True)

    def _metadata(self) -> struct_pb2.Struct:
        metadata = struct_pb2.Struct()
        metadata.update({LB_NAMESPACE: {ENDPOINT_KEY: self.endpoints},
                         **({ANSWER_NAMESPACE: self.answer} if self.answer else {})})
        return metadata

    async def Process(self, request_iterator: Any, context: Any) -> AsyncIterator[ext_proc.ProcessingResponse]:
        try:
            async for response in self._process(request_iterator):
                yield response
        finally:
            self.streams_ended.append(time.monotonic())

    async def _process(self, request_iterator: Any) -> AsyncIterator[ext_proc.ProcessingResponse]:
        body = b""
        async for request in request_iterator:
            kind = request.WhichOneof("request")
            if kind == "request_headers":
                self.requests += 1
                if request.request_headers.end_of_stream:
                    yield ext_proc.ProcessingResponse(request_headers=ext_proc.HeadersResponse(response=self._pick()),
                                                      dynamic_metadata=self._metadata())
                else:
                    yield ext_proc.ProcessingResponse(request_headers=ext_proc.HeadersResponse())
            elif kind == "request_body":
                body += request.request_body.body
                if not request.request_body.end_of_stream:
                    continue
                self.bodies.append(body)
                yield ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse(response=self._pick()),
                                                  dynamic_metadata=self._metadata())
            elif kind == "request_trailers":
                yield ext_proc.ProcessingResponse(request_trailers=ext_proc.TrailersResponse())
            elif kind == "response_headers":
                fields = request.metadata_context.filter_metadata[LB_NAMESPACE].fields
                if SERVED_KEY in fields:
                    self.served.append(fields[SERVED_KEY].string_value)
                yield ext_proc.ProcessingResponse(response_headers=ext_proc.HeadersResponse())


class DuplexPicker(StubPicker):
    """The stub in FULL_DUPLEX_STREAMED body mode.

    Headers that carry a body get no answer until the body has ended (Envoy
    streams the chunks meanwhile); then it answers the headers (the pick) and
    sends the whole body back as one ``StreamedBodyResponse`` with
    ``end_of_stream``; trailers, when they come, get an empty answer.
    """

    chunks = 0  # request_body messages seen

    async def Process(self, request_iterator: Any, context: Any) -> AsyncIterator[ext_proc.ProcessingResponse]:
        try:
            async for response in self._process(request_iterator):
                yield response
        finally:
            self.streams_ended.append(time.monotonic())

    async def _process(self, request_iterator: Any) -> AsyncIterator[ext_proc.ProcessingResponse]:
        body = b""
        async for request in request_iterator:
            kind = request.WhichOneof("request")
            if kind == "request_headers":
                self.requests += 1
                if request.request_headers.end_of_stream:
                    yield ext_proc.ProcessingResponse(request_headers=ext_proc.HeadersResponse(response=self._pick()),
                                                      dynamic_metadata=self._metadata())
            elif kind == "request_body":
                body += request.request_body.body
                self.chunks += 1
                if not request.request_body.end_of_stream:
                    continue
                self.bodies.append(body)
                yield ext_proc.ProcessingResponse(request_headers=ext_proc.HeadersResponse(response=self._pick()),
                                                  dynamic_metadata=self._metadata())
                mutation = ext_proc.BodyMutation(
                    streamed_response=ext_proc.StreamedBodyResponse(body=body, end_of_stream=True))
                yield ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse(
                    response=ext_proc.CommonResponse(body_mutation=mutation)))
            elif kind == "request_trailers":
                yield ext_proc.ProcessingResponse(request_trailers=ext_proc.TrailersResponse())
            elif kind == "response_headers":
                yield ext_proc.ProcessingResponse(response_headers=ext_proc.HeadersResponse())


@contextlib.asynccontextmanager
async def serve_picker(picker: StubPicker) -> AsyncIterator[tuple[str, grpc.aio.Server]]:
    """Serve ``picker`` (and gRPC health SERVING for the ext_proc service) on 127.0.0.1; yield (address, server)."""
    server = grpc.aio.server()
    ext_proc_grpc.add_ExternalProcessorServicer_to_server(picker, server)
    als_pb2_grpc.add_AccessLogServiceServicer_to_server(picker, server)
    health_servicer = health.aio.HealthServicer()
    await health_servicer.set(EXT_PROC_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", server
    finally:
        await server.stop(grace=None)


class Replica:
    """A tiny HTTP replica on 127.0.0.1: ``/`` answers its name and the body; ``/sse`` streams 5 events."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.hits = 0
        self.runner: web.AppRunner | None = None
        self.address = ""

    async def _hello(self, request: web.Request) -> web.Response:
        self.hits += 1
        body = await request.read()
        return web.Response(text=f"{self.name}:{len(body)}:{request.headers.get(ENDPOINT_KEY, '')}")

    async def _sse(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for i in range(5):
            await response.write(f"data: {self.name} {i}\n\n".encode())
            await asyncio.sleep(0.02)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/sse", self._sse)
        app.router.add_route("*", "/{tail:.*}", self._hello)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.address = f"127.0.0.1:{port}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def _tls_files(tmp_path: Path) -> TlsFiles:
    """A throw-away CA in ``tmp_path/pki`` and a certificate for 127.0.0.1 (:mod:`harness.tlsgen`)."""
    tlsgen.generate(tmp_path / "pki", ("envoy",))
    return TlsFiles(cert_path=str(tmp_path / "pki" / "envoy.pem"), key_path=str(tmp_path / "pki" / "envoy.key"))


def closed_port() -> str:
    """An ``ip:port`` on 127.0.0.1 that nothing listens on (bound once, then closed): connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
async def replicas() -> AsyncIterator[list[Replica]]:
    started = [Replica(name) for name in ("a", "b", "c")]
    try:
        for replica in started:
            await replica.start()
        yield started
    finally:
        for replica in started:
            await replica.stop()


@contextlib.asynccontextmanager
async def running_envoy(tmp_path: Path, pickers: list[str], replicas: list[str], tls: TlsFiles | None = None,
                        **overrides: Any) -> AsyncIterator[EnvoyProcess]:
    """A real Envoy with a rendered bootstrap (ports chosen by the kernel), stopped on the way out."""
    admin_port, stats_listen = overrides.pop("admin_port", 0), overrides.pop("stats_listen", "")
    settings = EnvoySettings(concurrency=1, access_log="", **overrides)
    envoy = await start_envoy(settings, work_dir=tmp_path / "envoy", pickers=pickers, replicas=replicas,
                              listen_port=0, admin_port=admin_port, tls=tls, stats_listen=stats_listen)
    try:
        yield envoy
    finally:
        await envoy.stop()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        yield session


def _url(envoy: EnvoyProcess, path: str = "/") -> str:
    return f"http://127.0.0.1:{envoy.listen_port}{path}"


async def _get(client: aiohttp.ClientSession, url: str, body: bytes | None = None) -> tuple[int, str]:
    async with client.request("POST" if body is not None else "GET", url, data=body) as response:
        return response.status, await response.text()


# ---------------------------------------------------------------- a real Envoy


@pytest.mark.e2e
@pytest.mark.timeout(60)
def test_every_rendering_validates(tmp_path: Path) -> None:
    """``envoy --mode validate`` accepts the bootstrap for every body mode, routing and upstream protocol."""
    tls = _tls_files(tmp_path)
    write_endpoints(tmp_path / "endpoints.json", ["127.0.0.1:9100"])
    jobs = []
    for mode in BODY_MODES:
        for routing in ROUTINGS:
            for protocol in UPSTREAM_PROTOCOLS:
                config = render_bootstrap(
                    EnvoySettings(request_body_mode=mode, upstream_routing=routing, upstream_protocol=protocol,
                                  access_log=str(tmp_path / "access.log")),
                    listen_port=0, admin_port=0, pickers=PICKERS, endpoints_path=str(tmp_path / "endpoints.json"),
                    tls=tls if protocol == "h2c" else None)
                path = tmp_path / f"{mode}-{routing}-{protocol}.json"
                path.write_text(json.dumps(config))
                jobs.append(subprocess.Popen([envoy_binary(), "--mode", "validate", "--config-path", str(path),
                                              "--log-level", "error"], stdout=subprocess.PIPE,
                                             stderr=subprocess.STDOUT, text=True))
    try:
        for job in jobs:
            output, _ = job.communicate(timeout=30)
            assert job.returncode == 0, output
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
                job.wait()


@pytest.mark.e2e
@pytest.mark.timeout(30)
@pytest.mark.parametrize("body", [None, b"x" * 3000], ids=["no-body", "body"])
async def test_routes_to_the_primary_and_reports_served(tmp_path: Path, replicas: list[Replica],
                                                        client: aiohttp.ClientSession, body: bytes | None) -> None:
    a, b, _ = replicas
    picker = StubPicker(f"{b.address},{a.address}")
    async with serve_picker(picker) as (address, _server), \
            running_envoy(tmp_path, [address], [r.address for r in replicas]) as envoy:
        for _ in range(3):
            status, text = await _get(client, _url(envoy), body)
            assert status == 200, text
            assert text == f"b:{len(body or b'')}:{picker.endpoints}"
        await _heard(picker, 3)
    assert (a.hits, b.hits) == (0, 3)
    assert picker.served == [b.address] * 3


@pytest.mark.e2e
@pytest.mark.timeout(30)
async def test_the_pickers_answer_headers_reach_the_client(tmp_path: Path, replicas: list[Replica],
                                                          client: aiohttp.ClientSession) -> None:
    # the tenant's x-ratelimit-* headers: put in dynamic metadata by the picker, added to the answer by the route
    a = replicas[0]
    limits = {"x-ratelimit-limit-requests": "2", "x-ratelimit-remaining-requests": "1",
              "x-ratelimit-reset-requests": "0.5s"}
    async with serve_picker(StubPicker(a.address, limits)) as (with_limits, _s1), \
            serve_picker(StubPicker(a.address)) as (without, _s2):
        async with running_envoy(tmp_path / "with", [with_limits], [a.address]) as envoy, \
                client.get(_url(envoy)) as response:
            assert response.status == 200
            assert {k: response.headers.get(k) for k in limits} == limits
        async with running_envoy(tmp_path / "without", [without], [a.address]) as envoy, \
                client.get(_url(envoy)) as response:
            assert response.status == 200
            assert not [k for k in response.headers if k.lower().startswith("x-ratelimit-")]


@pytest.mark.e2e
@pytest.mark.timeout(30)
async def test_refused_primary_falls_to_the_next(tmp_path: Path, replicas: list[Replica],
                                                 client: aiohttp.ClientSession) -> None:
    a, b, _ = replicas
    dead = closed_port()
    unknown = closed_port()  # not in the endpoint file: skipped
    picker = StubPicker(f"{dead},{unknown},{a.address},{b.address}")
    async with serve_picker(picker) as (address, _server), \
            running_envoy(tmp_path, [address], [dead, a.address, b.address]) as envoy:
        status, text = await _get(client, _url(envoy), b"{}")
        assert status == 200, text
        assert text.startswith("a:")
        _, stats = await envoy.admin("GET", f"/stats?filter=^cluster.{REPLICA_CLUSTER}.upstream_rq_retry$")
        await _heard(picker, 1)
    assert (a.hits, b.hits) == (1, 0)
    assert picker.served == [a.address]
    assert stats.strip().endswith(": 1")


@pytest.mark.e2e
@pytest.mark.timeout(30)
async def test_endpoint_file_updates_apply(tmp_path: Path, replicas: list[Replica],
                                           client: aiohttp.ClientSession) -> None:
    a, b, c = replicas
    picker = StubPicker(f"{c.address},{a.address}")
    async with serve_picker(picker) as (address, _server), \
            running_envoy(tmp_path, [address], [a.address, b.address]) as envoy:
        assert (await _get(client, _url(envoy)))[1].startswith("a:")  # c unknown yet: skipped
        envoy.set_endpoints([a.address, b.address, c.address])
        deadline = time.monotonic() + 5
        while not (await _get(client, _url(envoy)))[1].startswith("c:"):
            assert time.monotonic() < deadline, "the new endpoint file was not applied within 5 s"
            await asyncio.sleep(0.05)


@pytest.mark.e2e
@pytest.mark.timeout(30)
async def test_fails_closed_without_pickers(tmp_path: Path, replicas: list[Replica],
                                            client: aiohttp.ClientSession) -> None:
    async with running_envoy(tmp_path, [closed_port(), closed_port()], [r.address for r in replicas]) as envoy:
        for body in (None, b"{}"):
            status, _ = await _get(client, _url(envoy), body)
            assert 500 <= status < 600
    assert sum(r.hits for r in replicas) == 0


@pytest.mark.e2e
@pytest.mark.timeout(30)
@pytest.mark.parametrize("balance", ["failover", "round_robin"])
async def test_a_stopped_picker_is_skipped(tmp_path: Path, replicas: list[Replica],
                                           client: aiohttp.ClientSession, balance: str) -> None:
    a = replicas[0]
    first, second = StubPicker(a.address), StubPicker(a.address)
    async with serve_picker(first) as (address1, server1), serve_picker(second) as (address2, _server2), \
            running_envoy(tmp_path, [address1, address2], [a.address], picker_balance=balance) as envoy:
        for _ in range(4):
            assert (await _get(client, _url(envoy)))[0] == 200
        if balance == "failover":  # the first decides everything while it is healthy
            assert (first.requests, second.requests) == (4, 0)
        else:
            assert first.requests and second.requests  # round robin over both
        _, checks = await envoy.admin("GET", f"/stats?filter=^cluster.{PICKER_CLUSTER}.health_check.success$")
        assert int(checks.strip().rpartition(" ")[2]) >= 2  # both pickers passed a gRPC health check
        await server1.stop(grace=None)
        deadline = time.monotonic() + 5
        failures, streak = 0, 0
        while streak < 20:
            assert time.monotonic() < deadline, f"no 20 successes in a row within 5 s ({failures} failures)"
            status, _ = await _get(client, _url(envoy))
            streak = streak + 1 if status == 200 else 0
            failures += status != 200
        # The ext_proc stream is opened again on the live picker (grpc_service.retry_policy): measured 0.
        assert failures <= 2
        assert second.requests >= 20


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.e2e
@pytest.mark.timeout(30)
async def test_the_stats_listener_serves_only_the_prometheus_stats(tmp_path: Path, replicas: list[Replica],
                                                                   client: aiohttp.ClientSession) -> None:
    # a scraper off the host reaches Envoy's stats; the admin (drain, config dump) stays on loopback
    stats = f"127.0.0.1:{_free_port()}"
    with pytest.raises(ValueError, match="fixed admin port"):
        render_bootstrap(EnvoySettings(), listen_port=0, admin_port=0, pickers=PICKERS, stats_listen=stats,
                         endpoints_path=str(tmp_path / "e.json"))
    async with serve_picker(StubPicker(replicas[0].address)) as (address, _server), \
            running_envoy(tmp_path, [address], [replicas[0].address], admin_port=_free_port(),
                          stats_listen=stats) as envoy:
        await _get(client, _url(envoy))
        async with client.get(f"http://{stats}/stats/prometheus") as answer:
            text = await answer.text()
            assert answer.status == 200 and "envoy_cluster_upstream_rq_total" in text
        for path in ("/config_dump", "/drain_listeners", "/stats"):
            async with client.get(f"http://{stats}{path}") as refused:
                assert refused.status == 404
        async with client.post(f"http://{stats}/stats/prometheus") as posted:
            assert posted.status == 404


def _serial_served(port: int, ca: Path) -> str:
    """The serial number (hex) of the certificate Envoy's TLS listener presents now, checked against ``ca``."""
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        return str(tls.getpeercert()["serialNumber"]).upper()


def _serial_of(pem: Path) -> str:
    out = subprocess.run(["openssl", "x509", "-noout", "-serial", "-in", str(pem)], capture_output=True, text=True,
                         check=True, timeout=10).stdout
    return out.strip().partition("=")[2].upper()


@pytest.mark.e2e
@pytest.mark.timeout(60)
async def test_a_renewed_certificate_is_served_without_a_restart(tmp_path: Path, replicas: list[Replica]) -> None:
    # cert-manager renews the Secret, the kubelet swaps the mounted files: Envoy's next handshake presents the
    # renewed certificate (SDS files watching the directory), with no restart
    pki = tmp_path / "pki"
    tlsgen.generate(pki, ("envoy",))
    mount = SecretMount(tmp_path / "secret")
    mount.write_files(pki, "envoy")
    _, cert, key = mount.paths
    async with serve_picker(StubPicker(replicas[0].address)) as (address, _server), \
            running_envoy(tmp_path / "run", [address], [replicas[0].address],
                          tls=TlsFiles(cert_path=str(cert), key_path=str(key))) as envoy:
        first = await asyncio.to_thread(_serial_served, envoy.listen_port, pki / "ca.pem")
        assert first == _serial_of(pki / "envoy.pem")
        pid = envoy.process.pid
        tlsgen.issue(pki, "envoy")  # same CA and name, a new key and serial
        mount.write_files(pki, "envoy")
        renewed = _serial_of(pki / "envoy.pem")
        assert renewed != first
        deadline = time.monotonic() + 15
        served = first
        while served != renewed and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            served = await asyncio.to_thread(_serial_served, envoy.listen_port, pki / "ca.pem")
        assert served == renewed and envoy.process.pid == pid and envoy.process.returncode is None


@pytest.mark.e2e
@pytest.mark.timeout(30)
async def test_tls_listener_and_graceful_stop(tmp_path: Path, replicas: list[Replica],
                                              client: aiohttp.ClientSession) -> None:
    a = replicas[0]
    tls = _tls_files(tmp_path)
    context = ssl.create_default_context(cafile=str(tmp_path / "pki" / "ca.pem"))
    async with serve_picker(StubPicker(a.address)) as (address, _server), \
            running_envoy(tmp_path, [address], [a.address], tls=tls,
                          drain_time_s=1) as envoy:
        async with client.get(f"https://127.0.0.1:{envoy.listen_port}/", ssl=context) as response:
            assert response.status == 200
            assert (await response.text()).startswith("a:")
        assert await envoy.stop(drain_seconds=0.2) == 0


@pytest.mark.e2e
@pytest.mark.timeout(60)
async def test_a_drain_lasts_while_a_stream_runs_and_ends_once_nothing_is_in_flight(
        tmp_path: Path, replicas: list[Replica], client: aiohttp.ClientSession) -> None:
    a = replicas[0]
    async with serve_picker(StubPicker(a.address)) as (address, _server), \
            running_envoy(tmp_path, [address], [a.address]) as envoy:
        async with client.get(_url(envoy, "/sse")) as response:  # 5 events 20 ms apart: in flight while draining
            stopping = asyncio.ensure_future(envoy.stop(drain_seconds=20.0))
            body = await response.text()
        assert body.count("data:") == 6  # whole, [DONE] included
        start = time.monotonic()
        assert await stopping == 0
        assert time.monotonic() - start < 10.0, "the drain went on with nothing in flight"


@pytest.mark.e2e
@pytest.mark.timeout(30)
async def test_sse_stream_arrives_whole(tmp_path: Path, replicas: list[Replica],
                                        client: aiohttp.ClientSession) -> None:
    a = replicas[0]
    async with serve_picker(StubPicker(a.address)) as (address, _server), \
            running_envoy(tmp_path, [address], [a.address]) as envoy, client.get(_url(envoy, "/sse")) as response:
        assert response.status == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line async for line in response.content if line.strip()]
    assert events == [f"data: a {i}\n".encode() for i in range(5)] + [b"data: [DONE]\n"]


@pytest.mark.e2e
@pytest.mark.timeout(30)
@pytest.mark.parametrize("size", [0, 5, 200_000], ids=["empty", "small", "large"])
async def test_full_duplex_streamed_body(tmp_path: Path, replicas: list[Replica],
                                         client: aiohttp.ClientSession, size: int) -> None:
    a, b, _ = replicas
    picker = DuplexPicker(f"{b.address},{a.address}")
    body = bytes(i % 251 for i in range(size))
    async with serve_picker(picker) as (address, _server), \
            running_envoy(tmp_path, [address], [a.address, b.address],
                          request_body_mode="FULL_DUPLEX_STREAMED") as envoy:
        status, text = await _get(client, _url(envoy), body)
    assert status == 200, text
    assert text.startswith(f"b:{size}:")
    assert picker.requests == 1
    assert picker.bodies == ([body] if size else [])
    if size > 100_000:
        assert picker.chunks > 1  # streamed in pieces, not buffered


@pytest.mark.e2e
@pytest.mark.timeout(30)
async def test_grpc_client_reaches_a_grpc_replica_over_h2c(tmp_path: Path) -> None:
    """The KServe v2 service's paths go to the replicas over h2c (cluster ferry_replicas_kserve)."""
    def echo(request: bytes, context: Any) -> bytes:
        return b"echo:" + request

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", {"Echo": grpc.unary_unary_rpc_method_handler(echo)})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        replica = f"127.0.0.1:{port}"
        async with serve_picker(StubPicker(replica)) as (address, _server), \
                running_envoy(tmp_path, [address], [replica]) as envoy, \
                grpc.aio.insecure_channel(f"127.0.0.1:{envoy.listen_port}") as channel:
            call = channel.unary_unary("/inference.GRPCInferenceService/Echo")
            assert await call(b"hi", timeout=5) == b"echo:hi"
    finally:
        await server.stop(grace=None)



def test_the_config_file_envoy_section_reaches_the_settings(tmp_path) -> None:
    from ferry.config import load_file

    path = tmp_path / "ferry.toml"
    path.write_text("[envoy]\ndrain_time_s = 60\nmessage_timeout_ms = 500\n")
    settings = load_file(path).section(EnvoySettings, "envoy")
    assert (settings.drain_time_s, settings.message_timeout_ms) == (60, 500)
    path.write_text("[envoy]\nno_such_key = 1\n")
    with pytest.raises(ConfigError, match="envoy.no_such_key"):
        load_file(path).section(EnvoySettings, "envoy")


async def _heard(picker: StubPicker, answered: int, within: float = 5.0) -> None:
    """Wait until the picker heard of ``answered`` upstream answers and as many downstream ends (bounded)."""
    deadline = time.monotonic() + within
    while len(picker.served) < answered or sum(kind == "DownstreamEnd" for kind, _ in picker.ends) < answered:
        assert time.monotonic() < deadline, f"reports not heard within {within} s: {picker.ends}"
        await asyncio.sleep(0.01)


class SlowReplica(Replica):
    """``/sse`` streams 10 events 0.1 s apart."""

    async def _sse(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for i in range(10):
            await response.write(f"data: {self.name} {i}\n\n".encode())
            await asyncio.sleep(0.1)
        await response.write_eof()
        return response


@pytest.mark.e2e
@pytest.mark.timeout(30)
@pytest.mark.parametrize("kill", [False, True], ids=["picker-lives", "picker-killed"])
async def test_a_picker_hears_each_end_and_its_death_after_deciding_cuts_nothing(
        tmp_path: Path, client: aiohttp.ClientSession, kill: bool) -> None:
    replica = SlowReplica("s")
    await replica.start()
    picker = StubPicker(replica.address)
    try:
        async with serve_picker(picker) as (address, server), \
                running_envoy(tmp_path, [address], [replica.address]) as envoy, \
                client.get(_url(envoy, "/sse")) as response:
            assert response.status == 200
            first = await response.content.readline()
            if kill:
                await server.stop(grace=None)
            events = [first] + [line async for line in response.content if line.strip()]
            finished = time.monotonic()
            if not kill:
                await _heard(picker, 1)
    finally:
        await replica.stop()
    assert len([e for e in events if e.strip()]) == 10  # whole, picker or not
    if not kill:
        assert picker.streams_ended[0] < finished - 0.5  # the processor stream ended with the decision...
        ends = dict(picker.ends)
        assert finished - 0.2 < ends["UpstreamEnd"] < finished + 1.0  # ... the ends came with the reports
        assert finished - 0.2 < ends["DownstreamEnd"] < finished + 1.0
