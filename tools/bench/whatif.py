"""How close the fleet simulator comes to recorded traffic: what-if of one config against itself, next to the record.

Replays a recording (JSON Lines, :func:`tools.sim.whatif.read_rows`) on the
fitted fleet (``--engines``; else ``--replicas`` default engines per model)
with the same config on both sides (``--config``'s ``[proxy]``, else today's
defaults) through :func:`tools.sim.whatif.compare`, and prints the simulated
TTFT p50 and p99, end-to-end p99, prefix hit ratio and refused share next to
what the recording measured (``ttft_ms``, ``e2e_ms``, ``cached_tokens``,
``outcome``), with the relative error ``(simulated - recorded) / recorded``.
A recording without latencies (a plain Mooncake trace) gets the simulated
side only. Also the simulator's wall time per 1,000 requests (one run).
Writes ``bench-results/whatif.json``.

Usage: ``python -m tools.bench.whatif [--traffic FILE] [--engines FILE | --replicas N] [--config FILE]
[--seed N] [--out PATH]`` (default traffic: the bundled two minutes of the Mooncake conversation trace).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from dataplane.config import ProxySettings
from tools.fetch_traces import BUNDLED
from tools.sim import whatif

FIGURES = ("ttft_p50_ms", "ttft_p99_ms", "e2e_p99_ms", "hit_ratio", "refused_share")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tools.bench.whatif", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--traffic", default=str(BUNDLED), help="recorded requests, JSON Lines (default: bundled trace)")
    p.add_argument("--engines", default=None, help="the fitted fleet, JSON (default: --replicas default engines)")
    p.add_argument("--replicas", type=int, default=None, help="without --engines: replicas per model")
    p.add_argument("--config", default=None, help="TOML whose [proxy] section both sides run (default: defaults)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="bench-results/whatif.json")
    return p.parse_args(argv)


def error(simulated: float | None, recorded: float | None) -> float | None:
    """(simulated - recorded) / recorded, None when either is missing or the record is 0."""
    if simulated is None or recorded is None or recorded == 0:
        return None
    return round((simulated - recorded) / recorded, 4)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = whatif.read_rows(args.traffic)
    fleet = (whatif.parse_fleet(json.loads(Path(args.engines).read_text())) if args.engines
             else whatif.default_fleet(rows, args.replicas))
    settings = whatif.settings_from_toml(Path(args.config).read_text(), args.config) if args.config \
        else ProxySettings()
    result = whatif.compare(rows, fleet, settings, settings, seed=args.seed, resamples=100)
    simulated = {m["metric"]: m["baseline"] for m in result["metrics"]}
    recorded: dict[str, Any] = result["recorded"] or {}
    wall = result["baseline"]["wall_seconds"]
    per_1000 = round(wall / len(rows) * 1000, 3)
    print(f"{args.traffic}: {len(rows)} requests over {result['span_s']:.0f} s, {result['replicas']} replicas, "
          f"{result['proxies']} proxies; one simulated run took {wall:.2f} s ({per_1000:.3f} s per 1,000 requests)")
    print(f"{'figure':<14} {'simulated':>10} {'recorded':>10} {'rel. error':>10}")
    report: dict[str, Any] = {"traffic": Path(args.traffic).name, "requests": len(rows), "span_s": result["span_s"],
                              "replicas": result["replicas"], "proxies": result["proxies"], "seed": args.seed,
                              "config": args.config, "engines": args.engines, "figures": {},
                              "wall_seconds": wall, "wall_seconds_per_1000_requests": per_1000}
    for name in FIGURES:
        sim, rec = simulated.get(name), recorded.get(name)
        report["figures"][name] = {"simulated": sim, "recorded": rec, "relative_error": error(sim, rec)}
        rel = error(sim, rec)
        shape = ".1f" if name.endswith("_ms") else ".4f"
        print(f"{name:<14} {'-' if sim is None else format(sim, shape):>10} "
              f"{'-' if rec is None else format(rec, shape):>10} "
              f"{'-' if rel is None else f'{rel:+.1%}':>10}")
    if not recorded:
        print("(no latency recorded in this file: the simulated side only)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
