"""The fleet simulator: replay a trace on N simulated replicas behind M proxies, per policy and load.

Virtual time, discrete events (:mod:`tools.sim.fleet`): the replicas are
:class:`agent.replica.engine.Engine` objects, unchanged; each proxy has its own copy
of the table, refreshed every ``--refresh-ms``, and its own in-flight
counts; Ferry's policy is the data plane's own code. ``--load`` is a share of
the fleet's capacity for the trace's mix, measured by a saturation run
(:mod:`tools.sim.capacity`) unless ``--capacity`` gives it; arrival times are
stretched to that rate. Each point is run with ``--seeds`` seeds and the
requests pooled (:mod:`tools.sim.report`).

Writes ``bench-results/simulate-<trace file stem>.json`` (``--out``) and a PNG
beside it (``--plots DIR`` puts it elsewhere, e.g. docs/img) and prints a table.

Example::

    python -m tools.fetch_traces   # once: the full public traces into traces/ (docs/traces.md)
    python -m tools.simulate --trace traces/mooncake_conversation_trace.jsonl \\
        --replicas 16 --proxies 4 --load 0.5,0.8,0.95 --policies all
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from agent.replica.engine import EngineParams
from ferry.config import from_mapping
from tools.fetch_traces import BUNDLED, trace_file
from tools.sim import capacity as capacity_run
from tools.sim import plots, workload
from tools.sim.fleet import Fleet, FleetConfig
from tools.sim.policies import POLICIES
from tools.sim.report import summarize

_REQUESTS: list[workload.SimRequest] = []


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="simulate", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--trace", type=trace_file, default=str(BUNDLED),
                   help="Azure CSV or Mooncake JSONL trace (default: the bundled excerpt; full traces: "
                        "python -m tools.fetch_traces)")
    p.add_argument("--replicas", type=int, default=16)
    p.add_argument("--proxies", type=int, default=4)
    p.add_argument("--load", default="0.5,0.8,0.95", help="comma-separated shares of fleet capacity")
    p.add_argument("--speedup", type=float, default=None,
                   help="instead of --load: divide the trace's arrival times by this, as tools.replay does")
    p.add_argument("--policies", default="all", help=f"'all' or a comma-separated list of {', '.join(POLICIES)}")
    p.add_argument("--minutes", type=float, default=None, help="only the first minutes of the trace")
    p.add_argument("--seeds", type=int, default=3, help="runs per policy and load, requests pooled (default 3)")
    p.add_argument("--seed", type=int, default=1, help="first seed")
    p.add_argument("--refresh-ms", type=float, default=500.0, help="table refresh period of every proxy")
    p.add_argument("--telemetry-ms", type=float, default=500.0, help="telemetry period of every replica")
    p.add_argument("--load-factor", type=float, default=1.25, help="the ring's bound c (table parameter)")
    p.add_argument("--capacity", type=float, default=None, help="fleet capacity in requests/s (skip measuring)")
    p.add_argument("--max-output", type=int, default=None, help="cap on output tokens per request")
    p.add_argument("--short-answers", type=float, default=0.0,
                   help="share of prompts of 4,096 tokens or more answered in 1 to 10 tokens (default 0)")
    p.add_argument("--engine", action="append", default=[], metavar="KEY=VALUE",
                   help="engine parameter override (agent.replica.engine.EngineParams), repeatable")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--out", default=None, help="JSON report (default bench-results/simulate-<trace stem>.json)")
    p.add_argument("--plots", default=None, help="folder for the PNG (default: beside the JSON)")
    return p.parse_args(argv)


def engine_params(overrides: list[str]) -> EngineParams:
    """EngineParams with KEY=VALUE overrides (numbers)."""
    values: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"--engine: expected KEY=VALUE, got {item!r}")
        values[key] = float(raw) if any(c in raw for c in ".eE") else int(raw)
    return from_mapping(EngineParams, values, "engine")


def _point(config: FleetConfig, policy: str, load: float, capacity: float, seeds: list[int],
           speedup: float | None = None) -> dict[str, Any]:
    started = time.monotonic()
    if speedup:
        requests = workload.scale(_REQUESTS, 1.0 / speedup)
        load = round(workload.rate(requests) / capacity, 3)
    else:
        requests = workload.at_load(_REQUESTS, load, capacity)
    runs = [Fleet(dataclasses.replace(config, seed=s), POLICIES[policy], requests).run() for s in seeds]
    row = {"policy": policy, "load": load, **summarize(runs)}
    row["wall_seconds"] = round((time.monotonic() - started) / len(seeds), 2)
    return row


def _print_row(row: dict[str, Any]) -> None:
    ms = {k: "refused" if row[k] is None else f"{row[k]:.1f}" for k in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p99_ms")}
    print(f"{row['policy']:<16} {row['load']:>5.2f} {ms['ttft_p50_ms']:>10} {ms['ttft_p99_ms']:>10} "
          f"{ms['e2e_p99_ms']:>10} {row['hit_ratio']:>7.3f} {row['max_mean_load']:>7.2f} "
          f"{row['utilisation']:>6.3f} {row['rejected']:>6} {row['wall_seconds']:>6.1f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    global _REQUESTS
    args = parse_args(argv)
    policies = list(POLICIES) if args.policies == "all" else [p.strip() for p in args.policies.split(",")]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise SystemExit(f"--policies: unknown {unknown} (known: {', '.join(POLICIES)})")
    loads = [0.0] if args.speedup else [float(x) for x in args.load.split(",")]
    config = FleetConfig(replicas=args.replicas, proxies=args.proxies, refresh_seconds=args.refresh_ms / 1000,
                         telemetry_seconds=args.telemetry_ms / 1000, engine=engine_params(args.engine),
                         load_factor=args.load_factor)
    _REQUESTS = workload.requests(args.trace, minutes=args.minutes, max_output=args.max_output,
                                  short_answers=args.short_answers)
    capacity = args.capacity or capacity_run.measure(_REQUESTS, config)
    stem = Path(args.trace).stem
    print(f"{args.trace}: {len(_REQUESTS)} requests, {workload.rate(_REQUESTS):.2f} req/s in the trace; "
          f"capacity {capacity:.1f} req/s on {args.replicas} replicas; {args.seeds} seed(s) per point",
          file=sys.stderr)
    print(f"{'policy':<16} {'load':>5} {'ttft p50':>10} {'ttft p99':>10} {'e2e p99':>10} {'hit':>7} "
          f"{'max/mean':>7} {'util':>6} {'reject':>6} {'wall s':>6}")
    seeds = list(range(args.seed, args.seed + args.seeds))
    points = [(p, load) for load in loads for p in policies]
    if args.jobs > 1:
        with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
            futures = [pool.submit(_point, config, p, load, capacity, seeds, args.speedup) for p, load in points]
            rows = []
            for future in futures:
                rows.append(future.result())
                _print_row(rows[-1])
    else:
        rows = []
        for p, load in points:
            rows.append(_point(config, p, load, capacity, seeds, args.speedup))
            _print_row(rows[-1])
    report = {
        "trace": Path(args.trace).name,
        "requests": len(_REQUESTS),
        "trace_rate_rps": round(workload.rate(_REQUESTS), 3),
        "infinite_cache_hit_ratio": round(workload.infinite_cache_hit_ratio(_REQUESTS), 4),
        "replicas": args.replicas,
        "proxies": args.proxies,
        "refresh_ms": args.refresh_ms,
        "telemetry_ms": args.telemetry_ms,
        "load_factor": args.load_factor,
        "seeds": args.seeds,
        "speedup": args.speedup,
        "max_output": args.max_output, "short_answers": args.short_answers,
        "capacity_rps": round(capacity, 3),
        "engine": dataclasses.asdict(config.engine),
        "results": rows,
    }
    out = Path(args.out or f"bench-results/simulate-{stem}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    png = plots.plot(report, Path(args.plots or out.parent) / f"simulate-{stem}.png")
    print(f"wrote {out} and {png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
