"""Regions in the simulator: interactive load per region, spill within the latency budget, in virtual time.

What runs, unchanged: one :class:`agent.engine.Engine` per replica, the
control plane's :func:`controlplane.spill.spill_weights` (recomputed every
``tick_seconds`` from the offered rates of the last ``window_seconds`` and
each region's capacity) and the proxy's :func:`dataplane.spill.choose_region`
(one uniform draw per request).

Events, in time order: **arrival** of an interactive request at its home
region (Poisson, rate ``load x capacity``), which chooses a region; a spilled
request reaches the other region half a round trip later (**enqueue**) and
its answer comes back half a round trip after it finishes. Inside a region
the request goes to the less loaded of two random replicas (queued +
running, read from the engine: telemetry is taken as fresh here, the
within-region pick is not what this simulator studies). **step end** runs
``finish_step``; **tick** recomputes the weights.

Capacity: a replica's sustained throughput for the request shape, measured
once by :func:`replica_capacity` (an engine kept full for 60 virtual
seconds, admitting one request per step as independent arrivals do, so
every step pays a prefill). Latency: arrival at the home region to the answer back there.

Deterministic for a seed. Cost: O(events log events), events dominated by
engine steps (replicas x duration / step time).
"""

from __future__ import annotations

import dataclasses
import heapq
import random
from collections import Counter, deque
from collections.abc import Mapping

from agent.engine import Engine, EngineParams, EngineRequest
from controlplane.spill import RegionLoad, parse_rtt, spill_weights
from dataplane.spill import SpillTarget, choose_region

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
    names = [r.name for r in config.regions]
    engines = {r.name: [Engine(config.engine) for _ in range(r.replicas)] for r in config.regions}
    busy: dict[tuple[str, int], bool] = {}
    events: list[tuple[float, int, int, tuple[str, ...]]] = []
    seq = 0

    def push(when: float, kind: int, *arg: str) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (when, seq, kind, arg))

    origin: dict[str, tuple[str, float, float]] = {}  # request id -> (home, arrival, return rtt seconds)
    recent: dict[str, deque[float]] = {n: deque() for n in names}
    targets: dict[str, list[SpillTarget]] = {n: [] for n in names}
    latencies: dict[str, list[float]] = {n: [] for n in names}
    served: Counter[tuple[str, str]] = Counter()
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

    while events:
        now, _, kind, arg = heapq.heappop(events)
        if now > config.duration_seconds:
            break
        if kind == _ARRIVE:
            home = arg[0]
            spec = next(r for r in config.regions if r.name == home)
            push(now + rng.expovariate(spec.load * spec.replicas * cap), _ARRIVE, home)
            recent[home].append(now)
            choice = choose_region(home, targets[home], tier="interactive", u=rng.random(), usable=names)
            ids += 1
            rid = str(ids)
            origin[rid] = (home, now, choice.rtt_ms / 2000.0)
            served[(home, choice.region)] += now >= config.warmup_seconds
            push(now + choice.rtt_ms / 2000.0, _ENQUEUE, choice.region, rid)
        elif kind == _ENQUEUE:
            region, rid = arg
            a, b = rng.randrange(len(engines[region])), rng.randrange(len(engines[region]))
            la, lb = (engines[region][k].load() for k in (a, b))
            i = a if la.queued + la.running <= lb.queued + lb.running else b
            engines[region][i].submit(EngineRequest(request_id=rid, prompt_tokens=config.prompt_tokens,
                                                    max_tokens=config.max_tokens), now)
            start(region, i, now)
        elif kind == _STEP:
            region, index = arg
            i = int(index)
            busy[(region, i)] = False
            for finished in engines[region][i].finish_step(now).finished:
                home, arrived, back = origin.pop(finished.request_id)
                if arrived >= config.warmup_seconds:
                    latencies[home].append(1000.0 * (now + back - arrived))
            start(region, i, now)
        else:
            push(now + config.tick_seconds, _TICK)
            if config.spill:
                loads = []
                for r in config.regions:
                    while recent[r.name] and recent[r.name][0] < now - config.window_seconds:
                        recent[r.name].popleft()
                    offered = len(recent[r.name]) / min(config.window_seconds, max(now, config.tick_seconds))
                    loads.append(RegionLoad(r.name, capacity=r.replicas * cap, offered=offered,
                                            slots=r.replicas * config.engine.max_running, service_ms=service_ms))
                weights = spill_weights(loads, rtt, budget_ms=config.budget_ms, headroom=config.headroom)
                targets = {n: [SpillTarget(t, w, rtt[(n, t)]) for (s, t), w in sorted(weights.items()) if s == n]
                           for n in names}
    totals = Counter({home: sum(v for (h, _), v in served.items() if h == home) for home in names})
    return RegionsResult(
        p99_ms={n: _p(latencies[n], 0.99) for n in names}, p50_ms={n: _p(latencies[n], 0.5) for n in names},
        requests=dict(totals), capacity_per_replica=cap, service_ms=service_ms,
        spill_share={f"{h}->{s}": v / max(1, totals[h]) for (h, s), v in sorted(served.items()) if h != s},
    )
