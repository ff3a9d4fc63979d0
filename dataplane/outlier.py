"""Outlier ejection at the proxy: keep traffic off a replica that fails or is far slower than its peers.

Algorithm (after the outlier detection of service meshes), per replica of a
pool (``group``: the model):

- **Consecutive failures**: ``consecutive_failures`` (default 5) replica
  failures in a row eject it. A success resets the count.
- **Latency**: an exponentially weighted mean (weight ``alpha``, default
  0.3) of the seconds per output token of each answered request. Once a
  replica has ``min_samples`` (default 5) and so has at least one peer, it is
  ejected when its mean exceeds ``latency_factor`` (default 5) times the
  median of its peers' means.
- **Ejection period**: ``base_ejection_seconds`` (default 2 s) times 2^(n-1)
  for its n-th ejection in a row, at most ``max_ejection_seconds`` (60 s);
  n falls back to 0 once a replica stayed admitted for
  ``max_ejection_seconds``. A readmitted replica starts with fresh
  statistics (its old ones describe the past) and gets traffic again; if it
  is still bad it is ejected again, for twice as long.
- **Cap**: at most ``max_ejected_share`` (default 10 %) of a pool's replicas
  are ejected at once, but at least one (a pool of two may lose one, never
  both); an outlier over the cap stays in.

Pure: the clock is an argument. Cost: :meth:`OutlierDetector.record` O(1),
plus O(peers) for the latency test (a median over the pool's replicas);
:meth:`OutlierDetector.ejected` O(1) until an ejection ends (then O(ejected)).
Memory: one small entry per replica seen, dropped by :meth:`forget`.
"""

from __future__ import annotations

import dataclasses
import statistics

from ferry.errors import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class OutlierParams:
    """See the module docstring for the meaning and defaults."""

    consecutive_failures: int = 5
    alpha: float = 0.3
    min_samples: int = 5
    latency_factor: float = 5.0
    base_ejection_seconds: float = 2.0
    max_ejection_seconds: float = 60.0
    max_ejected_share: float = 0.1

    def __post_init__(self) -> None:
        if self.consecutive_failures < 1 or self.min_samples < 1:
            raise ConfigError("proxy.outlier", "consecutive_failures and min_samples must be >= 1")
        if not 0 < self.alpha <= 1 or not self.latency_factor > 1:
            raise ConfigError("proxy.outlier", "alpha must be in (0, 1] and latency_factor above 1")
        if not 0 < self.base_ejection_seconds <= self.max_ejection_seconds:
            raise ConfigError("proxy.outlier", "need 0 < base_ejection_seconds <= max_ejection_seconds")
        if not 0 <= self.max_ejected_share <= 1:
            raise ConfigError("proxy.outlier", "max_ejected_share must be in [0, 1]")


@dataclasses.dataclass(slots=True)
class _Health:
    group: str
    failures: int = 0
    mean: float = 0.0
    samples: int = 0
    ejections: int = 0
    until: float = 0.0  # ejected while now < until
    admitted_at: float = 0.0


class OutlierDetector:
    """Feeds on request results; :meth:`ejected` is the set of replica ids to keep traffic off."""

    def __init__(self, params: OutlierParams | None = None) -> None:
        self.params = params or OutlierParams()
        self._health: dict[str, _Health] = {}
        self._ejected: dict[str, float] = {}  # replica id -> until
        self._next_end = float("inf")
        self._view: frozenset[str] = frozenset()

    def ejected(self, now: float) -> frozenset[str]:
        """Replica ids ejected at ``now`` (readmits those whose period ended)."""
        if now >= self._next_end:
            for rid in [r for r, until in self._ejected.items() if until <= now]:
                del self._ejected[rid]
                health = self._health.get(rid)
                if health is not None:
                    health.failures, health.mean, health.samples, health.admitted_at = 0, 0.0, 0, now
            self._next_end = min(self._ejected.values(), default=float("inf"))
            self._view = frozenset(self._ejected)
        return self._view

    def record(self, replica_id: str, group: str, *, ok: bool, seconds_per_token: float | None, now: float,
               pool_size: int) -> str | None:
        """One request's result on ``replica_id``; returns the ejection reason when it ejects the replica."""
        health = self._health.get(replica_id)
        if health is None:
            health = self._health[replica_id] = _Health(group=group, admitted_at=now)
        if replica_id in self.ejected(now):
            return None  # a request sent before the ejection: the verdict is in
        p = self.params
        if not ok:
            health.failures += 1
            if health.failures >= p.consecutive_failures:
                return self._eject(replica_id, health, now, pool_size, "failures")
            return None
        health.failures = 0
        if seconds_per_token is None:
            return None
        health.mean = seconds_per_token if not health.samples else (
            p.alpha * seconds_per_token + (1 - p.alpha) * health.mean)
        health.samples += 1
        if health.samples < p.min_samples:
            return None
        peers = [h.mean for rid, h in self._health.items()
                 if h.group == group and rid != replica_id and h.samples >= p.min_samples
                 and rid not in self._ejected]
        if peers and health.mean > p.latency_factor * statistics.median(peers):
            return self._eject(replica_id, health, now, pool_size, "latency")
        return None

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
        return reason

    def forget(self, keep: set[str]) -> None:
        """Drop the state of replicas not in ``keep`` (those that left the table)."""
        for rid in [r for r in self._health if r not in keep]:
            del self._health[rid]
            if self._ejected.pop(rid, None) is not None:
                self._view = frozenset(self._ejected)
        self._next_end = min(self._ejected.values(), default=float("inf"))
