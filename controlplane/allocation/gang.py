"""Gang allocation of GPUs to replicas across nodes: a pure planner (no I/O, ``now`` passed in).

:func:`plan` takes the nodes (GPUs, the replicas their agents registered, the
allocation slots already written), the pending requests (each one replica of
``gpus`` GPUs on one node, with the time it was asked for) and a
:class:`Policy`, and returns where each request goes and which replicas must
be drained for it, or why it waits.

Algorithm, one pass, requests oldest first (``requested_at``, then id):

1. **Accounting.** On a node, a GPU is held by an allocation slot or by a
   registered replica that is neither a slot's own replica nor displaced by a
   slot; ``free = gpus - held`` (registered replicas report a GPU count, not
   indices: slot indices are the control plane's bookkeeping among slots).
   Eligible nodes: live, not cordoned, of the request's region (if given).
2. **Fit.** A request goes to the eligible node where it fits with the fewest
   GPUs left over (best fit, then node name), which keeps whole nodes free
   for large replicas. Branch ``fit``.
3. **Drain.** A large request (``gpus >= gang_gpus``, 8) that fits nowhere
   may displace small replicas (registered, fewer than ``gang_gpus`` GPUs)
   of one node. Per node, small replicas are taken cheapest first (cost per
   GPU) until enough GPUs are free; the node's **drain cost** is the requests
   in flight on them (queued + running, from telemetry) plus
   ``replica_weight`` (10) per replica moved. The node of least cost wins
   (then fewest GPUs left, then name). Allocation slots not yet running and
   large replicas are never displaced. Branch ``drain``.
4. **Aging and reservation.** A large request younger than
   ``aging_seconds`` (30 s) drains only when the least cost is at most
   ``drain_budget`` (40: e.g. four idle replicas). Otherwise it waits and
   **reserves** that node for this pass: no younger request is placed there,
   so its free GPUs stay free and its cost can only fall as replicas finish.
   From ``aging_seconds`` on it drains the cheapest node whatever the cost
   (branch ``aged``). A stream of small placements therefore delays a large
   replica at most ``aging_seconds`` plus one pass once some node could host
   it (the node it reserved still can). Small requests never drain: they take
   free GPUs, oldest first, so a younger request never takes the GPUs an
   older one fits in.

A placement is all or nothing: every GPU on one node, in one slot (the caller
writes it in one transaction with the removal of the slots of the replicas it
displaces). Cost: O(requests x nodes x replicas per node x log) per pass.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from controlplane.allocation.records import Allocation
from controlplane.config import Policy

Branch = Literal["fit", "drain", "aged"]
BRANCHES: tuple[Branch, ...] = ("fit", "drain", "aged")


@dataclass(frozen=True, slots=True)
class Resident:
    """A replica the node's agent registered: its GPUs and requests in flight."""

    replica_id: str
    gpus: int
    inflight: int = 0


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node as the planner sees it."""

    node: str
    gpus: int
    region: str = ""
    live: bool = True
    cordoned: bool = False
    residents: tuple[Resident, ...] = ()
    slots: tuple[Allocation, ...] = ()

    @property
    def eligible(self) -> bool:
        return self.live and not self.cordoned


@dataclass(frozen=True, slots=True)
class Request:
    """One replica to place: ``gpus`` GPUs of one node. Stored as JSON at ``intent/pending/{request_id}``."""

    request_id: str
    model: str
    version: str
    gpus: int
    requested_at: float
    region: str = ""

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, request_id: str, value: bytes) -> Request:
        """The stored request; ValueError naming it when malformed."""
        try:
            data = json.loads(value)
            return cls(request_id, str(data["model"]), str(data["version"]), int(data["gpus"]),
                       float(data["requested_at"]), str(data.get("region", "")))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"allocation request {request_id!r} is malformed: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a request goes: the slot to write, and the slots of displaced replicas to remove with it."""

    request: Request
    node: str
    slot: Allocation
    removed: tuple[str, ...]  # replica ids of slots removed in the same transaction
    cost: float
    branch: Branch


@dataclass(frozen=True)
class Plan:
    """One pass of the planner: the placements to make, and why each request left waits."""

    placements: tuple[Placement, ...] = ()
    waiting: dict[str, str] = field(default_factory=dict)  # request id -> reason


def usage(node: NodeState) -> tuple[int, int]:
    """(GPUs held, GPUs free) of ``node``; free is negative when the node is over-committed."""
    slot_ids = {s.replica_id for s in node.slots}
    displaced = {r for s in node.slots for r in s.displaces}
    held = sum(len(s.gpus) for s in node.slots)
    held += sum(r.gpus for r in node.residents if r.replica_id not in slot_ids and r.replica_id not in displaced)
    return held, node.gpus - held


def _displace(node: NodeState, need: int, policy: Policy) -> tuple[float, list[Resident], int] | None:
    """The cheapest small residents to drain so that ``need`` GPUs are free: (cost, them, GPUs then free).

    None when even draining every small replica would not free enough.
    """
    _held, free = usage(node)
    if free >= need:
        return 0.0, [], free
    small = {s.replica_id: s for s in node.slots if len(s.gpus) < policy.gang_gpus}
    slot_ids = {s.replica_id for s in node.slots}
    displaced = {r for s in node.slots for r in s.displaces}
    movable = [r for r in node.residents if r.replica_id not in displaced and r.gpus < policy.gang_gpus
               and (r.replica_id not in slot_ids or r.replica_id in small)]
    movable.sort(key=lambda r: ((r.inflight + policy.replica_weight) / max(1, r.gpus), r.replica_id))
    chosen: list[Resident] = []
    for resident in movable:
        if free >= need:
            break
        chosen.append(resident)
        free += len(small[resident.replica_id].gpus) if resident.replica_id in small else resident.gpus
    if free < need:
        return None
    return sum(r.inflight + policy.replica_weight for r in chosen), chosen, free


def _place(node: NodeState, request: Request, moved: Sequence[Resident], now: float, cost: float) -> tuple[
        NodeState, Allocation, tuple[str, ...]]:
    moved_ids = {r.replica_id for r in moved}
    kept = tuple(s for s in node.slots if s.replica_id not in moved_ids)
    removed = tuple(sorted(s.replica_id for s in node.slots if s.replica_id in moved_ids))
    held = {g for s in kept for g in s.gpus}
    gpus = tuple(g for g in range(node.gpus) if g not in held)[:request.gpus]
    slot = Allocation(request.request_id, request.model, request.version, gpus, request.requested_at,
                      displaces=tuple(sorted(moved_ids)), placed_at=now, cost=cost)
    return dataclasses.replace(node, slots=(*kept, slot)), slot, removed


def plan(nodes: Iterable[NodeState], requests: Iterable[Request], *, now: float, policy: Policy) -> Plan:
    """Place ``requests`` on ``nodes`` at ``now`` (see the module doc)."""
    state = {n.node: n for n in nodes}
    placements: list[Placement] = []
    waiting: dict[str, str] = {}
    reserved: dict[str, str] = {}  # node -> the older large request that waits for it
    for request in sorted(requests, key=lambda r: (r.requested_at, r.request_id)):
        large = request.gpus >= policy.gang_gpus
        best: tuple[tuple[float, int, str], NodeState, list[Resident]] | None = None
        for node in state.values():
            if not node.eligible or node.gpus < request.gpus or (request.region and node.region != request.region):
                continue
            if node.node in reserved:
                continue
            free = usage(node)[1]
            found = _displace(node, request.gpus, policy) if large else (
                (0.0, [], free) if free >= request.gpus else None)
            if found is None:
                continue
            cost, moved, free = found
            key = (cost, free - request.gpus, node.node)
            if best is None or key < best[0]:
                best = (key, node, moved)
        if best is None:
            waiting[request.request_id] = _no_node(request, large)
            continue
        (cost, _left, _name), node, moved = best
        age = now - request.requested_at
        if moved and cost > policy.drain_budget and age < policy.aging_seconds:
            reserved[node.node] = request.request_id
            waiting[request.request_id] = (
                f"the cheapest drain (node {node.node}, reserved for it) costs {cost:g} > drain budget "
                f"{policy.drain_budget:g}; it drains anyway at age {policy.aging_seconds:g} s (now {age:.1f} s)")
            continue
        branch: Branch = "fit" if not moved else ("drain" if cost <= policy.drain_budget else "aged")
        state[node.node], slot, removed = _place(node, request, moved, now, cost)
        placements.append(Placement(request, node.node, slot, removed, cost, branch))
    return Plan(tuple(placements), waiting)


def _no_node(request: Request, large: bool) -> str:
    where = f" in region {request.region}" if request.region else ""
    if large:
        return (f"no live, uncordoned node{where} can free {request.gpus} GPUs (large replicas and slots not yet "
                "running are never displaced)")
    return f"no live, uncordoned node{where} has {request.gpus} free GPUs (small replicas never drain others)"
