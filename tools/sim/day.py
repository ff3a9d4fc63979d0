"""A day of scaling replayed: the control plane's own plan over a diurnal curve, the morning ramp in the engines.

Two layers, both in virtual time, deterministic for a seed:

1. **The day, minute by minute** (:func:`run_day`): the arrival rate follows
   :data:`DIURNAL` (share of the peak at each hour, UTC, linear between
   hours; the peak is ``peak_replicas`` replicas' worth at the target
   utilisation). Every ``plan_seconds`` the simulated control plane calls
   :func:`controlplane.scaling.plan.plan` (the very function the leader
   calls) with what it would measure: the arrival rate, the requests and KV
   tokens in flight (Little's law on the measured service time), the fluid
   backlog (rate above capacity, accumulated) and its queue wait, the replicas there are
   and the standby nodes; the history is a
   :class:`controlplane.scaling.history.History` (the leader's class, on the
   embedded store) fed by the same observations on the days before. The
   plan is applied as an autoscaler would: a replica added starts on a
   standby node (ready ``startup_seconds`` later) or, with none left, on a
   new machine (``replacement_seconds + startup_seconds``; a replica still
   waiting for its new machine moves to a standby node when one arrives); a
   replica removed frees its machine to the standby pool; the pool is topped up to
   ``standby_to_keep`` with new machines (arriving after
   ``replacement_seconds``) and trimmed above it. GPU-hours count every
   machine held: replicas (warming or ready) and standby nodes, each
   ``gpus_per_replica`` GPUs. ``days`` days are run; the last is measured.
   Compared: the same loop with no history (reactive: needed now only), and
   the peak capacity kept all day.
2. **The morning ramp in the engines** (:func:`ramp_ttft`): every
   ``sample_every_seconds`` of the ramp hours, a window of ``warmup_seconds
   + sample_seconds`` is replayed by the fleet simulator
   (:class:`tools.sim.fleet.Fleet`, Ferry's policy, real engines) on the
   replicas ready then (the fewest over the window), with Poisson arrivals
   at that minute's rate and the fluid backlog queued at its start. The
   requests are the trace's, in its order, repeated: the c-th pass over the
   trace shifts every block hash by ``c << 44``, so each pass is a fresh
   population of conversations with the trace's prefix structure (no
   prompt is a cache hit only because the excerpt was replayed twice).
   TTFTs of requests that arrive after the warm-up are pooled; a request
   refused counts as a miss (infinite TTFT). Every request is treated as
   interactive (the strictest reading: no lower tier yields to it).

Costs: layer 1 is O(minutes); layer 2 is the fleet simulator's cost over
the sampled windows (a few hundred thousand engine steps at full scale).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import random
import statistics
from collections.abc import Sequence
from typing import Any

from agent.replica.engine import EngineParams
from controlplane.scaling.history import History
from controlplane.scaling.plan import DAY, HOUR, Demand, Shape, State, Targets, needed_for, plan, standby_for
from controlplane.store.memory import MemoryStore
from tools.report import percentile
from tools.sim import capacity as capacity_run
from tools.sim.fleet import Fleet, FleetConfig
from tools.sim.policies import POLICIES
from tools.sim.workload import SimRequest, at_load

# Share of the peak arrival rate at each hour of the day (UTC), linear in between: a business day's curve,
# a trough at 03:00-05:00 of a tenth of the peak, the morning ramp from 06:00 to 09:00 (+40 % of the peak in
# the steepest hour), a plateau with a lunch dip, the evening decline.
DIURNAL = (0.22, 0.16, 0.12, 0.10, 0.10, 0.10, 0.15, 0.35, 0.75, 1.00, 1.00, 0.95,
           0.85, 0.90, 0.95, 0.95, 0.90, 0.80, 0.65, 0.50, 0.40, 0.34, 0.30, 0.26)
T0 = 20_000 * DAY  # the first simulated midnight (UTC), any will do
COPY_SHIFT = 44


@dataclasses.dataclass(frozen=True, kw_only=True)
class DayConfig:
    """The replay's parameters (defaults: the full run of docs/evaluation.md).

    ``peak_replicas``: the peak's demand in replicas at the target utilisation; ``gpus_per_replica``;
    ``startup_seconds`` (weights streamed onto a warm machine) and ``replacement_seconds`` (a new
    machine), as the control plane would have measured them; ``plan_seconds``: the plan's period;
    ``days``: days replayed, the last measured; ``ramp_hours``: the morning ramp measured in the engines;
    ``sample_every_seconds``, ``sample_seconds``, ``warmup_seconds``: its windows; ``proxies``, ``engine``,
    ``seed``: the fleet simulator's; ``targets``: the plan's.
    """

    peak_replicas: float = 16.0
    gpus_per_replica: int = 8
    startup_seconds: float = 600.0
    replacement_seconds: float = 1800.0
    plan_seconds: float = 60.0
    days: int = 2
    ramp_hours: tuple[float, float] = (6.0, 10.0)
    sample_every_seconds: float = 900.0
    sample_seconds: float = 60.0
    warmup_seconds: float = 30.0
    proxies: int = 2
    engine: EngineParams = dataclasses.field(default_factory=EngineParams)
    seed: int = 1
    targets: Targets = dataclasses.field(default_factory=lambda: Targets(
        ttft_target_seconds=4.0, utilisation=0.7, floor=1, cooldown_seconds=900.0, step_down=1,
        lookback_days=7, lead_seconds=60.0, failure_rate_per_hour=0.01))

    def __post_init__(self) -> None:
        self.targets.check()
        if not (self.peak_replicas > 0 and self.gpus_per_replica >= 1 and self.days >= 1
                and self.plan_seconds > 0 and self.startup_seconds >= 0 and self.replacement_seconds >= 0):
            raise ValueError("peak_replicas, gpus_per_replica, days, plan_seconds must be positive; "
                             "startup_seconds and replacement_seconds >= 0")
        start, end = self.ramp_hours
        if not 0 <= start < end <= 24 or self.sample_every_seconds <= 0 or self.sample_seconds <= 0:
            raise ValueError("ramp_hours must be 0 <= start < end <= 24; sample times positive")


def share_at(seconds_of_day: float) -> float:
    """The diurnal share of the peak at a time of day (seconds after midnight)."""
    h = (seconds_of_day % DAY) / HOUR
    i = int(h)
    return DIURNAL[i] + (DIURNAL[(i + 1) % 24] - DIURNAL[i]) * (h - i)


@dataclasses.dataclass(frozen=True, slots=True)
class Mix:
    """The request mix measured once on the trace: one replica's sustained rate, mean service seconds, mean
    tokens a request holds (prompt + output)."""

    replica_rate: float
    service_seconds: float
    tokens_per_request: float
    slots: int
    kv_tokens: int


def measure_mix(requests: Sequence[SimRequest], engine: EngineParams, *, seed: int = 1) -> Mix:
    """The mix of ``requests`` on one replica: saturated rate (:func:`tools.sim.capacity.measure`) and the
    mean time a request holds a slot at half that rate."""
    config = FleetConfig(replicas=1, proxies=1, engine=engine, seed=seed)
    rate = capacity_run.measure(requests, config)
    result = Fleet(config, POLICIES["ferry"], at_load(list(requests), 0.5, rate)).run()
    e2e = [s.e2e for s in result.served if not math.isnan(s.e2e)]
    tokens = statistics.fmean(r.prompt_tokens + r.max_tokens for r in requests)
    return Mix(rate, statistics.fmean(e2e), tokens, engine.max_running, engine.kv_blocks_total * engine.kv_block_tokens)


@dataclasses.dataclass(slots=True)
class _Fleet:
    """The machines of the fluid day: ready replicas, replicas warming (billed from, ready at), standby nodes,
    machines ordered for the pool (arriving at)."""

    ready: int
    warming: list[tuple[float, float]]
    standby: int
    arriving: list[float]

    def current(self) -> int:
        return self.ready + len(self.warming)


def run_day(config: DayConfig, mix: Mix, *, forecast: bool = True) -> dict[str, Any]:
    """Layer 1 (module docstring): the series of the last day, its GPU-hours, the ramp's fluid queue wait."""
    t = config.targets
    peak_rate = config.peak_replicas * mix.replica_rate * t.utilisation
    shape = Shape(slots=mix.slots, kv_tokens=mix.kv_tokens, replica_rate=mix.replica_rate)
    history = History(MemoryStore())
    start_need = math.ceil(needed_for(peak_rate * share_at(0.0), shape, t))
    fleet = _Fleet(ready=max(t.floor, start_need), warming=[], standby=0, arriving=[])
    previous: State | None = None
    backlog = 0.0
    dt = config.plan_seconds
    steps = round(DAY / dt)
    series: list[dict[str, Any]] = []
    gpu_hours = 0.0
    last_day = config.days - 1
    for day in range(config.days):
        for step in range(steps):
            now = T0 + day * DAY + step * dt
            fleet.ready += sum(1 for _, ready_at in fleet.warming if ready_at <= now)
            fleet.warming = [w for w in fleet.warming if w[1] > now]
            fleet.standby += sum(1 for at in fleet.arriving if at <= now)
            fleet.arriving = [at for at in fleet.arriving if at > now]
            rate = peak_rate * share_at(now - T0)
            capacity = fleet.ready * mix.replica_rate
            backlog = max(0.0, backlog + (rate - capacity) * dt)
            wait = backlog / capacity if capacity > 0 else (math.inf if backlog > 0 else 0.0)
            in_flight = min(rate, capacity) * mix.service_seconds
            demand = Demand(arrival_rate=rate, service_seconds=mix.service_seconds, in_flight=in_flight,
                            queued=backlog, tokens_in_flight=in_flight * mix.tokens_per_request,
                            queue_wait_seconds=min(wait, 1e9), ready=fleet.ready)
            decided = plan(demand, shape, t, history=history.records("chat", "sim"), now=now,
                           startup_seconds=config.startup_seconds, replacement_seconds=config.replacement_seconds,
                           current=fleet.current(), standby_nodes=fleet.standby, previous=previous)
            previous = decided.state
            if forecast:
                history.observe("chat", "sim", now, rate, mix.service_seconds)
            _apply(fleet, decided.desired, decided.promote, standby_for([decided]), now, config)
            held = fleet.ready + sum(1 for bill_from, _ in fleet.warming if bill_from <= now) + fleet.standby
            if day == last_day:
                gpu_hours += held * config.gpus_per_replica * dt / HOUR
                series.append({"hour": round(step * dt / HOUR, 4), "rate": round(rate, 3),
                               "needed_now": decided.needed_now, "needed_for_ramp": decided.needed_for_ramp,
                               "desired": decided.desired, "ready": fleet.ready, "current": fleet.current(),
                               "standby": fleet.standby, "standby_to_keep": decided.standby_to_keep,
                               "queue_wait_s": round(min(wait, 1e6), 3), "backlog": round(backlog, 2)})
    return {"series": series, "gpu_hours": round(gpu_hours, 2), "peak_rate": round(peak_rate, 3)}


def _apply(fleet: _Fleet, desired: int, promote: int, keep: int, now: float, config: DayConfig) -> None:
    """The autoscaler: replicas to ``desired`` (``promote`` of them on standby nodes, the rest on new machines),
    then the standby pool to ``keep``."""
    for i, (bill_from, _) in enumerate(fleet.warming):  # a replica waiting for a new machine takes a warm one
        if bill_from > now and fleet.standby > 0:
            fleet.standby -= 1
            fleet.warming[i] = (now, now + config.startup_seconds)
    diff = desired - fleet.current()
    if diff > 0:
        on_standby = min(promote, diff, fleet.standby)
        fleet.standby -= on_standby
        fleet.warming += [(now, now + config.startup_seconds)] * on_standby
        bill_from = now + config.replacement_seconds
        fleet.warming += [(bill_from, bill_from + config.startup_seconds)] * (diff - on_standby)
    elif diff < 0:
        remove = -diff
        fleet.warming.sort(key=lambda w: w[1])
        while remove and fleet.warming:
            bill_from, _ = fleet.warming.pop()
            fleet.standby += bill_from <= now  # a machine that has arrived stays warm
            remove -= 1
        taken = min(remove, fleet.ready)
        fleet.ready -= taken
        fleet.standby += taken
    pool = fleet.standby + len(fleet.arriving)
    if pool < keep:
        fleet.arriving += [now + config.replacement_seconds] * (keep - pool)
    elif fleet.standby > keep:
        fleet.standby = keep  # machines beyond the pool are given back


class Arrivals:
    """The trace's requests in order, repeated with shifted block hashes (module docstring), Poisson arrivals."""

    def __init__(self, requests: Sequence[SimRequest], seed: int) -> None:
        self._requests = requests
        self._next = 0
        self._rng = random.Random(seed)

    def window(self, rate: float, seconds: float, *, queued: int = 0) -> list[SimRequest]:
        """``queued`` requests at time 0, then Poisson arrivals at ``rate`` for ``seconds``."""
        out: list[SimRequest] = []
        at = 0.0
        while True:
            if len(out) >= queued:
                at += self._rng.expovariate(rate) if rate > 0 else math.inf
                if at >= seconds:
                    return out
            base = self._requests[self._next % len(self._requests)]
            copy = self._next // len(self._requests)
            self._next += 1
            hashes = tuple(h + (copy << COPY_SHIFT) for h in base.hash_ids) if copy else base.hash_ids
            out.append(dataclasses.replace(base, index=len(out), arrival=at, hash_ids=hashes))


def ramp_ttft(config: DayConfig, mix: Mix, requests: Sequence[SimRequest], series: list[dict[str, Any]],
              *, fixed_replicas: int | None = None) -> dict[str, Any]:
    """Layer 2 (module docstring): TTFT p99 over the ramp's windows on the replicas ``series`` had ready (or
    ``fixed_replicas``), per window and pooled."""
    peak_rate = config.peak_replicas * mix.replica_rate * config.targets.utilisation
    arrivals = Arrivals(requests, config.seed)
    hours = [row["hour"] for row in series]
    start, end = config.ramp_hours
    pooled: list[float] = []
    windows: list[dict[str, Any]] = []
    at = start * HOUR
    while at < end * HOUR:
        lo = bisect.bisect_left(hours, at / HOUR)
        hi = bisect.bisect_right(hours, (at + config.sample_seconds) / HOUR)
        rows = series[lo:max(hi, lo + 1)]
        replicas = fixed_replicas if fixed_replicas is not None else min(r["ready"] for r in rows)
        rate = peak_rate * share_at(at)
        queued = round(rows[0]["backlog"]) if fixed_replicas is None else 0
        reqs = arrivals.window(rate, config.warmup_seconds + config.sample_seconds, queued=queued)
        ttfts: list[float] = []
        if replicas > 0 and reqs:
            fleet = FleetConfig(replicas=replicas, proxies=config.proxies, engine=config.engine, seed=config.seed)
            result = Fleet(fleet, POLICIES["ferry"], reqs).run()
            ttfts = [math.inf if s.rejected or math.isnan(s.ttft) else s.ttft
                     for r, s in zip(reqs, result.served, strict=True) if r.arrival >= config.warmup_seconds]
        else:
            ttfts = [math.inf] * sum(1 for r in reqs if r.arrival >= config.warmup_seconds)
        pooled += ttfts
        p99 = percentile(ttfts, 99) if ttfts else math.nan
        windows.append({"hour": round(at / HOUR, 3), "replicas": replicas, "rate": round(rate, 3),
                        "requests": len(ttfts), "ttft_p99_s": _finite(p99)})
        at += config.sample_every_seconds
    p99 = percentile(pooled, 99) if pooled else math.nan
    return {"ttft_p99_s": _finite(p99), "requests": len(pooled), "misses": sum(1 for x in pooled if math.isinf(x)),
            "windows": windows}


def _finite(x: float) -> float | None:
    return round(x, 4) if math.isfinite(x) else None


def simulate(config: DayConfig, requests: Sequence[SimRequest]) -> dict[str, Any]:
    """Both layers for the plan with history, without (reactive), and peak capacity all day."""
    mix = measure_mix(requests, config.engine, seed=config.seed)
    scaled = run_day(config, mix, forecast=True)
    reactive = run_day(config, mix, forecast=False)
    peak = max(row["desired"] for row in scaled["series"])
    peak_hours = peak * config.gpus_per_replica * 24.0
    target = config.targets.ttft_target_seconds
    ramps = {"scaled": ramp_ttft(config, mix, requests, scaled["series"]),
             "reactive": ramp_ttft(config, mix, requests, reactive["series"]),
             "peak_all_day": ramp_ttft(config, mix, requests, scaled["series"], fixed_replicas=peak)}
    start, end = config.ramp_hours

    def in_ramp(run: dict[str, Any], field: str) -> float:
        return float(max(row[field] for row in run["series"] if start <= row["hour"] < end))

    return {
        "config": {**{k: v for k, v in dataclasses.asdict(config).items() if k not in ("engine", "targets")},
                   "targets": dataclasses.asdict(config.targets), "engine": dataclasses.asdict(config.engine)},
        "diurnal": list(DIURNAL),
        "mix": dataclasses.asdict(mix),
        "peak_rate": scaled["peak_rate"],
        "peak_replicas": peak,
        "gpu_hours": {"scaled": scaled["gpu_hours"], "reactive": reactive["gpu_hours"], "peak_all_day": peak_hours},
        "saved_share": round(1.0 - scaled["gpu_hours"] / peak_hours, 4),
        "ttft_target_s": target,
        "ramp": {name: {**r, "within_target": r["ttft_p99_s"] is not None and r["ttft_p99_s"] <= target}
                 for name, r in ramps.items()},
        "ramp_max_queue_wait_s": {"scaled": in_ramp(scaled, "queue_wait_s"),
                                  "reactive": in_ramp(reactive, "queue_wait_s")},
        "series": {"scaled": scaled["series"], "reactive": reactive["series"]},
    }
