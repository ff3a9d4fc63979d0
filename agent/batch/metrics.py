"""Prometheus metrics of the batch runtime, in a registry of their own.

A registry of its own (not the process default) so that the batch runtime and
another replica kind can live in one process (tests, ``ferry up``) without
registering ``nv_inference_pending_request_count`` twice. :func:`serve`
exposes it over HTTP on 127.0.0.1.

- ``nv_inference_pending_request_count{model,version}``: requests waiting in
  the batcher (Triton's name, so the agent reads both kinds alike);
- ``ferry_batch_size{model}``: histogram of requests per batch;
- ``ferry_batch_flushes_total{model,reason}``: reason ``size``, ``time``, ``retry``;
- ``ferry_batch_placements_total{model,branch}``: ``fit``, ``drained``, ``aged``;
- ``ferry_batch_requeued_total{model}``: requests put back after a GPU failure;
- ``ferry_gpu_idle_drain_seconds_total``: GPU-seconds held idle by gang drains;
- ``ferry_gpus_in_use``, ``ferry_gpus_failed``: the node's GPUs now.
"""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from ferry.grpcutil import split_address
from ferry.metrics import name

REGISTRY = CollectorRegistry()
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 80, 90, 99, 100, 200, 500, 1000)

PENDING = Gauge("nv_inference_pending_request_count", "Requests waiting in the batcher.",
                ["model", "version"], registry=REGISTRY)
BATCH_SIZE = Histogram(name("batch_size"), "Requests per batch.", ["model"], buckets=BATCH_BUCKETS, registry=REGISTRY)
FLUSHES = Counter(name("batch_flushes_total"), "Batches sent, by flush reason.", ["model", "reason"],
                  registry=REGISTRY)
PLACEMENTS = Counter(name("batch_placements_total"), "Batches placed on GPUs, by scheduler branch.",
                     ["model", "branch"], registry=REGISTRY)
REQUEUED = Counter(name("batch_requeued_total"), "Requests put back at the head after their GPU failed.", ["model"],
                   registry=REGISTRY)
DRAIN_IDLE = Counter(name("gpu_idle_drain_seconds_total"), "GPU-seconds left idle while a gang batch drained the node.",
                     registry=REGISTRY)
GPUS_IN_USE = Gauge(name("gpus_in_use"), "GPUs running a batch now.", registry=REGISTRY)
GPUS_FAILED = Gauge(name("gpus_failed"), "GPUs marked failed on this node.", registry=REGISTRY)


def serve(listen: str) -> tuple[WSGIServer, int]:
    """Serve :data:`REGISTRY` at ``http://listen/metrics``; returns the server (to shut down) and its port."""
    host, port = split_address(listen)
    server, _thread = start_http_server(port, addr=host, registry=REGISTRY)
    return server, int(server.server_port)
