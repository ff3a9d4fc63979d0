"""Routing policies in the fleet simulator: Ferry's (the data plane's own code) and the baselines.

Every policy is instantiated once per proxy (its state is that proxy's) and
sees only what a proxy sees: its copy of the table (pushed telemetry, as
stale as the refresh makes it) and what it sent itself.

- ``ferry``: :class:`dataplane.picker.Picker`, unchanged: prefix keys with
  the hot-prefix sketch, the ring under its load bound, the prefill-aware
  spill, P2C on the load score; told of first tokens and cached tokens as
  the router is.
- ``round_robin``: each proxy cycles over the replicas from its own offset.
- ``random``: uniform.
- ``least_loaded``: fewest queued + running in the pushed telemetry, ties at
  random; no local in-flight count, so proxies herd between pushes.
- ``consistent_hash``: the same key as Ferry (the Picker's first key that is
  not hot) on the same ring, its home replica whatever its load: no bound,
  no load signal; a request without a usable key (a prompt that is only a
  popular prefix) goes to a random replica.
- ``cache_aware``: in the style of the cache-aware routers of the field. Per proxy, an
  approximate tree of what it routed to each replica
  (:class:`tools.sim.radix.ApproxTree`, 32,768 blocks per replica, about its
  default 2^26-character tree). If the proxy's own in-flight counts are
  imbalanced (max - min > 64 and max > 1.5 x min) the shortest queue wins;
  else the replica with the longest prefix match when it covers more than
  ``cache_threshold`` (0.5) of the prompt, else the one with the smallest
  tree. The prompt is then recorded under the chosen replica.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol

from dataplane.picker import Attempt, Picker
from dataplane.policy import LocalLoad
from dataplane.table import Pool, Table
from ferry.tokens import BLOCK_TOKENS
from tools.sim.radix import ApproxTree
from tools.sim.workload import SimRequest

MODEL = "chat"


class ProxyPolicy(Protocol):
    """What the simulator asks of one proxy's policy."""

    def pick(self, table: Table, req: SimRequest, now: float) -> tuple[str, str]:
        """(replica id, branch label) for ``req`` at virtual time ``now``."""

    def first(self, req: SimRequest, replica_id: str) -> None:
        """``req``, sent to ``replica_id``, got its first token."""

    def done(self, req: SimRequest, replica_id: str, cached_tokens: int | None) -> None:
        """``req``, sent to ``replica_id``, finished (``cached_tokens`` None: refused)."""


def _pool(table: Table) -> Pool:
    return table.models[MODEL].default


class Ferry:
    """The data plane's Picker."""

    def __init__(self, rng: random.Random) -> None:
        self.picker = Picker(rng)
        self._attempts: dict[int, Attempt] = {}

    def pick(self, table: Table, req: SimRequest, now: float) -> tuple[str, str]:
        routing = self.picker.prepare(table, tenant=req.tenant, model=MODEL, version="",
                                      prompt_tokens=req.prompt_tokens, max_tokens=req.max_tokens,
                                      hashes=req.hash_ids)
        decision = self.picker.choose(table, routing, now)
        if decision.replica is None:
            raise RuntimeError(f"request {req.index}: no replica ({decision.reason})")
        self._attempts[req.index] = self.picker.sent(decision.replica.replica_id, routing, decision.branch)
        return decision.replica.replica_id, decision.branch.value

    def first(self, req: SimRequest, replica_id: str) -> None:
        self.picker.first(self._attempts[req.index])

    def done(self, req: SimRequest, replica_id: str, cached_tokens: int | None) -> None:
        self.picker.done(self._attempts.pop(req.index), cached_tokens)


class RoundRobin:
    def __init__(self, rng: random.Random) -> None:
        self._next = rng.randrange(1 << 16)

    def pick(self, table: Table, req: SimRequest, now: float) -> tuple[str, str]:
        pool = _pool(table)
        self._next += 1
        return pool[self._next % len(pool)].replica_id, "round_robin"

    def first(self, req: SimRequest, replica_id: str) -> None:
        pass

    def done(self, req: SimRequest, replica_id: str, cached_tokens: int | None) -> None:
        pass


class Uniform:
    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, table: Table, req: SimRequest, now: float) -> tuple[str, str]:
        pool = _pool(table)
        return pool[self._rng.randrange(len(pool))].replica_id, "random"

    def first(self, req: SimRequest, replica_id: str) -> None:
        pass

    def done(self, req: SimRequest, replica_id: str, cached_tokens: int | None) -> None:
        pass


class LeastLoaded:
    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, table: Table, req: SimRequest, now: float) -> tuple[str, str]:
        pool = _pool(table)
        least = min(r.queued + r.running for r in pool)
        ties = [r for r in pool if r.queued + r.running == least]
        return ties[self._rng.randrange(len(ties))].replica_id, "least_loaded"

    def first(self, req: SimRequest, replica_id: str) -> None:
        pass

    def done(self, req: SimRequest, replica_id: str, cached_tokens: int | None) -> None:
        pass


class ConsistentHash:
    def __init__(self, rng: random.Random) -> None:
        self.picker = Picker(rng)
        self._rng = rng

    def pick(self, table: Table, req: SimRequest, now: float) -> tuple[str, str]:
        routing = self.picker.prepare(table, tenant=req.tenant, model=MODEL, version="",
                                      prompt_tokens=req.prompt_tokens, max_tokens=req.max_tokens,
                                      hashes=req.hash_ids)
        if routing.key is None:  # no prefix worth a key: spread like any hash of the request would
            return routing.pool[self._rng.randrange(len(routing.pool))].replica_id, "random"
        return routing.pool[routing.pool.ring.home(routing.key)].replica_id, "consistent_hash"

    def first(self, req: SimRequest, replica_id: str) -> None:
        pass

    def done(self, req: SimRequest, replica_id: str, cached_tokens: int | None) -> None:
        pass


class CacheAware:
    def __init__(self, rng: random.Random, *, cache_threshold: float = 0.5, balance_abs: int = 64,
                 balance_rel: float = 1.5, max_blocks: int = 32768) -> None:
        self._rng = rng
        self._threshold, self._abs, self._rel = cache_threshold, balance_abs, balance_rel
        self._max_blocks = max_blocks
        self._tree: ApproxTree | None = None
        self._local = LocalLoad()

    def pick(self, table: Table, req: SimRequest, now: float) -> tuple[str, str]:
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
            else:
                sizes = [tree.size(i) for i in range(len(pool))]
                index, branch = sizes.index(min(sizes)), "smallest_tree"
        tree.insert(index, req.hash_ids)
        replica_id = pool[index].replica_id
        self._local.add(replica_id)
        return replica_id, branch

    def first(self, req: SimRequest, replica_id: str) -> None:
        pass

    def done(self, req: SimRequest, replica_id: str, cached_tokens: int | None) -> None:
        self._local.done(replica_id)


PolicyFactory = Callable[[int, random.Random], ProxyPolicy]

POLICIES: dict[str, PolicyFactory] = {
    "ferry": lambda proxy, rng: Ferry(rng),
    "round_robin": lambda proxy, rng: RoundRobin(rng),
    "random": lambda proxy, rng: Uniform(rng),
    "least_loaded": lambda proxy, rng: LeastLoaded(rng),
    "consistent_hash": lambda proxy, rng: ConsistentHash(rng),
    "cache_aware": lambda proxy, rng: CacheAware(rng),
}
