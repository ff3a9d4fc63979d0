"""An OTLP/gRPC trace receiver for tests: ``opentelemetry.proto.collector.trace.v1.TraceService/Export`` served by
a real ``grpc.aio`` server on 127.0.0.1 (port 0), keeping every request it is sent.

Tests wait for a trace's root span to arrive (:meth:`Collector.trace`), never on sleeps.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

from tests.dataplane.fakes import serve


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps each ``ExportTraceServiceRequest``; answers OK, or ``fail`` (a status code) when set."""

    def __init__(self, fail: grpc.StatusCode | None = None) -> None:
        self.fail = fail
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.arrived = asyncio.Event()
        self.server: grpc.aio.Server | None = None
        self.address = ""

    async def start(self) -> Collector:
        self.server, port = await serve(trace_service_pb2_grpc.add_TraceServiceServicer_to_server, self)
        self.address = f"127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)

    async def Export(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.requests.append(request)
        self.arrived.set()
        if self.fail is not None:
            await context.abort(self.fail, "collector refuses")
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[trace_pb2.Span]:
        """Every span received, in the order they came."""
        return [span for request in self.requests for rs in request.resource_spans for ss in rs.scope_spans
                for span in ss.spans]

    def services(self) -> set[str]:
        """The ``service.name`` of every resource that sent spans."""
        return {kv.value.string_value for request in self.requests for rs in request.resource_spans
                for kv in rs.resource.attributes if kv.key == "service.name"}

    async def trace(self, trace_id: bytes | None = None, within: float = 10.0) -> list[trace_pb2.Span]:
        """The spans of the first trace (of ``trace_id``, when given) whose root (kind SERVER) has arrived."""
        async with asyncio.timeout(within):
            while True:
                roots = [s for s in self.spans() if s.kind == trace_pb2.Span.SPAN_KIND_SERVER
                         and (trace_id is None or s.trace_id == trace_id)]
                if roots:
                    return [s for s in self.spans() if s.trace_id == roots[0].trace_id]
                self.arrived.clear()
                await self.arrived.wait()


def attributes(span: trace_pb2.Span) -> dict[str, Any]:
    """A span's attributes as plain values."""
    out: dict[str, Any] = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind) if kind else None
    return out
