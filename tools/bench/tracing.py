"""Tracing's CPU per request, in process: the spans of one streamed request made and exported as the proxy does.

For ``--requests`` requests (20,000): a trace begun from a caller's
``traceparent`` (:meth:`dataplane.tracing.Tracer.begin`), the spans the
router's hooks make for one streamed request that waits in its tier queue
(``admission``, ``decision``, ``forward`` with its ``first_token`` event, the
replica's ``traceparent`` rendered), the trace finished and queued; then the
queue encoded as OTLP ``ExportTraceServiceRequest`` batches of
``trace_batch_spans`` and serialized, as the exporter's task does before
each Export call (the call itself is not made). Prints the process CPU time
per request of each half (``time.process_time``); the attribute sets are
those the router passes (:mod:`dataplane.router`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from prometheus_client import CollectorRegistry, Counter

from dataplane.tracing import Tracer, TraceSettings, encode, resource


async def _done() -> None:
    return None


async def one_request(tracer: Tracer) -> None:
    """The spans of one streamed, queued request (the router's hooks, in their order)."""
    trace = tracer.begin("ferry.v1.Inference/InferStream", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                         "")
    assert trace is not None
    await trace.around("admission", {"ferry.model": "m", "ferry.tier": "interactive"}, _done())
    began = trace.now()
    trace.end(trace.start("decision", {"ferry.model": "m", "ferry.tier": "interactive", "ferry.attempt": 1,
                                       "ferry.branch": "affinity", "ferry.replica": "node-1-r0",
                                       "ferry.region": "local", "ferry.version": "v1"}, start_ns=began))
    trace.attempt("node-1-r0", 1)
    trace.headers()
    trace.first_token()
    trace.attempt_end("ok", **{"ferry.completion_tokens": 16})
    trace.finish("OK", {"ferry.request_id": "a" * 32, "ferry.model": "m", "ferry.tier": "interactive",
                        "ferry.attempts": 1, "ferry.prompt_tokens": 40, "ferry.completion_tokens": 16,
                        "ferry.replica": "node-1-r0", "ferry.region": "local"})


async def run(requests: int) -> tuple[float, float]:
    settings = TraceSettings(trace_endpoint="127.0.0.1:4317", trace_insecure=True, trace_queue_spans=requests * 8,
                             trace_batch_spans=512)
    tracer = Tracer(settings, counter=Counter("spans", "", ["outcome"], registry=CollectorRegistry()))
    start = time.process_time()
    for _ in range(requests):
        await one_request(tracer)
    made = time.process_time() - start
    queue = tracer.exporter._traces
    where = resource("ferry-proxy", "bench", "local")
    start = time.process_time()
    while queue:
        batch, spans = [], 0
        while queue and spans < settings.trace_batch_spans:
            batch.append(queue.popleft())
            spans += len(batch[-1].spans)
        encode(batch, where).SerializeToString()
    exported = time.process_time() - start
    return made / requests, exported / requests


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_tracing", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--requests", type=int, default=20_000)
    args = p.parse_args(argv)
    made, exported = asyncio.run(run(args.requests))
    print(f"{args.requests} traced requests of 4 spans: {made * 1e6:.1f} µs CPU each to make the spans, "
          f"{exported * 1e6:.1f} µs to encode and serialize them for export, {(made + exported) * 1e6:.1f} µs in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
