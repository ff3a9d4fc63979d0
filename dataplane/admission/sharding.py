"""Noisy-neighbour placement: a heavy tenant is confined to a shard of whole replicas, the others kept off it.

The fair-share ceiling (:func:`dataplane.admission.fairshare.tenant_ceilings`) bounds
how many slots a tenant runs, but not where: spread over every replica, a
tenant held to its share still lengthens every replica's steps, and with
them every other tenant's time to first token (a continuous-batching step
grows with what it runs). Confinement puts that tenant's work on replicas of
its own and keeps the others off them while they have somewhere else to go.

Algorithm (:func:`plan`), run by the proxy's tier queues each time the set of
heavy tenants or the replicas change:

1. A tenant is *heavy* (the caller's input ``heavy``: tenant -> slots) when,
   in some tier, it runs at its ceiling with more of its requests waiting;
   its slots are the sum of its ceilings over those tiers.
2. Heavy tenants are taken by slots, most first (then by name). Each walks
   its rendezvous order of the model's replicas (highest random weight:
   blake2b of tenant and replica id, so a tenant's shard moves only when one
   of its own replicas goes) and takes the replicas not already in another
   shard while their slots still fit under its own: whole replicas, rounded
   down. Rounding down charges the rounding to the tenant that exceeds its
   share, not to the others; a tenant whose slots are under one replica is
   not confined (its ceiling already bounds what it adds to any replica).
3. Shards stop growing once they would cover more than ``max_share`` of the
   replicas: the tenants within their share keep the rest.
4. :meth:`Shards.keep_off`: a confined tenant stays off every replica outside
   its shard; any other tenant stays off every shard. The pick treats it as
   a soft filter (:func:`dataplane.pick.decide.decide`'s ``avoid``): ignored when
   nothing but replicas already tried would be left. A confined tenant's
   ceiling becomes its shard's slots (:meth:`Shards.ceiling`), so no request
   waits inside a full replica.

Parameters: ``max_share`` (``[proxy] tenant_shard_max_share``, default 0.5;
0 turns confinement off).

Cost: O(heavy x replicas log replicas) per plan; :meth:`Shards.keep_off` is
O(1) (precomputed sets).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence

MAX_SHARE = 0.5


def rendezvous(tenant: str, replicas: Sequence[str]) -> list[str]:
    """``replicas`` in ``tenant``'s highest-random-weight order (stable: removing one keeps the others' order)."""
    def weight(replica: str) -> bytes:
        return hashlib.blake2b(f"{tenant}\0{replica}".encode(), digest_size=8).digest()
    return sorted(replicas, key=lambda r: (weight(r), r), reverse=True)


@dataclasses.dataclass(frozen=True)
class Shards:
    """The confined tenants' shards and the replicas the others keep off; see the module docstring.

    ``outside`` (each confined tenant's complement) and ``taken`` (every
    shard's replica) are precomputed by :func:`plan`: :meth:`keep_off` runs
    per request.
    """

    shards: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=dict)
    slots: Mapping[str, int] = dataclasses.field(default_factory=dict)
    outside: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=dict)
    taken: frozenset[str] = frozenset()

    def keep_off(self, tenant: str) -> frozenset[str]:
        """The replicas ``tenant``'s next request should avoid (empty: none). O(1)."""
        mine = self.outside.get(tenant)
        return self.taken if mine is None else mine

    def ceiling(self, tenant: str, ceiling: int) -> int:
        """``tenant``'s concurrency ceiling: at most its shard's slots when confined."""
        slots = self.slots.get(tenant)
        return ceiling if slots is None else min(ceiling, slots)


NONE = Shards()


def plan(heavy: Mapping[str, int], replicas: Mapping[str, int], max_share: float = MAX_SHARE) -> Shards:
    """Shards for the ``heavy`` tenants (tenant -> slots) over ``replicas`` (id -> concurrency target)."""
    if not heavy or not replicas or max_share <= 0:
        return NONE
    budget = int(max_share * len(replicas))
    ids = sorted(replicas)
    taken: set[str] = set()
    shards: dict[str, frozenset[str]] = {}
    slots: dict[str, int] = {}
    for tenant, want in sorted(heavy.items(), key=lambda kv: (-kv[1], kv[0])):
        mine: list[str] = []
        held = 0
        for replica in rendezvous(tenant, ids):
            if replica in taken:
                continue
            size = max(replicas[replica], 0)
            if held + size > want or len(taken) + len(mine) >= budget:
                break
            mine.append(replica)
            held += size
        if mine and held > 0:
            shards[tenant], slots[tenant] = frozenset(mine), held
            taken.update(mine)
    if not shards:
        return NONE
    every = frozenset(ids)
    return Shards(shards, slots, {t: every - mine for t, mine in shards.items()}, frozenset(taken))
