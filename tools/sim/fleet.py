"""The fleet simulator's core: a discrete-event loop in virtual time over real engines, tables and policies.

What runs, unchanged: N :class:`agent.replica.engine.Engine` replicas (one per
replica, ``start_step(now)`` returning a duration and ``finish_step(now +
duration)`` at the end of it), the control plane's snapshot turned into a
proxy table by :func:`dataplane.table.local.build_table`, and the policies of
:mod:`tools.sim.policies` (Ferry's is the proxy's :class:`dataplane.attempt.AttemptLoop`
over its :class:`dataplane.pick.state.PickState`).

Events, in time order (ties in the order they were scheduled):

- **arrival**: the request goes to a proxy drawn at random (clients spread
  over the proxies), whose policy admits it (Ferry's: the proxy's admission
  gate, :class:`dataplane.admission.gate.Admission`, its tier queues sized from
  every table (a grown capacity starts waiting requests at the **table tick**): a
  request waits there while every slot this proxy dispatches into is taken,
  and one still waiting at the gate's wait limit is refused, a **timeout**
  event) and, once it may start, picks a
  replica with that proxy's table
  (none: the request is refused, as the proxy would refuse it, e.g. longer
  than every replica's context); the engine queues it; a refusal by the
  engine (queue full, too long) is told to the policy, which may try another
  replica (Ferry's: the proxy's retry rule and budget, asked of its attempt
  loop, :class:`dataplane.attempt.AttemptLoop`), else the request
  counts as rejected; an idle engine starts a step.
- **step end**: ``finish_step``; first tokens give TTFT (arrival to the end
  of the prefill step) and tell the policy (Ferry's outlier detector and
  prefill backlog use the time), finished requests give end-to-end latency
  and tell their proxy's policy; the next step starts at once if there is
  work.
- **telemetry**: every ``telemetry_seconds`` (phase drawn per replica) the
  replica's agent samples its load (queued, running, free KV blocks), as a
  real agent polls its replica.
- **table tick**: every ``refresh_seconds`` the control plane builds a
  snapshot from the latest samples (``telemetry_age_seconds`` = tick - sample
  time), and every proxy applies it as its own table (the policy's
  ``apply``, as the proxy's table listener). Between ticks a proxy
  routes on that table, its age growing, plus whatever it counts itself.

With ``busy_bin_seconds``, each step's duration is also summed into bins of
virtual time (all replicas together): the fleet's busy time per window.
A request that names its ``proxy`` (recorded traffic) arrives there.

Network and proxy processing take no virtual time. Deterministic for a seed:
one ``random.Random(seed)`` draws the phases and seeds each proxy's own.

Cost: O(events log events); events are dominated by engine steps (each
O(running)), about (replicas x makespan / step time).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
from collections.abc import Mapping, Sequence

from agent.replica.engine import Engine, EngineLoad, EngineParams, EngineRequest, StepResult, SubmitOutcome
from dataplane.table.local import Table, TableParams, build_table
from dataplane.table.ring import DEFAULT_LOAD_FACTOR
from ferry.v1 import common_pb2, tables_pb2
from tools.sim.policies import MODEL, PolicyFactory
from tools.sim.workload import SimRequest

_ARRIVAL, _STEP, _TELEMETRY, _TICK, _TIMEOUT = 0, 1, 2, 3, 4


@dataclasses.dataclass(frozen=True, kw_only=True)
class FleetConfig:
    """Shape of the simulated fleet."""

    replicas: int = 16
    proxies: int = 4
    refresh_seconds: float = 0.5     # control-plane table tick, applied by every proxy
    telemetry_seconds: float = 0.5   # agent telemetry interval per replica
    engine: EngineParams = dataclasses.field(default_factory=EngineParams)
    engines: Mapping[int, EngineParams] = dataclasses.field(default_factory=dict)  # per replica, instead of engine
    load_factor: float = DEFAULT_LOAD_FACTOR  # the table's ring parameter
    table: TableParams | None = None  # the proxies' table parameters whole (instead of load_factor)
    busy_bin_seconds: float = 0.0  # > 0: engine busy time summed over replicas per bin of this width (RunResult.busy)
    seed: int = 1


@dataclasses.dataclass(slots=True)
class Served:
    """What happened to one request (times in virtual seconds; NaN when it never got there)."""

    replica: int = -1
    branch: str = ""
    ttft: float = math.nan
    e2e: float = math.nan
    cached_tokens: int = 0
    rejected: bool = False
    attempts: int = 0
    tokens: int = 0  # output tokens so far (told to the policy until it says it has seen enough)


@dataclasses.dataclass(frozen=True, slots=True)
class RunResult:
    """The raw outcome of one run, for :mod:`tools.sim.report`."""

    requests: Sequence[SimRequest]
    served: Sequence[Served]
    loads: Sequence[EngineLoad]           # each replica's counters at the end
    mean_outstanding: Sequence[float]     # each replica's queued + running, averaged over telemetry samples
    makespan: float                       # virtual time of the last event
    busy: Sequence[float] = ()            # engine-busy seconds over all replicas per bin (FleetConfig.busy_bin_seconds)


def _route(i: int, load: EngineLoad, sampled: float, tick: float, context: int) -> tables_pb2.ReplicaRoute:
    rid = f"r{i:03d}"
    return tables_pb2.ReplicaRoute(
        replica_id=rid, node=f"node-{i:03d}", version="v1", address=f"10.0.{i // 250}.{i % 250 + 1}:8001",
        max_concurrency=load.max_running, kv_block_tokens=load.kv_block_tokens, max_context_tokens=context,
        load=common_pb2.ReplicaLoad(replica_id=rid, state=common_pb2.REPLICA_STATE_READY, queued=load.queued,
                                    running=load.running, kv_blocks_free=load.kv_blocks_free,
                                    kv_blocks_total=load.kv_blocks_total),
        telemetry_age_seconds=max(0.0, tick - sampled),
    )


class Fleet:
    """One simulated run; :meth:`run` returns its :class:`RunResult`."""

    def __init__(self, config: FleetConfig, policy: PolicyFactory, requests: Sequence[SimRequest]) -> None:
        self.config = config
        self.requests = requests
        rng = random.Random(config.seed)
        self.engines = [Engine(config.engines.get(i, config.engine)) for i in range(config.replicas)]
        self.ids = [f"r{i:03d}" for i in range(config.replicas)]
        self.index = {rid: i for i, rid in enumerate(self.ids)}
        self.policies = [policy(p, random.Random(rng.getrandbits(64))) for p in range(config.proxies)]
        drawn = [rng.randrange(config.proxies) for _ in requests]  # drawn for all: the seed's sequence stays
        self.proxy_of = [r.proxy % config.proxies if r.proxy >= 0 else p for r, p in zip(requests, drawn, strict=True)]
        self.phases = [rng.uniform(0.0, config.telemetry_seconds) for _ in range(config.replicas)]
        self.served = [Served() for _ in requests]
        self.samples: list[tuple[float, EngineLoad]] = [(0.0, e.load()) for e in self.engines]
        self.outstanding = [0.0] * config.replicas
        self.sample_count = [0] * config.replicas
        self.stepping = [False] * config.replicas
        self.tables: list[Table] = []
        self.version = 0
        self._heap: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self.busy: list[float] = []
        self.now = 0.0
        self.pending = len(requests)

    def _push(self, when: float, kind: int, arg: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, kind, arg))

    def _tick(self) -> None:
        self.version += 1
        snapshot = tables_pb2.TableSnapshot(version=self.version, nonce=str(self.version), region="sim",
                                            computed_at=self.now)
        route = snapshot.models.add(model=MODEL, default_version="v1")
        route.replicas.extend(_route(i, load, at, self.now, self.engines[i].params.max_context_tokens)
                              for i, (at, load) in enumerate(self.samples))
        previous = self.tables[0] if self.tables else None
        table = build_table(snapshot, region="sim", applied_at=self.now, previous=previous,
                            params=self.config.table or TableParams(load_factor=self.config.load_factor))
        self.tables = [table] * self.config.proxies
        for policy in self.policies:
            self._settle(policy.apply(table), ())

    def _telemetry(self, i: int) -> None:
        load = self.engines[i].load()
        self.samples[i] = (self.now, load)
        self.outstanding[i] += load.queued + load.running
        self.sample_count[i] += 1

    def _step(self, i: int) -> None:
        duration = self.engines[i].start_step(self.now)
        self.stepping[i] = duration is not None
        if duration is not None:
            self._push(self.now + duration, _STEP, i)
            if self.config.busy_bin_seconds > 0:
                self._count_busy(self.now, self.now + duration)

    def _count_busy(self, start: float, end: float) -> None:
        """Add the step [start, end) to the busy bins it overlaps (a step spans a bin boundary now and then)."""
        width = self.config.busy_bin_seconds
        while start < end:
            k = int(start // width)
            if (k + 1) * width <= start:  # start on a bin's edge, floored into the bin before it by rounding
                k += 1
            if k >= len(self.busy):
                self.busy.extend([0.0] * (k + 1 - len(self.busy)))
            edge = min(end, (k + 1) * width)
            self.busy[k] += edge - start
            start = edge

    def _arrive(self, n: int) -> None:
        """Admission at the request's proxy: the requests it lets start now, those it refuses, a wait's limit."""
        req = self.requests[n]
        policy = self.policies[self.proxy_of[n]]
        start, refuse = policy.admit(req, self.now)
        self._settle(start, refuse)
        limit = policy.wait_limit(req)
        if limit is not None and n not in start and n not in refuse:
            self._push(self.now + limit, _TIMEOUT, n)

    def _settle(self, start: Sequence[int], refuse: Sequence[int]) -> None:
        for m in refuse:
            self._reject(m)
        for m in start:
            self._attempt(m)

    def _reject(self, n: int) -> None:
        self.served[n].rejected = True
        self.pending -= 1

    def _release(self, n: int) -> None:
        """Request ``n`` left its replica (answered or refused): its proxy may start others."""
        start, refuse = self.policies[self.proxy_of[n]].release(self.requests[n], self.now)
        self._settle(start, refuse)

    def _attempt(self, n: int, tried: tuple[str, ...] = ()) -> None:
        req = self.requests[n]
        proxy = self.proxy_of[n]
        policy = self.policies[proxy]
        replica_id, branch = policy.pick(self.tables[proxy], req, self.now, tried)
        served = self.served[n]
        served.branch = branch
        if replica_id is None:  # refused by the proxy (nothing can serve it)
            self._reject(n)
            self._release(n)
            return
        i = self.index[replica_id]
        served.replica = i
        served.attempts += 1
        admission = self.engines[i].submit(
            EngineRequest(request_id=str(n), prompt_tokens=req.prompt_tokens, max_tokens=req.max_tokens,
                          block_hashes=req.hash_ids), self.now)
        if admission is not SubmitOutcome.QUEUED:
            if policy.refused(req, replica_id, self.now):
                self._attempt(n, (*tried, replica_id))
                return
            self._reject(n)
            self._release(n)
            return
        if not self.stepping[i]:
            self._step(i)

    def _finish(self, i: int) -> None:
        result: StepResult = self.engines[i].finish_step(self.now)
        for rid in result.first:
            n = int(rid)
            self.served[n].ttft = self.now - self.requests[n].arrival
            self.policies[self.proxy_of[n]].first(self.requests[n], self.ids[i], self.now)
        for rid in result.tokens:
            served = self.served[int(rid)]
            if served.tokens >= 0:  # -1: the policy saw enough
                served.tokens += 1
                n = int(rid)
                if not self.policies[self.proxy_of[n]].progress(self.requests[n], self.ids[i], served.tokens,
                                                                self.now):
                    served.tokens = -1
        for done in result.finished:
            n = int(done.request_id)
            served = self.served[n]
            served.e2e = self.now - self.requests[n].arrival
            served.cached_tokens = done.cached_tokens
            self.pending -= 1
            self.policies[self.proxy_of[n]].done(self.requests[n], self.ids[i], done.cached_tokens, self.now,
                                                 done.completion_tokens)
            self._release(n)
        self._step(i)

    def run(self) -> RunResult:
        """Run until every request finished or was rejected."""
        cfg = self.config
        self._tick()
        for n, req in enumerate(self.requests):
            self._push(req.arrival, _ARRIVAL, n)
        for i, phase in enumerate(self.phases):
            self._push(phase, _TELEMETRY, i)
        self._push(cfg.refresh_seconds, _TICK, 0)
        heap = self._heap
        while heap and self.pending > 0:
            self.now, _, kind, arg = heapq.heappop(heap)
            if kind == _STEP:
                self._finish(arg)
            elif kind == _ARRIVAL:
                self._arrive(arg)
            elif kind == _TIMEOUT:
                if self.policies[self.proxy_of[arg]].expire(self.requests[arg], self.now):
                    self._reject(arg)
            elif kind == _TELEMETRY:
                self._telemetry(arg)
                self._push(self.now + cfg.telemetry_seconds, _TELEMETRY, arg)
            else:
                self._tick()
                self._push(self.now + cfg.refresh_seconds, _TICK, 0)
        mean = [s / c if c else 0.0 for s, c in zip(self.outstanding, self.sample_count, strict=True)]
        return RunResult(self.requests, self.served, [e.load() for e in self.engines], mean, self.now, self.busy)
