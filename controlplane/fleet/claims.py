"""Ownership claims: which node owns a node name, a replica id or a replica address, fleet-wide.

Every control plane on a store checks claims against the same keys, so a
registration (or a ``Telemetry.changed`` entry) that takes what a live node
holds on *any* control plane is refused with the field named, e.g.
``register.replicas[1].replica_id: held by node 'node-4' on control plane
'cp-b'``. The keys (``/ferry/claims/{kind}/{name}``, :func:`claim_key`) hold
JSON ``{"node", "control_plane", "hosts"}`` and are written by
:class:`controlplane.fleet.members.MemberLeases` with :meth:`Store.put_if`
(created only when absent, or taken over at the revision read when this
module allows it) under the member's lease, so they vanish with the member
when its agent or its control plane is gone.

Pure parts here: the claims of a registration (:func:`register_claims`) or
of a telemetry message (:func:`changed_claims`), and :func:`refusal`, the
rule that decides whether a claim held by someone may be taken:

- a claim held by the same node name is the node's own (reconnecting, or
  moving to this control plane), except a node name held on another control
  plane whose hosts do not include the new registration's hosts: that is a
  claim from another machine while the node lives, as the local rule
  (:func:`controlplane.fleet.view.claim_conflict`) says for one control plane
  (a registration with no replicas shows no hosts: refused too);
- a claim held by a node that this control plane sees dead (its member known
  and not live) may be taken, so a replica can move from a dead node before
  the dead node's lease runs out;
- any other holder refuses the claim.

Bounds: one key per node, per replica and per distinct address, so at most
``max_agents * (1 + 2 * max_replicas_per_node)`` keys. Cost: O(claims).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

from controlplane.store.base import CLAIMS_PREFIX
from ferry.v1 import fleet_pb2

NODE, REPLICA, ADDRESS = "node", "replica", "address"


def claim_key(kind: str, name: str) -> str:
    """Key of the claim of ``name`` (a node name, replica id or address), quoted so any byte is safe."""
    return f"{CLAIMS_PREFIX}{kind}/{quote(name, safe='')}"


def served_at(info: fleet_pb2.ReplicaInfo) -> str:
    """Where a replica is served: its KServe ``address``, else (OpenAI HTTP only) its ``http_address``."""
    return info.address or info.http_address


def served_field(info: fleet_pb2.ReplicaInfo) -> str:
    """The ReplicaInfo field :func:`served_at` reads, to name it in a refusal."""
    return "address" if info.address or not info.http_address else "http_address"


def host_of(address: str) -> str:
    """The host part of ``host:port``."""
    return address.rpartition(":")[0]


@dataclass(frozen=True, slots=True)
class Claim:
    """One thing a node claims: the field that names it in the message, its kind and its key."""

    field: str
    kind: str
    key: str


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a claim key: the node, its control plane, the hosts it serves from (node claims)."""

    node: str
    control_plane: str
    hosts: tuple[str, ...] = ()

    def encode(self) -> bytes:
        return json.dumps({"node": self.node, "control_plane": self.control_plane,
                           "hosts": list(self.hosts)}, sort_keys=True).encode()

    @classmethod
    def decode(cls, value: bytes) -> Holder:
        """The holder in a claim key's value; an unreadable value is held by nobody known (``?``)."""
        try:
            data = json.loads(value)
            return cls(str(data["node"]), str(data.get("control_plane", "")),
                       tuple(str(h) for h in data.get("hosts", ())))
        except (ValueError, KeyError, TypeError):
            return cls("?", "?")


def register_claims(reg: fleet_pb2.Register) -> list[Claim]:
    """The node name, then each replica's id and address, in the order of the registration's fields."""
    out = [Claim("register.node", NODE, claim_key(NODE, reg.node))]
    for i, info in enumerate(reg.replicas):
        out.append(Claim(f"register.replicas[{i}].replica_id", REPLICA, claim_key(REPLICA, info.replica_id)))
        out.append(Claim(f"register.replicas[{i}].{served_field(info)}", ADDRESS,
                         claim_key(ADDRESS, served_at(info))))
    return out


def changed_claims(telemetry: fleet_pb2.Telemetry) -> list[Claim]:
    """Each replica that telemetry adds or changes: its id and its address."""
    out = []
    for i, info in enumerate(telemetry.changed):
        out.append(Claim(f"telemetry.changed[{i}].replica_id", REPLICA, claim_key(REPLICA, info.replica_id)))
        out.append(Claim(f"telemetry.changed[{i}].{served_field(info)}", ADDRESS,
                         claim_key(ADDRESS, served_at(info))))
    return out


def refusal(claim: Claim, holder: Holder | None, *, node: str, control_plane: str, hosts: frozenset[str],
            dead: Callable[[str], bool]) -> str | None:
    """Why ``node`` (on ``control_plane``, from ``hosts``) may not take ``claim`` from ``holder``; None: it may."""
    if holder is None:
        return None
    if holder.node == node:
        same_hosts = bool(hosts) and hosts <= set(holder.hosts)
        foreign = claim.kind == NODE and holder.control_plane != control_plane and not same_hosts
        if foreign and not dead(node):
            return (f"held by node {holder.node!r} on control plane {holder.control_plane!r}, "
                    "which serves from other hosts")
        return None
    if dead(holder.node):
        return None
    return f"held by node {holder.node!r} on control plane {holder.control_plane!r}"
