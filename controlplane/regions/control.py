"""The spill controller: region spill weights sized from measured rates and steered by saturation.

Weights, the budget test and batch weights are the pure functions of
:mod:`controlplane.regions.weights`; this module keeps the state between table
computations.

:class:`SpillController` closes the loop when the offered rates are not
known, only each region's load at its replicas (:class:`RegionSample`:
slots, queued + running), as in the control plane. The demand a region's
proxies hold back in their queues is out of sight (a saturated region looks
the same with one request waiting or a hundred), and a target's load does
not say whose requests it runs, so the controller does not estimate demand:
it steers on what it sees, saturation, like an integral controller with a
dead band. Per update:

1. Each region's load is smoothed (weight ``alpha`` of the new sample,
   default 0.5) into its *pressure* ``(queued + running) / slots`` and its
   *busy* share ``running / slots``.
2. A target is *overfull* for a source when the wait at its replicas,
   ``queued / slots x service_ms`` (a queue of q drains through the slots
   in q x S / slots, smoothed), exceeds half of what the budget leaves after
   the round
   trip and the service, ``(budget - rtt - service) / 2`` (the other half
   is for the tail); it is *open* when not overfull and its engines are
   busy below ``fill`` (0.85: at 0.9 a 32-slot region's own p99 wait is
   already half the budget, at 0.85 less than a third). Busy and wait, not slots taken: with
   requests of a fraction of a second, the momentary imbalance between
   replicas queues a few at any load, and they cost a slot's turn each.
3. A source at pressure ``high`` or more (saturated) raises its weight to its
   nearest target that is not overfull, if that one is open (a busy near
   target is waited for, not skipped for a farther one), by
   ``step`` (default 0.05); below ``low`` (default 0.8) it lowers its
   farthest weight by ``step``; in between it holds. Every weight into an
   overfull target drops by ``step``. A source's weights never sum past
   ``max_share`` (default 0.9: it keeps at least a tenth of its work home).
   The weights settle where the source just stops being saturated or the
   target just fills to its headroom, whichever comes first.
   Targets are the regions :func:`reachable` from the source that do not
   spill themselves and are less loaded than the source (work flows
   downhill; a target that already has a weight stays one, its waits
   decide). A region with a weight into it does not raise its own (no
   cascade: its saturation is the spill it takes, which its sources' weights
   give back when its waits grow).
4. Routes: every pair with a weight, and, for a region whose utilisation
   exceeded ``route_share`` (default 0.5) in the last ``hold`` (default
   20) updates, every target of it (as in step 3), weight 0 when
   nothing is planned there: the proxies spill bursts on queue
   (:mod:`dataplane.regions.choice`) within the room they see, without waiting for
   the weights.

Sizing, when the proxies report (:class:`RegionSample` ``offered``,
``served``, ``waiting``, ``spilled``; the simulator passes its own counts the
same way):

0. Per region, smoothed with ``alpha``: the offered interactive rate (its
   proxies' arrivals, shed and spilled away included); the rate its
   replicas answer (its own, plus what it takes: each source's ``spilled``
   rate split over its weighted targets, its nearest route if it has no
   weight); its pressure counts its proxies' waiting requests too. Its
   capacity: the law L = λW, ``slots x answered / busy slots`` (measured when
   at least ``min_busy``, 0.25, of the slots are busy; else the last
   estimate, first ``slots / service_ms``; kept within half and twice that),
   and no more than its *ceiling*: what it answered per slot while saturated
   by its own work (pressure ``high`` or more, taking no spill), times its
   slots, raised whenever it answers more. The ceiling catches what the law L = λW cannot: a source
   whose slots are not all kept busy at saturation serves less than its
   busy slots promise.
1. The sized weights: :func:`spill_weights` on these rates and capacities,
   ``keep`` 0.85 (a source keeps 0.85 of its capacity), targets up to
   ``headroom``, levelled up to ``balance_to`` (0.95).
2. The saturation steps above are a correction on top of the sized weight
   (the last weight less the last sized weight), bounded to
   ``+-max_correction`` (0.15); a target counts as overfull for a measured
   source only while it also waits longer than the source (an overload is
   pooled, not pushed back whole). A source's weights are scaled to sum to
   ``max_share`` at most.

Regions without reports are steered by the saturation steps alone, as before.

Pure: the state between updates is the smoothed loads, rates and capacities,
the weights, their sized part and the updates since each region was busy; no
clock (one update per table computation). Cost per update: O(R^2 log R).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from controlplane.regions.weights import (
    DEFAULT_BUDGET_MS,
    DEFAULT_HEADROOM,
    RegionLoad,
    batch_weights,
    reachable,
    spill_weights,
)
from ferry.errors import ConfigError


@dataclasses.dataclass(frozen=True, slots=True)
class RegionSample:
    """One region's interactive slots, the load at its replicas (queued + running, and of it queued) and, when
    its proxies report them, its interactive ``offered`` rate (arrivals per second at its proxies, shed and
    spilled away included), ``served`` rate (answered per second by its own replicas for its proxies) and the
    requests ``waiting`` in its proxies' queues."""

    region: str
    slots: int
    load: float
    queued: float = 0.0
    offered: float | None = None
    served: float | None = None
    waiting: float = 0.0  # interactive requests waiting in its proxies' queues (they count in its pressure)
    spilled: float = 0.0  # interactive requests per second its proxies sent to other regions


@dataclasses.dataclass(frozen=True, slots=True)
class SpillPlan:
    """One update's weights ((source, target) -> share), routes ((source, target) pairs, sorted) and batch
    weights ((source, target) -> share of the source's batch work, any distance)."""

    weights: dict[tuple[str, str], float]
    routes: tuple[tuple[str, str], ...]
    batch: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)


class SpillController:
    """Spill weights sized from the offered rates and steered by saturation with a dead band (module doc)."""

    def __init__(self, rtt_ms: Mapping[tuple[str, str], float], *, budget_ms: float = DEFAULT_BUDGET_MS,
                 headroom: float = DEFAULT_HEADROOM, service_ms: float = 200.0, alpha: float = 0.5,
                 step: float = 0.05, low: float = 0.8, high: float = 0.95, fill: float = 0.9,
                 max_share: float = 0.9, route_share: float = 0.5, hold: int = 20, keep: float = 0.85,
                 max_correction: float = 0.15, min_busy: float = 0.25, balance_to: float = 0.95) -> None:
        if not 0 < alpha <= 1 or not 0 < step <= 1 or not 0 <= low < high or not 0 < max_share <= 1 or hold < 0 \
                or not 0 < keep <= headroom <= balance_to <= 1 or not 0 <= max_correction <= 1:
            raise ConfigError("controlplane.regions.weights", "need 0 < alpha <= 1, 0 < step <= 1, 0 <= low < high, "
                                                    "0 < max_share <= 1, hold >= 0, "
                                                    "0 < keep <= headroom <= balance_to <= 1, "
                                                    "0 <= max_correction <= 1")
        self.rtt = dict(rtt_ms)
        self.budget_ms = budget_ms
        self.headroom = headroom
        self.service_ms = service_ms
        self.alpha = alpha
        self.step = step
        self.low = low
        self.high = high
        self.fill = fill
        self.max_share = max_share
        self.route_share = route_share
        self.hold = hold
        self.keep = keep
        self.max_correction = max_correction
        self.min_busy = min_busy
        self.balance_to = balance_to
        self.weights: dict[tuple[str, str], float] = {}
        self.feedforward: dict[tuple[str, str], float] = {}  # the sized part of the weights, last update
        self.routes: tuple[tuple[str, str], ...] = ()
        self.utilisation: dict[str, float] = {}  # smoothed pressure per region
        self.busy: dict[str, float] = {}  # smoothed busy share per region
        self.offered: dict[str, float] = {}  # smoothed offered interactive rate per region (measured ones)
        self.served: dict[str, float] = {}  # smoothed rate its replicas answer (its own and spill taken)
        self.capacity: dict[str, float] = {}  # estimated requests per second per region
        self.ceiling: dict[str, float] = {}  # answered per second and slot when saturated by its own work
        self._quiet: dict[str, int] = {}  # updates since the region was last busy

    def _smooth(self, before: float | None, value: float) -> float:
        return value if before is None else self.alpha * value + (1 - self.alpha) * before

    def _taken(self, samples: Sequence[RegionSample]) -> dict[str, float]:
        """Per region, the spilled requests per second its replicas take from other regions: each source's
        ``spilled`` rate over the targets of its last weights in their proportion (none: its nearest route)."""
        taken: dict[str, float] = {}
        for s in samples:
            if not s.spilled:
                continue
            shares = {t: w for (src, t), w in self.weights.items() if src == s.region and w > 0}
            if not shares:
                routes = sorted((self.rtt[pair], pair[1]) for pair in self.routes if pair[0] == s.region)
                shares = {routes[0][1]: 1.0} if routes else {}
            total = sum(shares.values())
            for t, w in shares.items():
                taken[t] = taken.get(t, 0.0) + s.spilled * w / total
        return taken

    def _measure(self, samples: Sequence[RegionSample], util: Mapping[str, float],
                 busy: Mapping[str, float]) -> dict[str, RegionLoad]:
        """Smoothed offered rates and capacity estimates of the regions whose proxies report (step 0)."""
        loads: dict[str, RegionLoad] = {}
        offered: dict[str, float] = {}
        served: dict[str, float] = {}
        capacity: dict[str, float] = {}
        taken = self._taken(samples)
        taking = {t for _, t in self.weights}  # a region's waits while it takes spill are the spill's doing
        for s in samples:
            if s.offered is None:
                continue
            offered[s.region] = self._smooth(self.offered.get(s.region), max(0.0, s.offered))
            served[s.region] = self._smooth(self.served.get(s.region),
                                            max(0.0, s.served or 0.0) + taken.get(s.region, 0.0))
            nominal = s.slots * 1000.0 / self.service_ms if self.service_ms > 0 else math.inf
            cap = self.capacity.get(s.region, nominal)
            running = busy[s.region] * s.slots
            if running >= self.min_busy * s.slots and served[s.region] > 0:
                cap = s.slots * served[s.region] / running  # the law L = λW: the rate per busy slot, x slots
            if math.isfinite(nominal):
                cap = min(max(cap, nominal / 2), 2 * nominal)
            ceiling = self.ceiling.get(s.region)  # per slot: a region that grows keeps its rate per slot
            per_slot = served[s.region] / s.slots
            if util[s.region] >= self.high and s.region not in taking and served[s.region] > 0:
                ceiling = self._smooth(ceiling, per_slot)  # saturated by its own work: all it can serve
            elif ceiling is not None:
                ceiling = max(ceiling, per_slot)  # it can serve at least what it serves
            if ceiling is not None:
                self.ceiling[s.region] = ceiling
                cap = min(cap, max(ceiling * s.slots, cap / 2))
            capacity[s.region] = cap
            loads[s.region] = RegionLoad(s.region, capacity=cap, offered=offered[s.region],
                                         slots=s.slots, service_ms=self.service_ms)
        self.offered, self.served, self.capacity = offered, served, capacity
        return loads

    def update(self, samples: Sequence[RegionSample]) -> SpillPlan:
        """One update from this computation's samples (regions without slots are left out)."""
        samples = sorted((s for s in samples if s.slots > 0), key=lambda s: s.region)
        util: dict[str, float] = {}
        busy: dict[str, float] = {}
        for sample in samples:
            pressure = (sample.load + max(0.0, sample.waiting)) / sample.slots
            running = (sample.load - sample.queued) / sample.slots
            util[sample.region] = self._smooth(self.utilisation.get(sample.region), pressure)
            busy[sample.region] = self._smooth(self.busy.get(sample.region), running)
        self.utilisation, self.busy = util, busy
        measured = self._measure(samples, util, busy)
        loads = [RegionLoad(s.region, capacity=float(s.slots), offered=util[s.region] * s.slots, slots=s.slots,
                            service_ms=self.service_ms) for s in samples]
        # The sized part: the offered rates against the capacities (regions that report; others as sampled).
        sized = [measured.get(r.region, r) for r in loads]
        feedforward = {pair: w for pair, w in spill_weights(
            sized, self.rtt, budget_ms=self.budget_ms, headroom=self.headroom, keep=self.keep,
            balance_to=self.balance_to).items()
            if pair[0] in measured and pair[1] in measured} if measured else {}
        spilling = {s for s, _ in self.weights} | {s for s, _ in feedforward}
        taking = {t for _, t in self.weights} | {t for _, t in feedforward}
        targets = {source: tuple(t for t in ts if t not in spilling
                                 and ((source, t) in self.weights or (source, t) in feedforward
                                      or util[t] < util[source]))
                   for source, ts in reachable(loads, self.rtt, budget_ms=self.budget_ms,
                                               headroom=self.headroom).items()}
        # The correction: what the last weights held beyond their sized part, stepped on saturation.
        correction = {pair: w - self.feedforward.get(pair, 0.0) for pair, w in self.weights.items()
                      if pair[0] in util and pair[1] in util}
        for pair in feedforward:
            correction.setdefault(pair, 0.0)

        def total(pair: tuple[str, str]) -> float:
            return feedforward.get(pair, 0.0) + correction.get(pair, 0.0)

        wait = {s.region: self.service_ms * (util[s.region] - busy[s.region]) for s in samples}

        def overfull(source: str, target: str) -> bool:
            # Measured: only while the target also waits longer than the source (an overload is pooled).
            return wait[target] > (self.budget_ms - self.rtt[(source, target)] - self.service_ms) / 2 and (
                source not in measured or wait[target] > wait[source])

        for (source, target) in list(correction):
            if target not in targets.get(source, ()) or overfull(source, target):
                correction[(source, target)] -= self.step
        for source in util:
            mine = [t for t in targets.get(source, ()) if total((source, t)) > 0]
            if util[source] >= self.high and source not in taking:
                room = self.max_share - sum(total((source, t)) for t in mine)
                nearest = next((t for t in targets.get(source, ()) if not overfull(source, t)), None)
                if nearest is not None and busy[nearest] < self.fill and room > 0:
                    correction[(source, nearest)] = correction.get((source, nearest), 0.0) + min(self.step, room)
            elif util[source] < self.low and mine:
                correction[(source, mine[-1])] -= self.step
        weights: dict[tuple[str, str], float] = {}
        for pair, c in sorted(correction.items()):
            if pair[0] in measured:  # sized: the correction is bounded, the feedforward carries the weight
                c = min(max(c, -self.max_correction), self.max_correction)
            w = feedforward.get(pair, 0.0) + c
            if w > 1e-9:
                weights[pair] = w
        for source in {s for s, _ in weights}:  # a source keeps at least 1 - max_share of its work home
            share = sum(w for (s, _), w in weights.items() if s == source)
            if share > self.max_share:
                for pair in [p for p in weights if p[0] == source]:
                    weights[pair] *= self.max_share / share
        self.weights = {pair: round(w, 6) for pair, w in sorted(weights.items())}
        self.feedforward = feedforward
        pairs = set(self.weights)
        for source, u in util.items():
            self._quiet[source] = 0 if u > self.route_share else self._quiet.get(source, self.hold) + 1
            if self._quiet[source] <= self.hold:
                pairs.update((source, target) for target in targets.get(source, ()))
        self.routes = tuple(sorted(pairs))
        return SpillPlan(dict(self.weights), self.routes, self.batch(loads))

    def batch(self, loads: Sequence[RegionLoad]) -> dict[tuple[str, str], float]:
        """(source, target) -> share of a busy source's batch work to send to target (module doc, step 5)."""
        shares = batch_weights(loads)
        return {(s.region, t): round(w, 6) for s in loads if s.offered > self.route_share * s.capacity
                for t, w in shares.items() if t != s.region and w > 0}
