"""The recorded traffic on a control plane: taken off the proxies' reports, stored by the leader, relayed once.

:meth:`TrafficService.take` runs as a proxy's usage report arrives on its
table watch (:meth:`controlplane.services.tables.TableService.proxy_report`):
it takes the report's ``traffic`` rows and ``traffic_dropped`` off the report
(so the last report kept per proxy, which a follower relays every tick, carries
none), stamps each row with the proxy's id and region from the watch, and
refuses a malformed row (counted). Then:

- **leading**: the rows go to the store (:mod:`controlplane.traffic.store`);
- **following**: they wait in a bounded outbox (``traffic_relay_max_rows``;
  beyond, dropped and counted) and :meth:`relay` puts at most
  ``traffic_relay_rows`` of them, with the drops since, on each
  ``FollowerReport`` (:meth:`controlplane.services.peers.PeerService.follower_report`),
  each row once; the leader's :meth:`absorb` stores them. A follower that
  starts to lead stores its outbox with the next rows.

A row is sent at most once: rows on a report lost with its stream (a proxy's
watch or a follower's link that breaks) are lost, not counted.

Metrics: ``ferry_controlplane_traffic_rows_total{how}`` with ``how`` one of
``stored`` (kept by this control plane's store), ``relayed`` (sent to the
leader), ``refused`` (malformed), ``dropped`` (the outbox was full); and
``ferry_controlplane_traffic_proxy_dropped_total`` (rows the proxies
reported they dropped).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter

from controlplane.config import ControlPlaneSettings
from controlplane.traffic.rows import check
from controlplane.traffic.store import MemoryStore, SegmentStore, StoreLimits, TrafficStore
from ferry.grpcutil import take_within
from ferry.metrics import name
from ferry.v1 import admin_pb2, tables_pb2


def store_for(settings: ControlPlaneSettings, *, wall: Callable[[], float]) -> TrafficStore:
    """The store ``[controlplane] traffic_*`` describe: segments in ``traffic_dir``, else memory."""
    limits = StoreLimits(segment_bytes=settings.traffic_segment_bytes,
                         segment_seconds=settings.traffic_segment_seconds, max_bytes=settings.traffic_max_bytes,
                         max_age_seconds=settings.traffic_max_age_seconds, memory_rows=settings.traffic_memory_rows)
    if settings.traffic_dir:
        return SegmentStore(settings.traffic_dir, limits, wall=wall)
    return MemoryStore(limits, wall=wall)


class TrafficService:
    """Rows in from the proxies and followers, out to the store or the leader; see the module docstring."""

    def __init__(self, settings: ControlPlaneSettings, *, leading: Callable[[], bool], wall: Callable[[], float],
                 store: TrafficStore | None = None, registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        self.store = store if store is not None else store_for(settings, wall=wall)
        self._leading = leading
        self._outbox: collections.deque[tables_pb2.TrafficRow] = collections.deque()
        self._outbox_dropped = 0  # rows dropped (by proxies, or the outbox) not yet told to the leader
        reg = {"registry": registry}  # None: counted, not registered (tests)
        self._rows = Counter(name("controlplane_traffic_rows"), "Recorded traffic rows (controlplane.traffic): "
                             "stored here, relayed to the leader, refused as malformed, dropped (the relay's "
                             "outbox full).", ["how"], **reg)
        self._counted = {how: self._rows.labels(how) for how in ("stored", "relayed", "refused", "dropped")}
        self._proxy_dropped = Counter(name("controlplane_traffic_proxy_dropped"),
                                      "Rows the proxies' recorders reported they dropped (their buffer full).", **reg)

    def count(self, how: str) -> float:
        """Rows counted under ``how`` so far (stored, relayed, refused, dropped)."""
        return float(self._counted[how]._value.get())

    def take(self, proxy_id: str, region: str, report: tables_pb2.Report) -> None:
        """A proxy's report arrived: its rows taken off it, stamped with the proxy, stored or queued for the leader."""
        dropped = report.traffic_dropped
        if not report.traffic and not dropped:
            return
        rows = []
        for row in report.traffic:
            row.proxy_id, row.region = proxy_id, region
            if check(row) is None:
                rows.append(row)
        if len(rows) < len(report.traffic):
            self._counted["refused"].inc(len(report.traffic) - len(rows))
        report.ClearField("traffic")  # the rows taken keep their messages (detached from the report)
        report.ClearField("traffic_dropped")
        if dropped:
            self._proxy_dropped.inc(dropped)
        self._route(rows, dropped, proxy_id)

    def _route(self, rows: Sequence[tables_pb2.TrafficRow], dropped: int, source: str) -> None:
        if self._leading():
            if self._outbox or self._outbox_dropped:  # rows queued while this control plane followed
                self._store(list(self._outbox), self._outbox_dropped, "outbox")
                self._outbox.clear()
                self._outbox_dropped = 0
            self._store(rows, dropped, source)
            return
        room = self.settings.traffic_relay_max_rows - len(self._outbox)
        self._outbox.extend(rows[:max(room, 0)])
        lost = max(0, len(rows) - max(room, 0))
        if lost:
            self._counted["dropped"].inc(lost)
        self._outbox_dropped += dropped + lost

    def _store(self, rows: Sequence[tables_pb2.TrafficRow], dropped: int, source: str) -> None:
        self.store.append(rows, dropped, source)
        if rows:
            self._counted["stored"].inc(len(rows))

    def relay(self, report: admin_pb2.FollowerReport) -> None:
        """Following: move at most ``traffic_relay_rows`` (and ``traffic_relay_bytes``) of the outbox, and the
        drops since, onto ``report``."""
        if self._leading():
            return
        rows = take_within(self._outbox, max_rows=self.settings.traffic_relay_rows,
                           max_bytes=self.settings.traffic_relay_bytes)
        n = len(rows)
        report.traffic.extend(rows)
        report.traffic_dropped = self._outbox_dropped
        self._outbox_dropped = 0
        if n:
            self._counted["relayed"].inc(n)

    def absorb(self, cp_id: str, rows: Sequence[tables_pb2.TrafficRow], dropped: int) -> None:
        """Leading: a follower's relayed rows (stamped by it), checked and stored."""
        if not rows and not dropped:
            return
        kept = [row for row in rows if check(row) is None]
        if len(kept) < len(rows):
            self._counted["refused"].inc(len(rows) - len(kept))
        self._route(kept, dropped, cp_id)

    def close(self) -> None:
        self.store.close()
