"""The controller's dealings with the other control planes (a mixin of ``Controller``).

- As a follower: :meth:`Peers.follower_report` builds the per-tick report of
  the nodes held here (liveness and the last load of each replica: O(replicas
  held here)); :meth:`Peers.adopt` takes a table the leader published, pushes
  it to this control plane's proxies and wakes anyone waiting for it.
- As the leader: :meth:`Peers.follow_open`, :meth:`Peers.follow_report` and
  :meth:`Peers.follow_close` serve ``Admin.Follow`` (only while leading:
  ``Unavailable`` naming the leader otherwise; reports are validated).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from controlplane import validate
from controlplane.cluster import Cluster
from controlplane.config import ControlPlaneSettings
from controlplane.fleet import FleetView, Member, is_live
from controlplane.followers import FollowerSession
from controlplane.metrics import Metrics
from controlplane.table import TableVersions
from controlplane.usage import ProxyUsage
from controlplane.watchers import Watchers
from ferry.errors import InvalidArgument, Overloaded, Unavailable
from ferry.v1 import admin_pb2, tables_pb2


class Peers:
    """Follower and leader sides of ``Admin.Follow``."""

    settings: ControlPlaneSettings
    fleet: FleetView
    watchers: Watchers
    proxy_usage: ProxyUsage
    tables: TableVersions
    metrics: Metrics
    cluster: Cluster | None
    leading: bool
    _clock: Callable[[], float]
    _adopted: asyncio.Event | None

    # Provided by Controller and Operator (annotations only, so that they do not shadow them).
    members: Callable[[], list[Member]]
    notify: Callable[[], None]
    reject: Callable[..., None]

    # -- follower

    def follower_report(self) -> admin_pb2.FollowerReport:
        """What this control plane holds, for the leader: every live node, its age and loads."""
        now, grace = self._clock(), self.settings.grace_seconds
        members = [
            admin_pb2.MemberReport(node=m.node, connected=m.connected, heard_seconds_ago=max(0.0, now - m.last_heard),
                                   loads=list(m.loads.values()))
            for m in self.fleet.members() if is_live(m, now, grace)
        ]
        return admin_pb2.FollowerReport(control_plane_id=self.settings.id, members=members,
                                        regions=sorted(self.watchers.regions()),
                                        proxy_usage=self.proxy_usage.relay())  # controlplane.usage

    def adopt(self, snapshot: tables_pb2.TableSnapshot) -> None:
        """A table the leader published: serve it here (ignored while this control plane leads)."""
        if self.leading or self.cluster is None:
            return
        published = self.tables.adopt(snapshot)
        self.cluster.remote.absorb(snapshot)
        if published is not None:
            self.metrics.table_version.labels(region=snapshot.region).set(published.version)
            for watcher in self.watchers.of_region(snapshot.region):
                watcher.offer(published.snapshot)
        if self._adopted is not None:
            self._adopted.set()
        self._adopted = asyncio.Event()

    # -- leader

    def follow_open(self, report: admin_pb2.FollowerReport) -> FollowerSession:
        """A follower's first report: open its session and queue every current table for it."""
        validate.check_name(report.control_plane_id, "report.control_plane_id", self.settings.max_name_bytes)
        if self.cluster is None or not self.leading:
            leader = self.cluster.election.leader if self.cluster is not None else None
            known = f"; the leader is {leader.id} at {leader.address}" if leader is not None else ""
            raise Unavailable(f"control plane {self.settings.id!r} does not lead{known}")
        try:
            session = self.cluster.followers.attach(report.control_plane_id)
        except Overloaded:
            self.reject("followers_limit")
            raise
        for region in self.tables.regions():
            published = self.tables.get(region)
            if published is not None:
                session.offer(published.snapshot)
        self.follow_report(session, report)
        return session

    def follow_report(self, session: FollowerSession, report: admin_pb2.FollowerReport) -> None:
        assert self.cluster is not None
        try:
            validate.check_report(report, self.settings)
        except InvalidArgument:
            self.reject("report_field")
            raise
        if report.control_plane_id != session.cp_id:
            self.reject("report_field")
            raise InvalidArgument("report.control_plane_id", f"the stream belongs to {session.cp_id!r}")
        self.cluster.followers.reported(session, list(report.regions))
        self.cluster.remote.report(session.cp_id, report)
        for reason in self.proxy_usage.absorb(report.proxy_usage):  # its proxies' usage
            self.reject(reason)
        self.notify()

    def follow_close(self, session: FollowerSession) -> None:
        if self.cluster is not None:
            self.cluster.followers.detach(session)
