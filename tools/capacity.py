"""Capacity calculator for the fixed-batch backend: the arithmetic, the timer, and a measured answer.

``python -m tools.capacity --rate 10000 --p95-ms 500`` prints

(a) the briefs' arithmetic: per GPU ``max_batch / batch_s`` requests/s at full
    batches, the floor, the rule of thumb (65 % utilisation plus two spares),
    and the router fleet's sizing (developers, requests a day, peak, in flight,
    replicas);
(b) the derivation of the batcher's ``max_wait`` from the budget
    (:func:`agent.batch.budget.derive`);
(c) a measured answer: the fewest GPUs that hold P95 ≤ the budget at the rate,
    found by running the real batcher, fill order, GPU scheduler and requeue
    (:mod:`agent.batch.simulate`) against simulated GPUs in virtual time with
    seeded random arrivals (exponential gaps); then the same with one GPU killed mid-run (its
    batch goes back to the head of the queue). A count holds when its P95 is
    within budget, no request is lost, answered twice, shed or failed, and the
    surviving GPUs carry the rate below their full-batch capacity (ρ < 1: a
    finite run at ρ ≥ 1 can show a fine P95 while its queue grows without
    bound, so such a row is printed but never chosen).

Writes ``bench-results/capacity.json``. Search: GPU counts upward from the
floor, one run each (about 0.4 s per run at 10,000 requests/s for 6 s).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from agent.batch.budget import LatencyBudget, busy_gpus, derive, floor_gpus, rule_of_thumb_gpus
from agent.batch.dispatch import ModelContract
from agent.batch.gpusched import SchedulerConfig
from agent.batch.simulate import Scenario, SimResult, Stream, run

MODEL = "batchstring"


def fleet_arithmetic(developers: float = 4e6, active: float = 0.2, per_day: float = 1000, peak: float = 3,
                     seconds_each: float = 10, per_replica: float = 60) -> dict[str, float]:
    """The router fleet's sizing from the briefs."""
    daily = developers * active * per_day
    average = daily / 86400
    peak_rate = average * peak
    in_flight = peak_rate * seconds_each
    return {"requests_per_day": daily, "average_per_s": average, "peak_per_s": peak_rate,
            "in_flight": in_flight, "replicas": in_flight / per_replica}


def about(x: float) -> str:
    """``x`` to two significant figures, with thousands separators."""
    digits = max(0, math.floor(math.log10(abs(x))) - 1) if x else 0
    return f"{round(x, -digits):,.0f}"


def gpus_word(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def simulate(args: argparse.Namespace, gpus: int, *, kill: bool, max_wait_s: float, network_s: float) -> SimResult:
    duration = max(6.0, min(120.0, 60_000 / args.rate)) if args.duration is None else args.duration
    contract = ModelContract(name=MODEL, max_batch=args.max_batch, batch_s=args.batch_ms / 1e3, max_wait_s=max_wait_s,
                             max_pending=args.max_pending)
    scenario = Scenario(contracts=(contract,), scheduler=SchedulerConfig(gpus=gpus),
                        streams=(Stream(model=MODEL, rate=args.rate),), duration_s=duration,
                        warmup_s=min(0.5, duration / 10), network_s=network_s,
                        kill_at_s=0.4 * duration if kill else None, seed=args.seed)
    return run(scenario)


def row(args: argparse.Namespace, gpus: int, kill: bool, result: SimResult) -> dict[str, Any]:
    m = result.models[MODEL]
    survivors = gpus - (1 if kill else 0)
    rho = args.rate / (survivors * args.max_batch / (args.batch_ms / 1e3)) if survivors else math.inf
    clean = result.lost == 0 and result.duplicated == 0 and m.shed == 0 and m.failed == 0
    return {"gpus": gpus, "killed": 1 if kill else 0, "rho_survivors": round(rho, 3), "stable": rho < 1,
            "p50_ms": round(m.p50_ms, 1), "p95_ms": round(m.p95_ms, 1), "p99_ms": round(m.p99_ms, 1),
            "max_ms": round(m.max_ms, 1), "mean_fill": round(m.mean_fill, 1), "batches": m.batches,
            "answered": m.answered, "shed": m.shed, "failed": m.failed, "requeued": result.requeued,
            "requeued_max_ms": round(result.requeued_max_ms, 1), "lost": result.lost,
            "duplicated": result.duplicated, "gpu_busy": round(result.gpu_busy_fraction, 3),
            "flushes": result.flushes,
            "holds": rho < 1 and clean and m.p95_ms <= args.p95_ms}


def search(args: argparse.Namespace, start: int, *, kill: bool, max_wait_s: float, network_s: float,
           rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    for gpus in range(start, args.max_gpus + 1):
        r = row(args, gpus, kill, simulate(args, gpus, kill=kill, max_wait_s=max_wait_s, network_s=network_s))
        rows.append(r)
        if r["holds"]:
            return r
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.capacity", description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=10_000, help="requests per second (default %(default)s)")
    p.add_argument("--p95-ms", type=float, default=500, help="P95 budget end to end (default %(default)s)")
    p.add_argument("--batch-ms", type=float, default=100, help="time of one batch (default %(default)s)")
    p.add_argument("--max-batch", type=int, default=100, help="inputs per batch (default %(default)s)")
    p.add_argument("--max-pending", type=int, default=5000, help="batcher queue bound (default %(default)s)")
    p.add_argument("--duration", type=float, help="simulated seconds per run (default: 6 s, longer at low rates)")
    p.add_argument("--max-gpus", type=int, default=64, help="give up above this many GPUs (default %(default)s)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="bench-results/capacity.json", help="JSON output (default %(default)s)")
    args = p.parse_args(argv)
    started = time.perf_counter()
    batch_s = args.batch_ms / 1e3
    per_gpu = args.max_batch / batch_s
    floor = floor_gpus(args.rate, args.max_batch, batch_s)
    thumb = rule_of_thumb_gpus(args.rate, args.max_batch, batch_s)
    fleet = fleet_arithmetic()

    print("(a) arithmetic")
    print(f"  per GPU: {args.max_batch} / {batch_s:g} s = {per_gpu:,.0f} requests/s at full batches")
    print(f"  {args.rate:,.0f}/s needs {args.rate:,.0f} / {per_gpu:,.0f} = {args.rate / per_gpu:.2f} -> "
          f"{gpus_word(floor)} as a floor")
    print(f"  at 65 % utilisation plus two spares: ceil({args.rate / per_gpu:.2f} / 0.65) + 2 = {gpus_word(thumb)}")
    print(f"  router fleet: 4 million developers x 20 % active x 1,000 requests = "
          f"{fleet['requests_per_day'] / 1e6:,.0f} million a day;")
    print(f"    {fleet['average_per_s']:,.0f}/s average (about {about(fleet['average_per_s'])}), "
          f"{fleet['peak_per_s']:,.0f}/s at peak, 3x (about {about(fleet['peak_per_s'])});")
    print(f"    {fleet['in_flight']:,.0f} in flight at 10 s each (about {about(fleet['in_flight'])}), "
          f"{fleet['replicas']:,.0f} replicas at 60 each (about {about(fleet['replicas'])})")

    budget = LatencyBudget(budget_s=args.p95_ms / 1e3, batch_s=batch_s)
    derivation = derive(budget)
    wait = derivation.max_wait_s
    print("(b) max_wait from the budget")
    print("\n".join(derivation.lines()))
    for w in sorted({0.02, wait, 0.08}):
        full = 1 + args.rate * w >= args.max_batch
        busy = busy_gpus(args.rate, w, batch_s, args.max_batch)
        print(f"  at {args.rate:,.0f}/s a {w * 1e3:.0f} ms timer keeps {busy:.2f} GPUs busy "
              f"({'batches fill first: the size rule leads' if full else 'the timer leads'})")

    rows: list[dict[str, Any]] = []
    best = search(args, floor, kill=False, max_wait_s=wait, network_s=budget.network_s, rows=rows)
    start = max(2, best["gpus"] if best else floor)
    best_fail = search(args, start, kill=True, max_wait_s=wait, network_s=budget.network_s, rows=rows)
    print(f"(c) measured in virtual time (exponential gaps, seed {args.seed}; real batcher and scheduler)")
    print(f"  {'gpus':>4} {'killed':>6} {'rho':>5} {'p50':>6} {'p95':>6} {'p99':>6} {'max':>6} {'fill':>5} "
          f"{'requeued':>8} {'rq max':>6} {'lost':>4} {'dup':>3}  verdict")
    for r in rows:
        verdict = "holds" if r["holds"] else ("unstable (rho >= 1)" if not r["stable"] else "misses")
        print(f"  {r['gpus']:>4} {r['killed']:>6} {r['rho_survivors']:>5.2f} {r['p50_ms']:>6.0f} {r['p95_ms']:>6.0f} "
              f"{r['p99_ms']:>6.0f} {r['max_ms']:>6.0f} {r['mean_fill']:>5.1f} {r['requeued']:>8} "
              f"{r['requeued_max_ms']:>6.0f} {r['lost']:>4} {r['duplicated']:>3}  {verdict}")
    summary = {
        "rate": args.rate, "p95_budget_ms": args.p95_ms, "batch_ms": args.batch_ms, "max_batch": args.max_batch,
        "seed": args.seed, "per_gpu_per_s": per_gpu, "floor_gpus": floor, "rule_of_thumb_gpus": thumb,
        "measured_min_gpus": best["gpus"] if best else None,
        "measured_min_gpus_with_failure": best_fail["gpus"] if best_fail else None,
        "p95_ms_at_measured_min": best["p95_ms"] if best else None,
        "p95_ms_at_measured_min_with_failure": best_fail["p95_ms"] if best_fail else None,
        "mean_fill_at_measured_min": best["mean_fill"] if best else None,
        "requeued_max_ms_with_failure": best_fail["requeued_max_ms"] if best_fail else None,
        "lost": sum(r["lost"] for r in rows), "duplicated": sum(r["duplicated"] for r in rows),
        "max_wait_ms": round(wait * 1e3, 3),
        "derivation": [dataclasses.asdict(t) for t in derivation.terms],
        "fleet": {k: round(v, 1) for k, v in fleet.items()},
        "runs": rows, "seconds": round(time.perf_counter() - started, 2),
    }
    print(f"  measured: {gpus_word(summary['measured_min_gpus'] or 0)} (P95 {summary['p95_ms_at_measured_min']} ms), "
          f"{summary['measured_min_gpus_with_failure']} with one killed mid-run "
          f"(P95 {summary['p95_ms_at_measured_min_with_failure']} ms); lost {summary['lost']}, "
          f"duplicated {summary['duplicated']}; {summary['seconds']} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"  wrote {out}")
    return 0 if best and best_fail and summary["lost"] == 0 and summary["duplicated"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
