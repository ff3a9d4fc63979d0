"""Prometheus metrics of one batch runtime, in a registry of its own.

A registry per runtime (not the process default), so that a node process can
hold the runtime beside its agent and simulated replicas, and a test process
many runtimes, without two owners of one metric name. Load figures are read
from the runtime when scraped (:class:`LoadCollector` over a
:class:`~agent.batch.telemetry.RuntimeLoad` snapshot); :func:`serve` answers
scrapes (``aiohttp.web``) on the runtime's own event loop, so a snapshot never races a batch.

Under Triton's names, so the agent reads the runtime as any KServe v2 endpoint
(:func:`agent.triton.from_metrics`):

- ``nv_inference_pending_request_count{model,version}``: requests pending in the batcher;
- ``nv_inference_request_success{model,version}``, ``nv_inference_request_failure{model,version}``,
  ``nv_inference_exec_count{model,version}`` (batches completed);
- ``nv_gpu_utilization{gpu_uuid}``: each healthy GPU's busy share of the last second.

Ferry's own:

- ``ferry_batch_running_requests{model,version}``: requests in batches on GPUs now;
- ``ferry_batch_max_concurrency{model,version}``: ``max_batch`` × batch slots on the healthy GPUs;
- ``ferry_batch_size{model}``: histogram of requests per batch;
- ``ferry_batch_flushes_total{model,reason}``: reason ``size``, ``time``, ``retry``;
- ``ferry_batch_placements_total{model,branch}``: ``fit``, ``drained``, ``aged``;
- ``ferry_batch_requeued_total{model}``: requests put back after a GPU failure;
- ``ferry_batch_aborted_total{model,version}``: batches aborted by a GPU failure (requests requeued,
  the late result of the abandoned call never answered);
- ``ferry_gpu_idle_drain_seconds_total``: GPU-seconds held idle by gang drains;
- ``ferry_gpus_in_use``, ``ferry_gpus_failed``: the node's GPUs now.

Cost of a scrape: O(models + GPUs × recent batches).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, UnknownMetricFamily

from agent.batch.telemetry import RuntimeLoad
from ferry.grpcutil import split_address
from ferry.metrics import name

BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 80, 90, 99, 100, 200, 500, 1000)
MODEL_LABELS = ["model", "version"]


class LoadCollector:
    """Yields the load families from a fresh snapshot at every scrape."""

    def __init__(self, snapshot: Callable[[], RuntimeLoad]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        load = self._snapshot()
        pending = GaugeMetricFamily("nv_inference_pending_request_count", "Requests waiting in the batcher.",
                                    labels=MODEL_LABELS)
        success = UnknownMetricFamily("nv_inference_request_success", "Requests answered.", labels=MODEL_LABELS)
        failure = UnknownMetricFamily("nv_inference_request_failure", "Requests failed.", labels=MODEL_LABELS)
        execs = UnknownMetricFamily("nv_inference_exec_count", "Batches completed.", labels=MODEL_LABELS)
        aborted = CounterMetricFamily(name("batch_aborted"), "Batches aborted by a GPU failure.", labels=MODEL_LABELS)
        running = GaugeMetricFamily(name("batch_running_requests"), "Requests in batches on GPUs now.",
                                    labels=MODEL_LABELS)
        limit = GaugeMetricFamily(name("batch_max_concurrency"), "max_batch x batch slots on the healthy GPUs.",
                                  labels=MODEL_LABELS)
        for m in load.models:
            labels = [m.model, m.version]
            pending.add_metric(labels, m.pending)
            success.add_metric(labels, m.answered)
            failure.add_metric(labels, m.failed)
            execs.add_metric(labels, m.batches)
            aborted.add_metric(labels, m.aborted)
            running.add_metric(labels, m.running)
            limit.add_metric(labels, m.max_concurrency)
        utilization = GaugeMetricFamily("nv_gpu_utilization", "Busy share of the last second, healthy GPUs only.",
                                        labels=["gpu_uuid"])
        for gpu, share in enumerate(load.gpu_utilization):
            if share is not None:
                utilization.add_metric([f"GPU-{gpu}"], share)
        yield from (pending, success, failure, execs, aborted, running, limit, utilization)
        yield GaugeMetricFamily(name("gpus_in_use"), "GPUs running a batch now.", value=load.gpus_in_use)
        yield GaugeMetricFamily(name("gpus_failed"), "GPUs marked failed on this node.", value=load.gpus_failed)
        yield CounterMetricFamily(name("gpu_idle_drain_seconds"),
                                  "GPU-seconds left idle while a gang batch drained the node.",
                                  value=load.drain_idle_gpu_s)


class BatchMetrics:
    """The event metrics of one runtime, and its load collector, in ``registry``."""

    def __init__(self, snapshot: Callable[[], RuntimeLoad], registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.batch_size = Histogram(name("batch_size"), "Requests per batch.", ["model"], buckets=BATCH_BUCKETS,
                                    registry=r)
        self.flushes = Counter(name("batch_flushes_total"), "Batches sent, by flush reason.", ["model", "reason"],
                               registry=r)
        self.placements = Counter(name("batch_placements_total"), "Batches placed on GPUs, by scheduler branch.",
                                  ["model", "branch"], registry=r)
        self.requeued = Counter(name("batch_requeued_total"), "Requests put back at the head after their GPU failed.",
                                ["model"], registry=r)
        r.register(LoadCollector(snapshot))

    def render(self) -> str:
        """The exposition text (call on the runtime's event loop)."""
        return str(generate_latest(self.registry).decode())


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


async def serve(listen: str, metrics: BatchMetrics) -> tuple[web.AppRunner, int]:
    """Serve ``metrics`` at ``http://listen/metrics`` on the running loop (``aiohttp.web``; 404 for another
    path, 405 for another method); returns the runner (``cleanup()`` stops it) and the bound port."""
    host, port = split_address(listen)

    async def scrape(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render().encode("utf-8"), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", scrape, allow_head=False)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner, int(runner.addresses[0][1])
