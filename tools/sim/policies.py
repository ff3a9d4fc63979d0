"""Routing policies in the fleet simulator: Ferry's (the data plane's own code) and the baselines.

Every policy is instantiated once per proxy (its state is that proxy's) and
sees only what a proxy sees: its copy of the table (pushed telemetry, as
stale as the refresh makes it) and what it sent itself.

- ``ferry``: the proxy's own attempt loop, whole: a
  :class:`dataplane.attempt.AttemptLoop` over a
  :class:`dataplane.pick.state.PickState` built from the proxy's default settings
  (:meth:`dataplane.pick.state.PickState.from_settings`), the same object the
  router and the endpoint picker drive, here in virtual time: its decision
  (:func:`dataplane.pick.decide.decide` with the table's view, applied on
  every tick, the request's routing, the replicas and nodes already tried,
  the ejected replicas of its outlier detector fed with simulated results:
  first-token and end times, cached tokens, refusals; the learned detour
  threshold and the remembered placements), its records and its retry rule
  and budget (:meth:`dataplane.attempt.AttemptLoop.retry`): a request the
  replica refuses is retried as the router retries it; one the decision
  cannot place (longer than every context) is refused, as the proxy refuses
  it. Admission is the proxy's gate, the same object
  (:class:`dataplane.admission.gate.Admission`: tier queues sized from every
  table, offer, dispatch, the wait's limit and its expiry; their avoid set goes
  into the decision through the loop); a request's tier is its ``tier``
  (interactive unless the workload says otherwise: recorded traffic does),
  which picks its queue, queue timeout and whether it is retried. No preemption
  of lower tiers (its tickets are not preemptible: a simulated request is not
  cancelled and requeued; the tier simulator, :mod:`tools.sim.tiers`, covers that).
- ``round_robin``: each proxy cycles over the replicas from its own offset.
- ``random``: uniform.
- ``least_loaded``: fewest queued + running in the pushed telemetry, ties at
  random; no local in-flight count, so proxies herd between pushes.
- ``consistent_hash``: the same key as Ferry (the PickState's first key that is
  not hot) on the same ring, its home replica whatever its load: no bound,
  no load signal; a request without a usable key (a prompt that is only a
  popular prefix) goes to a random replica.
- ``prompt_hash``: a hash of the whole prompt (its block ids) picks the
  replica, as a consistent-hash router keyed on the request body does when no
  session id is sent: a conversation's growing turns land anywhere.
- ``cache_aware``: in the style of the cache-aware routers of the field. Per proxy, an
  approximate tree of what it routed to each replica
  (:class:`tools.sim.radix.ApproxTree`, 32,768 blocks per replica, about its
  default 2^26-character tree). If the proxy's own in-flight counts are
  imbalanced (max - min > 64 and max > 1.5 x min) the shortest queue wins;
  else the replica with the longest prefix match when it covers more than
  ``cache_threshold`` (0.5) of the prompt, else the one with the smallest
  tree. The prompt is then recorded under the chosen replica.
- ``cache_aware_load``: the same, but a miss goes to the replica with the
  fewest of this proxy's requests in flight, the first on a tie, as the
  newer cache-aware routers do (sglang-router 0.3.2 and vllm-router 0.1.17
  behave so in front of the simulated replicas).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Protocol

from prometheus_client import CollectorRegistry

from dataplane.admission.gate import Admission
from dataplane.admission.queues import Shed, Ticket
from dataplane.attempt import AttemptLoop, Tries
from dataplane.config import ProxySettings
from dataplane.pick.p2c import LocalLoad
from dataplane.pick.state import Attempt, PickState
from dataplane.table.local import Pool, Table
from ferry.errors import ReplicaFailed
from ferry.tokens import BLOCK_TOKENS
from tools.sim.radix import ApproxTree
from tools.sim.workload import SimRequest

MODEL = "chat"


class ProxyPolicy(Protocol):
    """What the simulator asks of one proxy's policy."""

    def apply(self, table: Table) -> list[int]:
        """A new table was applied (every tick): indexes of requests that may start now (the queues grew)."""

    def pick(self, table: Table, req: SimRequest, now: float, tried: tuple[str, ...] = ()) -> tuple[str | None, str]:
        """(replica id or None: refused, branch label) for ``req`` at virtual time ``now``, off ``tried``."""

    def first(self, req: SimRequest, replica_id: str, now: float) -> None:
        """``req``, sent to ``replica_id``, got its first token at ``now``."""

    def progress(self, req: SimRequest, replica_id: str, tokens: int, now: float) -> bool:
        """``req`` has ``tokens`` output tokens by ``now``; whether to be told of the next ones."""

    def done(self, req: SimRequest, replica_id: str, cached_tokens: int, now: float, completion_tokens: int) -> None:
        """``req``, sent to ``replica_id``, finished at ``now``."""

    def refused(self, req: SimRequest, replica_id: str, now: float) -> bool:
        """The replica refused ``req``; whether to try another replica."""

    def admit(self, req: SimRequest, now: float) -> tuple[list[int], list[int]]:
        """``req`` arrived: (indexes of requests that may start now, indexes refused)."""

    def release(self, req: SimRequest, now: float) -> tuple[list[int], list[int]]:
        """``req`` left its replica: (indexes of requests that may start now, indexes refused)."""

    def wait_limit(self, req: SimRequest) -> float | None:
        """How long ``req`` may wait to start (None: it never waits)."""

    def expire(self, req: SimRequest, now: float) -> bool:
        """``req``'s wait limit passed: whether it was still waiting (and is now refused)."""


def _pool(table: Table) -> Pool:
    return table.models[MODEL].default


class Baseline:
    """What a baseline does with the feedback it ignores: nothing (no retries, no table state)."""

    def apply(self, table: Table) -> list[int]:
        return []

    def first(self, req: SimRequest, replica_id: str, now: float) -> None:
        pass

    def progress(self, req: SimRequest, replica_id: str, tokens: int, now: float) -> bool:
        return False

    def done(self, req: SimRequest, replica_id: str, cached_tokens: int, now: float, completion_tokens: int) -> None:
        pass

    def refused(self, req: SimRequest, replica_id: str, now: float) -> bool:
        return False

    def admit(self, req: SimRequest, now: float) -> tuple[list[int], list[int]]:
        return [req.index], []

    def release(self, req: SimRequest, now: float) -> tuple[list[int], list[int]]:
        return [], []

    def wait_limit(self, req: SimRequest) -> float | None:
        return None

    def expire(self, req: SimRequest, now: float) -> bool:
        return False


class Ferry:
    """The proxy's attempt loop (:class:`dataplane.attempt.AttemptLoop`) and admission gate
    (:class:`dataplane.admission.gate.Admission`) driven in virtual time (module docstring).

    What is the simulator's own: the clock (the event's time), the engines' answers turned into the loop's calls,
    and which simulated request holds which ticket; offering, dispatching, the wait's limit and its expiry are
    the gate's, deciding, recording, the retry rule and budget the loop's."""

    def __init__(self, rng: random.Random, settings: ProxySettings | None = None) -> None:
        self.settings = settings or ProxySettings()
        s = self.settings
        self.picker = PickState.from_settings(s.pick, rng, region=s.region, regions=s.regions,
                                           capacity_share=s.queues.admission_capacity_share, outliers=s.outliers,
                                           retries=s.retries)
        self.now = 0.0  # the virtual time of the event being handled: the loop's and the gate's clock
        self.admission = Admission(s.queues.queue_params(), clock=lambda: self.now, registry=CollectorRegistry(),
                                   capacity_share=s.queues.admission_capacity_share)
        self.loop = AttemptLoop(self.picker, s.retries, clock=lambda: self.now, gate=self.admission)
        self._tries: dict[int, Tries] = {}
        self._attempts: dict[int, Attempt] = {}
        self._tickets: dict[int, Ticket] = {}
        self._by_ticket: dict[Ticket, int] = {}

    def apply(self, table: Table) -> list[int]:
        self.now = table.applied_at
        self.picker.apply_table(table)
        return self._indices(self.admission.apply(table)) if self.settings.queues.admission else []

    def admit(self, req: SimRequest, now: float) -> tuple[list[int], list[int]]:
        self.now = now
        if not self.admission.active(MODEL):
            return [req.index], []
        # not preemptible: a simulated request is not cancelled and requeued (the tier simulator covers that)
        ticket = Ticket(tenant=req.tenant, plan="enterprise", tier=req.tier, cost=req.prompt_tokens + req.max_tokens,
                        deadline=now + self.settings.server.default_deadline_seconds, preemptible=False)
        self._tickets[req.index], self._by_ticket[ticket] = ticket, req.index
        try:
            offered = self.admission.offer(MODEL, ticket)
        except Shed:
            self._drop(ticket)
            return [], [req.index]
        refused = [self._drop(victim) for victim in offered.evicted]
        return self._indices(offered.started), refused

    def _indices(self, started: list[Ticket]) -> list[int]:
        return [self._by_ticket[t] for t in started]

    def _drop(self, ticket: Ticket) -> int:
        index = self._by_ticket.pop(ticket)
        self._tickets.pop(index, None)
        return index

    def release(self, req: SimRequest, now: float) -> tuple[list[int], list[int]]:
        self.now = now
        ticket = self._tickets.get(req.index)
        if ticket is None:
            return [], []
        self._drop(ticket)
        return self._indices(self.admission.release(MODEL, ticket)), []

    def wait_limit(self, req: SimRequest) -> float | None:
        ticket = self._tickets.get(req.index)
        return self.admission.wait_limit(ticket) if ticket is not None else None

    def expire(self, req: SimRequest, now: float) -> bool:
        self.now = now
        ticket = self._tickets.get(req.index)
        if ticket is None or not self.admission.expire(MODEL, ticket):
            return False
        self._drop(ticket)
        return True

    def pick(self, table: Table, req: SimRequest, now: float, tried: tuple[str, ...] = ()) -> tuple[str | None, str]:
        self.now = now
        tries = self._tries.get(req.index)
        if tries is None:  # admitted: its routing resolved once, as the router's begin does
            routing = self.picker.prepare(table, tenant=req.tenant, model=MODEL, version="",
                                          prompt_tokens=req.prompt_tokens, max_tokens=req.max_tokens,
                                          hashes=req.hash_ids)
            tries = self._tries[req.index] = Tries(routing, MODEL, req.tier)
            self.loop.admitted()
        tries.ticket = self._tickets.get(req.index)
        assert tries.routing is not None
        pool = tries.routing.pool
        failed = [pool.replicas[pool.index[r]] for r in tried if r in pool.index]
        decision = self.loop.decide(tries, self.picker.view_of(table), failed)
        if decision.replica is None:
            self._forget(req.index)
            return None, decision.branch.value
        self._attempts[req.index] = self.loop.send(tries, decision, streamed=True)
        return decision.replica.replica_id, decision.branch.value

    def first(self, req: SimRequest, replica_id: str, now: float) -> None:
        self.loop.first(self._attempts[req.index], now)

    def progress(self, req: SimRequest, replica_id: str, tokens: int, now: float) -> bool:
        return self.loop.progress(self._attempts[req.index], tokens, now)

    def done(self, req: SimRequest, replica_id: str, cached_tokens: int, now: float, completion_tokens: int) -> None:
        self.now = now
        attempt = self._attempts[req.index]
        self.loop.done(attempt, cached_tokens)
        self.loop.answered(attempt, completion_tokens=completion_tokens, cached_tokens=cached_tokens)
        self._forget(req.index)

    def refused(self, req: SimRequest, replica_id: str, now: float) -> bool:
        """The engine refused (its queue full): a retryable failure before any output, as the replica's would be."""
        self.now = now
        attempt = self._attempts.pop(req.index)
        error = ReplicaFailed(replica_id, "queue full", output_started=False, retryable=True)
        self.loop.done(attempt)
        self.loop.failed(attempt, error)
        if self.loop.retry(self._tries[req.index], error):
            return True
        self._forget(req.index)
        return False

    def _forget(self, index: int) -> None:
        self._tries.pop(index, None)
        self._attempts.pop(index, None)


class RoundRobin(Baseline):
    """Round robin over the pool (a peer baseline), from a random start."""

    def __init__(self, rng: random.Random) -> None:
        self._next = rng.randrange(1 << 16)

    def pick(self, table: Table, req: SimRequest, now: float, tried: tuple[str, ...] = ()) -> tuple[str | None, str]:
        pool = _pool(table)
        self._next += 1
        return pool[self._next % len(pool)].replica_id, "round_robin"


class Uniform(Baseline):
    """A uniformly random replica of the pool (a peer baseline)."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, table: Table, req: SimRequest, now: float, tried: tuple[str, ...] = ()) -> tuple[str | None, str]:
        pool = _pool(table)
        return pool[self._rng.randrange(len(pool))].replica_id, "random"


class LeastLoaded(Baseline):
    """The replica with the fewest requests queued and running, ties broken at random (a peer baseline)."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, table: Table, req: SimRequest, now: float, tried: tuple[str, ...] = ()) -> tuple[str | None, str]:
        pool = _pool(table)
        least = min(r.queued + r.running for r in pool)
        ties = [r for r in pool if r.queued + r.running == least]
        return ties[self._rng.randrange(len(ties))].replica_id, "least_loaded"


class ConsistentHash(Baseline):
    """Ferry's bounded-load ring alone, without placements, detours or P2C (a baseline)."""

    def __init__(self, rng: random.Random) -> None:
        self.picker = PickState(rng)
        self._rng = rng

    def pick(self, table: Table, req: SimRequest, now: float, tried: tuple[str, ...] = ()) -> tuple[str | None, str]:
        routing = self.picker.prepare(table, tenant=req.tenant, model=MODEL, version="",
                                      prompt_tokens=req.prompt_tokens, max_tokens=req.max_tokens,
                                      hashes=req.hash_ids)
        if routing.key is None:  # no prefix worth a key: spread like any hash of the request would
            return routing.pool[self._rng.randrange(len(routing.pool))].replica_id, "random"
        return routing.pool[routing.pool.ring.home(routing.key)].replica_id, "consistent_hash"


class PromptHash(Baseline):
    """A hash of the whole prompt's blocks modulo the pool (a peer baseline)."""

    def __init__(self, rng: random.Random) -> None:
        pass

    def pick(self, table: Table, req: SimRequest, now: float, tried: tuple[str, ...] = ()) -> tuple[str | None, str]:
        pool = _pool(table)
        digest = hashlib.blake2b(repr(req.hash_ids).encode(), digest_size=8).digest()
        return pool[int.from_bytes(digest, "big") % len(pool)].replica_id, "prompt_hash"


class CacheAware(Baseline):
    """The peers' ``cache_aware`` policy: an approximate prefix tree per router, shortest queue past a load spread."""

    def __init__(self, rng: random.Random, *, cache_threshold: float = 0.5, balance_abs: int = 64,
                 balance_rel: float = 1.5, max_blocks: int = 32768, miss: str = "smallest_tree") -> None:
        self._rng = rng
        self._miss = miss
        self._threshold, self._abs, self._rel = cache_threshold, balance_abs, balance_rel
        self._max_blocks = max_blocks
        self._tree: ApproxTree | None = None
        self._local = LocalLoad()

    def pick(self, table: Table, req: SimRequest, now: float, tried: tuple[str, ...] = ()) -> tuple[str | None, str]:
        pool = _pool(table)
        if self._tree is None:
            self._tree = ApproxTree(len(pool), self._max_blocks)
        tree = self._tree
        loads = [self._local.get(r.replica_id) for r in pool]
        high, low = max(loads), min(loads)
        if high - low > self._abs and high > self._rel * low:
            index, branch = loads.index(low), "shortest_queue"
        else:
            best, depth = tree.match(req.hash_ids)
            if best and min(depth * BLOCK_TOKENS, req.prompt_tokens) > self._threshold * req.prompt_tokens:
                index, branch = self._rng.choice(sorted(best)), "cache_hit"
            elif self._miss == "least_load":
                index, branch = loads.index(low), "least_load"
            else:
                sizes = [tree.size(i) for i in range(len(pool))]
                index, branch = sizes.index(min(sizes)), "smallest_tree"
        tree.insert(index, req.hash_ids)
        replica_id = pool[index].replica_id
        self._local.add(replica_id)
        return replica_id, branch

    def done(self, req: SimRequest, replica_id: str, cached_tokens: int, now: float, completion_tokens: int) -> None:
        self._local.done(replica_id)


PolicyFactory = Callable[[int, random.Random], ProxyPolicy]

POLICIES: dict[str, PolicyFactory] = {
    "ferry": lambda proxy, rng: Ferry(rng),
    "round_robin": lambda proxy, rng: RoundRobin(rng),
    "random": lambda proxy, rng: Uniform(rng),
    "least_loaded": lambda proxy, rng: LeastLoaded(rng),
    "consistent_hash": lambda proxy, rng: ConsistentHash(rng),
    "cache_aware": lambda proxy, rng: CacheAware(rng),
    "cache_aware_load": lambda proxy, rng: CacheAware(rng, miss="least_load"),
    "prompt_hash": lambda proxy, rng: PromptHash(rng),
}
