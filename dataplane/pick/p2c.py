"""The load of a replica and power of two choices on it: the pick without a prefix key, the decision's last step.

``pick(candidates, need, inflight, rng, excluded) -> Decision(replica | None, branch)``
is pure: no I/O, no clock (the table's age is passed in), the random
generator injected. It is a composition of three small pieces, so later
policies (prefix ring, outlier ejection, spill) slot in as more filters or
scorers:

1. **Filters**: :func:`exclude` drops replicas this request already tried
   (retries only) and, while others remain, those on the nodes of the
   replicas that failed it (a dead node takes all its replicas with it, so
   the retry goes to another node); :func:`draw` takes two distinct replicas by the rng and,
   if one lacks the free KV-cache blocks the request needs while some
   replica has them, draws again among those that have them (when none has
   room, the drawn pair stays: a replica queues it rather than the proxy
   refusing). The result is a uniform pair of the replicas with room, as
   filtering first would give, without an O(n) pass in the common case.
2. **Scorer** (:func:`score`, lower is better)::

       load      = max(queued + running - counted, 0) x trust              (:func:`dataplane.table.pool.load`)
       occupancy = (load + inflight) / max_concurrency                  (:func:`dataplane.table.pool.occupancy`)
       kv_use    = 1 - (kv_free - need_blocks) / kv_total       clamped to [0, 1]; 0 if kv_total unknown
       staleness = (age - fresh) / (stale - fresh)              clamped to [0, 1]
       score     = occupancy + kv_weight * kv_use + stale_weight * staleness

   where ``inflight`` is this proxy's own count of requests it has sent to
   the replica and not yet seen finish (so that proxies sharing a push do not
   all pile onto the replica that looked idle), and ``counted`` is the part
   of it the pushed load already includes (this proxy's in-flight count when
   the table was applied, :meth:`LocalLoad.mark`; 0 when not
   given): without it, a push older than a request lasts counts this proxy's
   requests twice and sends everything to whichever replica looked idle,
   then everything to the other, push after push; ``trust`` is the share of
   the pushed load that still stands at its age (1 when not given;
   :meth:`LocalLoad.trust`: none of it once requests last
   less than the telemetry's age, so that proxies sharing replicas do not
   all chase the same stale imbalance). ``need_blocks`` is
   ``ceil((prompt_tokens + max_tokens) / kv_block_tokens)``, and ``age`` is
   the pushed telemetry age plus the time since the table was applied.
   Defaults: kv_weight 0.5, stale_weight 1.0 (telemetry older than
   ``stale`` = 6 s counts as one full replica of load), fresh 1 s.
3. **Picker** (:func:`better`): of the drawn pair the lower score wins, an
   exact tie is settled by the rng (never list order). Only the two drawn
   replicas are scored. A caller may pass another ``cost`` (the detour of
   :mod:`dataplane.pick.decide` compares prefill backlogs).

Branches (a metric label and a test assertion): ``p2c`` (a pair compared),
``single`` (one replica left, or the only one with room), ``none``
(nothing left).

The load the score reads of this proxy, :class:`LocalLoad`: its in-flight
requests per replica (``inflight``), and the prompt tokens it sent each
replica that have not yet produced a first token (its view of the replica's
prefill backlog, behind the decision's detour test); entries vanish at zero,
so its size is bounded by the requests in flight. :meth:`LocalLoad.mark`,
on each table applied, keeps the counts as ``counted``: the in-flight
requests the table's pushed loads already include (approximately: the
telemetry was sampled shortly before), so that the pick does not count them
twice; :meth:`LocalLoad.observe` learns how long a request lasts here (an
exponential average of answered forwards, weight 0.05), and
:meth:`LocalLoad.trust` says how much of a pushed load sampled ``age``
seconds ago still stands: ``1 - age / duration``, clamped to [0, 1] (1
until a duration is known). Requests that last less than the telemetry's
age have all been replaced since the sample: its imbalance between replicas
is gone, and only this proxy's own in-flight count is current.

Cost: O(1) (two draws, two scores) in the common case; O(n) over the
model's candidates on a retry or when a drawn replica lacks KV room;
O(1) per :class:`LocalLoad` call.
"""

from __future__ import annotations

import dataclasses
import enum
import random
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence

from dataplane.table.pool import Replica, occupancy


class Branch(enum.StrEnum):
    """Which way the decision went (a metric label); :mod:`dataplane.pick.decide` documents each."""

    AFFINITY = "affinity"
    OVERFLOW = "overflow"
    PLACED = "placed"
    DETOUR = "detour"
    REGION = "region"
    SPREAD = "spread"
    P2C = "p2c"
    FALLBACK = "fallback"
    SINGLE = "single"
    NONE = "none"
    TOO_LONG = "too_long"


@dataclasses.dataclass(frozen=True, slots=True)
class Need:
    """What the request asks of a replica: tokens to hold (prompt + max_tokens), of which prompt tokens."""

    tokens: int
    prompt_tokens: int = 0

    def blocks(self, kv_block_tokens: int) -> int:
        """KV-cache blocks needed on a replica with blocks of ``kv_block_tokens`` (0 if unknown)."""
        if kv_block_tokens <= 0:
            return 0
        return -(-self.tokens // kv_block_tokens)


@dataclasses.dataclass(frozen=True, slots=True)
class ScoreParams:
    """Weights of the load score; see the module docstring."""

    kv_weight: float = 0.5
    stale_weight: float = 1.0
    fresh_seconds: float = 1.0
    stale_seconds: float = 6.0


DEFAULT_PARAMS = ScoreParams()


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """The replica chosen (None when nothing is eligible), the branch taken, and the region when not this one."""

    replica: Replica | None
    branch: Branch
    reason: str = ""
    region: str = ""     # another region's name (branch ``region``), else ""
    rtt_ms: float = 0.0  # the round trip to that region


def fits(replica: Replica, need: Need) -> bool:
    """Whether the replica reports enough free KV blocks for the request (True when it reports none)."""
    if replica.kv_blocks_total <= 0:
        return True
    return replica.kv_blocks_free >= need.blocks(replica.kv_block_tokens)


def exclude(
    candidates: Sequence[Replica], excluded: Collection[str], avoid_nodes: Collection[str] = ()
) -> Sequence[Replica]:
    """Candidates not in ``excluded``, and off ``avoid_nodes`` while any such remain (same sequence when neither)."""
    if not excluded and not avoid_nodes:
        return candidates
    pool = [r for r in candidates if r.replica_id not in excluded]
    if avoid_nodes:
        elsewhere = [r for r in pool if r.node not in avoid_nodes]
        return elsewhere or pool
    return pool


def draw(pool: Sequence[Replica], need: Need, rng: random.Random) -> tuple[Replica, ...]:
    """Two distinct replicas of ``pool`` (len >= 2), preferring those with KV room; one if only one has room."""
    i, j = rng.sample(range(len(pool)), 2)
    a, b = pool[i], pool[j]
    if fits(a, need) and fits(b, need):
        return a, b
    roomy = [r for r in pool if fits(r, need)]
    if not roomy:
        return a, b
    if len(roomy) == 1:
        return (roomy[0],)
    i, j = rng.sample(range(len(roomy)), 2)
    return roomy[i], roomy[j]


def kv_use(replica: Replica, need: Need) -> float:
    """The share of ``replica``'s KV cache in use once this request's blocks are taken, 0..1 (0: unknown)."""
    if replica.kv_blocks_total <= 0:
        return 0.0
    left = replica.kv_blocks_free - need.blocks(replica.kv_block_tokens)
    return min(max(1.0 - left / replica.kv_blocks_total, 0.0), 1.0)


def staleness(age: float, fresh_seconds: float, stale_seconds: float) -> float:
    """Telemetry ``age`` from fresh (0) to stale (1), linear in between."""
    return min(max((age - fresh_seconds) / (stale_seconds - fresh_seconds), 0.0), 1.0)


def score(replica: Replica, need: Need, inflight: int, age: float, params: ScoreParams = DEFAULT_PARAMS,
          counted: int = 0, trust: float = 1.0) -> float:
    """The load score of ``replica`` for this request (lower is better); see the module docstring.

    The default plan's scorers (``load``, ``kv``, ``staleness`` in :mod:`dataplane.pick.scorers`) are these
    terms, the same functions; this sum is :func:`pick`'s cost when it is given none."""
    return (occupancy(replica, inflight, counted, trust) + params.kv_weight * kv_use(replica, need)
            + params.stale_weight * staleness(age, params.fresh_seconds, params.stale_seconds))


def better(a: Replica, b: Replica, cost: Callable[[Replica], float], rng: random.Random) -> Replica:
    """The lower-cost replica of the pair; ``rng`` settles an exact tie."""
    ca, cb = cost(a), cost(b)
    if ca == cb:
        return a if rng.random() < 0.5 else b
    return a if ca < cb else b


def pick(
    candidates: Sequence[Replica],
    need: Need,
    inflight: Mapping[str, int],
    rng: random.Random,
    excluded: Collection[str] = (),
    *,
    avoid_nodes: Collection[str] = (),
    table_age: float = 0.0,
    params: ScoreParams = DEFAULT_PARAMS,
    cost: Callable[[Replica], float] | None = None,
    counted: Mapping[str, int] | None = None,
    trust: Callable[[float], float] | None = None,
) -> Decision:
    """Choose a replica among ``candidates`` for a request needing ``need``; see the module docstring."""
    pool = exclude(candidates, excluded, avoid_nodes)
    if not pool:
        reason = "every ready replica was already tried" if candidates else "no ready replica"
        return Decision(None, Branch.NONE, reason)
    if len(pool) == 1:
        return Decision(pool[0], Branch.SINGLE)
    pair = draw(pool, need, rng)
    if len(pair) == 1:
        return Decision(pair[0], Branch.SINGLE)

    def default_cost(replica: Replica) -> float:
        age = replica.telemetry_age + table_age
        return score(replica, need, inflight.get(replica.replica_id, 0), age, params,
                     counted.get(replica.replica_id, 0) if counted else 0, trust(age) if trust else 1.0)

    return Decision(better(pair[0], pair[1], cost or default_cost, rng), Branch.P2C)


class LocalLoad(Mapping[str, int]):
    """In-flight requests this proxy has sent to each replica, and the prompt tokens not yet prefilled."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._prefill: dict[str, int] = {}
        self.counted: Mapping[str, int] = {}  # the counts when the current table was applied (mark)
        self.duration = 0.0  # seconds an answered forward lasts, averaged (observe)

    def observe(self, seconds: float) -> None:
        """An answered forward took ``seconds`` (the request duration the pushed loads are weighed by)."""
        self.duration = seconds if self.duration <= 0 else self.duration + 0.05 * (seconds - self.duration)

    def trust(self, age: float) -> float:
        """Share of a pushed load sampled ``age`` seconds ago that still stands (see the module docstring)."""
        if self.duration <= 0:
            return 1.0
        return min(max(1.0 - age / self.duration, 0.0), 1.0)

    def mark(self) -> None:
        """A table was applied: its pushed loads include what is in flight now (see the module docstring)."""
        self.counted = dict(self._counts)

    def __getitem__(self, replica_id: str) -> int:
        return self._counts[replica_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._counts)

    def __len__(self) -> int:
        return len(self._counts)

    def get(self, replica_id: str, default: int = 0) -> int:  # type: ignore[override]
        return self._counts.get(replica_id, default)

    def prefill(self, replica_id: str) -> int:
        """Prompt tokens sent to ``replica_id`` whose first token has not come back: its prefill backlog."""
        return self._prefill.get(replica_id, 0)

    def add(self, replica_id: str, prompt_tokens: int = 0) -> None:
        """One more request, of ``prompt_tokens``, sent to ``replica_id``."""
        _inc(self._counts, replica_id, 1)
        _inc(self._prefill, replica_id, prompt_tokens)

    def first(self, replica_id: str, prompt_tokens: int) -> None:
        """A request of ``prompt_tokens`` to ``replica_id`` got its first token: its prefill is done."""
        _inc(self._prefill, replica_id, -prompt_tokens)

    def done(self, replica_id: str, prompt_tokens: int = 0) -> None:
        """A request to ``replica_id`` finished (either way); ``prompt_tokens`` if no first token came back."""
        _inc(self._counts, replica_id, -1)
        _inc(self._prefill, replica_id, -prompt_tokens)


def _inc(counts: dict[str, int], key: str, by: int) -> None:
    if not by:
        return
    left = counts.get(key, 0) + by
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
