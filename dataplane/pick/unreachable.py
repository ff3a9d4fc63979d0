"""Replicas whose connection was refused: out of the pick at once, until their agent reports them again.

A refused connection is not a slow or flaky replica for outlier ejection
(:mod:`dataplane.pick.outlier`) to count to ``consecutive_failures``: nothing
listens there (its process or node is gone), and every request sent there
until the table drops it would be refused too. So the first refusal this
proxy sees takes the replica out of its pick, with no cap on the share of a
pool (a pool whose every replica refuses has nothing to serve with).

Readmission, whichever comes first:

- **Fresh telemetry**: a table carries telemetry for the replica taken after
  the refusal (the table's ``applied_at`` minus the replica's
  ``telemetry_age``, on the proxy's clock, later than the refusal): its agent
  saw it alive since. A dead node's agent reports nothing, so its replicas
  stay out until the table drops them.
- **Re-probe**: ``probe_seconds`` (default 5 s) after the refusal, doubling
  with each refusal in a row up to ``max_probe_seconds`` (60 s), the replica
  is admitted again, so that one request probes it (a live replica whose
  table is unchanged, and so not pushed again, is not kept out for good). A
  refused probe costs that request one uncharged retry
  (:mod:`dataplane.failover.budget`) and takes the replica out again.

Pure: the clock is an argument. Cost: :meth:`Unreachable.refused` O(1);
:meth:`Unreachable.excluded` O(1) until a probe is due (then O(excluded));
:meth:`Unreachable.reported` O(excluded). Memory: one entry per excluded
replica and one per replica refused in a row, dropped by :meth:`forget`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection

from ferry.errors import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class UnreachableParams:
    """See the module docstring."""

    probe_seconds: float = 5.0
    max_probe_seconds: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.probe_seconds <= self.max_probe_seconds:
            raise ConfigError("proxy.unreachable_probe_seconds",
                              "need 0 < unreachable_probe_seconds <= unreachable_max_probe_seconds")


class Unreachable:
    """The replicas refused since their last report; :meth:`excluded` is the set to keep traffic off."""

    def __init__(self, params: UnreachableParams | None = None) -> None:
        self.params = params or UnreachableParams()
        self._since: dict[str, float] = {}  # replica id -> when it was refused (excluded while present)
        self._until: dict[str, float] = {}  # replica id -> when it is probed again
        self._streak: dict[str, int] = {}  # replica id -> refusals in a row (cleared by a report)
        self._next = float("inf")
        self._view: frozenset[str] = frozenset()

    def __len__(self) -> int:
        return len(self._since)

    def refused(self, replica_id: str, now: float) -> bool:
        """A connection to ``replica_id`` was refused at ``now``; True when this takes it out of the pick."""
        if replica_id in self._since:
            return False
        streak = self._streak[replica_id] = self._streak.get(replica_id, 0) + 1
        p = self.params
        until = now + min(p.probe_seconds * 2 ** (streak - 1), p.max_probe_seconds)
        self._since[replica_id], self._until[replica_id] = now, until
        self._next = min(self._next, until)
        self._view = frozenset(self._since)
        return True

    def answered(self, replica_id: str) -> None:
        """A request to ``replica_id`` was answered: its refusal streak ends."""
        if self._streak:
            self._streak.pop(replica_id, None)

    def excluded(self, now: float) -> frozenset[str]:
        """Replica ids out of the pick at ``now`` (readmits those whose probe is due)."""
        if now >= self._next:
            for rid in [r for r, until in self._until.items() if until <= now]:
                self._drop(rid)
            self._refresh()
        return self._view

    def reported(self, telemetry_at: Callable[[str], float | None]) -> list[str]:
        """A table was applied: readmit the replicas whose telemetry (``telemetry_at(id)``, on the clock of
        :meth:`refused`; None when the table does not carry the replica) is newer than their refusal;
        returns them. Their refusal streak ends."""
        back = []
        for rid, since in self._since.items():
            at = telemetry_at(rid)
            if at is not None and at > since:
                back.append(rid)
        for rid in back:
            self._drop(rid)
            self._streak.pop(rid, None)
        if back:
            self._refresh()
        return back

    def forget(self, keep: Collection[str]) -> None:
        """Drop the state of replicas not in ``keep`` (those that left the table)."""
        gone = [rid for rid in self._streak if rid not in keep]
        for rid in gone:
            self._drop(rid)
            del self._streak[rid]
        if gone:
            self._refresh()

    def _drop(self, replica_id: str) -> None:
        self._since.pop(replica_id, None)
        self._until.pop(replica_id, None)

    def _refresh(self) -> None:
        self._next = min(self._until.values(), default=float("inf"))
        self._view = frozenset(self._since)
