"""The fleet view: members, their replicas, the load last reported, connection state.

Held in the control plane's memory and fed by the agent streams: a
registration sets a member (a node with its region, GPUs and replicas; a node
registering again under the same name replaces its earlier registration and
session); telemetry sets each replica's load with its receive time on the
injected clock, and may add, change or remove replicas.

Liveness (:func:`is_live`): a member is live while its agent stream is open or
gone for at most ``grace_seconds`` (default 3 s), and while the last message
from it (registration or telemetry) is at most ``grace_seconds`` old. A member
that is not live leaves the tables and its replicas are shown as ``dead``; it
is forgotten ``forget_after_seconds`` (default 300 s) after it was last heard.

Bounds: ``max_members`` nodes (a new node beyond it, once dead ones that can
be forgotten are gone, raises ``Overloaded``) and ``max_replicas_per_node``
(replicas added by telemetry beyond it are ignored and counted). Costs: O(1)
per replica per telemetry message; O(members) to forget the expired.

Claims (:func:`claim_conflict`): a registration may not take a replica id or
a replica address that another live node holds, nor the name of a live,
connected node from other hosts (``AlreadyExists`` naming the field). Indexes
by replica id and by address keep the check O(replicas of the registration).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from controlplane.fleet.claims import served_at, served_field
from ferry import sampling
from ferry.errors import AlreadyExists, Overloaded
from ferry.v1 import common_pb2, fleet_pb2

READY = common_pb2.REPLICA_STATE_READY
DEAD = common_pb2.REPLICA_STATE_DEAD


@dataclass
class Member:
    """One node as the control plane sees it. Owned by :class:`FleetView`; read, never written, elsewhere."""

    node: str
    region: str
    gpus: int
    agent_version: str
    session: int
    registered_at: float
    last_heard: float
    replicas: dict[str, fleet_pb2.ReplicaInfo] = field(default_factory=dict)
    loads: dict[str, common_pb2.ReplicaLoad] = field(default_factory=dict)
    load_at: dict[str, float] = field(default_factory=dict)
    connected: bool = True
    disconnected_at: float | None = None
    last_seq: int = 0

    def registration(self) -> fleet_pb2.Register:
        """The node's registration as it stands now (what the store holds)."""
        return fleet_pb2.Register(
            node=self.node, region=self.region, gpus=self.gpus,
            replicas=list(self.replicas.values()), agent_version=self.agent_version,
        )


def is_live(member: Member, now: float, grace_seconds: float) -> bool:
    """Whether the member belongs in the tables at ``now``."""
    if not member.connected and member.disconnected_at is not None and now - member.disconnected_at > grace_seconds:
        return False
    return now - member.last_heard <= grace_seconds


def replica_state(member: Member, replica_id: str, live: bool) -> common_pb2.ReplicaState:
    """The state to show: ``dead`` when the member is not live, else the last one its agent reported."""
    if not live:
        return DEAD
    load = member.loads.get(replica_id)
    if load is not None and load.state != common_pb2.REPLICA_STATE_UNSPECIFIED:
        return load.state
    return member.replicas[replica_id].state


def load_of(member: Member, replica_id: str, now: float) -> tuple[common_pb2.ReplicaLoad, float]:
    """The replica's last load (empty before its first telemetry) and its age at ``now``."""
    load = member.loads.get(replica_id)
    at = member.load_at.get(replica_id, member.registered_at)
    return (load if load is not None else common_pb2.ReplicaLoad(replica_id=replica_id)), max(0.0, now - at)


@dataclass(frozen=True)
class TelemetryOutcome:
    """What applying one telemetry message did: ``ignored`` counts ignored entries by reason.

    ``state_changed``: some replica's reported state differs from the one before (routability may
    have changed); otherwise only loads moved.
    """

    membership_changed: bool
    ignored: Counter[str]
    state_changed: bool = False


def claim_conflict(view: FleetView, reg: fleet_pb2.Register) -> None:
    """Raise AlreadyExists naming the field when ``reg`` claims what another live node holds.

    A replica id or a replica address held by another live node is refused. The node name itself
    is refused while a live node of that name is still connected and serves from other hosts (a
    claim from another machine); the same node reconnecting (replicas on the same hosts) replaces
    its earlier registration.
    """
    for i, info in enumerate(reg.replicas):
        holder = view.find(info.replica_id)
        if holder is not None and holder.node != reg.node and view.live(holder):
            raise AlreadyExists(
                f"register.replicas[{i}].replica_id", f"{info.replica_id!r} is held by live node {holder.node!r}")
        for node in sorted(view.serving(served_at(info)) - {reg.node}):
            other = view.member(node)
            if other is not None and view.live(other):
                raise AlreadyExists(f"register.replicas[{i}].{served_field(info)}",
                                    f"{served_at(info)!r} is served by live node {node!r}")
    same = view.member(reg.node)
    if same is not None and same.connected and view.live(same):
        before = {served_at(info).rpartition(":")[0] for info in same.replicas.values()}
        after = {served_at(info).rpartition(":")[0] for info in reg.replicas}
        if before and after and not after <= before:
            raise AlreadyExists("register.node", f"{reg.node!r} is held by a live, connected node on other hosts")


class FleetView:
    """Members by node name, with a replica-id index; every time comes from ``clock``."""

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        grace_seconds: float = 3.0,
        forget_after_seconds: float = 300.0,
        max_members: int = 4096,
        max_replicas_per_node: int = 64,
    ) -> None:
        self._clock = clock
        self.grace_seconds = grace_seconds
        self._forget_after = forget_after_seconds
        self._max_members = max_members
        self._max_replicas = max_replicas_per_node
        self._members: dict[str, Member] = {}
        self._owner: dict[str, str] = {}  # replica id -> node
        self._served: dict[str, Counter[str]] = {}  # replica address -> replicas per node serving there
        self._sessions = itertools.count(1)

    def __len__(self) -> int:
        return len(self._members)

    def members(self) -> Iterator[Member]:
        return iter(self._members.values())

    def member(self, node: str) -> Member | None:
        return self._members.get(node)

    def find(self, replica_id: str) -> Member | None:
        """The member that holds ``replica_id``, live or not."""
        node = self._owner.get(replica_id)
        return None if node is None else self._members[node]

    def live(self, member: Member) -> bool:
        return is_live(member, self._clock(), self.grace_seconds)

    def register(self, reg: fleet_pb2.Register) -> Member:
        """Set (or replace) the member of ``reg.node``; ``reg`` is already validated."""
        now = self._clock()
        claim_conflict(self, reg)
        if reg.node not in self._members and len(self._members) >= self._max_members:
            self.forget_expired()
            if len(self._members) >= self._max_members:
                raise Overloaded(f"the fleet holds {self._max_members} nodes", retry_after=self.grace_seconds)
        self._drop(reg.node)
        for info in reg.replicas:  # replicas that moved here from a dead node
            holder = self.find(info.replica_id)
            if holder is not None:
                self._remove_replica(holder, info.replica_id)
        member = Member(
            node=reg.node, region=reg.region, gpus=reg.gpus, agent_version=reg.agent_version,
            session=next(self._sessions), registered_at=now, last_heard=now,
        )
        self._members[reg.node] = member
        for info in reg.replicas:
            self._add_replica(member, info)
        return member

    def apply_telemetry(self, member: Member, telemetry: fleet_pb2.Telemetry) -> TelemetryOutcome:
        """Apply one validated telemetry message of ``member``'s current session."""
        now = self._clock()
        ignored: Counter[str] = Counter()
        member.last_heard = now
        member.last_seq = telemetry.seq
        changed = False
        for replica_id in telemetry.removed:
            if replica_id in member.replicas:
                self._remove_replica(member, replica_id)
                changed = True
            else:
                ignored["unknown_replica"] += 1
        for info in telemetry.changed:
            holder = self.find(info.replica_id)
            if holder is not None and holder is not member and self.live(holder):
                ignored["replica_conflict"] += 1
            elif info.replica_id not in member.replicas and len(member.replicas) >= self._max_replicas:
                ignored["replicas_limit"] += 1
            else:
                if holder is not None and holder is not member:
                    self._remove_replica(holder, info.replica_id)
                self._add_replica(member, info)
                changed = True
        state_changed = False
        for load in telemetry.replicas:
            if load.replica_id not in member.replicas:
                ignored["unknown_replica"] += 1
                continue
            state_changed = state_changed or replica_state(member, load.replica_id, True) != (
                load.state or member.replicas[load.replica_id].state)
            member.loads[load.replica_id] = load
            member.load_at[load.replica_id] = now
        return TelemetryOutcome(changed, ignored, state_changed)

    def disconnect(self, member: Member) -> bool:
        """Mark the stream of ``member`` gone, unless a newer registration replaced it."""
        if self._members.get(member.node) is not member or not member.connected:
            return False
        member.connected = False
        member.disconnected_at = self._clock()
        return True

    def forget_expired(self) -> list[str]:
        """Forget members not heard from for ``forget_after_seconds``; returns their names."""
        now = self._clock()
        gone = [
            m.node for m in self._members.values()
            if not is_live(m, now, self.grace_seconds) and now - m.last_heard > self._forget_after
        ]
        for node in gone:
            self._drop(node)
        return gone

    def serving(self, address: str) -> set[str]:
        """The nodes (live or not) with a replica at ``address`` (its KServe address, else its HTTP address)."""
        return set(self._served.get(address, ()))

    def _serve(self, address: str, node: str, delta: int) -> None:
        counts = self._served.setdefault(address, Counter())
        counts[node] += delta
        if counts[node] <= 0:
            del counts[node]
        if not counts:
            del self._served[address]

    def _drop(self, node: str) -> None:
        member = self._members.pop(node, None)
        if member is not None:
            for replica_id, info in member.replicas.items():
                self._serve(served_at(info), node, -1)
                if self._owner.get(replica_id) == node:
                    del self._owner[replica_id]

    def _add_replica(self, member: Member, info: fleet_pb2.ReplicaInfo) -> None:
        stored = fleet_pb2.ReplicaInfo()
        stored.CopyFrom(info)
        if not stored.kserve_model:
            stored.kserve_model = stored.model
        if len(stored.inputs) > sampling.MAX_INPUTS or any(len(n) > sampling.MAX_INPUT_CHARS for n in stored.inputs):
            kept = sampling.bounded(list(stored.inputs))  # bounded: the names every table carries
            del stored.inputs[:]
            stored.inputs.extend(kept)
        old = member.replicas.get(info.replica_id)
        if old is not None:
            self._serve(served_at(old), member.node, -1)
        member.replicas[info.replica_id] = stored
        self._serve(served_at(stored), member.node, 1)
        self._owner[info.replica_id] = member.node

    def _remove_replica(self, member: Member, replica_id: str) -> None:
        self._serve(served_at(member.replicas[replica_id]), member.node, -1)
        del member.replicas[replica_id]
        member.loads.pop(replica_id, None)
        member.load_at.pop(replica_id, None)
        if self._owner.get(replica_id) == member.node:
            del self._owner[replica_id]
