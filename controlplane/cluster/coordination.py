"""What one control plane does beside the others on a shared store: elect, share the fleet, relay.

:class:`Cluster` bundles, for a control plane started with ``elect=True``
(every etcd-backed one):

- the :class:`controlplane.cluster.election.Election` (who leads; fenced by lease time);
- a mirror of ``/ferry/members/`` feeding :class:`controlplane.cluster.remote.RemoteFleet`
  (the registrations of nodes held anywhere);
- the leader's side of ``Admin.Follow`` (:class:`controlplane.cluster.followers.Followers`:
  reports in, tables out);
- the follower's side (:class:`controlplane.cluster.leaderlink.LeaderLink`);
- the heads of the published tables, ``/ferry/tables/{region}``, which the
  leader writes at most once per region per tick and only when the version
  changed (:meth:`write_heads`): a small JSON, so the store's write rate is
  O(regions) per tick, never O(replicas).

Only the leader computes and publishes tables; any control plane serves
agents, proxies and ferryctl. The peer service asks :meth:`leading` each pass
of the table loop and rebases the table versions when a new term starts. Cost: see
each part; nothing here is O(replicas) per tick but the report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable

from controlplane.cluster.election import Election
from controlplane.cluster.followers import Followers
from controlplane.cluster.leaderlink import LeaderLink
from controlplane.cluster.remote import RemoteFleet
from controlplane.config import ControlPlaneSettings
from controlplane.store.base import MEMBERS_PREFIX, KeyValue, Store, table_key
from controlplane.store.mirror import Mirror
from controlplane.tables.compute import Published
from controlplane.tasks import TaskGroup
from ferry.errors import FerryError
from ferry.tls import TLSConfig
from ferry.v1 import admin_pb2, fleet_pb2, tables_pb2

log = logging.getLogger(__name__)


class Cluster:
    """The shared-store parts of one control plane; :meth:`start` after its server is bound."""

    def __init__(
        self,
        store: Store,
        settings: ControlPlaneSettings,
        *,
        address: str,
        clock: Callable[[], float],
        wall: Callable[[], float],
        on_change: Callable[[], None],
        report: Callable[[], admin_pb2.FollowerReport],
        adopt: Callable[[tables_pb2.TableSnapshot], None],
        metadata: tuple[tuple[str, str], ...] = (),
        tls: TLSConfig | None = None,
        held: Callable[[str], bool] = lambda node: False,
    ) -> None:
        self._store = store
        self._held = held  # whether a node's agent stream is here: its own view wins, its key changes nothing
        self.id = settings.id
        self._wall = wall
        self._on_change = on_change
        self.election = Election(store, cp_id=settings.id, address=address, ttl_seconds=settings.leader_lease_seconds,
                                 clock=clock, wall=wall, on_change=self._elected)
        self.remote = RemoteFleet(clock=clock, grace_seconds=settings.grace_seconds,
                                  forget_after_seconds=settings.forget_after_seconds, max_members=settings.max_agents)
        self.members = Mirror(store, MEMBERS_PREFIX, on_change=self._member_key)
        self.followers = Followers(max_followers=settings.max_followers, clock=clock)
        self.link = LeaderLink(cp_id=settings.id, leader=lambda: self.election.leader, report=report, adopt=adopt,
                               interval=settings.tick_seconds, metadata=metadata, tls=tls,
                               tls_name=settings.peer_tls_name)
        self._heads: dict[str, Published] = {}
        self._clock = clock
        self._tick = settings.tick_seconds
        self._heads_at = float("-inf")
        self._tasks = TaskGroup(logger=log)

    def leading(self) -> bool:
        return self.election.is_leader()

    async def start(self, wait_seconds: float) -> None:
        """Start the tasks; wait (up to ``wait_seconds``) for the members' mirror and a first election pass."""
        self._tasks.start(self.members.run(), name="controlplane-members")
        self._tasks.start(self.election.run(), name="controlplane-election")
        self._tasks.start(self.link.run(), name="controlplane-leader-link")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_seconds):
                await self.members.synced.wait()
                await self.election.stepped.wait()

    async def stop(self) -> None:
        self.followers.close_all("the control plane is stopping")
        await self._tasks.stop()
        await self.election.resign()

    def published(self, published: Published) -> None:
        """The leader published a new version of a region: send it to the followers, write its head."""
        self.followers.offer(published.snapshot)
        self._heads[published.snapshot.region] = published

    async def write_heads(self) -> None:
        """Write the head of every region published since the last write, at most once per tick."""
        if not self._heads or self._clock() - self._heads_at < self._tick:
            return
        self._heads_at = self._clock()
        heads, self._heads = self._heads, {}
        for region, published in sorted(heads.items()):
            snapshot = published.snapshot
            head = {"version": snapshot.version, "leader": self.id, "computed_at": snapshot.computed_at,
                    "replicas": len(published.replica_ids)}
            try:
                await self._store.put(table_key(region), json.dumps(head, sort_keys=True).encode())
            except FerryError as exc:
                self._heads.setdefault(region, published)  # a later version may have replaced it meanwhile
                log.debug("table head of %s not written: %s", region, exc)
                return

    def _elected(self) -> None:
        self.link.wake()
        self._on_change()

    def _member_key(self, key: str, kv: KeyValue | None) -> None:
        node = key.removeprefix(MEMBERS_PREFIX)
        if kv is None:
            self.remote.stored(node, None)
        else:
            try:
                self.remote.stored(node, fleet_pb2.Register.FromString(kv.value))
            except ValueError as exc:  # protobuf's DecodeError is a ValueError
                log.warning("member %s in the store is unreadable: %s", node, exc)
                return
        if not self._held(node):  # a key of a node whose stream is here changes nothing: the local view wins
            self._on_change()
