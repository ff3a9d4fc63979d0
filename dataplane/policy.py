"""Small pure policies of the request path besides the pick: retry, and the in-flight bound.

- :func:`retry_reason`: retry on another replica when the failure is a
  :class:`ferry.errors.ReplicaFailed` marked retryable (no output reached the
  client; a transport or replica error, not a bad request), the request's
  tier is in ``retry_tiers`` (default: interactive only) and attempts are
  left (``max_attempts``, default 2 = one retry). Returns the metric reason
  label, or None for no retry.
- :class:`InflightLimit`: at most ``limit`` requests in flight in the proxy
  (default 4096); :meth:`InflightLimit.enter` raises
  :class:`ferry.errors.Overloaded` with the retry-after to send back.
- :class:`LocalLoad`: this proxy's in-flight requests per replica (the local
  term of the pick's score), and the prompt tokens it sent each replica that
  have not yet produced a first token (its view of the replica's prefill
  backlog, behind the pick's spill test); entries vanish at zero, so its
  size is bounded by the requests in flight. :meth:`LocalLoad.mark`, on each
  table applied, keeps the counts as ``counted``: the in-flight requests the
  table's pushed loads already include (approximately: the telemetry was
  sampled shortly before), so that the pick does not count them twice;
  :meth:`LocalLoad.observe` learns how long a request lasts here (an
  exponential average of answered forwards, weight 0.05), and
  :meth:`LocalLoad.trust` says how much of a pushed load sampled ``age``
  seconds ago still stands: ``1 - age / duration``, clamped to [0, 1] (1
  until a duration is known). Requests that last less than the telemetry's
  age have all been replaced since the sample: its imbalance between
  replicas is gone, and only this proxy's own in-flight count is current.

Cost: O(1) each.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping

from ferry.errors import FerryError, Overloaded, ReplicaFailed


def retry_reason(error: FerryError, *, tier: str, attempts: int, max_attempts: int,
                 retry_tiers: Collection[str]) -> str | None:
    """The retry reason label if the request should try another replica, else None."""
    if not isinstance(error, ReplicaFailed) or not error.retryable or error.output_started:
        return None
    if tier not in retry_tiers or attempts >= max_attempts:
        return None
    kind = getattr(error, "kind", "")
    return kind if isinstance(kind, str) and kind else "replica_failed"


class InflightLimit:
    """A counter with a ceiling: the proxy's bound on requests in flight."""

    def __init__(self, limit: int, retry_after: float) -> None:
        self.limit = limit
        self.retry_after = retry_after
        self.count = 0

    def enter(self) -> None:
        """Take a slot; raises Overloaded when all ``limit`` are taken."""
        if self.count >= self.limit:
            raise Overloaded(f"proxy in-flight limit of {self.limit} requests reached", self.retry_after)
        self.count += 1

    def leave(self) -> None:
        """Give a slot back."""
        self.count -= 1


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
