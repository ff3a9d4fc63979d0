"""One proxy's pick: its state and the calls of the per-request path, shared with the fleet simulator.

:class:`Picker` owns what a proxy keeps between requests for the pick: its
in-flight load and prefill backlog (:class:`dataplane.policy.LocalLoad`), its
hot-prefix sketch (:class:`dataplane.prefix.HotKeys`), what it learned of
prefix reuse (:class:`Reuse`) and its random generator. The router calls it
per request; the fleet simulator (``tools/sim``) drives the very same object
in virtual time.

- :meth:`Picker.prepare`, once per request: the prefix keys (the explicit
  ``prefix_key``'s, else one per depth of the prompt's block hashes), the
  first that is not hot (threshold: ``load_factor`` / replicas of the model,
  the share one replica may take); when all are hot, none: the request is
  spread over the whole pool (every replica ends up caching a prefix that
  popular); the version (a canary split drawn from the key, so a
  conversation keeps its version; from the rng without one) and its pool.
  It counts the request in the sketch. Raises NotFound.
- :meth:`Picker.choose`, per attempt: :func:`dataplane.route.route` with the
  table's age at ``now`` and the spill threshold.
- :meth:`Picker.sent`, :meth:`Picker.first` (the first token came back; a
  unary call never says, and counts as prefilling until it ends) and
  :meth:`Picker.done` (with the cached prompt tokens the replica reported,
  if it did) around each forward.

**Reuse** learns, from the cached tokens replicas report, the share of a
prompt served from cache when the request went to its prefix's replica
(``affinity``, ``overflow``) and when it went to any replica (``p2c``,
``fallback``, ``single``), as exponential moving averages (weight
``learn_rate`` = 0.01 per request, prompt-token weighted), and the mean
prompt. Its *advantage* is the difference of the two shares: what the
prefix's replica saves (a rough measure: the two groups of requests differ;
when those that go to any replica are short prompts wholly in a shared
prefix, it comes out 0 and requests leave a busy replica readily). The spill threshold of :func:`dataplane.route.route`,
in prompt tokens of backlog, is what leaving it costs::

    threshold = advantage x spill_factor x mean prompt

``spill_factor`` (default 12) is large because the backlog a proxy sees is
only its own share of the replica's, and a spill costs the conversation's
next turns their cache too (they find neither replica up to date); it was
chosen with the fleet simulator (docs/evaluation.md). On a workload where
the prefix's replica saves little, requests leave a busy one readily; where
it saves much, only for a deep backlog. Before any report (a server that
reports no cached tokens), the advantage is taken as 0.5. Spilled requests
are left out of the averages: they land on a replica that holds part of
their prefix, neither home nor any replica.

Cost: O(depths) hashing and sketch updates per request, then the route's.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Collection, Sequence

from dataplane.pick import Branch, Decision, Need
from dataplane.policy import LocalLoad
from dataplane.pool import Pool
from dataplane.prefix import DEPTHS, HotKeys, explicit_key, prefix_keys
from dataplane.route import DEFAULT_ROUTE, RouteParams, route
from dataplane.table import Table

HOME_BRANCHES = frozenset({Branch.AFFINITY, Branch.OVERFLOW})


@dataclasses.dataclass(frozen=True, slots=True)
class Routing:
    """What :meth:`Picker.prepare` found for a request: version, pool, prefix key (None: none usable), need."""

    version: str
    pool: Pool
    key: int | None
    need: Need
    hot: bool = False  # no key because every key of the request is hot


@dataclasses.dataclass(slots=True)
class Attempt:
    """One forward of a request: where it went, by which branch, whether its first token came back."""

    replica_id: str
    routing: Routing
    branch: Branch
    prefilled: bool = False


class Reuse:
    """Share of prompt tokens served from cache at the prefix's replica and elsewhere, and the mean prompt."""

    def __init__(self, rate: float = 0.01, prior: float = 0.5) -> None:
        self.rate = rate
        self._home = [prior, 1.0]   # [cached, prompt] tokens, averaged
        self._other = [0.0, 1.0]
        self.mean_prompt = 0.0

    def learn(self, home: bool, cached: int, prompt: int) -> None:
        """One request's report: ``cached`` of its ``prompt`` tokens came from the cache."""
        pair = self._home if home else self._other
        pair[0] += self.rate * (cached - pair[0])
        pair[1] += self.rate * (prompt - pair[1])

    def prompt(self, tokens: int) -> None:
        """Count one request's prompt in the mean."""
        self.mean_prompt += self.rate * (tokens - self.mean_prompt) if self.mean_prompt else tokens

    def advantage(self) -> float:
        """How much more of a prompt the prefix's replica serves from cache than another (>= 0)."""
        return max(0.0, self._home[0] / self._home[1] - self._other[0] / self._other[1])


class Picker:
    """The pick state of one proxy; see the module docstring."""

    def __init__(self, rng: random.Random, *, params: RouteParams = DEFAULT_ROUTE, depths: Sequence[int] = DEPTHS,
                 hot: HotKeys | None = None, spill_factor: float = 12.0, learn_rate: float = 0.01) -> None:
        self.rng = rng
        self.params = params
        self.depths = tuple(depths)
        self.spill_factor = spill_factor
        self.local = LocalLoad()
        self.hot = hot if hot is not None else HotKeys()
        self.reuse = Reuse(learn_rate)

    def keys(self, tenant: str, prefix_key: str, hashes: Sequence[int]) -> tuple[int, ...]:
        """The request's keys, shallowest first."""
        if prefix_key:
            return (explicit_key(tenant, prefix_key),)
        return prefix_keys(tenant, hashes, self.depths)

    def prepare(self, table: Table, *, tenant: str, model: str, version: str, prompt_tokens: int,
                max_tokens: int, prefix_key: str = "", hashes: Sequence[int] = ()) -> Routing:
        """Key, version and pool of a request; counts it in the hot sketch. Raises NotFound."""
        keys = self.keys(tenant, prefix_key, hashes)
        entry = table.models.get(model)
        replicas = len(entry.default) if entry is not None else 1
        start = self.hot.first_cool(keys, table.load_factor / max(1, replicas))
        key = keys[start] if start < len(keys) else None
        served, pool = table.candidates(model, version, key / 2.0**64 if key is not None else self.rng.random())
        self.hot.observe(keys[:start + 1])
        self.reuse.prompt(prompt_tokens)
        return Routing(served, pool, key, Need(prompt_tokens + max_tokens, prompt_tokens), bool(keys) and key is None)

    def choose(self, table: Table, routing: Routing, now: float, *, excluded: Collection[str] = (),
               avoid_nodes: Collection[str] = (), avoid: Collection[str] = ()) -> Decision:
        """The replica for one attempt (``now`` on the clock that stamped ``table.applied_at``)."""
        return route(routing.pool, routing.need, routing.key, self.local, self.rng, spill=self.spill(),
                     hot=routing.hot, table_age=now - table.applied_at, excluded=excluded,
                     avoid_nodes=avoid_nodes, avoid=avoid, params=self.params)

    def spill(self) -> float:
        """The spill threshold as learned so far, in prompt tokens of backlog."""
        return self.reuse.advantage() * self.spill_factor * self.reuse.mean_prompt

    def sent(self, replica_id: str, routing: Routing, branch: Branch) -> Attempt:
        """A request was forwarded to ``replica_id``; the attempt to hand back to :meth:`first` and :meth:`done`."""
        self.local.add(replica_id, routing.need.prompt_tokens)
        return Attempt(replica_id, routing, branch)

    def first(self, attempt: Attempt) -> None:
        """The attempt's first token came back: its prefill is done."""
        if not attempt.prefilled:
            attempt.prefilled = True
            self.local.first(attempt.replica_id, attempt.routing.need.prompt_tokens)

    def done(self, attempt: Attempt, cached_tokens: int | None = None) -> None:
        """The attempt ended (either way); ``cached_tokens`` when the replica reported them."""
        prompt = attempt.routing.need.prompt_tokens
        self.local.done(attempt.replica_id, 0 if attempt.prefilled else prompt)
        attempt.prefilled = True
        if cached_tokens is not None and prompt > 0 and attempt.branch is not Branch.SPILL:
            self.reuse.learn(attempt.branch in HOME_BRANCHES, cached_tokens, prompt)
