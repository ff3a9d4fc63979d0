"""What the plan is fed, gathered from the members' telemetry and the proxies' merged reports (pure).

:func:`gather` turns the fleet as the leader sees it (live members, each
replica's last load) and the proxies' figures per (model, region, tier)
(:func:`controlplane.tables.usage.merge`) into one :class:`Observed` per
(model, region):

- ``arrival_rate``: the offered requests/s of every tier, summed;
- ``in_flight``: requests running at the ready replicas; ``queued``: those
  waiting in their queues and in the proxies' tier queues;
- ``tokens_in_flight``: KV tokens in use at the ready replicas
  (``(total - free blocks) x block tokens``);
- ``service_seconds``: Little's law, requests running / requests ended per
  second, when requests end; else ``default_service_seconds``;
- ``queue_wait_seconds``: Little's law on the queues, requests queued /
  offered rate;
- ``current``: replicas warming or ready, ``ready``: ready ones; the
  replica's shape: the largest ``max_concurrency`` and KV tokens among them
  (``default_slots`` when there is none yet).

Standby nodes (:func:`standby_nodes`): live, uncordoned members with no replica (the
agent's ``--standby``: warm hardware, no weights), per region. At most
``max_pairs`` pairs are returned, in sorted order (the rest are dropped and
counted in ``Gathered.dropped``). Cost: O(replicas + figures).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet

from controlplane.fleet.view import Member, is_live, replica_state
from controlplane.scaling.plan import Demand, Shape
from controlplane.tables.usage import Figures
from ferry.v1 import common_pb2

WARMING, READY = common_pb2.REPLICA_STATE_WARMING, common_pb2.REPLICA_STATE_READY


@dataclasses.dataclass(slots=True)
class Observed:
    """The demand and fleet of one (model, region) now."""

    demand: Demand
    shape: Shape
    current: int


@dataclasses.dataclass(slots=True)
class _Tally:
    """Sums of one (model, region) while gathering."""

    offered: float = 0.0
    ended: float = 0.0
    proxy_queued: int = 0
    running: int = 0
    queued: int = 0
    kv_used: int = 0
    current: int = 0
    ready: int = 0
    slots: int = 0
    kv_tokens: int = 0


@dataclasses.dataclass(slots=True)
class Gathered:
    """The pairs observed, and how many were dropped past ``max_pairs``."""

    pairs: dict[tuple[str, str], Observed]
    dropped: int = 0


def standby_nodes(members: Iterable[Member], *, now: float, grace: float,
                  cordoned: AbstractSet[str] = frozenset()) -> Counter[str]:
    """Live, uncordoned members with no replica, per region."""
    out: Counter[str] = Counter()
    for m in members:
        if not m.replicas and m.node not in cordoned and is_live(m, now, grace):
            out[m.region] += 1
    return out


def gather(members: Iterable[Member], figures: Mapping[tuple[str, str, str], Figures], *, now: float, grace: float,
           default_service_seconds: float, default_slots: int, max_pairs: int) -> Gathered:
    """One :class:`Observed` per (model, region) with replicas or proxy traffic (see the module docstring)."""
    tallies: dict[tuple[str, str], _Tally] = {}
    for (model, region, _tier), f in figures.items():
        t = tallies.setdefault((model, region), _Tally())
        t.offered += max(f.offered_rate, f.request_rate)
        t.ended += f.request_rate
        t.proxy_queued += f.queued
    for m in members:
        if not is_live(m, now, grace):
            continue
        for replica_id, info in m.replicas.items():
            state = replica_state(m, replica_id, True)
            if state not in (WARMING, READY):
                continue
            t = tallies.setdefault((info.model, m.region), _Tally())
            t.current += 1
            load = m.loads.get(replica_id)
            t.slots = max(t.slots, info.max_concurrency)
            if load is not None:
                t.kv_tokens = max(t.kv_tokens, load.kv_blocks_total * info.kv_block_tokens)
            if state != READY:
                continue
            t.ready += 1
            if load is not None:
                t.running += load.running
                t.queued += load.queued
                t.kv_used += max(0, load.kv_blocks_total - load.kv_blocks_free) * info.kv_block_tokens
    out: dict[tuple[str, str], Observed] = {}
    keys = sorted(tallies)
    for key in keys[:max_pairs]:
        t = tallies[key]
        service = t.running / t.ended if t.ended > 0 else default_service_seconds
        queued = t.queued + t.proxy_queued
        wait = queued / t.offered if queued and t.offered > 0 else 0.0
        demand = Demand(arrival_rate=t.offered, service_seconds=service, in_flight=float(t.running),
                        queued=float(queued),
                        tokens_in_flight=float(t.kv_used), queue_wait_seconds=wait, ready=t.ready)
        out[key] = Observed(demand, Shape(slots=t.slots or default_slots, kv_tokens=t.kv_tokens), t.current)
    return Gathered(out, max(0, len(keys) - max_pairs))
