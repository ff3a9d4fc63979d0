"""Regions in the simulator: interactive load per region, spill within the latency budget, in virtual time.

What runs, unchanged: one :class:`agent.replica.engine.Engine` per replica; per
region one proxy's admission queue (:class:`dataplane.admission.queues.TierQueues`,
capacity = the region's slots, its shedding included); the control plane's
:class:`controlplane.regions.control.SpillController` (updated every ``tick_seconds``
from each region's slots and the queued + running of its engines as
sampled at the previous tick: telemetry a tick old, as in ``ferry up``; and,
with ``usage`` (default), its proxy's figures since the last tick as the
real proxies report them: arrivals per second (offered), its own requests
answered at home per second (served), the depth of its interactive queue
(waiting) and the requests it spilled per second);
and the proxy's :func:`dataplane.regions.choice.region_for` (the weighted draw, then
the spill on queue from :func:`dataplane.regions.choice.local_queue`, within the
:func:`dataplane.regions.choice.room` of each target seen in that stale sample).

Events, in time order: **arrival** of an interactive request at its home
region (exponential gaps, rate ``load x capacity``), which chooses a region; a local
request joins its proxy's queue (or is shed) and is dispatched to an engine
when a slot frees; a spilled request skips it (as in the proxy) and reaches
the other region's engines half a round trip later (**enqueue**), its
answer coming back half a round trip after it finishes. A dispatched or
spilled request goes to the less loaded of two random engines of the region
(queued + running, read fresh: the within-region pick is not what this
simulator studies). **step end** runs ``finish_step``; **tick** updates the
controller.

Capacity: a replica's sustained throughput for the request shape, measured
once by :func:`replica_capacity` (an engine kept full for 60 virtual
seconds, admitting one request per step as independent arrivals do, so
every step pays a prefill). Latency: arrival at the home region to the
answer back there, for the answered requests (shed ones are counted apart).

Deterministic for a seed. Cost: O(events log events), events dominated by
engine steps (replicas x duration / step time).
"""

from __future__ import annotations

import dataclasses
import heapq
import random
from collections import Counter, deque
from collections.abc import Mapping

from agent.replica.engine import Engine, EngineParams, EngineRequest
from controlplane.config import parse_rtt
from controlplane.regions.control import RegionSample, SpillController
from dataplane.admission.queues import QueueParams, Shed, Ticket, sized
from dataplane.regions.choice import (
    DEFAULT_HEADROOM,
    DEFAULT_QUEUE_MS,
    SpillTarget,
    local_queue,
    local_wait_ms,
    region_for,
    room,
)

_ARRIVE, _ENQUEUE, _STEP, _TICK = 0, 1, 2, 3
ENGINE = EngineParams(max_running=16, max_queue=100_000)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RegionSpec:
    """A region: its replicas and the interactive load offered to it, as a share of its capacity."""

    name: str
    replicas: int
    load: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class RegionsConfig:
    """The simulated fleet and workload; see the module docstring."""

    regions: tuple[RegionSpec, ...]
    rtt_ms: Mapping[str, float]
    budget_ms: float = 500.0
    headroom: float = 0.9
    spill: bool = True
    queue_ms: float = DEFAULT_QUEUE_MS  # the proxies' spill on queue threshold
    room_headroom: float = DEFAULT_HEADROOM  # the proxies' room: this x a target's slots
    step: float = 0.1  # the controller's weight step per update
    usage: bool = True  # the proxies report their offered and served rates (the controller sizes the weights)
    engine: EngineParams = ENGINE
    prompt_tokens: int = 64
    max_tokens: int = 16
    duration_seconds: float = 60.0
    warmup_seconds: float = 10.0
    tick_seconds: float = 0.5
    window_seconds: float = 2.0
    seed: int = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class RegionsResult:
    """Per home region: p99 latency (ms) and requests; per (home, served) region: share of home's requests."""

    p99_ms: dict[str, float]
    p50_ms: dict[str, float]
    requests: dict[str, int]
    spill_share: dict[str, float]  # "a->b": share of a's requests served in b
    shed: dict[str, int]  # per home region: requests refused at its proxy's admission
    capacity_per_replica: float
    service_ms: float


def replica_capacity(engine: EngineParams, prompt_tokens: int, max_tokens: int, seconds: float = 60.0) -> float:
    """Sustained requests per second of one engine kept full of requests of this shape."""
    e = Engine(engine)
    n, now, done = 0, 0.0, 0
    while now < seconds:
        load = e.load()
        if load.queued + load.running < engine.max_running:  # one admission per step: arrivals out of phase
            e.submit(EngineRequest(request_id=str(n), prompt_tokens=prompt_tokens, max_tokens=max_tokens), now)
            n += 1
        duration = e.start_step(now)
        assert duration is not None
        now += duration
        done += len(e.finish_step(now).finished)
    return done / now


def _p(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def simulate(config: RegionsConfig) -> RegionsResult:
    """Run the regions for ``duration_seconds`` of virtual time; see the module docstring."""
    rng = random.Random(config.seed)
    cap = replica_capacity(config.engine, config.prompt_tokens, config.max_tokens)
    service_ms = 1000.0 * config.engine.max_running / cap  # a request's time in a full engine
    rtt = parse_rtt(config.rtt_ms)
    specs = {r.name: r for r in config.regions}
    names = [r.name for r in config.regions]
    slots = {r.name: r.replicas * config.engine.max_running for r in config.regions}
    engines = {r.name: [Engine(config.engine) for _ in range(r.replicas)] for r in config.regions}
    queues = {n: sized(None, QueueParams(), {f"{n}/{i}": config.engine.max_running for i in range(specs[n].replicas)},
                       1.0) for n in names}
    controller = SpillController(rtt, budget_ms=config.budget_ms, headroom=config.headroom, service_ms=service_ms,
                                 step=config.step)
    busy: dict[tuple[str, int], bool] = {}
    events: list[tuple[float, int, int, tuple[str, ...]]] = []
    seq = 0

    def push(when: float, kind: int, *arg: str) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (when, seq, kind, arg))

    origin: dict[str, tuple[str, float, float]] = {}  # request id -> (home, arrival, return rtt seconds)
    tickets: dict[str, Ticket] = {}  # request id -> its ticket in its home proxy's queue (local requests)
    waiting: dict[str, deque[str]] = {n: deque() for n in names}  # request ids in dispatch order
    spilled: Counter[tuple[str, str]] = Counter()  # (home, region) -> spilled requests in flight
    targets: dict[str, list[SpillTarget]] = {n: [] for n in names}
    sample: dict[str, tuple[float, float]] = {n: (0.0, 0.0) for n in names}  # region -> (load, queued), a tick old
    counted: Counter[tuple[str, str]] = Counter()  # in flight when the sample was taken
    latencies: dict[str, list[float]] = {n: [] for n in names}
    served: Counter[tuple[str, str]] = Counter()
    shed: Counter[str] = Counter()
    arrivals: Counter[str] = Counter()  # per home region, since the last tick: what its proxy reports as offered
    answered: Counter[str] = Counter()  # per region, since the last tick: its own requests its engines answered
    sent: Counter[str] = Counter()  # per home region, since the last tick: requests it spilled
    last_tick = 0.0
    for r in config.regions:
        push(rng.expovariate(r.load * r.replicas * cap), _ARRIVE, r.name)
    push(0.0, _TICK)
    ids = 0

    def start(region: str, i: int, now: float) -> None:
        if busy.get((region, i)):
            return
        duration = engines[region][i].start_step(now)
        if duration is not None:
            busy[(region, i)] = True
            push(now + duration, _STEP, region, str(i))

    def submit(region: str, rid: str, now: float) -> None:
        a, b = rng.randrange(len(engines[region])), rng.randrange(len(engines[region]))
        la, lb = (engines[region][k].load() for k in (a, b))
        i = a if la.queued + la.running <= lb.queued + lb.running else b
        engines[region][i].submit(EngineRequest(request_id=rid, prompt_tokens=config.prompt_tokens,
                                                max_tokens=config.max_tokens), now)
        start(region, i, now)

    def dispatch(region: str, now: float) -> None:
        started = {id(t) for t in queues[region].dispatch(now)}
        while started and waiting[region]:
            rid = waiting[region][0]
            ticket = tickets[rid]
            if ticket.state == "queued":
                break
            waiting[region].popleft()
            if id(ticket) in started:
                submit(region, rid, now)

    def rooms(home: str) -> dict[str, float]:
        return {t.region: room(slots[t.region], max(sample[t.region][0] - counted[(home, t.region)], 0.0),
                               spilled[(home, t.region)], headroom=config.room_headroom) for t in targets[home]}

    while events:
        now, _, kind, arg = heapq.heappop(events)
        if now > config.duration_seconds:
            break
        if kind == _ARRIVE:
            home = arg[0]
            spec = specs[home]
            push(now + rng.expovariate(spec.load * spec.replicas * cap), _ARRIVE, home)
            ids += 1
            rid = str(ids)
            arrivals[home] += 1
            choice = region_for(home, targets[home], tier="interactive", u=rng.random(), usable=names,
                                wait_ms=local_wait_ms(local_queue(queues[home], now)), threshold_ms=config.queue_ms,
                                rooms=lambda h=home: rooms(h))  # type: ignore[misc]
            if choice.region != home:
                origin[rid] = (home, now, choice.rtt_ms / 2000.0)
                spilled[(home, choice.region)] += 1
                sent[home] += 1
                served[(home, choice.region)] += now >= config.warmup_seconds
                push(now + choice.rtt_ms / 2000.0, _ENQUEUE, choice.region, rid)
                continue
            ticket = Ticket(tenant="bench", plan="enterprise", tier="interactive",
                            cost=config.prompt_tokens + config.max_tokens, deadline=now + 10.0)
            try:
                queues[home].offer(ticket, now)
            except Shed:
                shed[home] += now >= config.warmup_seconds
                continue
            origin[rid] = (home, now, 0.0)
            tickets[rid] = ticket
            waiting[home].append(rid)
            served[(home, home)] += now >= config.warmup_seconds
            dispatch(home, now)
        elif kind == _ENQUEUE:
            region, rid = arg
            submit(region, rid, now)
        elif kind == _STEP:
            region, index = arg
            i = int(index)
            busy[(region, i)] = False
            for finished in engines[region][i].finish_step(now).finished:
                home, arrived, back = origin.pop(finished.request_id)
                if arrived >= config.warmup_seconds:
                    latencies[home].append(1000.0 * (now + back - arrived))
                if finished.request_id in tickets:
                    answered[region] += 1
                    ticket = tickets.pop(finished.request_id)
                    queues[region].finish(ticket)
                    dispatch(region, now)
                else:
                    spilled[(home, region)] -= 1
            start(region, i, now)
        else:
            push(now + config.tick_seconds, _TICK)
            window = max(now - last_tick, 1e-9)
            if config.spill:
                plan = controller.update([RegionSample(
                    n, slots[n], load=sample[n][0], queued=sample[n][1],
                    offered=arrivals[n] / window if config.usage else None,
                    served=answered[n] / window if config.usage else None,
                    waiting=float(queues[n].depth("interactive")) if config.usage else 0.0,
                    spilled=sent[n] / window if config.usage else 0.0) for n in names])
                targets = {n: [SpillTarget(t, plan.weights.get((s, t), 0.0), rtt[(s, t)])
                               for s, t in plan.routes if s == n] for n in names}
            for n in names:  # the telemetry the next update (and the proxies' rooms) will see
                loads = [e.load() for e in engines[n]]
                sample[n] = (float(sum(x.queued + x.running for x in loads)), float(sum(x.queued for x in loads)))
            counted = Counter(spilled)
            arrivals, answered, sent, last_tick = Counter(), Counter(), Counter(), now
    totals = Counter({home: sum(v for (h, _), v in served.items() if h == home) for home in names})
    return RegionsResult(
        p99_ms={n: _p(latencies[n], 0.99) for n in names}, p50_ms={n: _p(latencies[n], 0.5) for n in names},
        requests=dict(totals), capacity_per_replica=cap, service_ms=service_ms, shed=dict(shed),
        spill_share={f"{h}->{s}": v / max(1, totals[h]) for (h, s), v in sorted(served.items()) if h != s and v},
    )
