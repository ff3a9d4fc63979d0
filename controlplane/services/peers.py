"""Leadership and the other control planes: who leads, the fleet they share, ``Admin.Follow`` both ways.

:class:`PeerService` holds this control plane's place among the others on a
shared store. Alone (``elect=False``, the embedded store) it always leads and
has no :class:`controlplane.cluster.coordination.Cluster`. With ``elect=True`` it joins the
others once its server is bound (:meth:`PeerService.join`): only the leader
computes tables; :meth:`PeerService.transition` follows the election each pass
of the loop, and a control plane that starts to lead in a new term rebases
its table versions above all it saw.

- :meth:`PeerService.members`: every member this control plane knows, its own
  merged with the others' (:func:`controlplane.cluster.remote.merge`);
- as a follower: :meth:`PeerService.follower_report` builds the per-tick
  report of the nodes held here (liveness and the last load of each replica:
  O(replicas held here)); the tables the leader sends go to ``adopt`` (the
  table service's);
- as the leader: :meth:`PeerService.follow_open`,
  :meth:`PeerService.follow_report` and :meth:`PeerService.follow_close` serve
  ``Admin.Follow`` (only while leading: ``Unavailable`` naming the leader
  otherwise; reports are validated).

State: the cluster (None until joined, or alone), whether it leads, the term,
the advertised address. Dependencies: the settings, the store, the clocks, the
metrics, this control plane's members (:class:`controlplane.fleet.view.FleetView`),
the table versions, the proxies' regions and usage (to report them), the
admin credentials and TLS of the leader link, and ``notify`` (something
changed: recompute).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from controlplane import validate
from controlplane.cluster.coordination import Cluster
from controlplane.cluster.followers import FollowerSession
from controlplane.cluster.remote import merge
from controlplane.config import ControlPlaneSettings
from controlplane.fleet.view import FleetView, Member, is_live
from controlplane.metrics import Metrics
from controlplane.services.engines import EngineService
from controlplane.services.traffic import TrafficService
from controlplane.store.base import Store
from controlplane.tables.compute import Published, TableVersions, initial_version
from controlplane.tables.usage import ProxyUsage
from controlplane.tables.watchers import Watchers
from ferry.errors import InvalidArgument, Overloaded, Unavailable
from ferry.logs import event
from ferry.tls import TLSConfig
from ferry.v1 import admin_pb2, tables_pb2

log = logging.getLogger(__name__)


class PeerService:
    """Leadership, the shared fleet and both sides of ``Admin.Follow``.

    State: the cluster (None alone or before :meth:`join`), ``leading``, the term, the address.
    Dependencies: settings, store, clocks, metrics, the members held here, the table versions, the
    proxies' watchers and usage, ``notify``, the leader link's credentials and TLS.
    """

    def __init__(
        self,
        settings: ControlPlaneSettings,
        store: Store,
        *,
        fleet: FleetView,
        tables: TableVersions,
        watchers: Watchers,
        proxy_usage: ProxyUsage,
        metrics: Metrics,
        clock: Callable[[], float],
        wall: Callable[[], float],
        notify: Callable[[], None],
        elect: bool = False,
        admin_metadata: tuple[tuple[str, str], ...] = (),
        tls: TLSConfig | None = None,
        traffic: TrafficService | None = None,
        engines: EngineService | None = None,
    ) -> None:
        self._traffic = traffic  # recorded rows: relayed by a follower, stored by the leader (controlplane.traffic)
        self.settings = settings
        self._store = store
        self._engines = engines  # engine samples: relayed up as a follower, taken in as the leader
        self._fleet = fleet
        self._tables = tables
        self._watchers = watchers
        self._proxy_usage = proxy_usage
        self._metrics = metrics
        self._clock = clock
        self._wall = wall
        self._notify = notify
        self.elect = elect
        self._admin_metadata = admin_metadata  # a follower's credentials on Admin.Follow
        self._tls = tls  # a follower's mutual TLS to the leader (None: plain text)
        self.cluster: Cluster | None = None
        self.address = ""
        self.leading = not elect
        self._term = 0

    # -- lifecycle

    async def join(self, address: str, adopt: Callable[[tables_pb2.TableSnapshot], None]) -> None:
        """Take part in the election as ``address`` (when ``elect``); the leader's tables go to ``adopt``."""
        self.address = address
        if not self.elect:
            return
        self.cluster = Cluster(self._store, self.settings, address=address, clock=self._clock, wall=self._wall,
                               on_change=self._notify, report=self.follower_report, adopt=adopt,
                               metadata=self._admin_metadata, tls=self._tls, held=self._held)
        await self.cluster.start(self.settings.store_timeout_seconds)
        self.transition()

    async def stop(self) -> None:
        if self.cluster is not None:
            await self.cluster.stop()

    def transition(self) -> None:
        """Follow the election: start or stop leading; a new term rebases the table versions."""
        if self.cluster is None:
            return
        leading = self.cluster.leading()
        if leading and not self.leading:
            term = self.cluster.election.term
            if term != self._term:
                self._term = term
                self._tables.rebase(max(initial_version(self._wall()), self._tables.high))
            event(log, "leader_elected", control_plane=self.settings.id, term=term)
        elif self.leading and not leading:
            self.cluster.followers.close_all(f"control plane {self.settings.id!r} no longer leads")
            event(log, "leadership_lost", logging.WARNING, control_plane=self.settings.id,
                  detail="serving the last tables")
        self.leading = leading

    # -- the shared fleet

    def members(self) -> list[Member]:
        """Every member this control plane knows: its own, merged with the others' when it has peers."""
        local = list(self._fleet.members())
        if self.cluster is None:
            return local
        remote = self.cluster.remote.members(own={m.node for m in local})
        return merge(local, remote, now=self._clock(), grace=self.settings.grace_seconds)

    def _held(self, node: str) -> bool:
        member = self._fleet.member(node)
        return member is not None and member.connected

    def held_here(self) -> set[str]:
        """The nodes whose agent stream this control plane holds (their telemetry is measured here)."""
        return {m.node for m in self._fleet.members() if m.connected}

    def holder(self, replica_id: str) -> Member | None:
        """The member that holds ``replica_id``: this control plane's first, else any peer's."""
        local = self._fleet.find(replica_id)
        if local is not None or self.cluster is None:
            return local
        return next((m for m in self.members() if replica_id in m.replicas), None)

    def stream_holder(self, member: Member) -> str:
        """Id of the control plane holding the node's agent stream, as far as this one knows."""
        local = self._fleet.member(member.node)
        if local is not None and local.connected:
            return self.settings.id
        if self.cluster is not None:
            entry = self.cluster.remote.entries.get(member.node)
            if entry is not None and entry.connected:
                return entry.reporter
        return ""

    def forget_expired(self) -> None:
        if self.cluster is not None:
            self.cluster.remote.forget_expired()

    # -- tables to and from the others

    def follower_regions(self) -> set[str]:
        """The regions the followers' proxies watch (leading), so that the leader computes them."""
        return self.cluster.followers.regions() if self.cluster is not None else set()

    def published(self, published: Published) -> None:
        """A new version of a region: to the followers, and its head to the store."""
        if self.cluster is not None:
            self.cluster.published(published)

    def absorbed(self, snapshot: tables_pb2.TableSnapshot) -> None:
        """A table the leader sent: its replicas' loads are the leader's view of the fleet."""
        if self.cluster is not None:
            self.cluster.remote.absorb(snapshot)

    def ask_leader(self) -> None:
        """A follower lacks a region's table: ask the leader now."""
        if self.cluster is not None:
            self.cluster.link.wake()

    async def write_heads(self) -> None:
        """Leading: write the heads of the tables published since the last write."""
        if self.cluster is not None and self.leading:
            await self.cluster.write_heads()

    # -- follower

    def follower_report(self) -> admin_pb2.FollowerReport:
        """What this control plane holds, for the leader: every live node, its age and loads."""
        now, grace = self._clock(), self.settings.grace_seconds
        engines = self._engines.relay() if self._engines is not None else {}
        members = [
            admin_pb2.MemberReport(node=m.node, connected=m.connected, heard_seconds_ago=max(0.0, now - m.last_heard),
                                   loads=list(m.loads.values()), engine_samples=engines.get(m.node, []))
            for m in self._fleet.members() if is_live(m, now, grace)
        ]
        report = admin_pb2.FollowerReport(control_plane_id=self.settings.id, members=members,
                                          regions=sorted(self._watchers.regions()),
                                          proxy_usage=self._proxy_usage.relay())  # controlplane.tables.usage
        if self._traffic is not None:
            self._traffic.relay(report)  # recorded rows, each once (controlplane.traffic)
        return report

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
            self._metrics.reject("followers_limit")
            raise
        for region in self._tables.regions():
            published = self._tables.get(region)
            if published is not None:
                session.offer(published.snapshot)
        self.follow_report(session, report)
        return session

    def follow_report(self, session: FollowerSession, report: admin_pb2.FollowerReport) -> None:
        assert self.cluster is not None
        try:
            validate.check_report(report, self.settings)
            if self._engines is not None:
                self._engines.check_report(report)
        except InvalidArgument:
            self._metrics.reject("report_field")
            raise
        if report.control_plane_id != session.cp_id:
            self._metrics.reject("report_field")
            raise InvalidArgument("report.control_plane_id", f"the stream belongs to {session.cp_id!r}")
        self.cluster.followers.reported(session, list(report.regions))
        self.cluster.remote.report(session.cp_id, report)
        if self._engines is not None:  # the follower's nodes' engine samples, into the leader's fits
            for item in report.members:
                entry = self.cluster.remote.entries.get(item.node)
                if entry is not None and item.engine_samples:
                    self._engines.record(item.node, entry.member.replicas, item.engine_samples, relay=False)
        for reason in self._proxy_usage.absorb(report.proxy_usage):  # its proxies' usage
            self._metrics.reject(reason)
        if self._traffic is not None:
            self._traffic.absorb(session.cp_id, report.traffic, report.traffic_dropped)  # controlplane.traffic
        self._notify()

    def follow_close(self, session: FollowerSession) -> None:
        if self.cluster is not None:
            self.cluster.followers.detach(session)
