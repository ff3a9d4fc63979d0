"""What operators see through ``Admin``: replicas, tables and proxies, built from plain state.

Pure functions: the fleet's members, the drain intent, the current tables and
the proxies' statuses at ``now`` in, ``admin_pb2`` messages out, sorted for
stable output (replicas by id, regions by name, proxies by id). A replica is
``in_table`` when its region's current table lists it; a replica whose node
is not live is ``dead`` and shown with no load (its last one is not what it
carries now), only the age of its last report. Cost: O(replicas) for
a listing, O(regions + proxies) for the tables.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet

from controlplane.fleet.view import Member, is_live, load_of, replica_state
from controlplane.tables.compute import TableVersions
from controlplane.tables.watchers import ProxyStatus
from ferry.v1 import admin_pb2, common_pb2


def replica_view(
    member: Member, replica_id: str, *, drains: AbstractSet[str], tables: TableVersions, now: float, grace: float,
    cordons: AbstractSet[str] = frozenset(),
) -> admin_pb2.ReplicaView:
    info = member.replicas[replica_id]
    live = is_live(member, now, grace)
    load, age = load_of(member, replica_id, now)
    if not live:
        load = common_pb2.ReplicaLoad(replica_id=replica_id, state=common_pb2.REPLICA_STATE_DEAD)
    published = tables.get(member.region)
    return admin_pb2.ReplicaView(
        replica_id=replica_id, node=member.node, region=member.region, model=info.model, version=info.version,
        address=info.address, state=replica_state(member, replica_id, live), drain_requested=replica_id in drains,
        load=load, telemetry_age_seconds=age,
        in_table=published is not None and replica_id in published.replica_ids, cordoned=member.node in cordons,
    )


def list_replicas(
    members: Iterable[Member], *, drains: AbstractSet[str], tables: TableVersions, now: float, grace: float,
    model: str = "", region: str = "", cordons: AbstractSet[str] = frozenset(),
) -> list[admin_pb2.ReplicaView]:
    """Every known replica, optionally only those of ``model`` and/or ``region``."""
    views = [
        replica_view(member, replica_id, drains=drains, tables=tables, now=now, grace=grace, cordons=cordons)
        for member in members
        if not region or member.region == region
        for replica_id, info in member.replicas.items()
        if not model or info.model == model
    ]
    return sorted(views, key=lambda v: v.replica_id)


def get_table(
    tables: TableVersions, proxies: Iterable[ProxyStatus], *, now: float, region: str = "",
) -> admin_pb2.GetTableResponse:
    """The current table of each region (or of ``region``) and every proxy remembered there."""
    response = admin_pb2.GetTableResponse()
    for name in tables.regions():
        published = tables.get(name)
        if published is None or (region and name != region):
            continue
        snapshot = published.snapshot
        response.regions.append(admin_pb2.RegionTable(
            region=name, version=snapshot.version, computed_at=snapshot.computed_at,
            replicas=len(published.replica_ids), models=[m.model for m in snapshot.models],
        ))
    for status in sorted(proxies, key=lambda s: s.proxy_id):
        if region and status.region != region:
            continue
        current = tables.get(status.region)
        since = status.subscribed_at if status.last_ack_at is None else status.last_ack_at
        response.proxies.append(admin_pb2.ProxyView(
            proxy_id=status.proxy_id, region=status.region, applied_version=status.applied_version,
            lag_versions=status.lag(current.version) if current is not None else 0,
            connected=status.connected,
            last_ack_age_seconds=max(0.0, now - since),
            last_error=status.last_error,
        ))
    return response
