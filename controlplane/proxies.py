"""The controller's dealings with the proxies that watch its tables (a mixin of ``Controller``).

``Tables.Watch`` from the servicer side: :meth:`Proxies.subscribe` validates
the subscription (``controlplane.validate``; INVALID_ARGUMENT naming the
field, RESOURCE_EXHAUSTED past ``max_watchers`` or ``max_proxies``) and offers
the region's current table at once (computing it on the leader, asking the
leader on a follower); :meth:`Proxies.ack` records what the proxy applied or
why it rejected a version (a stale or malformed ack is ignored and counted);
:meth:`Proxies.proxy_report` keeps the proxy's last usage report
(:mod:`controlplane.usage`). Cost: O(1) per message plus the metrics of the
proxies, O(proxies).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from controlplane import validate
from controlplane.cluster import Cluster
from controlplane.config import ControlPlaneSettings
from controlplane.metrics import Metrics
from controlplane.table import Published, TableVersions
from controlplane.usage import ProxyUsage
from controlplane.watchers import Watcher, Watchers
from ferry.errors import InvalidArgument, Overloaded
from ferry.logs import event
from ferry.v1 import tables_pb2

log = logging.getLogger(__name__)


class Proxies:
    """Subscriptions, acks and usage reports of the proxies watching this control plane."""

    settings: ControlPlaneSettings
    watchers: Watchers
    proxy_usage: ProxyUsage
    tables: TableVersions
    metrics: Metrics
    cluster: Cluster | None
    leading: bool

    # Provided by Controller and Operator (annotations only, so that they do not shadow them).
    recompute: Callable[[], list[Published]]
    reject: Callable[..., None]


    def subscribe(self, sub: tables_pb2.Subscribe) -> Watcher:
        try:
            validate.check_subscribe(sub, self.settings)
            watcher = self.watchers.subscribe(sub.proxy_id, sub.region)
        except InvalidArgument:
            self.reject("subscribe_field")
            raise
        except Overloaded:
            self.reject("watchers_limit")
            raise
        published = self.tables.get(sub.region)
        if published is None and self.leading:
            self.recompute()
            published = self.tables.get(sub.region)
        if published is not None:  # always, even to a proxy that holds it (tables.proto)
            watcher.offer(published.snapshot)
        elif self.cluster is not None:
            self.cluster.link.wake()  # a follower: ask the leader for the region now
        self._observe_proxies()
        return watcher

    def ack(self, watcher: Watcher, ack: tables_pb2.Ack) -> None:
        ignored = self.watchers.ack(watcher, ack)
        if ignored is not None:
            self.reject(ignored)
        elif not ack.applied:
            event(log, "table_rejected_by_proxy", logging.WARNING, proxy_id=watcher.status.proxy_id,
                  version=ack.version, reason=ack.error)
        self._observe_proxies()

    def pushed(self, watcher: Watcher) -> None:
        self.metrics.table_pushes.labels(region=watcher.region).inc()

    def unsubscribe(self, watcher: Watcher) -> None:
        self.watchers.unsubscribe(watcher)
        self.proxy_usage.drop(watcher.status.proxy_id, watcher)

    def proxy_report(self, watcher: Watcher, report: tables_pb2.Report) -> None:
        """A proxy's usage report: kept as its last (controlplane.usage); a malformed one is ignored and counted."""
        ignored = self.proxy_usage.put(watcher.status.proxy_id, watcher.region, report, stream=watcher)
        if ignored is not None:
            self.reject(ignored)

    def _observe_proxies(self) -> None:
        self.metrics.observe_proxies(self.watchers.statuses(), self.tables)
