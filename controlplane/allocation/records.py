"""GPU allocation intent: which replica holds which GPUs of a node, kept in the store.

One record per node at ``/ferry/intent/alloc/{node}``: JSON ``{"node",
"slots": [{"replica_id", "model", "version", "gpus": [..], "requested_at",
"displaces", "placed_at", "cost"}]}`` (the last three optional: the gang
allocator's, :mod:`controlplane.allocation.gang`), slots sorted by replica id. A gang
allocation (all eight GPUs of one node for a large model) is one slot, so it
is written whole or not at all; :func:`place` adds it and removes the slots
of the replicas it displaces in the same transaction.

The record is changed only by read, modify, then :meth:`Store.put_if` on the
revision read (one transaction): two control planes that allocate on the same
node at once cannot both win; the loser reads again and retries (at most
``attempts``, 5) or finds its GPUs taken. :func:`with_allocation` and
:func:`without` are the pure part (no I/O): a slot whose GPUs overlap another
replica's, or fall outside ``0 .. node_gpus - 1``, raises
:class:`AllocationConflict`; allocating a replica again replaces its slot.

Control planes keep every record in memory through the intent mirror
(:class:`controlplane.intent.cache.IntentCache`), so a restarted control plane finds
them again. Cost: O(slots of the node) per change; one store read and one
transaction per attempt.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from controlplane.store.base import Store, alloc_key
from ferry.errors import FerryError, Unavailable


class AllocationConflict(FerryError):
    """The GPUs asked for are held by another replica, or do not exist on the node."""

    def __init__(self, node: str, reason: str) -> None:
        super().__init__(f"allocation on node {node!r}: {reason}")
        self.node = node
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Allocation:
    """GPUs of one node given to one replica."""

    replica_id: str
    model: str
    version: str
    gpus: tuple[int, ...]
    requested_at: float = 0.0
    displaces: tuple[str, ...] = ()  # small replicas drained to make room (gang allocation)
    placed_at: float = 0.0
    cost: float = 0.0  # the drain cost paid when it was placed


@dataclass(frozen=True, slots=True)
class NodeAllocations:
    """The allocation record of one node."""

    node: str
    slots: tuple[Allocation, ...] = ()

    def encode(self) -> bytes:
        slots = [{"replica_id": a.replica_id, "model": a.model, "version": a.version, "gpus": list(a.gpus),
                  "requested_at": a.requested_at, "displaces": list(a.displaces), "placed_at": a.placed_at,
                  "cost": a.cost} for a in self.slots]
        return json.dumps({"node": self.node, "slots": slots}, sort_keys=True).encode()

    def held(self) -> dict[int, str]:
        """GPU index -> replica id."""
        return {gpu: a.replica_id for a in self.slots for gpu in a.gpus}


def decode(node: str, value: bytes) -> NodeAllocations:
    """The record stored for ``node``; a malformed one raises ValueError naming the node."""
    try:
        data = json.loads(value)
        slots = tuple(
            Allocation(str(s["replica_id"]), str(s["model"]), str(s["version"]),
                       tuple(int(g) for g in s["gpus"]), float(s.get("requested_at", 0.0)),
                       tuple(str(r) for r in s.get("displaces", ())), float(s.get("placed_at", 0.0)),
                       float(s.get("cost", 0.0)))
            for s in data["slots"]
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"allocation record of node {node!r} is malformed: {exc}") from exc
    return NodeAllocations(node, slots)


def with_allocation(record: NodeAllocations, slot: Allocation, node_gpus: int) -> NodeAllocations:
    """``record`` with ``slot`` added (replacing the replica's earlier slot, if any)."""
    if not slot.gpus:
        raise AllocationConflict(record.node, f"replica {slot.replica_id!r} asks for no GPU")
    if len(set(slot.gpus)) != len(slot.gpus):
        raise AllocationConflict(record.node, f"replica {slot.replica_id!r} names a GPU twice")
    outside = [g for g in slot.gpus if not 0 <= g < node_gpus]
    if outside:
        raise AllocationConflict(record.node, f"GPU {outside[0]} does not exist (the node has {node_gpus})")
    others = without(record, slot.replica_id)
    held = others.held()
    taken = [g for g in slot.gpus if g in held]
    if taken:
        raise AllocationConflict(record.node, f"GPU {taken[0]} is held by replica {held[taken[0]]!r}")
    slots = sorted((*others.slots, slot), key=lambda a: a.replica_id)
    return NodeAllocations(record.node, tuple(slots))


def without(record: NodeAllocations, replica_id: str) -> NodeAllocations:
    """``record`` without the slot of ``replica_id``."""
    return NodeAllocations(record.node, tuple(a for a in record.slots if a.replica_id != replica_id))


def with_placement(record: NodeAllocations, slot: Allocation, removed: Iterable[str],
                   node_gpus: int) -> NodeAllocations:
    """``record`` without the slots of ``removed`` and with ``slot`` (a gang placement's one change)."""
    for replica_id in removed:
        record = without(record, replica_id)
    return with_allocation(record, slot, node_gpus)


async def allocate(store: Store, node: str, slot: Allocation, *, node_gpus: int, attempts: int = 5) -> int:
    """Add ``slot`` to the node's record atomically; returns the store revision of the write."""
    return await place(store, node, slot, (), node_gpus=node_gpus, attempts=attempts)


async def place(store: Store, node: str, slot: Allocation, removed: Iterable[str], *, node_gpus: int,
                attempts: int = 5) -> int:
    """Remove the slots of ``removed`` and add ``slot`` in one transaction; returns its store revision."""
    removed = tuple(removed)
    for _ in range(attempts):
        current = await store.get(alloc_key(node))
        record = decode(node, current.value) if current is not None else NodeAllocations(node)
        updated = with_placement(record, slot, removed, node_gpus)
        revision = await store.put_if(alloc_key(node), updated.encode(),
                                      revision=current.revision if current is not None else 0)
        if revision:
            return revision
    raise Unavailable(f"allocation on node {node!r}: the record kept changing ({attempts} attempts)")


async def release(store: Store, node: str, replica_id: str, *, attempts: int = 5) -> int:
    """Remove the replica's slot from the node's record; returns the revision (0: nothing to remove)."""
    for _ in range(attempts):
        current = await store.get(alloc_key(node))
        if current is None:
            return 0
        record = decode(node, current.value)
        updated = without(record, replica_id)
        if updated == record:
            return 0
        revision = await store.put_if(alloc_key(node), updated.encode(), revision=current.revision)
        if revision:
            return revision
    raise Unavailable(f"release on node {node!r}: the record kept changing ({attempts} attempts)")
