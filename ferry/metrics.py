"""Prometheus naming and exposition shared by every component.

Names start with ``ferry_``, durations are in seconds, counters end in
``_total``; labels are model, tier, region, status, branch and similar bounded
sets, never a request or tenant id. Each process serves its default registry
over HTTP with :func:`start_metrics_server` (port 0 allowed).
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, disable_created_metrics, start_http_server

from ferry.grpcutil import split_address

PREFIX = "ferry_"

# Latency buckets from 1 ms to 60 s, for request, queue and first-token times.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)


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
    host, port = split_address(listen)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return int(server.server_port)


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
