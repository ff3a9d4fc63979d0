"""Members held by other control planes, and the merge of them with this one's own.

:class:`RemoteFleet` has one entry per node registered anywhere in the fleet,
built from the store's ``/ferry/members/{node}`` keys (through a mirror:
:meth:`RemoteFleet.stored`). Two things make an entry live:

- a **report**: a follower's per-tick report (``admin_pb2.FollowerReport``,
  :meth:`RemoteFleet.report`) that it heard the node ``heard_seconds_ago``;
  the entry is live while that was at most ``grace_seconds`` ago, and takes
  the reported loads. This is how telemetry received by a follower reaches the
  leader's tables;
- the **store**: the key exists, so the node's control plane keeps its lease
  alive (a node held by this control plane itself is judged by its own
  stream instead). This covers a new leader's first tables, before the
  followers' reports reach it, and a follower cut off from the leader but
  not from the store. A follower takes loads from the relayed tables
  (:meth:`RemoteFleet.absorb`), for display.

A deleted key does not remove the entry at once: an entry still reported
stays live (the store may be catching up after an outage); an entry neither
stored nor reported for ``forget_after_seconds`` is forgotten. While the
store is unreachable nothing is deleted: members it cannot see are kept.

:func:`merge` gives one member per node and each replica id to one member:
rank (live, connected, held here) decides, so a node connected here wins over
the store's copy of it, and a node that moved to a follower wins over the
stale local one. Bounds: ``max_members`` entries (more are ignored and
counted). Costs: O(replicas reported) per report, O(members + replicas) per
merge.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from controlplane.fleet.view import Member, is_live
from ferry.v1 import admin_pb2, fleet_pb2, tables_pb2

NEVER = float("-inf")


@dataclass
class RemoteEntry:
    """Another control plane's member as this one holds it: stored, last reported, connected, and by whom."""

    member: Member
    stored: bool = True
    reported_at: float = NEVER
    connected: bool = False
    reporter: str = ""


class RemoteFleet:
    """Nodes as the store and the followers' reports show them; every time comes from ``clock``."""

    def __init__(
        self, *, clock: Callable[[], float], grace_seconds: float, forget_after_seconds: float, max_members: int,
    ) -> None:
        self._clock = clock
        self._grace = grace_seconds
        self._forget_after = forget_after_seconds
        self._max = max_members
        self.entries: dict[str, RemoteEntry] = {}
        self.ignored: Counter[str] = Counter()

    def stored(self, node: str, reg: fleet_pb2.Register | None) -> None:
        """The store's key of ``node`` was written (``reg``) or deleted (None)."""
        entry = self.entries.get(node)
        if reg is None:
            if entry is not None:
                entry.stored = False
            return
        now = self._clock()
        if entry is None:
            if len(self.entries) >= self._max:
                self.forget_expired()
                if len(self.entries) >= self._max:
                    self.ignored["remote_members_limit"] += 1
                    return
            member = Member(node=node, region=reg.region, gpus=reg.gpus, agent_version=reg.agent_version,
                            session=0, registered_at=now, last_heard=now)
            entry = self.entries[node] = RemoteEntry(member)
        m = entry.member
        m.region, m.gpus, m.agent_version = reg.region, reg.gpus, reg.agent_version
        m.replicas = {info.replica_id: info for info in reg.replicas}
        for gone in [r for r in m.loads if r not in m.replicas]:
            m.loads.pop(gone, None)
            m.load_at.pop(gone, None)
        entry.stored = True

    def report(self, cp_id: str, report: admin_pb2.FollowerReport) -> None:
        """Apply one follower's report: liveness and loads of the nodes it holds."""
        now = self._clock()
        for item in report.members:
            entry = self.entries.get(item.node)
            if entry is None:
                self.ignored["unknown_node"] += 1  # its registration is not in the store's mirror yet
                continue
            heard_at = now - max(0.0, item.heard_seconds_ago)
            if heard_at < entry.reported_at:
                continue
            entry.reported_at, entry.connected, entry.reporter = heard_at, item.connected, cp_id
            member = entry.member
            for load in item.loads:
                if load.replica_id not in member.replicas:
                    self.ignored["unknown_replica"] += 1
                    continue
                member.loads[load.replica_id] = load
                member.load_at[load.replica_id] = heard_at

    def absorb(self, snapshot: tables_pb2.TableSnapshot) -> None:
        """Take the loads of a relayed table for the nodes it lists (a follower's display)."""
        now = self._clock()
        for model in snapshot.models:
            for route in model.replicas:
                entry = self.entries.get(route.node)
                if entry is not None and route.replica_id in entry.member.replicas:
                    entry.member.loads[route.replica_id] = route.load
                    entry.member.load_at[route.replica_id] = now - route.telemetry_age_seconds

    def members(self, *, own: AbstractSet[str] = frozenset()) -> list[Member]:
        """Every entry as a member whose ``last_heard`` and ``connected`` encode its liveness now.

        The store's key does not make live the nodes in ``own``: this control plane holds them and
        knows better (their keys are its own, and outlive their agents by up to a lease).
        """
        now = self._clock()
        out = []
        for node, entry in self.entries.items():
            m = entry.member
            reported = now - entry.reported_at <= self._grace
            m.connected = reported and entry.connected
            m.disconnected_at = None
            stored = entry.stored and node not in own
            m.last_heard = entry.reported_at if reported else (now if stored else NEVER)
            out.append(m)
        return out

    def forget_expired(self) -> list[str]:
        now = self._clock()
        gone = [n for n, e in self.entries.items()
                if not e.stored and now - e.reported_at > self._forget_after]
        for node in gone:
            del self.entries[node]
        return gone


def merge(local: Iterable[Member], remote: Iterable[Member], *, now: float, grace: float) -> list[Member]:
    """One member per node (the best ranked) and each replica id on one member only, sorted by node."""
    best: dict[str, tuple[tuple[bool, bool, bool], Member]] = {}
    for here, members in ((True, local), (False, remote)):
        for m in members:
            rank = (is_live(m, now, grace), m.connected, here)
            if m.node not in best or rank > best[m.node][0]:
                best[m.node] = (rank, m)
    owner: dict[str, Member] = {}
    for _rank, m in sorted(best.values(), key=lambda rm: rm[0], reverse=True):
        for replica_id in m.replicas:
            owner.setdefault(replica_id, m)
    out = []
    for node in sorted(best):
        m = best[node][1]
        if any(owner[r] is not m for r in m.replicas):
            keep = {r: info for r, info in m.replicas.items() if owner[r] is m}
            m = dataclasses.replace(m, replicas=keep, loads={r: v for r, v in m.loads.items() if r in keep},
                                    load_at={r: v for r, v in m.load_at.items() if r in keep})
        out.append(m)
    return out
