"""What operators see through ``Admin``, built from plain state: pure functions, ``admin_pb2`` messages out.

The fleet's members, the intent (drains, cordons, allocations), the current
tables and the proxies' statuses at ``now`` in; everything sorted for stable
output (replicas by id, regions by name, proxies by id).

- :func:`replica_view`, :func:`get_table`: replicas, tables and proxies. A
  replica is ``in_table`` when its region's current table lists it; a replica
  whose node is not live is ``dead`` and shown with no load (its last one is
  not what it carries now), only the age of its last report;
- :func:`node_state`: a member and its allocation record as the gang planner
  (:mod:`controlplane.allocation.gang`) sees it: residents are the registered replicas
  not reported ``dead``, with requests in flight = queued + running;
- :func:`node_view`: ``ListNodes``'s row (GPUs held and free counted as the
  planner counts them, so what ``ferryctl nodes`` shows is what ``alloc`` uses);
- :func:`slot_view`, :func:`pending_view`: allocation slots and waiting
  requests; a slot is ``running`` once its node registered a ready replica
  of its id, ``draining`` while a replica it displaced still runs, ``placed``
  otherwise (its GPUs are free for the agent to load it);
- :func:`model_views`: per model, its versions, replicas ready (in a table)
  and registered, GPUs each, slots and pending requests;
- :func:`usage_rows`: per model and region, the load the control plane knows
  (for ``ferryctl top`` and the utilisation metrics).

Cost: O(replicas + slots) for a listing, O(regions + proxies) for the tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet

from controlplane.allocation.gang import NodeState, Request, Resident, usage
from controlplane.allocation.records import Allocation, NodeAllocations
from controlplane.fleet.view import DEAD, READY, Member, is_live, load_of, replica_state
from controlplane.tables.compute import TableVersions
from controlplane.tables.watchers import ProxyStatus
from ferry.config import ModelConfig
from ferry.tokens import tokenizer_label
from ferry.v1 import admin_pb2, common_pb2

DRAINED_OR_DEAD = (common_pb2.REPLICA_STATE_DRAINED, DEAD)


def node_state(member: Member, record: NodeAllocations | None, *, live: bool, cordoned: bool) -> NodeState:
    residents = []
    for replica_id, info in sorted(member.replicas.items()):
        if replica_state(member, replica_id, live) == DEAD:
            continue
        load = member.loads.get(replica_id)
        inflight = (load.queued + load.running) if load is not None else 0
        residents.append(Resident(replica_id, max(1, info.gpus), inflight))
    return NodeState(node=member.node, gpus=member.gpus, region=member.region, live=live, cordoned=cordoned,
                     residents=tuple(residents), slots=record.slots if record is not None else ())


def node_view(member: Member, record: NodeAllocations | None, *, now: float, grace: float, cordoned: bool,
              control_plane: str) -> admin_pb2.NodeView:
    live = is_live(member, now, grace)
    held, free = usage(node_state(member, record, live=live, cordoned=cordoned))
    return admin_pb2.NodeView(
        node=member.node, region=member.region, gpus=member.gpus, gpus_allocated=held, gpus_free=max(0, free),
        replica_ids=sorted(member.replicas), agent_connected=member.connected and live,
        control_plane=control_plane if member.connected and live else "", cordoned=cordoned, live=live,
        heard_seconds_ago=max(0.0, now - member.last_heard), slots=len(record.slots) if record is not None else 0,
    )


def slot_state(slot: Allocation, member: Member | None, *, now: float, grace: float) -> str:
    if member is None:
        return "placed"
    live = is_live(member, now, grace)
    if slot.replica_id in member.replicas and replica_state(member, slot.replica_id, live) == READY:
        return "running"
    still = [r for r in slot.displaces
             if r in member.replicas and replica_state(member, r, live) not in DRAINED_OR_DEAD]
    return "draining" if still else "placed"


def slot_view(node: str, slot: Allocation, member: Member | None, *, now: float, grace: float) -> admin_pb2.SlotView:
    return admin_pb2.SlotView(
        replica_id=slot.replica_id, node=node, region=member.region if member is not None else "",
        model=slot.model, version=slot.version, gpus=list(slot.gpus),
        state=slot_state(slot, member, now=now, grace=grace), displaces=list(slot.displaces),
        requested_at=slot.requested_at, placed_at=slot.placed_at, drain_cost=slot.cost,
    )


def pending_view(request: Request, *, wall: float, reason: str) -> admin_pb2.PendingView:
    return admin_pb2.PendingView(
        request_id=request.request_id, model=request.model, version=request.version, gpus=request.gpus,
        region=request.region, age_seconds=max(0.0, wall - request.requested_at), reason=reason,
    )


def model_views(members: Sequence[Member], models: Sequence[ModelConfig], tables: TableVersions, *,
                allocations: Mapping[str, NodeAllocations], pending: Iterable[Request]) -> list[admin_pb2.ModelView]:
    views = {m.name: admin_pb2.ModelView(model=m.name, default_version=m.default_version, gpus_each=m.min_gpus,
                                         tokenizer=tokenizer_label(m.tokenizer))  # the catalog's (ferry.tokens)
             for m in models}
    versions: dict[str, set[str]] = {m.name: {m.default_version} for m in models}
    for member in members:
        published = tables.get(member.region)
        for replica_id, info in member.replicas.items():
            view = views.get(info.model)
            if view is None:
                continue
            view.replicas_total += 1
            view.replicas_ready += published is not None and replica_id in published.replica_ids
            versions[info.model].add(info.version)
    for record in allocations.values():
        for slot in record.slots:
            if slot.model in views:
                views[slot.model].slots += 1
    for request in pending:
        if request.model in views:
            views[request.model].pending += 1
    for name, view in views.items():
        view.versions.extend(sorted(versions[name]))
    return [views[name] for name in sorted(views)]


def usage_rows(members: Iterable[Member], tables: TableVersions, *, now: float) -> list[admin_pb2.UsageRow]:
    """Per (model, region): routable replicas' load summed, utilisation, completed requests of all replicas."""
    rows: dict[tuple[str, str], admin_pb2.UsageRow] = {}
    kv: dict[tuple[str, str], list[int]] = {}
    gpu: dict[tuple[str, str], list[float]] = {}
    for member in members:
        published = tables.get(member.region)
        for replica_id, info in member.replicas.items():
            key = (info.model, member.region)
            row = rows.get(key)
            if row is None:
                row = rows[key] = admin_pb2.UsageRow(model=info.model, region=member.region)
                kv[key], gpu[key] = [0, 0], []
            row.replicas += 1
            load, age = load_of(member, replica_id, now)
            row.requests_total += load.requests_total
            if published is None or replica_id not in published.replica_ids:
                continue
            row.replicas_ready += 1
            row.queued += load.queued
            row.running += load.running
            kv[key][0] += load.kv_blocks_total - min(load.kv_blocks_free, load.kv_blocks_total)
            kv[key][1] += load.kv_blocks_total
            gpu[key].append(load.gpu_utilization)
            row.telemetry_age_seconds = max(row.telemetry_age_seconds, age)
    for key, row in rows.items():
        used, total = kv[key]
        row.kv_utilisation = used / total if total else 0.0
        row.gpu_utilisation = sum(gpu[key]) / len(gpu[key]) if gpu[key] else 0.0
    return [rows[k] for k in sorted(rows)]



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
