"""Outlier ejection at the proxy: keep traffic off a replica that fails, or that is far slower than its peers
at what it controls.

Algorithm (the outlier detection of service meshes, with a latency test fit
for LLM traffic), per replica of a pool (``group``: the model):

- **Consecutive failures**: ``consecutive_failures`` (default 5) replica
  failures in a row eject it. A success resets the count.
- **Latency, split by phase.** A request's time says little by itself: a
  10 k-token prompt with a 3-token answer takes long on a healthy replica,
  and so does a request queued behind other prompts. Two rates are kept per
  replica, each a ratio of decayed sums (time constant ``window_seconds``,
  default 10 s; weighted by work, so one stalled request among many moves
  it little):

  - *decode*: seconds per output token after the first, ``(now - first) /
    (tokens - 1)``, taken once per streamed attempt, when ``probe_tokens``
    (default 16) tokens after the first have come back (so a slow replica is
    seen before its long answers end), or at the end of a shorter answer with
    at least ``min_decode_tokens`` (default 4) tokens after the first. An
    engine's step decodes the whole batch and prefills new prompts, so a
    replica's decode is slower while it prefills: an attempt during whose
    decode this proxy sent the replica ``min_prefill_tokens`` or more prompt
    tokens gives no decode sample (:class:`dataplane.pick.state.PickState` knows). A unary call gives no first-token
    time: it counts as decode only when its prompt is short (under
    ``min_prefill_tokens``), so its time is nearly all decode.
  - *prefill*: taken when the first token comes back (so a slow replica is
    seen before its long answers end), seconds to the first token per prompt
    token of prefill work, ``(first - sent) / (prompt tokens + prompt tokens
    this proxy had already sent there without a first token)``: the work ahead of the
    request counts, so a replica is not judged slow for being busy, nor for
    long prompts. Only requests with at least ``min_prefill_tokens`` (default
    4,096) prompt tokens count: a shorter prompt's time to first
    token is mostly the engine's step granularity (a decode step of a full
    batch, 20 ms or so, against 20 µs a prompt token), not its speed.

  Once a replica's rate has ``min_samples`` (default 5) requests in it and a
  peer's has too, it is ejected when the rate exceeds ``latency_factor``
  (default 8: over an hour of the Mooncake trace on 16 simulated replicas
  behind 4 proxies, healthy replicas' decode rates reached 5 to 7 times the
  median while other proxies' prompts, which this one cannot see, were
  prefilling there; a replica ten times slower is far past it) times the
  median of its admitted peers' rates, for either phase (metric reason
  ``latency``; the log says which phase), or when each of its last
  ``streak_samples`` (default 3) samples alone was (a replica that just
  became slow is seen before its decayed rate catches up).
- **Overdue**: a replica that is slow gets little traffic (the decision
  routes around its backlog), so its answers, and their samples, come
  slowly. A streamed attempt still waiting for its first token is evidence
  too: its wait over its prefill work is a lower bound of its prefill rate,
  and once the attempt has waited ``overdue_seconds`` (default 5 s) and that
  bound exceeds ``overdue_factor`` (default 10) times the peers' median
  (:meth:`OutlierDetector.overdue`), the replica is ejected without waiting
  for more samples. (A healthy replica's short request can wait a second or
  two behind another proxy's 100 k-token prompt, which this proxy cannot
  see: hence the floor.)
- **Ejection period**: ``base_ejection_seconds`` (default 2 s) times 2^(n-1)
  for its n-th ejection in a row, at most ``max_ejection_seconds`` (60 s);
  n falls back to 0 once a replica stayed admitted for
  ``max_ejection_seconds``. A readmitted replica starts with fresh
  statistics (its old ones describe the past) and gets traffic again; if it
  is still bad it is ejected again, for twice as long.
- **Cap**: at most ``max_ejected_share`` (default 10 %) of a pool's replicas
  are ejected at once, but at least one (a pool of two may lose one, never
  both); an outlier over the cap stays in.

An ejected replica leaves the pick as any filtered replica does
(:func:`dataplane.pick.decide.decide`): a key whose home it is goes to the next
replica of its walk; nobody else's affinity changes.

Pure: the clock is an argument. Cost: :meth:`OutlierDetector.record` O(1),
plus O(peers) for the latency test (a median over the pool's replicas);
:meth:`OutlierDetector.ejected` O(1) until an ejection ends (then O(ejected)).
Memory: one small entry per replica seen, dropped by :meth:`forget`.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import deque

from ferry.errors import ConfigError

DECODE, PREFILL = "decode", "prefill"


@dataclasses.dataclass(frozen=True, kw_only=True)
class OutlierParams:
    """See the module docstring for the meaning and defaults."""

    consecutive_failures: int = 5
    window_seconds: float = 10.0
    min_samples: int = 5
    min_decode_tokens: int = 4
    probe_tokens: int = 16
    streak_samples: int = 3
    overdue_factor: float = 10.0
    overdue_seconds: float = 5.0
    min_prefill_tokens: int = 4096
    latency_factor: float = 5.0
    base_ejection_seconds: float = 2.0
    max_ejection_seconds: float = 60.0
    max_ejected_share: float = 0.1

    def __post_init__(self) -> None:
        if self.consecutive_failures < 1 or self.min_samples < 1:
            raise ConfigError("proxy.outlier", "consecutive_failures and min_samples must be >= 1")
        if not self.window_seconds > 0 or not self.latency_factor > 1:
            raise ConfigError("proxy.outlier", "window_seconds must be above 0 and latency_factor above 1")
        if self.min_decode_tokens < 1 or self.min_prefill_tokens < 1 or self.probe_tokens < self.min_decode_tokens:
            raise ConfigError("proxy.outlier", "min_decode_tokens and min_prefill_tokens must be >= 1, probe_tokens "
                                               "at least min_decode_tokens")
        if not 0 < self.base_ejection_seconds <= self.max_ejection_seconds:
            raise ConfigError("proxy.outlier", "need 0 < base_ejection_seconds <= max_ejection_seconds")
        if not 0 <= self.max_ejected_share <= 1:
            raise ConfigError("proxy.outlier", "max_ejected_share must be in [0, 1]")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """One answered attempt as the proxy saw it (seconds on one clock; ``first`` None: no first-token time)."""

    sent: float
    first: float | None
    ended: float
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0   # prompt tokens the replica served from cache (0 when it does not say)
    ahead_tokens: int = 0    # prompt tokens this proxy had sent there without a first token, at send time


@dataclasses.dataclass(slots=True)
class _Rate:
    """Decayed sums of seconds and work; the rate is their ratio."""

    seconds: float = 0.0
    work: float = 0.0
    samples: int = 0
    at: float = 0.0
    streak: int = 0  # samples in a row, the latest included, each above the ejection bound by itself

    def add(self, seconds: float, work: float, now: float, window: float) -> None:
        keep = math.exp(-max(0.0, now - self.at) / window) if self.samples else 0.0
        self.seconds = self.seconds * keep + seconds
        self.work = self.work * keep + work
        self.samples += 1
        self.at = now

    @property
    def value(self) -> float:
        return self.seconds / self.work if self.work > 0 else 0.0


@dataclasses.dataclass(slots=True)
class _Health:
    """One replica's health as the detector sees it: failures in a row, decode and prefill rates, ejections."""

    group: str
    failures: int = 0
    decode: _Rate = dataclasses.field(default_factory=_Rate)
    prefill: _Rate = dataclasses.field(default_factory=_Rate)
    ejections: int = 0
    until: float = 0.0  # ejected while now < until
    admitted_at: float = 0.0

    def rate(self, phase: str) -> _Rate:
        return self.decode if phase == DECODE else self.prefill


def samples(timing: Timing, p: OutlierParams) -> list[tuple[str, float, float]]:
    """The (phase, seconds, work) samples one answered attempt gives; see the module docstring.

    A streamed attempt's prefill sample is :func:`prefill_sample`, taken when its first token came back.
    """
    if timing.first is None:
        if timing.prompt_tokens < p.min_prefill_tokens and timing.completion_tokens >= p.min_decode_tokens:
            return [(DECODE, timing.ended - timing.sent, float(timing.completion_tokens))]
        return []
    after = timing.completion_tokens - 1
    if after >= p.min_decode_tokens:
        return [(DECODE, max(0.0, timing.ended - timing.first), float(after))]
    return []


def prefill_sample(timing: Timing, p: OutlierParams) -> tuple[str, float, float] | None:
    """The prefill sample of an attempt whose first token came back at ``timing.first``, or None.

    At that moment the cached tokens are not known yet: ``timing.cached_tokens`` is what the caller knows
    (0: the whole prompt counts as work, which can only make a replica look faster, never slower).
    """
    if timing.first is None:
        return None
    uncached = max(0, timing.prompt_tokens - timing.cached_tokens)
    if uncached < p.min_prefill_tokens:
        return None
    return PREFILL, max(0.0, timing.first - timing.sent), float(uncached + timing.ahead_tokens)


class OutlierDetector:
    """Feeds on request results; :meth:`ejected` is the set of replica ids to keep traffic off."""

    def __init__(self, params: OutlierParams | None = None) -> None:
        self.params = params or OutlierParams()
        self._health: dict[str, _Health] = {}
        self._ejected: dict[str, float] = {}  # replica id -> until
        self._next_end = float("inf")
        self._view: frozenset[str] = frozenset()
        self.last_phase = ""  # the phase of the last latency ejection (for the log)
        self.history: deque[tuple[float, str, str]] = deque(maxlen=256)  # (when, replica id, reason), latest last

    def ejected(self, now: float) -> frozenset[str]:
        """Replica ids ejected at ``now`` (readmits those whose period ended)."""
        if now >= self._next_end:
            for rid in [r for r, until in self._ejected.items() if until <= now]:
                del self._ejected[rid]
                health = self._health.get(rid)
                if health is not None:
                    health.failures, health.admitted_at = 0, now
                    health.decode, health.prefill = _Rate(), _Rate()
            self._next_end = min(self._ejected.values(), default=float("inf"))
            self._view = frozenset(self._ejected)
        return self._view

    def _entry(self, replica_id: str, group: str, now: float) -> _Health:
        health = self._health.get(replica_id)
        if health is None:
            health = self._health[replica_id] = _Health(group=group, admitted_at=now)
        return health

    def failed(self, replica_id: str, group: str, *, now: float, pool_size: int) -> str | None:
        """A replica failure on ``replica_id``; returns ``failures`` when it ejects the replica."""
        health = self._entry(replica_id, group, now)
        if replica_id in self.ejected(now):
            return None  # a request sent before the ejection: the verdict is in
        health.failures += 1
        if health.failures >= self.params.consecutive_failures:
            return self._eject(replica_id, health, now, pool_size, "failures")
        return None

    def answered(self, replica_id: str, group: str, timing: Timing, *, now: float, pool_size: int) -> str | None:
        """An answered attempt on ``replica_id`` (its decode sample); returns ``latency`` when it ejects it."""
        health = self._entry(replica_id, group, now)
        if replica_id in self.ejected(now):
            return None
        health.failures = 0
        for phase, seconds, work in samples(timing, self.params):
            reason = self._judge(replica_id, health, phase, seconds, work, now, pool_size)
            if reason is not None:
                return reason
        return None

    def first_token(self, replica_id: str, group: str, timing: Timing, *, now: float, pool_size: int) -> str | None:
        """An attempt's first token came back (its prefill sample); returns ``latency`` when it ejects the replica."""
        sample = prefill_sample(timing, self.params)
        if sample is None:
            return None
        health = self._entry(replica_id, group, now)
        if replica_id in self.ejected(now):
            return None
        return self._judge(replica_id, health, *sample, now, pool_size)

    def overdue(self, replica_id: str, group: str, *, waited: float, work: float, now: float,
                pool_size: int) -> str | None:
        """An attempt on ``replica_id`` waited ``waited`` seconds for its first token, for ``work`` prompt tokens
        (its own and those ahead of it): ``latency`` when that alone is ``overdue_factor`` x the peers' rate."""
        p = self.params
        if waited < p.overdue_seconds or work < p.min_prefill_tokens or replica_id in self.ejected(now):
            return None
        health = self._entry(replica_id, group, now)
        peers = self._peers(replica_id, group, PREFILL)
        if peers and waited / work > p.overdue_factor * statistics.median(peers):
            reason = self._eject(replica_id, health, now, pool_size, "latency")
            if reason is not None:
                self.last_phase = PREFILL
            return reason
        return None

    def _judge(self, replica_id: str, health: _Health, phase: str, seconds: float, work: float, now: float,
               pool_size: int) -> str | None:
        """Add one sample; eject when the replica's rate, or each of its last ``streak_samples`` samples, is
        ``latency_factor`` x its peers' median rate."""
        p = self.params
        rate = health.rate(phase)
        rate.add(seconds, work, now, p.window_seconds)
        peers = self._peers(replica_id, health.group, phase)
        if not peers:
            return None
        bound = p.latency_factor * statistics.median(peers)
        rate.streak = rate.streak + 1 if work > 0 and seconds / work > bound else 0
        if (rate.samples >= p.min_samples and rate.value > bound) or rate.streak >= p.streak_samples:
            reason = self._eject(replica_id, health, now, pool_size, "latency")
            if reason is not None:
                self.last_phase = phase
            return reason
        return None

    def _peers(self, replica_id: str, group: str, phase: str) -> list[float]:
        """The ``phase`` rates of the admitted replicas of ``group`` with enough samples, ``replica_id`` left out."""
        least = self.params.min_samples
        return [h.rate(phase).value for rid, h in self._health.items()
                if h.group == group and rid != replica_id and h.rate(phase).samples >= least
                and rid not in self._ejected]

    def _eject(self, replica_id: str, health: _Health, now: float, pool_size: int, reason: str) -> str | None:
        p = self.params
        in_group = sum(1 for rid in self._ejected if self._health[rid].group == health.group)
        if in_group >= max(1, int(p.max_ejected_share * pool_size)):
            return None
        if now - health.admitted_at >= p.max_ejection_seconds:
            health.ejections = 0
        health.ejections += 1
        period = min(p.base_ejection_seconds * 2 ** (health.ejections - 1), p.max_ejection_seconds)
        health.until = now + period
        self._ejected[replica_id] = health.until
        self._next_end = min(self._next_end, health.until)
        self._view = frozenset(self._ejected)
        self.history.append((now, replica_id, reason))
        return reason

    def forget(self, keep: set[str]) -> None:
        """Drop the state of replicas not in ``keep`` (those that left the table)."""
        for rid in [r for r in self._health if r not in keep]:
            del self._health[rid]
            if self._ejected.pop(rid, None) is not None:
                self._view = frozenset(self._ejected)
        self._next_end = min(self._ejected.values(), default=float("inf"))
