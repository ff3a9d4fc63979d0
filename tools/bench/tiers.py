"""Tier benchmarks: isolation, reclaim, noisy neighbour and overload, simulated and real.

``python -m tools.bench.tiers [--mode sim|real|both] [--trials N] [--out bench-results/tiers.json]``
prints each figure and writes ``{"sim": {...}, "real": {...}}``, each with
``isolation`` (``interactive_p99_ratio``, ``utilisation``, ``drained``),
``reclaim`` (``seconds``, ``recovery_seconds``), ``noisy``
(``max_other_p99_ratio``) and ``overload`` (``paid_interactive_p99_ms``,
``unanswered``, ``max_rss_mb``).

Scenarios (capacity: the requests/s the fleet completes when saturated, measured;
output lengths spread evenly over 0.5 to 1.5 times the mean, 64 tokens for
interactive and standard, 256 for batch, prompts of 256 tokens):

- isolation: interactive at 40 % of capacity alone, then with a batch backlog
  of three times the fleet's slots queued at t=0: interactive TTFT p99 ratio,
  mean slot utilisation while the backlog lasts, whether it drained;
  ``isolation_frontier`` (simulated only) repeats it with 2 to 7 of the 8
  replicas kept for interactive (``interactive_replica_share`` 0.25 to
  0.875), against the same baseline (the default proxy with no batch): what
  isolation costs in utilisation;
- reclaim: interactive at 20 % for ``step`` seconds then 80 %, batch filling
  the rest: ``seconds``, from the step until batch runs within its quota (as
  the proxy computes it from demand) in every later sample;
  ``batch_to_reserve_seconds``, until batch is down to its reserve plus 5 % of
  the slots (paced by interactive demand filling up); ``recovery_seconds``,
  until interactive TTFT p99 over 0.5 s windows stays within 1.2 x its
  steady p99 of the last 3 s; ``steady_p99_vs_no_batch``, that steady p99
  over the p99 of interactive at 80 % alone;
- noisy: standard tier, five tenants at 120 % of capacity, one sending 60 %:
  the worst ratio of another tenant's TTFT p99 with it to without it (the
  heavy tenant held to its share and, on whole replicas, to a shard of its
  own: :mod:`dataplane.admission.sharding`), and how many of its requests were answered;
- overload: five times capacity, a mix of plans and tiers: paid interactive
  TTFT p99, requests with no answer by their deadline, the process's peak RSS.

The simulated mode (:mod:`tools.sim.tiers`) runs the proxy's queue code and
the replicas' engine in virtual time; the real mode (:mod:`tools.bench.tiers_real`)
runs a control plane, a proxy and a node of simulated replicas as processes.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.replica.engine import EngineParams
from dataplane.admission.queues import QueueParams
from tools.sim.tiers import Outcome, Req, TierSim

ENGINE = EngineParams(max_running=60)
REPLICAS = 8
INTERACTIVE_TOKENS, BATCH_TOKENS = 64, 256


def service_seconds(engine: EngineParams, tokens: int, prompt: int = 256) -> float:
    """One request's time on a full replica."""
    step = engine.decode_base_seconds + engine.decode_seconds_per_request * engine.max_running
    return engine.prefill_base_seconds + engine.prefill_seconds_per_token * prompt + tokens * step


def capacity_rps(replicas: int, engine: EngineParams, tokens: int) -> float:
    """Requests per second the fleet completes at full load."""
    return replicas * engine.max_running / service_seconds(engine, tokens)


def p99(values: Sequence[float]) -> float:
    """The 99th percentile (nearest rank); nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def arrivals(rate: float, start: float, end: float, seed: int) -> list[float]:
    """Deterministic arrivals at ``rate``/s in [start, end) (golden-ratio jittered spacing)."""
    if rate <= 0:
        return []
    n = int((end - start) * rate)
    phi = (math.sqrt(5) - 1) / 2
    return [start + (i + ((i * phi + seed * 0.37) % 1.0)) / rate for i in range(n)]


class Ids:
    """Request ids for one scenario."""

    def __init__(self) -> None:
        self.n = 0

    def reqs(self, times: list[float], **kw: Any) -> list[Req]:
        """Requests arriving at ``times``; ``max_tokens`` spread over 0.5x..1.5x its value (output lengths vary)."""
        out = []
        mean = kw.pop("max_tokens", 64)
        for t in times:
            self.n += 1
            tokens = max(1, int(mean * (0.5 + (self.n * 0.6180339887) % 1.0)))
            out.append(Req(rid=self.n, arrival=t, max_tokens=tokens, **kw))
        return out


def _sim(reqs: list[Req], until: float, **kw: Any) -> TierSim:
    params = QueueParams(**kw) if kw else QueueParams()
    return TierSim(replicas=REPLICAS, engine=ENGINE, queues=params).run(reqs, until)


def _ttft(sim: TierSim, pred: Any) -> list[float]:
    return [o.ttft for o in sim.outcomes.values() if pred(o) and o.ttft is not None]


def sim_isolation(share: float = 0.0) -> dict[str, Any]:
    """Isolation with ``share`` of the replicas kept for interactive; the baseline is always the default proxy's."""
    cap = measured_capacity()
    ids = Ids()
    inter = ids.reqs(arrivals(0.4 * cap, 0.0, 30.0, 1), tier="interactive", max_tokens=INTERACTIVE_TOKENS)
    alone = _sim(inter, 60.0)
    backlog = ids.reqs([0.0] * (3 * REPLICAS * ENGINE.max_running), tier="batch", tenant="bulk",
                       max_tokens=BATCH_TOKENS, deadline=120.0)
    mixed = _sim(inter + backlog, 120.0, interactive_replica_share=share)
    def is_inter(o: Outcome) -> bool:  # after 1 s: the first prefill of the whole backlog is a start-up transient
        return o.req.tier == "interactive" and o.req.arrival >= 1.0
    busy = [s for s in mixed.samples if s.waiting["batch"] > 0 and 1.0 <= s.at <= 30.0]
    slots = REPLICAS * ENGINE.max_running
    util = sum(sum(s.running.values()) for s in busy) / (len(busy) * slots) if busy else 0.0
    drained = all(o.done is not None for o in mixed.outcomes.values() if o.req.tier == "batch")
    last = max((o.done or 0.0) for o in mixed.outcomes.values() if o.req.tier == "batch")
    return {"interactive_p99_ratio": round(p99(_ttft(mixed, is_inter)) / p99(_ttft(alone, is_inter)), 3),
            "interactive_p99_ms": round(1000 * p99(_ttft(mixed, is_inter)), 1),
            "interactive_alone_p99_ms": round(1000 * p99(_ttft(alone, is_inter)), 1),
            "utilisation": round(util, 3), "drained": drained, "drained_at_seconds": round(last, 2),
            "preempted": mixed.preempted}


FRONTIER_SHARES = (0.25, 0.375, 0.5, 0.625, 0.75, 0.875)


def sim_isolation_frontier() -> list[dict[str, Any]]:
    """Isolation against utilisation as replicas are kept for interactive (``[proxy] interactive_replica_share``)."""
    keys = ("interactive_p99_ratio", "interactive_p99_ms", "utilisation", "drained", "drained_at_seconds")
    return [{"interactive_replica_share": share, **{k: v for k, v in sim_isolation(share).items() if k in keys}}
            for share in FRONTIER_SHARES]


def sim_reclaim(step: float = 10.0) -> dict[str, Any]:
    cap = measured_capacity()
    slots = REPLICAS * ENGINE.max_running
    ids = Ids()
    low = ids.reqs(arrivals(0.2 * cap, 0.0, step, 2), tier="interactive", max_tokens=INTERACTIVE_TOKENS)
    high = ids.reqs(arrivals(0.8 * cap, step, 2 * step, 3), tier="interactive", max_tokens=INTERACTIVE_TOKENS)
    batch = ids.reqs([0.0] * (4 * slots), tier="batch", tenant="bulk", max_tokens=BATCH_TOKENS, deadline=300.0)
    base = _sim(ids.reqs(arrivals(0.8 * cap, 0.0, step, 4), tier="interactive", max_tokens=INTERACTIVE_TOKENS),
                step + 5)
    target = 1.2 * p99(_ttft(base, lambda o: True))
    sim = _sim(low + high + batch, 2 * step + 1)
    after = [s for s in sim.samples if step <= s.at <= 2 * step]
    over = [s.at - step for s in after if s.running["batch"] > s.batch_quota]
    reserve = math.floor(0.1 * slots)
    floor = next((s.at - step for s in after if s.running["batch"] <= reserve + 0.05 * slots), None)
    windows = [(a, p99(_ttft(sim, lambda o, a=a: o.req.tier == "interactive" and a <= o.req.arrival < a + 0.5))
                ) for a in (step + 0.5 * k for k in range(int(2 * step)))]
    steady = p99(_ttft(sim, lambda o: o.req.tier == "interactive" and 2 * step - 3 <= o.req.arrival < 2 * step))
    bad = [a for a, v in windows if v > 1.2 * steady]
    return {"seconds": round(over[-1] + 0.1 if over else 0.0, 3),
            "batch_to_reserve_seconds": None if floor is None else round(floor, 3),
            "recovery_seconds": round(bad[-1] + 0.5 - step, 3) if bad else 0.0,
            "steady_p99_ms": round(1000 * steady, 1),
            "steady_p99_vs_no_batch": round(steady / (target / 1.2), 3), "preempted": sim.preempted}


def sim_noisy() -> dict[str, Any]:
    cap = measured_capacity()
    total = 1.2 * cap
    ids = Ids()
    others = [r for i in range(4) for r in ids.reqs(arrivals(0.1 * total, 0.0, 20.0, 10 + i), tier="standard",
                                                     tenant=f"t{i}", max_tokens=INTERACTIVE_TOKENS)]
    noisy = ids.reqs(arrivals(0.6 * total, 0.0, 20.0, 20), tier="standard", tenant="noisy",
                     max_tokens=INTERACTIVE_TOKENS)
    without = _sim(others, 60.0)
    mixed = _sim(others + noisy, 60.0)
    ratios = {}
    for i in range(4):
        def mine(o: Outcome, t: str = f"t{i}") -> bool:
            return o.req.tenant == t
        ratios[f"t{i}"] = round(p99(_ttft(mixed, mine)) / p99(_ttft(without, mine)), 3)
    shed_others = sum(1 for o in mixed.outcomes.values() if o.shed and o.req.tenant != "noisy")
    return {"max_other_p99_ratio": max(ratios.values()), "ratios": ratios, "others_shed": shed_others,
            "noisy_shed": sum(1 for o in mixed.outcomes.values() if o.shed and o.req.tenant == "noisy"),
            "noisy_answered": sum(1 for o in mixed.outcomes.values() if o.done is not None and o.req.tenant == "noisy"),
            "noisy_requests": len(noisy)}


OVERLOAD_MIX = (("interactive", "paid", 0.1, 5.0), ("interactive", "free", 0.1, 5.0),
                ("standard", "paid", 0.2, 15.0), ("standard", "free", 0.2, 15.0),
                ("batch", "paid", 0.2, 30.0), ("batch", "free", 0.2, 30.0))


def sim_overload(factor: float = 5.0, seconds: float = 10.0) -> dict[str, Any]:
    cap = measured_capacity()
    ids = Ids()
    reqs: list[Req] = []
    for k, (tier, plan, share, deadline) in enumerate(OVERLOAD_MIX):
        for i in range(4):
            reqs += ids.reqs(arrivals(factor * cap * share / 4, 0.0, seconds, 30 + 4 * k + i), tier=tier,
                             plan=plan, tenant=f"{plan}{i}", max_tokens=INTERACTIVE_TOKENS, deadline=deadline)
    sim = _sim(reqs, seconds + 40.0)
    paid = _ttft(sim, lambda o: o.req.tier == "interactive" and o.req.plan == "paid")
    unanswered = sum(1 for o in sim.outcomes.values()
                     if o.answered_at is None or o.answered_at > o.req.arrival + o.req.deadline + 1e-9)
    shed = {f"{t}/{p}": sum(1 for o in sim.outcomes.values() if o.shed and (o.req.tier, o.req.plan) == (t, p))
            for t, p, _, _ in OVERLOAD_MIX}
    no_retry = sum(1 for o in sim.outcomes.values() if o.shed and not o.retry_after > 0)
    return {"paid_interactive_p99_ms": round(1000 * p99(paid), 1), "unanswered": unanswered,
            "deadline_exceeded": sum(1 for o in sim.outcomes.values() if o.expired),
            "requests": len(reqs), "shed": shed, "shed_without_retry_after": no_retry,
            "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


_CAPACITY: list[float] = []


def measured_capacity(seconds: float = 10.0) -> float:
    """Requests/s the simulated fleet completes when saturated with interactive-sized requests (cached)."""
    if not _CAPACITY:
        offered = 2 * capacity_rps(REPLICAS, ENGINE, INTERACTIVE_TOKENS)
        reqs = Ids().reqs(arrivals(offered, 0.0, seconds, 9), tier="standard", max_tokens=INTERACTIVE_TOKENS,
                          deadline=1e6)
        sim = _sim(reqs, seconds, bounds={"interactive": 1, "standard": 100_000, "batch": 1},
                   timeouts={"interactive": 1.0, "standard": 1e6, "batch": 1.0}, max_queued=100_000)
        done = [o.done for o in sim.outcomes.values() if o.done is not None and 2.0 <= o.done < seconds]
        _CAPACITY.append(len(done) / (seconds - 2.0))
    return _CAPACITY[0]


def run_sim() -> dict[str, Any]:
    """Every scenario in the simulator."""
    return {"capacity_rps": round(measured_capacity(), 1), "isolation": sim_isolation(),
            "isolation_frontier": sim_isolation_frontier(), "reclaim": sim_reclaim(), "noisy": sim_noisy(),
            "overload": sim_overload()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_tiers", description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("sim", "real", "both"), default="both")
    parser.add_argument("--out", default="bench-results/tiers.json")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the real fleet's logs here")
    parser.add_argument("--trials", type=int, default=5, help="real isolation and noisy-neighbour trials (median)")
    args = parser.parse_args(argv)
    path = Path(args.out)
    report: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    if args.mode in ("sim", "both"):
        report["sim"] = run_sim()
        print(json.dumps({"sim": report["sim"]}, indent=1))
    if args.mode in ("real", "both"):
        from tools.bench.tiers_real import run_real
        report["real"] = run_real(args.workdir, max(1, args.trials))
        print(json.dumps({"real": report["real"]}, indent=1))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
