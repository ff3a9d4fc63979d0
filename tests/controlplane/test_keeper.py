"""The lease keeper's decision (:func:`controlplane.store.etcdkeeper.stand_ins`), case by case."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from controlplane.store.etcdkeeper import Held, stand_ins

NOW = 100.0
TTL = 3.0


@dataclass(frozen=True)
class Case:
    id: str
    stalled: float  # seconds since the owner's loop ticked
    asked_ago: float  # the owner's last ask
    sent_ago: float  # the last answered refresh
    pending: bool = False
    ttl: float = TTL
    refresh: bool = False
    drop: bool = False


CASES = [
    Case("owner-runs", stalled=0.1, asked_ago=0.5, sent_ago=2.0),
    Case("owner-runs-lease-abandoned", stalled=0.1, asked_ago=6.5, sent_ago=6.5, drop=True),
    Case("stalled-due", stalled=2.0, asked_ago=2.5, sent_ago=1.5, refresh=True),
    Case("stalled-not-due", stalled=1.0, asked_ago=1.2, sent_ago=1.2),
    Case("stalled-already-refreshing", stalled=2.0, asked_ago=2.5, sent_ago=1.6, pending=True),
    Case("stalled-ttl-unknown", stalled=2.0, asked_ago=2.5, sent_ago=1.6, ttl=0.0),
    Case("stalled-owner-had-stopped-asking", stalled=2.0, asked_ago=5.5, sent_ago=5.5),
    Case("stalled-past-the-bound", stalled=10.5, asked_ago=11.0, sent_ago=1.6),
    Case("stalled-just-now", stalled=0.2, asked_ago=1.5, sent_ago=1.5),
    Case("stalled-at-the-threshold", stalled=0.25, asked_ago=1.5, sent_ago=1.5, refresh=True),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_stand_ins(case: Case) -> None:
    held = {7: Held(ttl=case.ttl, asked=NOW - case.asked_ago, sent=NOW - case.sent_ago, pending=case.pending)}
    refresh, drop = stand_ins(held, now=NOW, stalled=case.stalled, stall_seconds=0.25, stand_in_seconds=10.0)
    assert (refresh == [7], drop == [7]) == (case.refresh, case.drop)
