"""One proxy's decision state and the calls around :func:`dataplane.pick.decide.decide`, shared with the simulator.

:class:`PickState` owns what a proxy keeps between requests for its decision:
its in-flight load and prefill backlog (:class:`dataplane.pick.p2c.LocalLoad`),
where it sent each prefix key (:class:`dataplane.pick.decide.Placements`), its
hot-prefix sketch (:class:`dataplane.pick.prefix.HotKeys`), what it learned of
prefix reuse (:class:`Reuse`), its outlier detector
(:class:`dataplane.pick.outlier.OutlierDetector`), the replicas that refused
a connection (:class:`dataplane.pick.unreachable.Unreachable`, out of the
pick with the ejected ones until their telemetry is newer), its retry budget
(:class:`dataplane.failover.budget.RetryBudget`) and its random generator. The
router calls it per request; the fleet simulator (``tools/sim``) drives the
very same object in virtual time, so both run one decision with everything
it weighs.

- :meth:`PickState.apply_table`, once per table: the frozen
  :class:`dataplane.pick.decide.View`, the in-flight counts the table's loads
  include (:meth:`LocalLoad.mark`), the outlier state of departed replicas
  dropped, refused replicas with fresh telemetry readmitted.
- :meth:`PickState.prepare`, once per request: the prefix keys (the explicit
  ``prefix_key``'s, else one per depth of the prompt's block hashes), the
  first that is not hot (threshold: ``load_factor`` / replicas of the model,
  the share one replica may take); when all are hot, none: the request is
  spread over the whole pool; the version (a canary split drawn from the
  key, so a conversation keeps its version; from the rng without one) and
  its pool. It counts the request in the sketch. Raises NotFound.
- :meth:`PickState.decide`, per attempt: :func:`dataplane.pick.decide.decide` with
  this proxy's :class:`dataplane.pick.decide.Local` at ``now``. A new key is
  placed among the first ``place_choices`` (4) replicas of its walk while
  this proxy carries most (``SOLE_SHARE``, 75 %) of its pools' load (its
  in-flight when a table's loads were sampled over their queued + running,
  smoothed over tables), else among two: the other proxies cannot see this
  one's placements, and the fewer the choices the more often they agree (on
  the Azure workload behind four proxies, p99 145 ms with two, 157 with
  four; behind one proxy on the Mooncake slice, four are better).
- :meth:`PickState.sent`, :meth:`PickState.first` (the first token came back; a
  unary call never says, and counts as prefilling until it ends),
  :meth:`PickState.done` (with the cached prompt tokens the replica reported, if
  it did), and :meth:`PickState.progress` (a stream's output so far),
  :meth:`PickState.answered` / :meth:`PickState.failed` (the outlier detector's
  feed) around each forward.

**Reuse** learns, from the cached tokens replicas report, the share of a
prompt served from cache when a request of a known key went back to its
replica (``affinity``, ``overflow``) and when a request went to any replica
(``p2c``, ``fallback``, ``single``, ``spread``), as exponential moving
averages (weight ``learn_rate`` = 0.01 per request, prompt-token weighted),
and the mean prompt. Its *advantage* is the difference of the two shares:
what the prefix's replica saves. The detour threshold of
:func:`dataplane.pick.decide.decide`, in prompt tokens of backlog, is what
leaving it costs::

    threshold = advantage x detour_factor x mean prompt

``detour_factor`` (default 24) is large because the backlog a proxy sees is
only its own share of the replica's, and a detour costs the conversation its
cache (a detoured long prompt loses hundreds of cached blocks at once). At
12, the Mooncake hour at 0.8 behind one proxy had a TTFT p99 of 1,787 ms and
reused 95.7 % of what an infinite cache would; at 24, 1,974 ms and 97.9 %;
behind four proxies 2,528 against 2,571 ms (docs/evaluation.md). The real
runs of the peer benchmark varied with the few detours of long prompts at
12 (91 to 99 % of the limit in six runs) and less at 24. Before any report (a server that reports no cached
tokens), the advantage is taken as 0.5. Detoured requests and keys new to
the proxy are left out of the averages.

Cost: O(depths) hashing and sketch updates per request, then the decision's.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Callable, Sequence

from dataplane.failover.budget import RetryBudget
from dataplane.failover.settings import RetrySettings
from dataplane.pick.decide import (
    DEFAULT_DECIDE,
    Ask,
    DecideParams,
    Local,
    Placements,
    Routing,
    View,
    decide,
    make_view,
    region,
)
from dataplane.pick.outlier import OutlierDetector, Timing
from dataplane.pick.p2c import Branch, Decision, LocalLoad, Need
from dataplane.pick.plugin import Notes, Steps, compose, describe
from dataplane.pick.prefix import DEPTHS, HotKeys, explicit_key, prefix_keys
from dataplane.pick.settings import OutlierSettings, PickSettings
from dataplane.pick.unreachable import Unreachable
from dataplane.regions.choice import LocalQueue
from dataplane.regions.settings import RegionSettings
from dataplane.table.local import Table
from dataplane.table.pool import load
from ferry.logs import event

HOME_BRANCHES = frozenset({Branch.AFFINITY, Branch.OVERFLOW})
ANY_BRANCHES = frozenset({Branch.P2C, Branch.FALLBACK, Branch.SINGLE, Branch.SPREAD})
SOLE_SHARE = 0.75  # a proxy carrying this share of its pools' load places new keys among place_choices replicas
SHARE_WEIGHT = 0.1  # per table applied (two a second: a time constant of about 5 s)
SHARE_MIN_LOAD = 8  # requests in the pools before the share is measured at all
OVERDUE_CHECK_SECONDS = 0.25  # how often the attempts waiting for a first token are looked at (in decide)
REMEMBERED = frozenset({Branch.AFFINITY, Branch.OVERFLOW, Branch.PLACED, Branch.DETOUR, Branch.FALLBACK})

MAX_NOTES = 32  # replicas' scores in one decision's debug log line
log = logging.getLogger("ferry.proxy.pick")

__all__ = ["Attempt", "PickState", "Reuse", "Routing"]


@dataclasses.dataclass(slots=True)
class Attempt:
    """One forward of a request: where it went, by which branch, when, and whether its first token came back."""

    replica_id: str
    routing: Routing
    branch: Branch
    sent_at: float = 0.0
    ahead: int = 0          # prompt tokens already waiting for a first token there (this proxy's), at send
    known: bool = False     # the key was remembered at send (a conversation going back)
    prefilled: bool = False
    first_at: float | None = None
    decode_sampled: bool = False  # the outlier detector has its decode sample (PickState.progress)
    streamed: bool = True  # a stream says when its first token came back; a unary call never does
    mark: int = 0  # prompt tokens this proxy had sent the replica and seen prefilled, at the first token


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


class PickState:
    """The decision state of one proxy; see the module docstring."""

    def __init__(self, rng: random.Random, *, params: DecideParams = DEFAULT_DECIDE, depths: Sequence[int] = DEPTHS,
                 hot: HotKeys | None = None, detour_factor: float = 24.0, place_factor: float = 3.0,
                 learn_rate: float = 0.01,
                 placements: int = 65_536, outliers: OutlierDetector | None = None,
                 budget: RetryBudget | None = None, unreachable: Unreachable | None = None) -> None:
        self.rng = rng
        self.params = params
        self.depths = tuple(depths)
        self.detour_factor = detour_factor
        self.place_factor = place_factor
        self.local = LocalLoad()
        self.placements = Placements(placements)
        self.hot = hot if hot is not None else HotKeys()
        self.reuse = Reuse(learn_rate)
        self.outliers = outliers if outliers is not None else OutlierDetector()
        self.budget = budget if budget is not None else RetryBudget()
        self.unreachable = unreachable if unreachable is not None else Unreachable()
        self.view: View | None = None
        self.on_eject: Callable[[str, str, str], None] | None = None  # (replica id, pool group, reason)
        self._waiting: dict[str, dict[int, Attempt]] = {}  # streamed attempts without a first token, per replica
        self._prompted: dict[str, int] = {}  # prompt tokens sent to each replica in all (replicas of the table)
        self._checked = float("-inf")
        self.share = 1.0  # this proxy's share of its pools' load (apply_table); alone until seen otherwise
        self.steps: Steps | None = None  # where each decision step's time goes (dataplane.metrics.PickSteps)

    @classmethod
    def from_settings(cls, pick: PickSettings, rng: random.Random, *, region: str = "",
                      regions: RegionSettings | None = None, capacity_share: float = 1.0,
                      outliers: OutlierSettings | None = None, retries: RetrySettings | None = None) -> PickState:
        """A proxy's picker as its ``[proxy]`` settings describe it (the router's, and the simulator's).

        ``pick``: the decision's keys; ``region``: this proxy's; ``regions``: the
        spill step's; ``capacity_share``: this proxy's share of a region's slots
        (``admission_capacity_share``); ``outliers`` and ``retries``: the outlier
        detector's and the retry budget's (defaults when None). The decision's
        filters, scorers and picker are composed from ``pick.pick`` (``[proxy.pick]``,
        :func:`dataplane.pick.plugin.compose`; ConfigError naming the key).
        """
        regions = regions or RegionSettings()
        params = DecideParams(
            walk_limit=pick.walk_limit, region=region, spill_queue_ms=regions.spill_queue_ms,
            spill_headroom=regions.spill_headroom, capacity_share=capacity_share, plan=compose(pick))
        return cls(rng, params=params, depths=pick.prefix_depths, detour_factor=pick.detour_factor,
                   place_factor=pick.place_factor, hot=HotKeys(capacity=pick.hot_keys, window=pick.hot_window),
                   placements=pick.placements, outliers=OutlierDetector((outliers or OutlierSettings()).params()),
                   budget=(retries or RetrySettings()).budget(),
                   unreachable=Unreachable((outliers or OutlierSettings()).unreachable_params()))

    def reconfigure(self, pick: PickSettings, *, regions: RegionSettings, capacity_share: float,
                    outliers: OutlierSettings, retries: RetrySettings) -> None:
        """Swap the live parameters (a router config, :mod:`ferry.routerconfig`) and keep every state.

        The decision's parameters (walk limit, spill step, capacity share, telemetry ages: the plan recomposed
        with them, :func:`dataplane.pick.plugin.compose`), the detour and
        placement factors, the outlier detector's and the unreachable set's parameters, the retry budget's
        ratio and floor change; the in-flight load, placements, hot keys, reuse, outlier health and ejections,
        refused replicas and the budget's counts stay. Requests already deciding keep the view they began
        with; the next ones read the new one. Sizes (``placements``, ``hot_keys``, depths) are not live.
        """
        self.params = dataclasses.replace(
            self.params, walk_limit=pick.walk_limit, spill_queue_ms=regions.spill_queue_ms,
            spill_headroom=regions.spill_headroom, capacity_share=capacity_share, plan=compose(pick))
        self.detour_factor = pick.detour_factor
        self.place_factor = pick.place_factor
        self.outliers.params = outliers.params()
        self.unreachable.params = outliers.unreachable_params()
        self.budget.retune(ratio=retries.retry_budget_ratio, min_per_second=retries.retry_budget_min_per_second)
        if self.view is not None:
            self.view = make_view(self.view.table, self.params)

    def apply_table(self, table: Table) -> View:
        """A table was applied: its frozen view; the in-flight counts its loads include; departed replicas forgotten."""
        self.local.mark()
        present = {r.replica_id for entry in table.models.values()
                   for pool in (entry.default, *entry.by_version.values()) for r in pool}
        self.outliers.forget(present)
        if len(self.unreachable):
            self.unreachable.forget(present)
            self.unreachable.reported(_telemetry_times(table).get)
        self._prompted = {rid: n for rid, n in self._prompted.items() if rid in present}
        self.view = make_view(table, self.params)
        pushed, counted = 0.0, 0
        for entry in table.models.values():
            for r in entry.default:
                pushed += load(r)
                counted += self.local.counted.get(r.replica_id, 0)
        if pushed >= SHARE_MIN_LOAD:  # this proxy's share of the load its pools carry, smoothed over tables
            self.share += SHARE_WEIGHT * (min(1.0, counted / pushed) - self.share)
        return self.view

    def view_of(self, table: Table) -> View:
        """The view of ``table``: the applied one when it is, else built (a table a request started under)."""
        view = self.view
        if view is not None and view.table is table:
            return view
        return make_view(table, self.params)

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

    def decide(self, view: View, ask: Ask, now: float, *,
               queue: Callable[[], LocalQueue | None] | None = None) -> Decision:
        """The region and replica for one attempt (``now`` on the clock that stamped the table's ``applied_at``).

        With the ``ferry.proxy.pick`` logger at DEBUG, one ``pick`` event per decision: its branch, replica,
        the plan's parts, and the raw term of each scorer (and the cost) of each replica the decision weighed
        (at most ``MAX_NOTES``).
        """
        if not log.isEnabledFor(logging.DEBUG):
            return decide(view, ask, self._state(now, queue), self.rng, now)
        notes: Notes = []
        decision = decide(view, ask, self._state(now, queue, notes), self.rng, now)
        replica = decision.replica
        event(log, "pick", logging.DEBUG, model=ask.model, branch=decision.branch.value,
              replica=replica.replica_id if replica is not None else "", region=decision.region,
              plan=describe(view.params.plan), attempt=len(ask.tried) + 1,
              scores=[{"replica": rid, **terms, "cost": cost} for rid, terms, cost in notes[:MAX_NOTES]],
              scores_left_out=max(0, len(notes) - MAX_NOTES))
        return decision

    def region(self, view: View, ask: Ask, now: float, *,
               queue: Callable[[], LocalQueue | None] | None = None) -> Decision | None:
        """The decision's region step alone (:func:`.decide.region`): another region's replica, or None."""
        return region(view, ask, self._state(now, queue), self.rng, now)

    def _state(self, now: float, queue: Callable[[], LocalQueue | None] | None, notes: Notes | None = None) -> Local:
        """What this proxy knows at ``now``, as the decision reads it (the overdue streams looked at first)."""
        if now - self._checked >= OVERDUE_CHECK_SECONDS:
            self._checked = now
            self._overdue(now)
        choices = self.params.place_choices if self.share >= SOLE_SHARE else min(2, self.params.place_choices)
        margin = self.reuse.advantage() * self.place_factor * self.reuse.mean_prompt
        ejected = self.outliers.ejected(now)
        if len(self.unreachable):
            ejected = ejected | self.unreachable.excluded(now)
        return Local(self.local, ejected, self.detour(), self.placements, queue, choices, margin, self.steps, notes)

    def _overdue(self, now: float) -> None:
        """Tell the outlier detector how long each replica's oldest streamed attempt waits for a first token."""
        for waiting in self._waiting.values():
            oldest = next(iter(waiting.values()))
            pool = oldest.routing.pool
            self._report(oldest.replica_id, pool.group, self.outliers.overdue(
                oldest.replica_id, pool.group, waited=now - oldest.sent_at, now=now, pool_size=len(pool),
                work=oldest.routing.need.prompt_tokens + oldest.ahead))

    def _report(self, replica_id: str, group: str, reason: str | None) -> str | None:
        if reason is not None and self.on_eject is not None:
            self.on_eject(replica_id, group, reason)
        return reason

    def _wait(self, attempt: Attempt, waiting: bool) -> None:
        """Keep ``attempt`` among the streamed attempts waiting for a first token, or drop it."""
        if waiting:
            self._waiting.setdefault(attempt.replica_id, {})[id(attempt)] = attempt
            return
        at = self._waiting.get(attempt.replica_id)
        if at is not None and at.pop(id(attempt), None) is not None and not at:
            del self._waiting[attempt.replica_id]

    def detour(self) -> float:
        """The detour threshold as learned so far, in prompt tokens of backlog."""
        return self.reuse.advantage() * self.detour_factor * self.reuse.mean_prompt

    def sent(self, replica_id: str, routing: Routing, branch: Branch, now: float = 0.0, *,
             streamed: bool = True, queued: int = 0) -> Attempt:
        """A request was forwarded to ``replica_id``; the attempt to hand back to :meth:`first` and :meth:`done`.

        ``queued``: the requests the table says wait in the replica's own queue (every proxy's): the prefill
        work ahead of this one is taken as the larger of this proxy's backlog there and ``queued`` mean prompts.
        """
        key = routing.key
        known = key is not None and self.placements.get(key) is not None
        if key is not None and branch in REMEMBERED:
            self.placements.put(key, replica_id)
        ahead = max(self.local.prefill(replica_id), int(queued * self.reuse.mean_prompt))
        self.local.add(replica_id, routing.need.prompt_tokens)
        self._prompted[replica_id] = self._prompted.get(replica_id, 0) + routing.need.prompt_tokens
        attempt = Attempt(replica_id, routing, branch, sent_at=now, ahead=ahead, known=known, streamed=streamed)
        if streamed:
            self._wait(attempt, True)
        return attempt

    def first(self, attempt: Attempt, now: float | None = None) -> str | None:
        """The attempt's first token came back (at ``now``, when known): its prefill is done.

        With ``now``, the outlier detector gets the attempt's prefill sample; returns the ejection reason
        when that ejects the replica.
        """
        if attempt.prefilled:
            return None
        attempt.prefilled = True
        attempt.first_at = now
        self.local.first(attempt.replica_id, attempt.routing.need.prompt_tokens)
        # prompts still waiting for their prefill there will be prefilled while this one decodes
        attempt.mark = self._prompted.get(attempt.replica_id, 0) - self.local.prefill(attempt.replica_id)
        self._wait(attempt, False)
        if now is None:
            return None
        timing = Timing(sent=attempt.sent_at, first=now, ended=now, prompt_tokens=attempt.routing.need.prompt_tokens,
                        completion_tokens=1, ahead_tokens=attempt.ahead)
        pool = attempt.routing.pool
        return self._report(attempt.replica_id, pool.group, self.outliers.first_token(
            attempt.replica_id, pool.group, timing, now=now, pool_size=len(pool)))

    def done(self, attempt: Attempt, cached_tokens: int | None = None) -> None:
        """The attempt ended (either way); ``cached_tokens`` when the replica reported them."""
        prompt = attempt.routing.need.prompt_tokens
        self.local.done(attempt.replica_id, 0 if attempt.prefilled else prompt)
        self._wait(attempt, False)
        attempt.prefilled = True
        if cached_tokens is None or prompt <= 0:
            return
        if attempt.known and attempt.branch in HOME_BRANCHES:
            self.reuse.learn(True, cached_tokens, prompt)
        elif attempt.branch in ANY_BRANCHES:
            self.reuse.learn(False, cached_tokens, prompt)

    def progress(self, attempt: Attempt, tokens: int, now: float) -> str | None:
        """``tokens`` output tokens of a streamed attempt came back by ``now``: once ``probe_tokens`` after the
        first have, the outlier detector gets its decode sample; returns the ejection reason when it ejects."""
        if attempt.decode_sampled or attempt.first_at is None or tokens - 1 < self.outliers.params.probe_tokens:
            return None
        attempt.decode_sampled = True
        if self._overlapped(attempt):
            return None
        timing = Timing(sent=attempt.sent_at, first=attempt.first_at, ended=now,
                        prompt_tokens=attempt.routing.need.prompt_tokens, completion_tokens=tokens)
        pool = attempt.routing.pool
        return self._report(attempt.replica_id, pool.group, self.outliers.answered(
            attempt.replica_id, pool.group, timing, now=now, pool_size=len(pool)))

    def answered(self, attempt: Attempt, *, now: float, completion_tokens: int, cached_tokens: int = 0) -> str | None:
        """Feed an answered attempt to the outlier detector; the ejection reason when it ejects the replica.

        Replicas are compared with the others of the attempt's pool (one model version).
        """
        self.unreachable.answered(attempt.replica_id)
        timing = Timing(sent=attempt.sent_at, first=attempt.first_at, ended=now,
                        prompt_tokens=attempt.routing.need.prompt_tokens,
                        completion_tokens=0 if attempt.decode_sampled or self._overlapped(attempt)
                        else completion_tokens,
                        cached_tokens=cached_tokens, ahead_tokens=attempt.ahead)
        pool = attempt.routing.pool
        return self._report(attempt.replica_id, pool.group, self.outliers.answered(
            attempt.replica_id, pool.group, timing, now=now, pool_size=len(pool)))

    def _overlapped(self, attempt: Attempt) -> bool:
        """Whether this proxy sent the replica prompts to prefill while the attempt decoded (its steps were
        longer for them: not the replica's decode speed)."""
        return (attempt.first_at is not None and self._prompted.get(attempt.replica_id, 0) - attempt.mark
                >= self.outliers.params.min_prefill_tokens)

    def failed(self, attempt: Attempt, *, now: float, unreached: bool = False) -> str | None:
        """Feed a replica failure to the outlier detector; the ejection reason when it ejects the replica.

        ``unreached``: the connection was refused (:func:`dataplane.forward.failures.unreached`): the replica
        leaves the pick at once (:class:`dataplane.pick.unreachable.Unreachable`; reason ``unreachable``).
        """
        pool = attempt.routing.pool
        if unreached:
            taken = self.unreachable.refused(attempt.replica_id, now)
            return self._report(attempt.replica_id, pool.group, "unreachable" if taken else None)
        return self._report(attempt.replica_id, pool.group, self.outliers.failed(
            attempt.replica_id, pool.group, now=now, pool_size=len(pool)))




def _telemetry_times(table: Table) -> dict[str, float]:
    """When each replica of ``table`` last reported, on the clock of its ``applied_at``."""
    return {r.replica_id: table.applied_at - r.telemetry_age for entry in table.models.values()
            for pool in (entry.default, *entry.by_version.values()) for r in pool}
