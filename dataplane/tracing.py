"""Request traces: W3C Trace Context in, spans of the request path, OTLP over gRPC out.

Off unless ``[proxy] trace_endpoint`` is set (:class:`TraceSettings`, below).
Off, the router holds no :class:`Tracer`, every request's ``RequestState.trace``
stays None, and each hook on the path is one ``is None`` test: no header is
read, no span, id or dict is made (a test counts that none is).

**In.** A front door passes the caller's ``traceparent`` (and ``tracestate``)
to :meth:`Tracer.begin`: gRPC metadata on ``ferry.v1.Inference``, HTTP headers
on the OpenAI front door, the request headers Envoy hands the endpoint picker.
:func:`parse_traceparent` follows W3C Trace Context level 1: version ``00`` is
exactly 55 characters, a later version may carry more after a ``-``, ``ff``
and all-zero ids are invalid, hex is lower case. A malformed one is ignored:
the request starts a trace of its own, never an error. Sampling is parent
based: a caller's sampled flag decides; without a caller's context, the
trace id's low 64 bits below ``trace_sample_ratio`` x 2^64 decide (the rule
of OpenTelemetry's ``TraceIdRatioBased``, so every hop agrees on one id). A
request not sampled gets no trace.

**Spans of one request** (one :class:`RequestTrace`), made by the router's
hooks (:mod:`dataplane.router`), so both front doors and the picker get the
same ones: the root (kind SERVER, named by its front door: the RPC, the HTTP
route, ``pick``) from the request's arrival to its status; ``cold_start``
(waiting for a warming version) and ``admission`` (the tier-queue wait, again
after a preemption) when they happen; ``decision`` per attempt (attributes
``ferry.branch``, ``ferry.replica``, ``ferry.region``, ``ferry.model``,
``ferry.version``, ``ferry.tier``); ``forward`` per attempt (kind CLIENT;
``ferry.replica``, ``ferry.outcome``: ``ok``, a failure's kind, ``cancelled``,
``preempted``, ``unreached``), with a ``first_token`` event on a stream's. The
root ends with ``ferry.status`` (the gRPC code name), the model, tier,
tokens, attempts and replica. A trace holds at most ``MAX_SPANS`` spans.

**Out to the replica.** :meth:`RequestTrace.headers` is the ``traceparent``
naming the attempt's ``forward`` span as parent (and the caller's
``tracestate``): the relay sends it as the KServe call's metadata
(:mod:`dataplane.forward.kserve`), the picker sets it on the request Envoy
forwards (header mutation, replacing the caller's).

**Export.** A finished trace is queued whole (:meth:`Exporter.put`, O(1), never
awaits); at most ``trace_queue_spans`` spans wait, a trace that does not fit is
dropped and counted (``ferry_proxy_trace_spans_total{outcome="dropped"}``).
One task sends batches of up to ``trace_batch_spans`` spans as
``ExportTraceServiceRequest`` messages over grpc.aio on the proxy's own loop,
when a batch is full or every ``trace_flush_seconds``; a failed or late
(``trace_export_timeout_seconds``) call's spans are counted ``failed``, never
retried, and the failure logged once until an export succeeds again.

Why the messages are built here from ``opentelemetry-proto`` rather than with
the OpenTelemetry SDK (``opentelemetry-sdk`` with
``opentelemetry-exporter-otlp-proto-grpc``, which installs beside the pinned
protobuf and grpcio too): the SDK's batch processor exports from a thread of
its own over a blocking gRPC channel and drops spans without a count a proxy
can serve; its spans carry a context, a lock and an attribute-bounding
wrapper each, where a request here has six known spans; and its global
provider would be one more process-wide singleton. What is needed of OTLP is
one message type and one RPC: about 100 lines below, on the proxy's own event
loop, with the drops in the proxy's metrics.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

import ferry
from ferry.config import positive
from ferry.errors import ConfigError
from ferry.logs import event

log = logging.getLogger("ferry.proxy")

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
MAX_TRACESTATE = 512  # characters of a caller's tracestate kept (W3C: 32 members); longer: not propagated
MAX_SPANS = 64  # spans kept per trace (a stream preempted and continued many times); more are counted on the root
MAX_NAME = 128  # characters of a span name or a string attribute

INTERNAL = trace_pb2.Span.SPAN_KIND_INTERNAL
SERVER = trace_pb2.Span.SPAN_KIND_SERVER
CLIENT = trace_pb2.Span.SPAN_KIND_CLIENT
_REMOTE_PARENT = 0x300  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE | SPAN_FLAGS_CONTEXT_IS_REMOTE
_SAMPLED = 0x01
T = TypeVar("T")
Attribute = str | int | float | bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class TraceSettings:
    """Request traces (:mod:`dataplane.tracing`): W3C ``traceparent`` in, OTLP over gRPC out; off unless
    ``trace_endpoint`` is set (then nothing is read, allocated or sent per request)."""

    trace_endpoint: str = ""  # host:port of an OTLP/gRPC collector (its port 4317, say); empty: tracing off
    trace_sample_ratio: float = 1.0  # share of requests traced that bring no traceparent (a caller's flag rules)
    trace_insecure: bool = False  # plain text to the collector; else TLS, checked against trace_ca or the system's
    trace_ca: str = ""  # PEM file of the CA that signed the collector's certificate (empty: the system's roots)
    trace_queue_spans: int = 2048  # finished spans waiting for export; a trace that does not fit is dropped, counted
    trace_batch_spans: int = 512  # spans per Export call (a batch is sent as soon as this many wait)
    trace_flush_seconds: float = 1.0  # what waits is sent at least this often
    trace_export_timeout_seconds: float = 5.0  # an Export call's deadline; its spans are dropped, counted, past it

    def __post_init__(self) -> None:
        if self.trace_endpoint:
            host, sep, port = self.trace_endpoint.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError("proxy.trace_endpoint", f"{self.trace_endpoint!r}: expected host:port")
        if not 0 <= self.trace_sample_ratio <= 1:
            raise ConfigError("proxy.trace_sample_ratio", "must be 0..1")
        if self.trace_insecure and self.trace_ca:
            raise ConfigError("proxy.trace_ca", "a CA with trace_insecure: choose TLS or plain text")
        positive("proxy", {"trace_queue_spans": self.trace_queue_spans, "trace_batch_spans": self.trace_batch_spans,
                           "trace_flush_seconds": self.trace_flush_seconds,
                           "trace_export_timeout_seconds": self.trace_export_timeout_seconds})
        if self.trace_batch_spans > self.trace_queue_spans:
            raise ConfigError("proxy.trace_batch_spans", "must be at most trace_queue_spans")


def parse_traceparent(value: str) -> tuple[int, int, bool] | None:
    """(trace id, parent span id, sampled) of a W3C ``traceparent``, or None when it is malformed."""
    if len(value) < 55 or (len(value) > 55 and value[55] != "-"):
        return None
    match = _TRACEPARENT.match(value)
    if match is None:
        return None
    version, trace, parent, flags = match.groups()
    if version == "ff" or (version == "00" and len(value) != 55):
        return None
    trace_id, span_id = int(trace, 16), int(parent, 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, bool(int(flags, 16) & _SAMPLED)


def format_traceparent(trace_id: int, span_id: int) -> str:
    """The ``traceparent`` (version 00, sampled) naming ``span_id`` of ``trace_id`` as the parent."""
    return f"00-{trace_id:032x}-{span_id:016x}-01"


def header(metadata: Iterable[tuple[str, str | bytes]], name: str) -> str:
    """The first value of ``name`` in gRPC metadata ("" when absent or binary)."""
    for key, value in metadata:
        if key == name:
            return value if isinstance(value, str) else ""
    return ""


class Span:
    """One span: ids, name, kind, times (Unix ns), attributes, events and an error message ("" when none)."""

    __slots__ = ("attributes", "end_ns", "error", "events", "kind", "name", "parent_id", "span_id", "start_ns")

    def __init__(self, span_id: int, parent_id: int, name: str, kind: int, start_ns: int,
                 attributes: dict[str, Attribute]) -> None:
        self.span_id = span_id
        self.parent_id = parent_id
        self.name = name
        self.kind = kind
        self.start_ns = start_ns
        self.end_ns = 0
        self.attributes = attributes
        self.events: list[tuple[str, int]] = []
        self.error = ""


class RequestTrace:
    """The spans of one sampled request: its root, then the others in the order they started."""

    __slots__ = ("_tracer", "dropped", "forward", "remote", "root", "spans", "trace_id", "tracestate")

    def __init__(self, tracer: Tracer, trace_id: int, parent_id: int, tracestate: str, name: str) -> None:
        self._tracer = tracer
        self.trace_id = trace_id
        self.tracestate = tracestate
        self.remote = bool(parent_id)  # the root's parent is the caller's span
        self.root = Span(tracer.span_id(), parent_id, name[:MAX_NAME], SERVER, tracer.now(), {})
        self.spans = [self.root]
        self.forward: Span | None = None  # the attempt in flight
        self.dropped = 0

    def now(self) -> int:
        """The tracer's clock, Unix ns."""
        return self._tracer.now()

    def start(self, name: str, attributes: dict[str, Attribute], *, kind: int = INTERNAL,
              start_ns: int = 0) -> Span:
        """A child of the root started now (or at ``start_ns``); past ``MAX_SPANS`` it is made but not kept."""
        span = Span(self._tracer.span_id(), self.root.span_id, name, kind, start_ns or self.now(), attributes)
        if len(self.spans) < MAX_SPANS:
            self.spans.append(span)
        else:
            self.dropped += 1
        return span

    def end(self, span: Span, error: BaseException | str | None = None) -> None:
        """End ``span`` now; an error names what failed (its message, or its type when it has none)."""
        span.end_ns = self.now()
        if error is not None:
            span.error = (error if isinstance(error, str) else str(error) or type(error).__name__)[:MAX_NAME]

    async def around(self, name: str, attributes: dict[str, Attribute], wait: Awaitable[T]) -> T:
        """Await ``wait`` inside a span ``name`` (ended with the error that ends the wait, if any)."""
        span = self.start(name, attributes)
        try:
            result = await wait
        except BaseException as exc:
            self.end(span, exc)
            raise
        self.end(span)
        return result

    def attempt(self, replica_id: str, attempt: int, **attributes: Attribute) -> None:
        """An attempt starts: its ``forward`` span (kind CLIENT), the parent the replica is told of."""
        self.forward = self.start("forward", {"ferry.replica": replica_id, "ferry.attempt": attempt, **attributes},
                                  kind=CLIENT)

    def first_token(self) -> None:
        """The attempt's first piece of output: an event on its ``forward`` span."""
        if self.forward is not None and len(self.forward.events) < 4:
            self.forward.events.append(("first_token", self.now()))

    def attempt_end(self, outcome: str, **attributes: Attribute) -> None:
        """The attempt in flight ended with ``outcome`` (``ok``, a failure's kind, ``cancelled``, …)."""
        span, self.forward = self.forward, None
        if span is None:
            return
        span.attributes["ferry.outcome"] = outcome
        span.attributes.update(attributes)
        self.end(span, None if outcome == "ok" else outcome)

    def headers(self) -> tuple[tuple[str, str], ...]:
        """``traceparent`` naming the attempt in flight (else the root) as parent, and the caller's ``tracestate``."""
        parent = self.forward.span_id if self.forward is not None else self.root.span_id
        own = (TRACEPARENT, format_traceparent(self.trace_id, parent))
        return ((own, (TRACESTATE, self.tracestate)) if self.tracestate else (own,))

    def finish(self, status: str, attributes: Mapping[str, Attribute]) -> None:
        """The request ended with gRPC status ``status``: spans still open are ended, the trace is queued."""
        now = self.now()
        root = self.root
        root.end_ns = now
        for span in self.spans:
            if not span.end_ns:
                span.end_ns = now
                span.error = span.error or "open when the request ended"
        root.attributes.update(attributes)
        root.attributes["ferry.status"] = status
        if self.dropped:
            root.attributes["ferry.spans_dropped"] = self.dropped
        if status != "OK":
            root.error = status
        self._tracer.exporter.put(self)


class Tracer:
    """Starts request traces and holds their exporter; see the module docstring.

    ``rng``: the ids' random generator (a fresh ``random.Random()``); ``clock``: Unix ns (``time.time_ns``).
    """

    def __init__(self, settings: TraceSettings, *, counter: Any, rng: random.Random | None = None,
                 clock: Callable[[], int] = time.time_ns) -> None:
        check_messages()
        self.settings = settings
        self._bits = (rng or random.Random()).getrandbits
        self.now = clock
        self._bound = int(settings.trace_sample_ratio * (1 << 64))  # sampled: low 64 bits of the trace id below
        self.exporter = Exporter(settings, counter=counter)

    def span_id(self) -> int:
        """A fresh non-zero span id."""
        return self._bits(64) or 1

    def begin(self, name: str, traceparent: str, tracestate: str) -> RequestTrace | None:
        """The trace of a request that arrived with these headers ("" when absent), or None when not sampled."""
        parent = parse_traceparent(traceparent) if traceparent else None
        if parent is not None:
            trace_id, parent_id, sampled = parent
            if not sampled:
                return None
            state = tracestate if len(tracestate) <= MAX_TRACESTATE else ""
        else:
            trace_id, parent_id, state = self._bits(128) or 1, 0, ""
            if (trace_id & 0xFFFF_FFFF_FFFF_FFFF) >= self._bound:
                return None
        return RequestTrace(self, trace_id, parent_id, state, name)


def _attributes(target: Any, values: Mapping[str, Attribute]) -> None:
    """Add ``values`` to a repeated ``KeyValue`` field, each in its typed slot."""
    for key, value in values.items():
        kv = target.add()
        kv.key = key
        if isinstance(value, bool):
            kv.value.bool_value = value
        elif isinstance(value, int):
            kv.value.int_value = value
        elif isinstance(value, float):
            kv.value.double_value = value
        else:
            kv.value.string_value = str(value)[:MAX_NAME]


def check_messages() -> None:
    """Raise ConfigError when the installed OTLP messages lack ``ScopeSpans``: ``xds-protos`` ships an old copy
    of the same ``opentelemetry/proto`` files, and whichever package pip installs last owns them
    (``make venv`` reinstalls ``opentelemetry-proto`` last)."""
    if "scope_spans" not in trace_pb2.ResourceSpans.DESCRIPTOR.fields_by_name:
        raise ConfigError("proxy.trace_endpoint", "the installed OTLP messages are an old copy (xds-protos "
                          "overwrote opentelemetry-proto's files): pip install --force-reinstall --no-deps "
                          "opentelemetry-proto==1.45.2")


def encode(traces: Iterable[RequestTrace],
           resource: resource_pb2.Resource) -> trace_service_pb2.ExportTraceServiceRequest:
    """One ``ExportTraceServiceRequest`` of ``traces``' spans, under ``resource`` and the scope ``ferry``."""
    request = trace_service_pb2.ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.CopyFrom(resource)
    scope = resource_spans.scope_spans.add()
    scope.scope.name, scope.scope.version = "ferry", ferry.__version__
    spans = scope.spans
    for trace in traces:
        trace_id = trace.trace_id.to_bytes(16, "big")
        for span in trace.spans:
            out = spans.add()
            out.trace_id = trace_id
            out.span_id = span.span_id.to_bytes(8, "big")
            if span.parent_id:
                out.parent_span_id = span.parent_id.to_bytes(8, "big")
            out.name, out.kind = span.name, span.kind
            out.trace_state = trace.tracestate
            out.flags = _SAMPLED | (_REMOTE_PARENT if span is trace.root and trace.remote else 0x100)
            out.start_time_unix_nano, out.end_time_unix_nano = span.start_ns, span.end_ns
            _attributes(out.attributes, span.attributes)
            for name, at in span.events:
                added = out.events.add()
                added.name, added.time_unix_nano = name, at
            if span.error:
                out.status.code = trace_pb2.Status.STATUS_CODE_ERROR
                out.status.message = span.error
    return request


def resource(service: str, instance: str, region: str) -> resource_pb2.Resource:
    """The process's resource: ``service.name`` (``ferry-proxy``, ``ferry-picker``), its id and region."""
    out = resource_pb2.Resource()
    _attributes(out.attributes, {"service.name": service, "service.instance.id": instance,
                                 "service.version": ferry.__version__, "ferry.region": region})
    return out


class Exporter:
    """Finished traces, queued (bounded in spans) and sent in batches by :meth:`run`; see the module docstring.

    ``counter``: ``ferry_proxy_trace_spans_total``'s metric (label ``outcome``: exported, dropped, failed).
    """

    def __init__(self, settings: TraceSettings, *, counter: Any) -> None:
        self._settings = settings
        try:  # read at start: a CA that cannot be read stops the proxy with the key's name
            self._roots = Path(settings.trace_ca).read_bytes() if settings.trace_ca else None
        except OSError as exc:
            raise ConfigError("proxy.trace_ca", f"cannot read {settings.trace_ca}: {exc.strerror}") from exc
        self._traces: collections.deque[RequestTrace] = collections.deque()
        self.queued = 0  # spans waiting
        self._wake = asyncio.Event()
        self._closing = False
        self._failing = False  # an export failed and none has succeeded since (logged once)
        self._exported = counter.labels("exported")
        self._dropped = counter.labels("dropped")
        self._failed = counter.labels("failed")

    def put(self, trace: RequestTrace) -> None:
        """Queue a finished trace, or drop and count it when its spans do not fit; never waits."""
        count = len(trace.spans)
        if self.queued + count > self._settings.trace_queue_spans:
            self._dropped.inc(count)
            return
        self._traces.append(trace)
        self.queued += count
        if self.queued >= self._settings.trace_batch_spans:
            self._wake.set()

    def channel(self) -> grpc.aio.Channel:
        """The collector's channel: plain text with ``trace_insecure``, else TLS (``trace_ca`` or system roots)."""
        s = self._settings
        if s.trace_insecure:
            return grpc.aio.insecure_channel(s.trace_endpoint)
        return grpc.aio.secure_channel(s.trace_endpoint, grpc.ssl_channel_credentials(root_certificates=self._roots))

    async def run(self, where: resource_pb2.Resource) -> None:
        """Send batches until :meth:`close`, then what is left (one flush, within the export timeout)."""
        s = self._settings
        async with self.channel() as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            while not self._closing:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(s.trace_flush_seconds):
                        await self._wake.wait()
                self._wake.clear()
                while self._traces:
                    await self._send(stub, where)

    async def _send(self, stub: Any, where: resource_pb2.Resource) -> None:
        batch: list[RequestTrace] = []
        count = 0
        while self._traces and count < self._settings.trace_batch_spans:
            trace = self._traces.popleft()
            batch.append(trace)
            count += len(trace.spans)
        self.queued -= count
        try:
            await stub.Export(encode(batch, where), timeout=self._settings.trace_export_timeout_seconds)
        except grpc.aio.AioRpcError as exc:
            self._failed.inc(count)
            if not self._failing:
                self._failing = True
                event(log, "trace_export_failed", logging.WARNING, endpoint=self._settings.trace_endpoint,
                      code=exc.code().name, reason=(exc.details() or "")[:200], spans=count)
            return
        self._exported.inc(count)
        self._failing = False

    def close(self) -> None:
        """Stop after sending what is queued."""
        self._closing = True
        self._wake.set()
