"""``ferry up --trace-stdout``: an OTLP/gRPC receiver in ``ferry up`` that prints each finished trace as a tree.

:class:`TraceSink` serves ``opentelemetry.proto.collector.trace.v1.TraceService/Export``
on 127.0.0.1 (a port the kernel chooses, plain text); ``ferry up`` points
every proxy and picker at it (:func:`proxy_settings`: ``[proxy]
trace_endpoint``, ``trace_insecure``, a short ``trace_flush_seconds``, every
request sampled unless the config file sets a ratio). Spans are grouped by
trace id; a trace is printed when its root arrives (the span of kind SERVER:
the request in a proxy or a picker), after the rest of its Export call is
read: a request's spans are queued together when it ends
(:mod:`dataplane.tracing`), so its children come in the same Export call or
an earlier one. Bounded: at most ``MAX_PENDING``
traces wait for their root (the oldest is dropped first) and ``MAX_SPANS``
spans each.

Printed (:func:`render`), one block per trace: a header with the trace id and
the service, then each span indented under its parent, children in the order
they started, with its duration in milliseconds, its attributes (the
``ferry.`` prefix dropped) and its error; an event is a line ``· name +offset``
under its span, the offset from the span's start.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable
from concurrent import futures
from typing import Any, TextIO

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

MAX_PENDING = 1024  # traces waiting for their root
MAX_SPANS = 256  # spans kept per trace
SERVER = trace_pb2.Span.SPAN_KIND_SERVER


def proxy_settings(endpoint: str, user: dict[str, Any]) -> dict[str, Any]:
    """The ``[proxy]`` keys that send a ``ferry up`` run's traces to ``endpoint``: the user's ``proxy`` section with
    the endpoint, plain text, a flush every 0.2 s, and a sample ratio of 1 unless the user set one."""
    section = dict(user)
    section.update(trace_endpoint=endpoint, trace_insecure=True, trace_flush_seconds=0.2)
    section.pop("trace_ca", None)
    section.setdefault("trace_sample_ratio", 1.0)
    return section


def _value(value: Any) -> str:
    kind = value.WhichOneof("value")
    return "" if kind is None else str(getattr(value, kind))


def render(spans: Iterable[trace_pb2.Span], service: str = "") -> str:
    """One trace as an indented tree (see the module docstring)."""
    spans = list(spans)
    ids = {span.span_id for span in spans}
    children: dict[bytes, list[trace_pb2.Span]] = collections.defaultdict(list)
    tops = []
    for span in sorted(spans, key=lambda s: s.start_time_unix_nano):
        if span.parent_span_id and span.parent_span_id in ids:
            children[span.parent_span_id].append(span)
        else:
            tops.append(span)
    trace_id = spans[0].trace_id.hex() if spans else ""
    lines = [f"trace {trace_id}" + (f" ({service})" if service else "")]

    def walk(span: trace_pb2.Span, depth: int) -> None:
        pad = "  " * depth
        millis = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6
        attributes = " ".join(f"{kv.key.removeprefix('ferry.')}={_value(kv.value)}" for kv in span.attributes)
        error = f"  error: {span.status.message}" if span.status.code == trace_pb2.Status.STATUS_CODE_ERROR else ""
        lines.append(f"{pad}{span.name}  {millis:.3f} ms  {attributes}{error}".rstrip())
        for event in span.events:
            lines.append(f"{pad}  · {event.name} +{(event.time_unix_nano - span.start_time_unix_nano) / 1e6:.3f} ms")
        for child in children.get(span.span_id, ()):
            walk(child, depth + 1)

    for top in tops:
        walk(top, 1)
    return "\n".join(lines) + "\n"


class TraceSink(trace_service_pb2_grpc.TraceServiceServicer):
    """Receives spans over OTLP/gRPC and writes each finished trace to ``out`` (None: counts them only, for a
    benchmark's receiver); see the module docstring."""

    def __init__(self, out: TextIO | None) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._pending: collections.OrderedDict[bytes, list[trace_pb2.Span]] = collections.OrderedDict()
        self._server: grpc.Server | None = None
        self.printed = 0
        self.address = ""

    def start(self) -> str:
        """Serve on 127.0.0.1 (a free port); returns ``host:port``."""
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="trace-sink"))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        self.address = f"127.0.0.1:{port}"
        return self.address

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(1).wait()
            self._server = None

    def Export(self, request: trace_service_pb2.ExportTraceServiceRequest,
               context: Any) -> trace_service_pb2.ExportTraceServiceResponse:
        with self._lock:
            finished: list[tuple[bytes, str]] = []  # printed once the whole request is read
            for resource_spans in request.resource_spans:
                service = next((_value(kv.value) for kv in resource_spans.resource.attributes
                                if kv.key == "service.name"), "")
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        if self._add(span):
                            finished.append((span.trace_id, service))
            for trace_id, service in finished:
                spans = self._pending.pop(trace_id, None)
                if spans is not None:
                    if self._out is not None:
                        self._out.write(render(spans, service))
                    self.printed += 1
            if self._out is not None:
                self._out.flush()
        return trace_service_pb2.ExportTraceServiceResponse()

    def _add(self, span: trace_pb2.Span) -> bool:
        """Keep ``span`` with its trace's; True when it is a root (its trace is finished)."""
        spans = self._pending.get(span.trace_id)
        if spans is None:
            if len(self._pending) >= MAX_PENDING:
                self._pending.popitem(last=False)
            spans = self._pending[span.trace_id] = []
        if len(spans) < MAX_SPANS:
            spans.append(span)
        return span.kind == SERVER
