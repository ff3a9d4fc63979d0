"""Prometheus naming and exposition shared by every component.

Names start with ``ferry_``, durations are in seconds, counters end in
``_total``; labels are model, tier, region, status, branch and similar bounded
sets, never a request or tenant id. Each process serves its default registry
over HTTP with :func:`start_metrics_server` (port 0 allowed), which also
registers ``ferry_build_info`` (a gauge of 1 labelled with Ferry's version
and the Python version: :func:`register_build_info`) in it.
"""

from __future__ import annotations

import platform

from prometheus_client import REGISTRY, CollectorRegistry, Gauge, disable_created_metrics, start_http_server

import ferry
from ferry.grpcutil import split_address

PREFIX = "ferry_"

# Latency buckets from 1 ms to 60 s, for request, queue and first-token times.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)

# Time per output token, 1 ms to 2.5 s (a decode step of a large model is tens of ms).
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)


def name(metric: str) -> str:
    """The full metric name: ``ferry_`` + ``metric`` (given without the prefix)."""
    if metric.startswith(PREFIX):
        raise ValueError(f"metric {metric!r}: pass it without the {PREFIX!r} prefix")
    return PREFIX + metric


def start_metrics_server(listen: str, registry: CollectorRegistry = REGISTRY) -> int:
    """Serve ``registry`` (the default one unless given) at ``http://listen/metrics``; returns the bound port.

    The server runs in a daemon thread for the life of the process.
    """
    disable_created_metrics()  # one series per metric: no `_created` twins
    register_build_info(registry)
    host, port = split_address(listen)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return int(server.server_port)


_BUILD_INFO: dict[int, Gauge] = {}  # registry id -> its gauge: registered once per registry


def register_build_info(registry: CollectorRegistry = REGISTRY) -> Gauge:
    """``ferry_build_info{version, python} 1`` in ``registry`` (once per registry; later calls return it)."""
    found = _BUILD_INFO.get(id(registry))
    if found is None:
        found = _BUILD_INFO[id(registry)] = Gauge(
            name("build_info"), "Ferry's version and the Python running it (always 1).", ["version", "python"],
            registry=registry)
        found.labels(ferry.__version__, platform.python_version()).set(1)
    return found


OTHER = "_other"  # the label value of every tenant past the bound


class BoundedLabel:
    """Label values for an open-ended set (tenants): the first ``limit`` seen keep their name, the rest ``_other``.

    Keeps a metric's series bounded (``limit`` + 1 values per other label
    combination) whatever the number of tenants; the names kept are those
    seen first since the process started. Cost: O(1) per call, O(limit) memory.
    """

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError("limit must be >= 0")
        self.limit = limit
        self._kept: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._kept:
            return value
        if len(self._kept) < self.limit:
            self._kept.add(value)
            return value
        return OTHER
