"""Cold start: a request for a model version whose replicas are all warming (pure: no I/O, clock passed in).

The control plane lists, per model and region, the versions with replicas
``warming`` (``ModelRoute.warming``); warming replicas are never in the
routable set, so they get no traffic. When a request's version (the one it
names, or the default a request without one resolves to) has no ready
replica but is warming, the proxy either waits for it or refuses at once:

- **expected warm-up left** (:func:`expected_ready`): ``warmup_seconds``
  (``[proxy] coldstart_warmup_seconds``, default 30 s: no agent reports a
  warm-up estimate today) minus how long this proxy has seen the version
  warming without a break (:func:`dataplane.table.warming.carry` keeps that
  start across tables, as the table is applied),
  at least ``floor`` (``[proxy] retry_after_seconds``, 1 s);
- **decision** (:func:`wait_seconds`): the request may wait at most
  ``min(tier queue timeout, deadline left - margin)`` (the tier's queue
  timeouts, 2 / 10 / 60 s by default: what the tenant's tier allows). If the
  expected warm-up fits, it waits that long for a table in which the version
  has a ready replica, then proceeds; else, or when the wait runs out, it
  ends UNAVAILABLE (:class:`WarmingUp`) with ``retry-after`` = the expected
  warm-up left, in the trailing metadata, and a message naming the version.

Cost: O(1) per request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from dataplane.table.warming import Warming
from ferry.errors import NoReplica


class WarmingUp(NoReplica):
    """The version has replicas warming and none ready: UNAVAILABLE with ``retry_after`` seconds."""

    def __init__(self, model: str, version: str, warming: Warming, retry_after: float) -> None:
        super().__init__(model, f"version {version!r} is warming up ({warming.replicas} replica(s) warming, "
                                f"none ready); retry after {retry_after:.3g} s")
        self.version = version
        self.retry_after = retry_after


def find(warming: Mapping[str, Warming], version: str) -> Warming | None:
    """The warming entry of ``version``; with no version (a pool of every version), the longest warming."""
    if version:
        return warming.get(version)
    return min(warming.values(), key=lambda w: w.since, default=None)


def expected_ready(warming: Warming, now: float, *, warmup_seconds: float, floor: float) -> float:
    """Seconds until a ready replica is expected: the warm-up left, at least ``floor``."""
    left = warmup_seconds - max(0.0, now - warming.since)
    return max(floor, left) if math.isfinite(left) else floor


def wait_seconds(expected: float, *, queue_timeout: float, deadline_left: float, margin: float) -> float:
    """How long the request may wait for a ready replica (0: refuse now).

    It waits when the expected warm-up fits in what its tier's queue and its deadline allow.
    """
    allowed = min(queue_timeout, deadline_left - margin)
    return allowed if allowed > 0 and expected <= allowed else 0.0
