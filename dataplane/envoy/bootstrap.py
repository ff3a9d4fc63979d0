"""Envoy's bootstrap for Ferry's HTTP data plane: settings (``[envoy]``) and a pure renderer.

Envoy forwards each request where Ferry's endpoint picker says, per the
Gateway API Inference Extension endpoint-picker protocol: the HTTP filter
``envoy.filters.http.ext_proc`` asks a picker (cluster ``ferry_picker``, every
picker a static endpoint) per request, and the picker answers with dynamic
metadata ``envoy.lb`` / ``x-gateway-destination-endpoint`` = ``ip:port[,ip:port...]``
(primary first, then fallbacks; it sets the header of that name too, for the
replica's information).

Routing (measured on Envoy 1.40.0):

- ``upstream_routing = "override_host"`` (default): cluster ``ferry_replicas``
  is an EDS cluster read from a file (:func:`render_endpoints`, written by
  :func:`dataplane.envoy.process.write_endpoints`; Envoy reloads it when the
  file is moved into place) with the load-balancing policy
  ``envoy.load_balancing_policies.override_host`` reading the metadata above.
  The first attempt goes to the primary; a retry (``retry_on``: a refused
  connection, a refused stream, a reset before any request byte was sent: the
  replica never started answering) goes to the next endpoint of the list.
  Only endpoints listed in the file can be chosen: an address not in it is
  skipped, and when none is (or the retries outnumber the list) Envoy falls
  back to round robin over the file's endpoints. The policy writes the
  endpoint that served into ``envoy.lb`` / ``x-gateway-destination-endpoint-served``,
  which ext_proc forwards to the picker with the response headers.
- ``upstream_routing = "original_dst"``: an ``ORIGINAL_DST`` cluster routed by
  the same metadata key: any ``ip:port`` without an endpoint file, but the
  value must be a single address (a comma list is refused: 503
  ``original_dst_host_invalid``), so no fallback and no served report.

Only the metadata is read, never the request header: a client could send the
header itself, but it cannot write Envoy's dynamic metadata.

Body modes (measured): with ``BUFFERED`` the picker gets the headers (answer
them at once, or pick there when they end the request) and then one message
with the whole body, and picks in its answer to it. With ``FULL_DUPLEX_STREAMED``
Envoy needs ``request_trailer_mode: SEND`` (rendered so), streams the body
chunks without waiting for an answer to the headers, and the picker answers
the headers (the pick) once it has read enough, then gives the body back as
``StreamedBodyResponse`` chunks (the last with ``end_of_stream``) and answers
trailers; a 600 ms upload did not hit the message timeout. In both modes Envoy
holds the body until the headers are answered, so a request body is limited
to ``per_connection_buffer_limit_bytes`` (413 beyond).

The pickers must serve gRPC health (``grpc.health.v1``) for the service
``envoy.service.ext_proc.v3.ExternalProcessor``; a picker reported unhealthy
gets no new stream (when none is healthy, Envoy tries them all). A stream
that cannot reach a picker is opened again on another one.

Nothing undecided is forwarded: the forwarding routes match only a request
whose destination a picker put in Envoy's dynamic metadata (:data:`DECIDED`,
which a client cannot write), and every other request meets a 503 route. So
the filter goes on past a picker's failure (``failure_mode_allow = True``, the
default): a picker that dies after deciding costs its request nothing, and
one that dies before leaves the request to the 503; authentication, tenant
quotas and admission are never skipped. ``False`` fails the request on any
picker error instead (Envoy's own 503), even after the decision.

Defaults: ext_proc message timeout 1 s (Envoy's own default, 200 ms, cut
requests with a 504 while a busy 2-core machine delayed the picker's loop;
a picker that queues a request
extends it per message with ``override_message_timeout``, up to 30 s), body
``BUFFERED``; 1 MiB per-connection buffers and HTTP/2 windows of 64 KiB per
stream and 1 MiB per connection (a client that stops reading stalls its own
stream only); upstream connect timeout 1 s; 2 retries; no route timeout (the
picker owns deadlines); a JSON access log on stdout; 2 workers; pickers
health-checked over gRPC every second and ejected after 2 failures in a row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from typing import Any

from dataplane.epp.protocol import ANSWER_HEADERS, ANSWER_NAMESPACE
from ferry.errors import ConfigError

ENDPOINT_KEY = "x-gateway-destination-endpoint"
SERVED_KEY = "x-gateway-destination-endpoint-served"
LB_NAMESPACE = "envoy.lb"
SUBSET_HINT_NAMESPACE = "envoy.lb.subset_hint"
PICKER_CLUSTER = "ferry_picker"
REPLICA_CLUSTER = "ferry_replicas"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
REPORT_LOG = "ferry_reports"  # the log name of the access logs that tell the pickers how each request ended
BODY_MODES = ("BUFFERED", "FULL_DUPLEX_STREAMED")
ROUTINGS = ("override_host", "original_dst")
UPSTREAM_PROTOCOLS = ("http1", "h2c")
KSERVE_CLUSTER = "ferry_replicas_kserve"  # KServe v2 gRPC to the replicas: always HTTP/2 (h2c)
KSERVE_PREFIX = "/inference.GRPCInferenceService/"  # the KServe v2 gRPC service's paths
CIRCUIT_LIMIT = 1_000_000  # Envoy's per-cluster circuit breakers, lifted: the pickers' admission bounds the load
# A route forwards only a request a picker decided: its destination in Envoy's dynamic metadata, which a client
# cannot write. So a picker's failure after it decided lets the request go on as decided, and one before it
# decided leaves the request to the 503 route (UNDECIDED), never forwarded unauthenticated.
DECIDED = {"filter": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint"}],
           "value": {"string_match": {"safe_regex": {"regex": ".+"}}}}
UNDECIDED = ('{"error":{"message":"no endpoint picker decided this request; retry","type":"server_error",'
             '"param":null,"code":"unavailable"}}')

_TYPE = "type.googleapis.com/envoy."

ACCESS_LOG_FORMAT: dict[str, str] = {
    "start_time": "%START_TIME%",
    "method": "%REQ(:METHOD)%",
    "path": "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%",
    "protocol": "%PROTOCOL%",
    "status": "%RESPONSE_CODE%",
    "flags": "%RESPONSE_FLAGS%",
    "details": "%RESPONSE_CODE_DETAILS%",
    "request_id": "%REQ(X-REQUEST-ID)%",
    "picked": f"%DYNAMIC_METADATA({LB_NAMESPACE}:{ENDPOINT_KEY})%",
    "upstream": "%UPSTREAM_HOST%",
    "attempts": "%UPSTREAM_REQUEST_ATTEMPT_COUNT%",
    "bytes_received": "%BYTES_RECEIVED%",
    "bytes_sent": "%BYTES_SENT%",
    "duration_ms": "%DURATION%",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TlsFiles:
    """A certificate chain and its private key (PEM file paths): the listener's TLS, or Envoy's client identity
    towards the pickers, with ``ca_path`` the CA their certificates are checked against ("" : none given)."""

    cert_path: str
    key_path: str
    ca_path: str = ""
    # where this pair's SDS files are (render_secrets; written by dataplane.envoy.process): Envoy then follows the
    # files, a renewed pair taken without a restart; "": the files are read once, at start
    secrets_dir: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvoySettings:
    """The ``[envoy]`` section: how Ferry runs Envoy as its HTTP data plane.

    Fields and defaults:

    - ``port`` (8480), ``admin_port`` (8481): the ports a launcher passes to
      :func:`render_bootstrap` (0: let the kernel choose; the launcher reads
      them back). Listener and admin bind 127.0.0.1.
    - ``concurrency`` (2): Envoy worker threads.
    - ``message_timeout_ms`` (1000): how long ext_proc waits for each picker
      answer; ``max_message_timeout_ms`` (30000): the most a picker may extend
      it per message (``override_message_timeout``) to queue a request.
    - ``failure_mode_allow`` (True): go on past a picker's error; only a decided request is forwarded
      either way (the module doc), so True loses no decided request and skips nothing.
    - ``request_body_mode`` ("BUFFERED"): or "FULL_DUPLEX_STREAMED" (the mode
      of the Inference Extension gateways; the picker must then echo each body
      chunk as a ``StreamedBodyResponse``).
    - ``response_header_mode`` ("SKIP"): the picker is not asked about responses, so its processor stream
      ends with the decision and a picker that dies after deciding cuts no stream; "SEND" asks it (one more
      message each way, and the answer waits for the picker).
    - ``report_flush_ms`` (10): how often Envoy sends each picker the ends of requests (the gRPC access-log
      service, :data:`REPORT_LOG`): the lag of the picker's in-flight accounting, against one message per
      batch instead of one per request.
    - ``request_body_buffer_limit_bytes`` (8 MiB): the most of a request body Envoy buffers for the picker
      to read (a long-context prompt); larger: 413. Only request bodies: answers stream under the limits below.
    - ``per_connection_buffer_limit_bytes`` (1 MiB), ``initial_stream_window_size``
      (64 KiB), ``initial_connection_window_size`` (1 MiB): flow control, so a
      client that stops reading stalls only its own stream.
    - ``connect_timeout_ms`` (1000): upstream connect timeout (replicas and pickers).
    - ``num_retries`` (2): retries to the picker's fallbacks, on ``retry_on``
      ("connect-failure,refused-stream,reset-before-request": only when the
      replica never started answering), ``retry_backoff_ms`` (2) apart at first.
    - ``route_timeout_ms`` (0: none; streams may be long, deadlines are the picker's).
    - ``stream_idle_timeout_ms`` (300000): a stream with no bytes either way this long ends.
    - ``access_log`` ("stdout"): a JSON line per request to stdout, a file path, or "" for none.
    - ``upstream_routing`` ("override_host"; or "original_dst", see the module doc).
    - ``upstream_protocol`` ("http1"; or "h2c"): how OpenAI HTTP reaches the replicas (cluster
      ``ferry_replicas``), whatever the client spoke; KServe v2 gRPC (paths under
      ``/inference.GRPCInferenceService/``) always goes over h2c (cluster ``ferry_replicas_kserve``).
    - ``picker_balance`` ("failover"): the first picker of ``--pickers`` decides every request while it is
      healthy and the next takes over when it is not (Envoy's priorities), so one picker's state (where it
      sent each prefix, its in-flight counts) sees every request; measured on the peers bench, two pickers
      sharing the requests round robin ("round_robin") kept 0.67 of the infinite-cache hit limit against
      0.97 for one. More decisions than one picker's core can make take more Envoy + picker pods.
    - ``picker_health_interval_ms`` (1000), ``picker_ejection_failures`` (2),
      ``picker_ejection_ms`` (5000): gRPC health checks of the pickers
      (service ``envoy.service.ext_proc.v3.ExternalProcessor``) and outlier
      ejection after that many failures in a row, for that long at first.
    - ``drain_time_s`` (5): how long a graceful drain lasts at most (it ends sooner once no request is in
      flight: :meth:`dataplane.envoy.process.EnvoyProcess.stop`).
    """

    port: int = 8480
    admin_port: int = 8481
    concurrency: int = 2
    message_timeout_ms: int = 1000
    max_message_timeout_ms: int = 30_000
    failure_mode_allow: bool = True
    request_body_mode: str = "BUFFERED"
    response_header_mode: str = "SKIP"
    report_flush_ms: int = 10
    per_connection_buffer_limit_bytes: int = 1 << 20
    request_body_buffer_limit_bytes: int = 8 << 20
    initial_stream_window_size: int = 1 << 16
    initial_connection_window_size: int = 1 << 20
    connect_timeout_ms: int = 1000
    num_retries: int = 2
    retry_on: str = "connect-failure,refused-stream,reset"
    retry_backoff_ms: int = 2
    route_timeout_ms: int = 0
    stream_idle_timeout_ms: int = 300_000
    access_log: str = "stdout"
    upstream_routing: str = "override_host"
    upstream_protocol: str = "http1"
    picker_balance: str = "failover"
    picker_health_interval_ms: int = 1000
    picker_ejection_failures: int = 2
    picker_ejection_ms: int = 5000
    drain_time_s: int = 5

    def __post_init__(self) -> None:
        for key in ("concurrency", "message_timeout_ms", "max_message_timeout_ms", "per_connection_buffer_limit_bytes",
                    "request_body_buffer_limit_bytes", "report_flush_ms",
                    "connect_timeout_ms", "retry_backoff_ms", "picker_health_interval_ms",
                    "picker_ejection_failures", "picker_ejection_ms"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"envoy.{key}", "must be positive")
        for key in ("port", "admin_port", "num_retries", "route_timeout_ms", "stream_idle_timeout_ms",
                    "drain_time_s"):
            if not getattr(self, key) >= 0:
                raise ConfigError(f"envoy.{key}", "must be >= 0")
        if self.port > 65535 or self.admin_port > 65535:
            raise ConfigError("envoy.port", "must be a port number")
        if self.max_message_timeout_ms < self.message_timeout_ms:
            raise ConfigError("envoy.max_message_timeout_ms", "must be >= message_timeout_ms")
        # Envoy's HTTP/2 bounds: windows of 65535 .. 2^31 - 1 bytes.
        for key in ("initial_stream_window_size", "initial_connection_window_size"):
            if not 65535 <= getattr(self, key) <= 2**31 - 1:
                raise ConfigError(f"envoy.{key}", "must be within 65535 .. 2147483647")
        for key, value, allowed in (("request_body_mode", self.request_body_mode, BODY_MODES),
                                    ("response_header_mode", self.response_header_mode, ("SEND", "SKIP")),
                                    ("picker_balance", self.picker_balance, ("failover", "round_robin")),
                                    ("upstream_routing", self.upstream_routing, ROUTINGS),
                                    ("upstream_protocol", self.upstream_protocol, UPSTREAM_PROTOCOLS)):
            if value not in allowed:
                raise ConfigError(f"envoy.{key}", f"must be one of {', '.join(allowed)}")
        if not self.retry_on.strip():
            raise ConfigError("envoy.retry_on", "must name at least one condition")


def split_address(address: str) -> tuple[str, int]:
    """``"ip:port"`` or ``"[ipv6]:port"`` as (host, port); ValueError when it is neither."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not an ip:port address: {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _socket_address(address: str) -> dict[str, Any]:
    host, port = split_address(address)
    return {"socket_address": {"address": host, "port_value": port}}


def _duration(ms: int) -> str:
    return f"{ms / 1000:.3f}s"


def render_endpoints(addresses: Sequence[str], *, cluster: str = REPLICA_CLUSTER) -> dict[str, Any]:
    """The EDS file Envoy reads for ``cluster`` (default ``ferry_replicas``): every ``ip:port`` in ``addresses``.

    The picker can route only to addresses listed here (override_host). Write it
    with :func:`dataplane.envoy.process.write_endpoints` (atomically, as Envoy wants).
    """
    return {"resources": [{
        "@type": _TYPE + "config.endpoint.v3.ClusterLoadAssignment",
        "cluster_name": cluster,
        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _socket_address(a)}} for a in addresses]}],
    }]}


def _http2_options(settings: EnvoySettings) -> dict[str, Any]:
    return {"initial_stream_window_size": settings.initial_stream_window_size,
            "initial_connection_window_size": settings.initial_connection_window_size}


def _access_log(settings: EnvoySettings) -> list[dict[str, Any]]:
    if not settings.access_log:
        return []
    log_format = {"json_format": ACCESS_LOG_FORMAT | (
        {"served": f"%DYNAMIC_METADATA({LB_NAMESPACE}:{SERVED_KEY})%"}
        if settings.upstream_routing == "override_host" else {})}
    if settings.access_log == "stdout":
        return [{"name": "envoy.access_loggers.stdout", "typed_config": {
            "@type": _TYPE + "extensions.access_loggers.stream.v3.StdoutAccessLog", "log_format": log_format}}]
    return [{"name": "envoy.access_loggers.file", "typed_config": {
        "@type": _TYPE + "extensions.access_loggers.file.v3.FileAccessLog",
        "path": settings.access_log, "log_format": log_format}}]


def _report_clusters(settings: EnvoySettings, pickers: Sequence[str], tls: TlsFiles | None) -> list[dict[str, Any]]:
    """One cluster per picker for its reports (``ferry_picker_report_<k>``): each picker hears of every request."""
    out = []
    for k, picker in enumerate(pickers):
        name = f"{PICKER_CLUSTER}_report_{k}"
        cluster: dict[str, Any] = {
            "name": name, "type": "STATIC", "connect_timeout": _duration(settings.connect_timeout_ms),
            "load_assignment": {"cluster_name": name, "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": _socket_address(picker)}}]}]},
            "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _TYPE + "extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}}}},
        }
        if tls is not None:
            cluster["transport_socket"] = _upstream_tls(tls)
        out.append(cluster)
    return out


def _reports(settings: EnvoySettings, pickers: Sequence[str]) -> list[dict[str, Any]]:
    """gRPC access loggers that tell every picker of each request's end (:data:`REPORT_LOG`).

    The same logger serves the connection manager (the downstream end: the client has its whole answer, or
    left) and the router (each upstream attempt's end: the replica finished, refused or was reset), so that a
    picker frees a replica's slot when the replica is done, not when a slow client is."""
    return [{"name": "envoy.access_loggers.http_grpc", "typed_config": {
        "@type": _TYPE + "extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig",
        "common_config": {
            "log_name": REPORT_LOG,
            "grpc_service": {"envoy_grpc": {"cluster_name": f"{PICKER_CLUSTER}_report_{k}"}},
            "transport_api_version": "V3",
            "buffer_flush_interval": _duration(settings.report_flush_ms),
            "buffer_size_bytes": 16_384,
        }}} for k in range(len(pickers))]


def _ext_proc_filter(settings: EnvoySettings) -> dict[str, Any]:
    return {"name": "envoy.filters.http.ext_proc", "typed_config": {
        "@type": _TYPE + "extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {
            "envoy_grpc": {"cluster_name": PICKER_CLUSTER},
            # The stream opened again on another picker when the connection to one failed (retry_on is
            # needed: with back-off alone, 1.40 did not retry; measured).
            # With the pickers in failover (one per priority), a retry must leave the priority it tried, not
            # draw the dead picker again while its health check has not noticed (previous_priorities).
            "retry_policy": {
                "num_retries": 2,
                "retry_on": "connect-failure,refused-stream,reset-before-request,unavailable",
                "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts", "typed_config": {
                    "@type": _TYPE + "extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}}],
                "host_selection_retry_max_attempts": 3,
                "retry_priority": {"name": "envoy.retry_priorities.previous_priorities", "typed_config": {
                    "@type": _TYPE + "extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig",
                    "update_frequency": 1}},
                "retry_back_off": {"base_interval": "0.002s", "max_interval": "0.020s"},
            },
        },
        "failure_mode_allow": settings.failure_mode_allow,
        "status_on_error": {"code": 503},  # no picker's answer: unavailable (retry), not Envoy's default 500
        "message_timeout": _duration(settings.message_timeout_ms),
        "max_message_timeout": _duration(settings.max_message_timeout_ms),
        "processing_mode": {
            "request_header_mode": "SEND",
            "request_body_mode": settings.request_body_mode,
            # Envoy 1.40 refuses FULL_DUPLEX_STREAMED unless request trailers are sent too.
            "request_trailer_mode": "SEND" if settings.request_body_mode == "FULL_DUPLEX_STREAMED" else "SKIP",
            "response_header_mode": settings.response_header_mode,
            "response_body_mode": "NONE",
            "response_trailer_mode": "SKIP",
        },
        "allow_mode_override": False,
        "metadata_options": {
            "forwarding_namespaces": {"untyped": [LB_NAMESPACE, SUBSET_HINT_NAMESPACE]},
            "receiving_namespaces": {"untyped": [LB_NAMESPACE, ANSWER_NAMESPACE]},
        },
    }}


SECRET_TYPE = _TYPE + "extensions.transport_sockets.tls.v3.Secret"


def _secret_names(tls: TlsFiles) -> tuple[str, str]:
    """The SDS names of a pair's certificate and CA (a digest of their paths: two pairs never share one)."""
    digest = hashlib.sha256(f"{tls.cert_path}\0{tls.key_path}\0{tls.ca_path}".encode()).hexdigest()[:12]
    return f"ferry_cert_{digest}", f"ferry_ca_{digest}"


def _sds(directory: str, name: str) -> dict[str, Any]:
    return {"name": name, "sds_config": {"resource_api_version": "V3",
                                         "path_config_source": {"path": f"{directory}/{name}.json"}}}


def _identity(tls: TlsFiles, *, ca: bool) -> dict[str, Any]:
    """The certificate (and, with ``ca``, the CA) of a ``common_tls_context``.

    With ``tls.secrets_dir``: from SDS files (:func:`render_secrets`) whose secrets carry a ``watched_directory``:
    Envoy reads the pair again when a file is moved into its directory, as the kubelet's atomic swap of a mounted
    Secret (cert-manager's renewal) does, and checks the pair before it replaces the old one; new connections
    then present the renewed certificate, connections open finish on the old. Without: the files, once."""
    names = _secret_names(tls)
    out: dict[str, Any]
    if tls.secrets_dir:
        out = {"tls_certificate_sds_secret_configs": [_sds(tls.secrets_dir, names[0])]}
        if ca and tls.ca_path:
            out["validation_context_sds_secret_config"] = _sds(tls.secrets_dir, names[1])
        return out
    out = {"tls_certificates": [{"certificate_chain": {"filename": tls.cert_path},
                                 "private_key": {"filename": tls.key_path}}]}
    if ca and tls.ca_path:
        out["validation_context"] = {"trusted_ca": {"filename": tls.ca_path}}
    return out


def render_secrets(tls: TlsFiles) -> dict[str, dict[str, Any]]:
    """The SDS files of a pair (file name -> content, to write into ``tls.secrets_dir``): its certificate and,
    with a CA, its validation context, each watching the directory its files are in."""
    cert, ca = _secret_names(tls)
    out = {f"{cert}.json": {"resources": [{"@type": SECRET_TYPE, "name": cert, "tls_certificate": {
        "certificate_chain": {"filename": tls.cert_path}, "private_key": {"filename": tls.key_path},
        "watched_directory": {"path": os.path.dirname(os.path.abspath(tls.cert_path))}}}]}}
    if tls.ca_path:
        out[f"{ca}.json"] = {"resources": [{"@type": SECRET_TYPE, "name": ca, "validation_context": {
            "trusted_ca": {"filename": tls.ca_path},
            "watched_directory": {"path": os.path.dirname(os.path.abspath(tls.ca_path))}}}]}
    return out


def _upstream_tls(tls: TlsFiles) -> dict[str, Any]:
    """Mutual TLS towards a cluster: Envoy's certificate, and the CA that signs the other side's."""
    common: dict[str, Any] = {**_identity(tls, ca=True), "alpn_protocols": ["h2"]}
    return {"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": _TYPE + "extensions.transport_sockets.tls.v3.UpstreamTlsContext", "common_tls_context": common}}


def _picker_endpoints(settings: EnvoySettings, pickers: Sequence[str]) -> list[dict[str, Any]]:
    """``failover``: the first picker decides everything while it is healthy, the next takes over (priorities
    0, 1, …), so one picker's state (where it sent each prefix, its in-flight counts) sees every request;
    ``round_robin``: all at priority 0, each seeing a share."""
    if settings.picker_balance == "round_robin":
        return [{"lb_endpoints": [{"endpoint": {"address": _socket_address(p)}} for p in pickers]}]
    return [{"priority": k, "lb_endpoints": [{"endpoint": {"address": _socket_address(p)}}]}
            for k, p in enumerate(pickers)]


def _picker_cluster(settings: EnvoySettings, pickers: Sequence[str], tls: TlsFiles | None = None) -> dict[str, Any]:
    failures = settings.picker_ejection_failures
    cluster = {
        "name": PICKER_CLUSTER,
        "type": "STATIC",
        "connect_timeout": _duration(settings.connect_timeout_ms),
        "lb_policy": "ROUND_ROBIN",
        "circuit_breakers": _circuit_breakers(),  # one processor stream per request, queued ones included
        "load_assignment": {"cluster_name": PICKER_CLUSTER, "endpoints": _picker_endpoints(settings, pickers)},
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": _TYPE + "extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}},
        "health_checks": [{
            "timeout": _duration(max(settings.picker_health_interval_ms, 100)),
            "interval": _duration(settings.picker_health_interval_ms),
            "no_traffic_interval": _duration(settings.picker_health_interval_ms),
            "unhealthy_threshold": 1,
            "healthy_threshold": 1,
            "grpc_health_check": {"service_name": EXT_PROC_SERVICE},
        }],
        "outlier_detection": {
            "split_external_local_origin_errors": True,
            "consecutive_local_origin_failure": failures,
            "enforcing_consecutive_local_origin_failure": 100,
            "consecutive_gateway_failure": failures,
            "enforcing_consecutive_gateway_failure": 100,
            "consecutive_5xx": failures,
            "enforcing_consecutive_5xx": 100,
            "interval": _duration(settings.picker_health_interval_ms),
            "base_ejection_time": _duration(settings.picker_ejection_ms),
            "max_ejection_percent": 100,
        },
    }
    if tls is not None:
        cluster["transport_socket"] = _upstream_tls(tls)
    return cluster


def kserve_endpoints_path(endpoints_path: str) -> str:
    """The KServe cluster's endpoint file, beside the OpenAI cluster's: ``endpoints-kserve.json``."""
    head, _, tail = endpoints_path.rpartition("/")
    stem = tail.removesuffix(".json")
    return f"{head}/{stem}-kserve.json" if head else f"{stem}-kserve.json"


def _circuit_breakers() -> dict[str, Any]:
    """Envoy's default thresholds (1,024 requests, 3 retries in flight) would refuse load the pickers admitted."""
    limit = {"max_connections": CIRCUIT_LIMIT, "max_pending_requests": CIRCUIT_LIMIT,
             "max_requests": CIRCUIT_LIMIT, "max_retries": CIRCUIT_LIMIT}
    return {"thresholds": [{"priority": "DEFAULT", **limit}, {"priority": "HIGH", **limit}]}


def _replica_cluster(settings: EnvoySettings, endpoints_path: str | None, *, kserve: bool = False) -> dict[str, Any]:
    """``ferry_replicas`` (OpenAI HTTP, ``upstream_protocol``) or ``ferry_replicas_kserve`` (gRPC, h2c)."""
    protocols: dict[str, Any]
    if kserve or settings.upstream_protocol == "h2c":
        protocols = {"explicit_http_config": {"http2_protocol_options": _http2_options(settings)}}
    else:
        protocols = {"explicit_http_config": {"http_protocol_options": {}}}
    name = KSERVE_CLUSTER if kserve else REPLICA_CLUSTER
    cluster: dict[str, Any] = {
        "name": name,
        "connect_timeout": _duration(settings.connect_timeout_ms),
        "per_connection_buffer_limit_bytes": settings.per_connection_buffer_limit_bytes,
        "circuit_breakers": _circuit_breakers(),
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": _TYPE + "extensions.upstreams.http.v3.HttpProtocolOptions", **protocols}},
    }
    metadata_key = {"key": LB_NAMESPACE, "path": [{"key": ENDPOINT_KEY}]}
    if settings.upstream_routing == "original_dst":
        cluster |= {"type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
                    "original_dst_lb_config": {"use_http_header": False, "metadata_key": metadata_key}}
        return cluster
    if not endpoints_path:
        raise ValueError("override_host routing needs endpoints_path (the EDS file of the replicas)")
    path = kserve_endpoints_path(endpoints_path) if kserve else endpoints_path
    directory = endpoints_path.rpartition("/")[0] or "."
    cluster |= {
        "type": "EDS",
        "eds_cluster_config": {"eds_config": {"resource_api_version": "V3", "path_config_source": {
            "path": path, "watched_directory": {"path": directory}}}},
        "load_balancing_policy": {"policies": [{"typed_extension_config": {
            "name": "envoy.load_balancing_policies.override_host",
            "typed_config": {
                "@type": _TYPE + "extensions.load_balancing_policies.override_host.v3.OverrideHost",
                "override_host_sources": [{"metadata": metadata_key}],
                "selected_host_key": {"key": LB_NAMESPACE, "path": [{"key": SERVED_KEY}]},
                "fallback_policy": {"policies": [{"typed_extension_config": {
                    "name": "envoy.load_balancing_policies.round_robin",
                    "typed_config": {"@type": _TYPE + "extensions.load_balancing_policies.round_robin.v3.RoundRobin"},
                }}]},
            },
        }}]},
    }
    return cluster


# what a picker asked to add to a forwarded answer (dataplane.epp.protocol.destination's answer_headers): each
# header from the picker's dynamic metadata, left out when the picker set none (keep_empty_value false)
ANSWER_HEADERS_TO_ADD = [{"header": {"key": name, "value": f"%DYNAMIC_METADATA({ANSWER_NAMESPACE}:{name})%"},
                          "append_action": "OVERWRITE_IF_EXISTS_OR_ADD", "keep_empty_value": False}
                         for name in ANSWER_HEADERS]


def _listener(settings: EnvoySettings, listen_port: int, tls: TlsFiles | None, pickers: Sequence[str],
              listen_host: str = "127.0.0.1") -> dict[str, Any]:
    def route(cluster: str) -> dict[str, Any]:
        return {
            "cluster": cluster,
            "timeout": _duration(settings.route_timeout_ms),
            "retry_policy": {
                "retry_on": settings.retry_on,
                "num_retries": settings.num_retries,
                "retry_back_off": {"base_interval": _duration(settings.retry_backoff_ms),
                                   "max_interval": _duration(settings.retry_backoff_ms * 4)},
            },
        }

    manager: dict[str, Any] = {
        "@type": _TYPE + "extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "ferry",
        "codec_type": "AUTO",
        "stream_idle_timeout": _duration(settings.stream_idle_timeout_ms),
        "http2_protocol_options": _http2_options(settings),
        "access_log": [*_access_log(settings), *_reports(settings, pickers)],
        "route_config": {"name": "ferry", "virtual_hosts": [{
            "name": "ferry", "domains": ["*"], "routes": [
                *({"match": {"prefix": prefix, "dynamic_metadata": [DECIDED]}, "route": route(cluster),
                   "response_headers_to_add": ANSWER_HEADERS_TO_ADD,
                   "request_body_buffer_limit": settings.request_body_buffer_limit_bytes}
                  for prefix, cluster in ((KSERVE_PREFIX, KSERVE_CLUSTER), ("/", REPLICA_CLUSTER))),
                # no picker's decision: nothing is forwarded (only a decided request matches the routes above)
                {"match": {"prefix": "/"}, "direct_response": {"status": 503, "body": {"inline_string": UNDECIDED}},
                 "request_body_buffer_limit": settings.request_body_buffer_limit_bytes}]}]},
        "http_filters": [
            _ext_proc_filter(settings),
            {"name": "envoy.filters.http.router",
             "typed_config": {"@type": _TYPE + "extensions.filters.http.router.v3.Router",
                              "upstream_log": _reports(settings, pickers)}},
        ],
    }
    chain: dict[str, Any] = {"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                          "typed_config": manager}]}
    if tls is not None:
        chain["transport_socket"] = {"name": "envoy.transport_sockets.tls", "typed_config": {
            "@type": _TYPE + "extensions.transport_sockets.tls.v3.DownstreamTlsContext",
            "common_tls_context": {"alpn_protocols": ["h2", "http/1.1"], **_identity(tls, ca=False)}}}
    return {
        "name": "ferry",
        "address": {"socket_address": {"address": listen_host, "port_value": listen_port}},
        "per_connection_buffer_limit_bytes": settings.per_connection_buffer_limit_bytes,
        # A few client connections spread over the workers evenly (SO_REUSEPORT does not).
        "enable_reuse_port": False,
        "connection_balance_config": {"exact_balance": {}},
        "filter_chains": [chain],
    }


STATS_LISTENER, ADMIN_CLUSTER, STATS_PATH = "stats", "envoy_admin", "/stats/prometheus"


def _stats(stats_listen: str, admin_port: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The listener (and the admin cluster behind it) that serves Envoy's Prometheus stats on ``stats_listen``
    (``host:port``) while the admin interface itself stays on loopback: ``GET /stats/prometheus`` only, every
    other path 404. None for "" (off)."""
    if not stats_listen:
        return [], []
    if not admin_port:
        raise ValueError("a stats listener needs a fixed admin port (its cluster names it)")
    manager = {
        "@type": _TYPE + "extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": STATS_LISTENER, "codec_type": "AUTO",
        "route_config": {"name": STATS_LISTENER, "virtual_hosts": [{
            "name": STATS_LISTENER, "domains": ["*"], "routes": [
                {"match": {"path": STATS_PATH, "headers": [{"name": ":method", "string_match": {"exact": "GET"}}]},
                 "route": {"cluster": ADMIN_CLUSTER, "timeout": "5s"}},
                {"match": {"prefix": "/"}, "direct_response": {"status": 404}}]}]},
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
            "@type": _TYPE + "extensions.filters.http.router.v3.Router"}}],
    }
    listener = {"name": STATS_LISTENER, "address": _socket_address(stats_listen), "filter_chains": [
        {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}]}]}
    cluster = {"name": ADMIN_CLUSTER, "type": "STATIC", "connect_timeout": "1s", "load_assignment": {
        "cluster_name": ADMIN_CLUSTER, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": _socket_address(f"127.0.0.1:{admin_port}")}}]}]}}
    return [listener], [cluster]


def render_bootstrap(settings: EnvoySettings, *, listen_port: int, admin_port: int, pickers: Sequence[str],
                     endpoints_path: str | None = None, tls: TlsFiles | None = None,
                     picker_tls: TlsFiles | None = None, listen_host: str = "127.0.0.1",
                     stats_listen: str = "") -> dict[str, Any]:
    """Envoy's v3 bootstrap (a dict; write it as JSON) for Ferry's data plane.

    ``listen_port``: the HTTP listener on 127.0.0.1 (HTTP/1.1 and h2c, or TLS
    with ALPN h2/http1.1 when ``tls`` is given; 0 lets the kernel choose).
    ``admin_port``: the admin interface on 127.0.0.1 (``/ready``,
    ``/stats/prometheus``, ``/drain_listeners``). ``pickers``: every picker's
    ``ip:port`` (at least one). ``endpoints_path``: the replicas' EDS file
    (:func:`render_endpoints`), required with ``upstream_routing = "override_host"``;
    Envoy watches its directory. ``tls``: cert/key files, None (default) for plain text.
    ``picker_tls``: Envoy's certificate and the CA for mutual TLS to the pickers (None: plain text).
    ``listen_host``: the listener's address (127.0.0.1; a pod's ``0.0.0.0``). The admin stays on loopback.
    ``stats_listen``: ``host:port`` of a listener serving only ``GET /stats/prometheus`` (for a scraper off the
    host; "" none; needs a fixed ``admin_port``).
    """
    if not pickers:
        raise ValueError("at least one picker address is needed")
    stats_listeners, stats_clusters = _stats(stats_listen, admin_port)
    return {
        "node": {"id": "ferry-envoy", "cluster": "ferry"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [_listener(settings, listen_port, tls, pickers, listen_host), *stats_listeners],
            "clusters": [_picker_cluster(settings, pickers, picker_tls),
                         *_report_clusters(settings, pickers, picker_tls), _replica_cluster(settings, endpoints_path),
                         _replica_cluster(settings, endpoints_path, kserve=True), *stats_clusters],
        },
    }
