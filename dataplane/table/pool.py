"""What the pick needs of one model version, computed once per table: replicas, ring, key shares.

Part of the table (the local fleet view, below the pick): the table holder
builds the pools as it applies each table.

- :class:`Replica`: one routable replica as the pick sees it (plain frozen
  data): identity, capacity, pushed load and its smoothed load.
- :class:`Pool`: the routable replicas of one model version with their
  :class:`dataplane.table.ring.Ring` (reused from the previous table while the
  replica ids are the same), the context limits, and each replica's *key
  share* (:func:`dataplane.table.ring.key_shares`: the share of
  its ring keys it keeps under the load bound).
- :func:`load`, :func:`occupancy`: a replica's pushed load that is not this
  proxy's, and its slots taken (the one copy of the formula, read by the
  pick's score and the remote view of :mod:`dataplane.regions.remote`).
- :func:`smoothed_loads`: each replica's queued + running, smoothed over the
  tables a proxy applies (exponential, time constant ``smoothing_seconds``,
  default 10 s), so that the bound follows sustained imbalance, not the
  request-to-request noise of a few dozen requests per replica. Every proxy
  applies the same tables, so every proxy computes nearly the same shares.

Cost: O(replicas) per pool and table, plus O(replicas x vnodes log) for a
ring whose membership changed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from dataplane.table.ring import Ring, key_shares

UNLIMITED = 1 << 62  # the context limit of a replica that reports none
RingCache = dict[tuple[tuple[str, ...], int], Ring]


@dataclasses.dataclass(frozen=True, slots=True)
class Replica:
    """One routable replica as the pick sees it: identity, capacity, pushed and smoothed load.

    ``address`` is its KServe v2 gRPC ``host:port`` (empty for a replica reached over OpenAI HTTP only);
    ``http_address`` the ``host:port`` of its OpenAI-compatible HTTP endpoint (empty when it serves none);
    ``engine`` the engine behind it (``simulated``, ``triton``, ``vllm``, ``sglang``, ``trtllm``; empty: unknown).
    ``telemetry``: the table row's whole ``ReplicaLoad`` message (a copy, never mutated; None when the table
    side does not pass it), read by scorers of signals the pick has no field for (docs/design.md, "Adding a
    replica signal to the pick"); left out of equality.
    """

    replica_id: str
    address: str
    kserve_model: str
    version: str
    node: str = ""
    http_address: str = ""
    engine: str = ""
    max_concurrency: int = 1
    kv_block_tokens: int = 0
    max_context_tokens: int = 0
    queued: int = 0
    running: int = 0
    kv_blocks_free: int = 0
    kv_blocks_total: int = 0
    telemetry_age: float = 0.0  # seconds, when the table was computed
    smoothed: float = 0.0       # queued + running smoothed over the tables applied (smoothed_loads)
    telemetry: Any = dataclasses.field(default=None, compare=False, repr=False)  # the row's ReplicaLoad


def context_limit(replica: Replica) -> int:
    """The most tokens (prompt + output) ``replica`` takes; UNLIMITED when it reports no limit."""
    return replica.max_context_tokens if replica.max_context_tokens > 0 else UNLIMITED


def load(replica: Replica, counted: int = 0, trust: float = 1.0) -> float:
    """The pushed load of ``replica`` that is not this proxy's: ``max(queued + running - counted, 0) x trust``.

    ``counted``: this proxy's in-flight requests the push already includes
    (:meth:`dataplane.pick.p2c.LocalLoad.mark`); ``trust``: the share of the push
    that still stands at its age (:meth:`dataplane.pick.p2c.LocalLoad.trust`).
    The one copy of the formula: the score, the remote pick, the spill rooms
    and the picker's load share all read it.
    """
    return max(replica.queued + replica.running - counted, 0) * trust


def occupancy(replica: Replica, inflight: int, counted: int = 0, trust: float = 1.0) -> float:
    """``(load + inflight) / max_concurrency``: the replica's slots taken, this proxy's ``inflight`` included."""
    return (load(replica, counted, trust) + inflight) / replica.max_concurrency


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Pool:
    """The routable replicas of one model version and the per-table values of the pick.

    Iterating or indexing a pool gives its replicas.
    """

    group: str                      # "model/version" (or "model/*"): the pool's name
    replicas: tuple[Replica, ...]
    ring: Ring
    shares: tuple[float, ...]       # per replica, the share of its ring keys it keeps (1 under the bound)
    min_context: int                # smallest context limit (UNLIMITED: a replica reports none)
    max_context: int                # largest context limit
    index: Mapping[str, int] = dataclasses.field(default_factory=dict)  # replica id -> position

    def __iter__(self) -> Iterator[Replica]:
        return iter(self.replicas)

    def __len__(self) -> int:
        return len(self.replicas)

    def __getitem__(self, index: int) -> Replica:
        return self.replicas[index]


def make_pool(group: str, replicas: Sequence[Replica], *, vnodes: int, load_factor: float,
              rings: RingCache) -> Pool:
    """The pool of ``replicas``; its ring comes from ``rings`` when one with the same ids exists (else added)."""
    ids = tuple(r.replica_id for r in replicas)
    ring = rings.get((ids, vnodes))
    if ring is None:
        ring = rings[(ids, vnodes)] = Ring(ids, vnodes)
    contexts = [context_limit(r) for r in replicas] or [UNLIMITED]
    shares = key_shares([r.smoothed for r in replicas], [r.max_concurrency for r in replicas], load_factor)
    index = {rid: i for i, rid in enumerate(ids)}
    return Pool(group, tuple(replicas), ring, shares, min(contexts), max(contexts), index)


def smoothed_loads(loads: Mapping[str, int], before: Mapping[str, float], elapsed: float,
                   smoothing_seconds: float) -> dict[str, float]:
    """Each replica's load blended with its smoothed load of the previous table ``elapsed`` seconds ago."""
    keep = math.exp(-max(0.0, elapsed) / smoothing_seconds) if smoothing_seconds > 0 else 0.0
    return {rid: load if rid not in before else before[rid] * keep + load * (1.0 - keep)
            for rid, load in loads.items()}
