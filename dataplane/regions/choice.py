"""The proxy's region choice: step 3 of the request path (docs/design.md), applying the table's spill weights.

Algorithm: the table gives, for the proxy's region, the share of its
interactive traffic to send to each other region (computed by the control
plane: :mod:`controlplane.regions.weights`). With one uniform draw ``u`` in [0, 1)
per request, the request goes to the first region whose cumulative weight
exceeds ``u``, in the table's order; past the sum of the weights it stays
local. The tiers in ``tiers`` (default: interactive) draw on ``weight``,
over the routes within the interactive budget (not ``batch_only``); the
tiers in ``batch_tiers`` (default: batch) draw the same way on
``batch_weight``, over every route, whatever its round trip (the control
plane's :func:`controlplane.regions.weights.batch_weights`: idle capacity); standard
stays local. A region whose replicas
the proxy cannot use for this model (none routable) is skipped, so the
request stays local rather than failing.

Returns a :class:`RegionChoice` (region, rtt_ms, branch ``local`` or
``spilled``); the branch is a metric label and a test assertion.

Spill on queue (:func:`spill_on_queue`), for a request the weights keep
local: the weights follow the control plane's view, a second or two late,
and a burst (or a weight a little too small) would queue here. So when the
local admission queue (:class:`LocalQueue`) would make the request wait
longer than ``max(threshold_ms, rtt)`` (default 100 ms; the wait is the
:func:`local_wait_ms` estimate: the dispatches it needs before it starts,
``waiting + 1``, over the queue's interactive dispatch rate), the request
goes to the nearest target (not ``batch_only``) that is faster than waiting (``rtt < wait``)
and has *room* for this proxy (:func:`room`): ``(headroom x slots -
others) x share - in-flight``, with ``headroom`` 1.25 (the proxy's
``spill_headroom``: a quarter of the slots again may wait at the target's
replicas, a fraction of a service time each; this proxy's in-flight count
also holds what is still on the way there and back), ``others`` the load in the table less what of it was
this proxy's (its in-flight there when the table was applied), ``share``
the share of the traffic this proxy sends and ``in-flight`` its requests
there now. Branch ``queue``.

Both together (:func:`region_for`, what the proxy and the simulator run):
the weighted draw first (checked against the target's room only with
``weighted_room``: the proxy leaves the weights as planned, since the
control plane already lowers them when the target's waits grow, and a
stale room would hold back the planned share), then the spill on queue.
Room is worked out only when it is needed.

Pure: the random draw is an argument. Cost: O(targets), a handful, plus the
rooms when needed: O(the targets' replicas).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Protocol

from ferry.config import TIERS

DEFAULT_QUEUE_MS = 100.0
DEFAULT_HEADROOM = 1.25


class RegionBranch(enum.StrEnum):
    """How the region was chosen."""

    LOCAL = "local"
    SPILLED = "spilled"
    QUEUE = "queue"  # spilled because the local queue would wait longer than the round trip


@dataclasses.dataclass(frozen=True, slots=True)
class SpillTarget:
    """Another region this proxy may send a share of its interactive traffic to."""

    region: str
    weight: float  # share of the local region's interactive traffic, 0..1
    rtt_ms: float  # configured round trip to it
    batch_weight: float = 0.0  # share of the local region's batch traffic, 0..1
    batch_only: bool = False  # beyond the interactive budget: batch alone goes there


@dataclasses.dataclass(frozen=True, slots=True)
class RegionChoice:
    """Where a request goes: its region, the round trip it costs, and why."""

    region: str
    rtt_ms: float
    branch: RegionBranch


def choose_region(local: str, targets: Sequence[SpillTarget], *, tier: str, u: float,
                  usable: Collection[str] = (), tiers: Collection[str] = ("interactive",),
                  batch_tiers: Collection[str] = ("batch",)) -> RegionChoice:
    """The region for one request; ``usable``: the regions with a routable replica of its model."""
    batch = tier in batch_tiers
    if tier in tiers or batch:
        edge = 0.0
        for target in targets:
            if not batch and target.batch_only:
                continue
            edge += target.batch_weight if batch else target.weight
            if u < edge:
                if target.region in usable:
                    return RegionChoice(target.region, target.rtt_ms, RegionBranch.SPILLED)
                break
    return RegionChoice(local, 0.0, RegionBranch.LOCAL)


@dataclasses.dataclass(frozen=True, slots=True)
class LocalQueue:
    """The proxy's admission queue of a model as a new interactive request finds it."""

    waiting: int  # interactive requests waiting (dispatched before a newcomer)
    running: int  # requests of every tier running
    capacity: int  # slots the queue dispatches into (0: admission off for the model)
    rate: float  # interactive dispatches per second lately (0: none yet)


class Rate(Protocol):
    """A tier's dispatch rate (:class:`dataplane.admission.shedding.DrainRate`)."""

    def rate(self, now: float) -> float:
        """Dispatches per second at ``now``."""


class TierQueueLoad(Protocol):
    """What :func:`local_queue` reads of one model's tier queues (:class:`dataplane.admission.queues.TierQueues`)."""

    @property
    def capacity(self) -> int:
        """The replicas' concurrency the queues dispatch to."""

    @property
    def drain(self) -> Mapping[str, Rate]:
        """Per tier, its dispatch rate."""

    def depth(self, tier: str) -> int:
        """Requests of ``tier`` waiting."""

    def running(self, tier: str) -> int:
        """Requests of ``tier`` dispatched and not done."""


def local_queue(queues: TierQueueLoad, now: float) -> LocalQueue:
    """The :class:`LocalQueue` of one model's tier queues at ``now``."""
    return LocalQueue(waiting=queues.depth(TIERS[0]), running=sum(queues.running(t) for t in TIERS),
                      capacity=queues.capacity, rate=queues.drain[TIERS[0]].rate(now))


def local_wait_ms(queue: LocalQueue) -> float:
    """Expected wait (ms) of a newcomer: 0 with a free slot, else (waiting + 1) / dispatch rate."""
    if queue.capacity <= 0 or (queue.waiting <= 0 and queue.running < queue.capacity):
        return 0.0
    return 1000.0 * (max(queue.waiting, 0) + 1) / queue.rate if queue.rate > 0 else math.inf


def room(slots: int, others: float, inflight: int, *, headroom: float = DEFAULT_HEADROOM,
         share: float = 1.0) -> float:
    """Requests this proxy may still send to a region of ``slots`` where ``others`` run besides its own ``inflight``.

    ``(headroom x slots - others) x share - inflight`` (see the module docstring).
    """
    return (headroom * slots - others) * share - inflight


def spill_on_queue(targets: Sequence[SpillTarget], rooms: Mapping[str, float], *, tier: str, wait_ms: float,
                   threshold_ms: float = DEFAULT_QUEUE_MS, usable: Collection[str] = (),
                   tiers: Collection[str] = ("interactive",)) -> RegionChoice | None:
    """The nearest faster target with room when the local wait exceeds ``max(threshold, rtt)``; else None."""
    if tier not in tiers or wait_ms <= threshold_ms:
        return None
    for target in sorted((t for t in targets if not t.batch_only), key=lambda t: (t.rtt_ms, t.region)):
        if target.rtt_ms >= wait_ms:
            break
        if target.region in usable and rooms.get(target.region, 0.0) >= 1.0:
            return RegionChoice(target.region, target.rtt_ms, RegionBranch.QUEUE)
    return None


def region_for(local: str, targets: Sequence[SpillTarget], *, tier: str, u: float, usable: Collection[str],
               wait_ms: float, rooms: Callable[[], Mapping[str, float]], threshold_ms: float = DEFAULT_QUEUE_MS,
               tiers: Collection[str] = ("interactive",), weighted_room: bool = False) -> RegionChoice:
    """The weighted draw if its target has room, else the spill on queue, else local (see the module doc)."""
    known: list[Mapping[str, float]] = []

    def room_of() -> Mapping[str, float]:
        if not known:
            known.append(rooms())
        return known[0]

    choice = choose_region(local, targets, tier=tier, u=u, usable=usable, tiers=tiers)
    if choice.branch is RegionBranch.SPILLED:
        if not weighted_room or room_of().get(choice.region, 0.0) >= 1.0:
            return choice
        choice = RegionChoice(local, 0.0, RegionBranch.LOCAL)
    if tier in tiers and wait_ms > threshold_ms:
        queued = spill_on_queue(targets, room_of(), tier=tier, wait_ms=wait_ms, threshold_ms=threshold_ms,
                                usable=usable, tiers=tiers)
        if queued is not None:
            return queued
    return choice
