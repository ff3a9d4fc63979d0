"""``Admin.GetStatus``: the control side as one control plane sees it, built from plain state (pure).

:func:`build_status` takes what the status service gathers (role and leader, the
control planes in the store, the follower sessions when leading, the store's
health, the tables served, the proxies watching here, counts) at ``now`` and
returns the ``GetStatusResponse``, sorted for stable output. Proxies are only
those that watch from this control plane: ``ferryctl status`` asks every
control plane and merges them, computing each proxy's lag against the
leader's version of its region. Cost: O(control planes + regions + proxies).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from controlplane.cluster.election import PlaneInfo
from controlplane.cluster.followers import FollowerSession
from controlplane.store.base import StoreHealth
from controlplane.tables.compute import TableVersions
from controlplane.tables.views import get_table
from controlplane.tables.watchers import ProxyStatus
from ferry.v1 import admin_pb2


@dataclass(frozen=True, slots=True)
class Counts:
    """This control plane's counts in ``GetStatus``: live nodes, drains, allocation slots, agent streams."""

    members: int  # live nodes
    drains: int
    allocations: int  # slots
    agents: int  # streams open here


def build_status(
    *,
    cp_id: str,
    address: str,
    role: str,
    leader: PlaneInfo | None,
    term: int,
    planes: Sequence[PlaneInfo],
    followers: Sequence[FollowerSession],
    health: StoreHealth,
    revision: int,
    tables: TableVersions,
    proxies: Sequence[ProxyStatus],
    counts: Counts,
    now: float,
) -> admin_pb2.GetStatusResponse:
    """The status answer; ``now`` is on the clock of ``health.last_ok`` and the sessions' times."""
    table = get_table(tables, proxies, now=now)
    sessions = {s.cp_id: s for s in followers}
    known = {p.id: p for p in planes}
    if cp_id not in known:
        known[cp_id] = PlaneInfo(cp_id, address)
    views = []
    for plane in sorted(known.values(), key=lambda p: p.id):
        session = sessions.get(plane.id)
        views.append(admin_pb2.ControlPlaneView(
            id=plane.id, address=plane.address, leader=leader is not None and leader.id == plane.id,
            following=session is not None,
            last_report_age_seconds=max(0.0, now - session.last_report_at) if session is not None else 0.0,
        ))
    store = admin_pb2.StoreView(
        backend=health.backend, endpoint=health.endpoint, healthy=health.ok, error=health.error,
        last_ok_age_seconds=max(0.0, now - health.last_ok) if health.last_ok else 0.0, revision=revision,
    )
    return admin_pb2.GetStatusResponse(
        control_plane_id=cp_id, role=role, leader_id=leader.id if leader is not None else "",
        leader_address=leader.address if leader is not None else "", term=term, control_planes=views,
        store=store, regions=table.regions, proxies=table.proxies, members=counts.members, drains=counts.drains,
        allocations=counts.allocations, agents=counts.agents,
    )
