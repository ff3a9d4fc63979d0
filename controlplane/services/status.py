"""``Admin.GetStatus``: this control plane's role, its peers, the store, the tables and the proxies at a glance.

:class:`StatusService` gathers what :func:`controlplane.cluster.status.build_status`
renders. State: none. Dependencies: the settings, the store (its health), the
clock, the members held here, the intent cache, the peers (role, leader,
term, followers), the table versions and the proxies' watchers.
"""

from __future__ import annotations

from collections.abc import Callable

from controlplane.cluster.election import PlaneInfo
from controlplane.cluster.status import Counts, build_status
from controlplane.config import ControlPlaneSettings
from controlplane.fleet.view import FleetView, is_live
from controlplane.intent.cache import IntentCache
from controlplane.intent.writer import IntentWriter
from controlplane.services.peers import PeerService
from controlplane.tables.compute import TableVersions
from controlplane.tables.watchers import Watchers
from ferry.v1 import admin_pb2


class StatusService:
    """Builds ``Admin.GetStatus``.

    State: none. Dependencies: settings, the intent writer (the store's health), the clock, the members
    held here, the intent cache, the peer service, the table versions, the watchers.
    """

    def __init__(
        self,
        settings: ControlPlaneSettings,
        *,
        writer: IntentWriter,
        fleet: FleetView,
        intent: IntentCache,
        peers: PeerService,
        tables: TableVersions,
        watchers: Watchers,
        clock: Callable[[], float],
    ) -> None:
        self.settings = settings
        self._writer = writer  # the store the intent is written to: its health
        self._fleet = fleet
        self._intent = intent
        self._peers = peers
        self._tables = tables
        self._watchers = watchers
        self._clock = clock

    def status(self) -> admin_pb2.GetStatusResponse:
        now = self._clock()
        members = self._peers.members()
        counts = Counts(
            members=sum(is_live(m, now, self.settings.grace_seconds) for m in members),
            drains=len(self._intent.drains),
            allocations=sum(len(r.slots) for r in self._intent.allocations.values()),
            agents=sum(m.connected for m in self._fleet.members()),
        )
        revision = self._intent.revision
        cluster, address = self._peers.cluster, self._peers.address
        if cluster is None:
            me = PlaneInfo(self.settings.id, address)
            leader: PlaneInfo | None = me
            role, term, planes, followers = "single", 0, [me], []
        else:
            election = cluster.election
            role, leader, term = election.role(), election.leader, election.term
            planes, followers = election.members(), cluster.followers.sessions()
            revision = max(revision, cluster.members.revision, election.keys.revision)
        return build_status(
            cp_id=self.settings.id, address=address, role=role, leader=leader, term=term, planes=planes,
            followers=followers, health=self._writer.store.health(), revision=revision, tables=self._tables,
            proxies=self._watchers.statuses(), counts=counts, now=now,
        )
