"""The scaling plan of one model in one region: replicas needed now, for the next ramp, desired, standby (pure).

No I/O and no clock: every input is an argument, so the control plane
(:mod:`controlplane.services.scaling`) and the day simulator
(:mod:`tools.sim.day`) call the very same :func:`plan` (docs/design.md, rule 1).

**Needed now** (:func:`needed_for`): the replicas that carry the demand
measured now at the target utilisation, the largest of

- *by rate*: ``(arrival_rate + queued / drain_seconds) / (replica_rate x
  utilisation)``: the arrivals, plus the backlog drained within
  ``drain_seconds``, over what a replica sustains (``Shape.replica_rate``
  when known, else Little's law on the slots, ``slots / service_seconds``);
- *by concurrency*: ``in_flight / (slots x utilisation)`` (requests
  running at the replicas: full replicas ask for their count over the
  utilisation);
- *by tokens*: ``tokens_in_flight / (kv_tokens x utilisation)`` (KV cache in
  use);
- *by queue wait*: when the measured queue wait exceeds ``queue_share`` of
  the TTFT target, one replica more than are ready now (the queue says the
  estimate above is short, whatever it says).

**Needed for the ramp** (:func:`forecast`, then the same conversion): the
highest peak arrival rate recorded for any hour of the window ``[now +
startup_seconds, now + startup_seconds + lead_seconds]`` on the previous
``lookback_days`` days (:class:`HourRecord`, kept in the store by hour of
week, one record per slot, :mod:`controlplane.scaling.history`). A replica
ordered now serves only after ``startup_seconds`` (the measured time to
bring one up), so the replicas the morning ramp needs are asked for that
long ahead of it; what is needed before then was asked for by the steps
before (and the cool-down keeps it). An hour's record is its peak, so a
rising hour is met from its start and a falling one keeps its first
minutes' level to its end.

**Desired** (:func:`bound`): ``max(floor, needed_now, needed_for_ramp)``, then
the scale-down bound against the previous decision (:class:`State`): up at
once; down only when ``cooldown_seconds`` have passed since the last change
(up or down), and by at most ``step_down`` replicas. So the fleet never
falls below ``floor``, and two scale-downs are at least a cool-down apart.
With no previous decision (the first step of a new leader) the replicas
there are count as decided now: a new leader scales up at once but waits a
cool-down before it scales down.

**Standby** (the warm pool is hardware, not weights: a standby node is a
registered machine with no replica loaded; when the plan gives it a model,
the weights stream onto it, which takes ``startup_seconds``):

- ``standby_to_keep`` = the growth the forecast expects, that no new
  machine could arrive in time for: a machine ordered now is there after
  ``replacement_seconds`` (the measured time to get a new machine), when it
  can take the replicas the plan asks for then, those needed a start-up time
  later: ``max(0, needed(peak forecast over [now, now + replacement_seconds
  + startup_seconds + lead_seconds]) - desired)`` (``standby_growth``),
  plus a reserve for machines lost meanwhile, ``desired x
  failure_rate_per_hour x replacement_seconds / 3600`` (``standby_reserve``),
  rounded up; a region keeps the sum of its models' growth plus the
  rounded-up sum of their reserves (:func:`standby_for`);
- ``promote`` = ``min(standby_nodes, max(0, desired - current))``: standby
  nodes to give this model now; a standby node gets a model only when the
  desired count (which includes the forecast) exceeds the replicas there are.

One replica is taken to fill one standby node. Cost: O(hours in the window
x lookback_days) per call.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

from ferry.errors import InvalidArgument

HOUR = 3600.0
DAY = 86400.0
WEEK_HOURS = 168
EPSILON = 1e-9


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Targets:
    """What the plan aims at; every field is checked by :meth:`check` (``InvalidArgument`` naming it).

    ``ttft_target_seconds``: interactive TTFT p99 target; ``queue_share``: share of it the queue wait may
    take before the plan adds a replica; ``utilisation``: target busy share of a replica's slots and KV
    tokens (0..1]; ``floor``: replicas never to go below (>= 0); ``cooldown_seconds``: least time between a
    change and a scale-down; ``step_down``: replicas removed at most per scale-down (>= 1);
    ``lookback_days``: previous days whose same hours make the forecast (1..7); ``lead_seconds``: margin
    added to the start-up time when looking ahead; ``failure_rate_per_hour``: share of replicas lost per
    hour, covered by standby until replaced; ``drain_seconds``: time a backlog is planned to drain in, on top
    of the arrivals.
    """

    ttft_target_seconds: float = 2.0
    queue_share: float = 0.5
    utilisation: float = 0.7
    floor: int = 1
    cooldown_seconds: float = 900.0
    step_down: int = 1
    lookback_days: int = 7
    lead_seconds: float = 60.0
    failure_rate_per_hour: float = 0.01
    drain_seconds: float = 300.0

    def check(self) -> Targets:
        """Self, or ``InvalidArgument`` naming the first field out of range."""
        checks = {
            "ttft_target_seconds": self.ttft_target_seconds > 0, "queue_share": 0 < self.queue_share <= 1,
            "utilisation": 0 < self.utilisation <= 1, "floor": 0 <= self.floor <= 100_000,
            "cooldown_seconds": 0 <= self.cooldown_seconds <= 7 * DAY, "step_down": 1 <= self.step_down <= 100_000,
            "lookback_days": 1 <= self.lookback_days <= 7, "lead_seconds": 0 <= self.lead_seconds <= DAY,
            "failure_rate_per_hour": 0 <= self.failure_rate_per_hour <= 1,
            "drain_seconds": 0 < self.drain_seconds <= DAY,
        }
        for name, ok in checks.items():
            if not ok:
                raise InvalidArgument(f"targets.{name}", f"out of range ({getattr(self, name)!r})")
        return self


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """One replica of the model: ``slots`` (requests it runs at once), ``kv_tokens`` (KV-cache tokens; 0:
    unknown), ``replica_rate`` (requests/s it sustains on this model's mix, measured; 0: unknown, Little's
    law on the slots is used)."""

    slots: int
    kv_tokens: int = 0
    replica_rate: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Demand:
    """What is measured now for one model in one region.

    ``arrival_rate``: requests/s offered (the proxies' reports); ``service_seconds``: mean time a request
    holds a slot; ``in_flight``: requests running at the replicas; ``queued``: requests waiting (replica and
    proxy queues); ``tokens_in_flight``:
    KV tokens in use; ``queue_wait_seconds``: mean wait before a slot; ``ready``: replicas ready now.
    """

    arrival_rate: float = 0.0
    service_seconds: float = 0.0
    in_flight: float = 0.0
    queued: float = 0.0
    tokens_in_flight: float = 0.0
    queue_wait_seconds: float = 0.0
    ready: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class HourRecord:
    """The peak of one hour as observed: ``day`` (days since the epoch, UTC) and ``peak_rate`` (requests/s),
    with the ``service_seconds`` measured then (0: unknown)."""

    day: int
    peak_rate: float
    service_seconds: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class State:
    """The previous decision: ``desired`` replicas and ``changed_at`` (seconds, the caller's clock)."""

    desired: int
    changed_at: float


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """The outcome for one model in one region (replica counts; standby in nodes)."""

    needed_now: int
    needed_for_ramp: int
    forecast_rate: float
    desired: int
    standby_growth: int
    standby_reserve: float
    standby_to_keep: int
    promote: int
    state: State


def standby_for(plans: Iterable[Plan]) -> int:
    """Standby nodes a region keeps for its models' plans: their growth, plus the ceiling of their reserves
    summed (one reserve for the region, not one per model)."""
    growth, reserve = 0, 0.0
    for p in plans:
        growth += p.standby_growth
        reserve += p.standby_reserve
    return growth + _ceil(reserve)


def hour_of_week(at: float) -> int:
    """The hour of the week of unix time ``at`` (0 = Thursday 00:00 UTC, the epoch's weekday; 0..167)."""
    return int(at // HOUR) % WEEK_HOURS


def day_of(at: float) -> int:
    """Days since the epoch of unix time ``at`` (UTC)."""
    return int(at // DAY)


def needed_for(rate: float, shape: Shape, targets: Targets, *, service_seconds: float = 0.0, in_flight: float = 0.0,
               queued: float = 0.0, tokens_in_flight: float = 0.0) -> float:
    """Replicas (fractional) that carry ``rate`` requests/s, drain ``queued`` within ``targets.drain_seconds``
    and hold the given load, at ``targets.utilisation``."""
    u = targets.utilisation
    slots = max(1, shape.slots)
    per_replica = shape.replica_rate if shape.replica_rate > 0 else (
        slots / service_seconds if service_seconds > 0 else 0.0)
    by_rate = (rate + queued / targets.drain_seconds) / (per_replica * u) if per_replica > 0 else 0.0
    by_concurrency = in_flight / (slots * u)
    by_tokens = tokens_in_flight / (shape.kv_tokens * u) if shape.kv_tokens > 0 else 0.0
    return max(by_rate, by_concurrency, by_tokens)


def _ceil(x: float) -> int:
    return math.ceil(x - EPSILON) if x > 0 else 0


def forecast(history: Mapping[int, HourRecord], start: float, end: float, lookback_days: int) -> HourRecord | None:
    """The highest peak recorded for the hours of ``[start, end]`` on the ``lookback_days`` days before
    ``start``'s day (a record of the same hour on an earlier day is another slot of the week), or None.

    ``history`` maps hour of week to its record; a record whose ``day`` is not one of those previous
    days (today's, or older than the lookback) is not used. The window is at most a week long.
    """
    today = day_of(start)
    best: HourRecord | None = None
    hour = math.floor(start / HOUR)
    last = math.floor(max(start, min(end, start + 7 * DAY)) / HOUR)
    hours_of_day = {h % 24 for h in range(hour, last + 1)}
    for back in range(1, lookback_days + 1):
        day = today - back
        for h in hours_of_day:
            record = history.get(int((day * 24 + h) % WEEK_HOURS))
            if record is not None and record.day == day and (best is None or record.peak_rate > best.peak_rate):
                best = record
    return best


def bound(raw: int, previous: State | None, now: float, targets: Targets) -> State:
    """The decision after the scale-down bound: up at once, down by ``step_down`` at most and only
    ``cooldown_seconds`` after the last change; never below ``floor``."""
    raw = max(raw, targets.floor)
    if previous is None:
        return State(raw, now)
    if raw > previous.desired:
        return State(raw, now)
    if raw == previous.desired or now - previous.changed_at < targets.cooldown_seconds:
        return State(max(previous.desired, targets.floor), previous.changed_at)
    return State(max(raw, previous.desired - targets.step_down, targets.floor), now)


def plan(demand: Demand, shape: Shape, targets: Targets, *, history: Mapping[int, HourRecord], now: float,
         startup_seconds: float, replacement_seconds: float, current: int, standby_nodes: int,
         previous: State | None) -> Plan:
    """The plan for one model in one region at unix time ``now`` (see the module docstring).

    ``history``: hour of week -> record; ``startup_seconds``: measured time from giving a warm machine a
    model to its replica being ready; ``replacement_seconds``: measured time to get a new machine;
    ``current``: replicas there are (warming or ready); ``standby_nodes``: standby nodes in the region;
    ``previous``: the last decision (None: the first, taken as ``current`` decided at ``now``). Bad inputs
    raise ``InvalidArgument`` naming them.
    """
    targets.check()
    for name, value in (("demand.arrival_rate", demand.arrival_rate), ("demand.service_seconds",
                        demand.service_seconds), ("demand.in_flight", demand.in_flight),
                        ("demand.queued", demand.queued),
                        ("demand.tokens_in_flight", demand.tokens_in_flight),
                        ("demand.queue_wait_seconds", demand.queue_wait_seconds),
                        ("startup_seconds", startup_seconds), ("replacement_seconds", replacement_seconds),
                        ("shape.replica_rate", shape.replica_rate)):
        if not (math.isfinite(value) and value >= 0):
            raise InvalidArgument(name, f"must be finite and >= 0 ({value!r})")
    for name, count, least in (("shape.slots", shape.slots, 1), ("shape.kv_tokens", shape.kv_tokens, 0),
                               ("current", current, 0), ("standby_nodes", standby_nodes, 0),
                               ("demand.ready", demand.ready, 0)):
        if count < least:
            raise InvalidArgument(name, f"must be >= {least} ({count!r})")
    now_need = needed_for(demand.arrival_rate, shape, targets, service_seconds=demand.service_seconds,
                          in_flight=demand.in_flight, queued=demand.queued,
                          tokens_in_flight=demand.tokens_in_flight)
    needed_now = _ceil(now_need)
    if demand.queue_wait_seconds > targets.queue_share * targets.ttft_target_seconds:
        needed_now = max(needed_now, demand.ready + 1)

    def need_at(record: HourRecord | None) -> int:
        if record is None:
            return 0
        service = record.service_seconds or demand.service_seconds
        return _ceil(needed_for(record.peak_rate, shape, targets, service_seconds=service))

    ahead = forecast(history, now + startup_seconds, now + startup_seconds + targets.lead_seconds,
                     targets.lookback_days)
    needed_for_ramp = need_at(ahead)
    if previous is None:  # the first decision (a new leader): what runs counts as decided now
        previous = State(current, now)
    state = bound(max(needed_now, needed_for_ramp), previous, now, targets)
    desired = state.desired
    within = forecast(history, now, now + replacement_seconds + startup_seconds + targets.lead_seconds,
                      targets.lookback_days)
    growth = max(0, need_at(within) - desired)
    reserve = desired * targets.failure_rate_per_hour * replacement_seconds / HOUR
    return Plan(needed_now=needed_now, needed_for_ramp=needed_for_ramp,
                forecast_rate=ahead.peak_rate if ahead is not None else 0.0, desired=desired,
                standby_growth=growth, standby_reserve=reserve, standby_to_keep=growth + _ceil(reserve),
                promote=min(standby_nodes, max(0, desired - current)), state=state)
