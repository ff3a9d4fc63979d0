"""Regions bench: a saturated region spills interactive work to a neighbour within the latency budget.

``python -m tools.bench.regions`` runs the scenario of issue 8: region A
offered 150 % of its interactive capacity, B 50 % with a 40 ms round trip
from A, C 20 % with 200 ms, an interactive budget of 500 ms, and reports per
mode ``a_interactive_p99_ms``, ``b_interactive_p99_ms``,
``spill_share_a_to_b``, ``spill_share_a_to_c`` (plus the same run without
spill for contrast, in the simulator). Mode ``sim`` (default) runs
:mod:`tools.sim.regions` in virtual time, about 5 s; mode ``real``
(``--mode real``) runs the same shape with real processes
(:mod:`tools.bench.regions_real`, about 60 s with 40 s of load; the regions are
loaded by a replica's capacity measured with every region saturated at once,
what it serves while the scenario runs on one shared machine, and
``--calibration alone`` by the higher figure measured through region C
alone); ``both`` runs the
two. Both run the same policies: the control plane's
:class:`controlplane.regions.control.SpillController` (sized from the proxies' offered
and served rates) and the proxy's :func:`dataplane.regions.choice.region_for`. Prints a table and writes
``bench-results/regions.json`` (modes not run keep their previous figures).

Simulated region sizes: A 4 replicas, B 8, C 4 (B is the larger neighbour,
so its spare capacity at 50 % covers A's excess); engine: 16 batch slots,
64-token prompts, 16 output tokens. Real sizes: :mod:`tools.bench.regions_real`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from tools.sim.regions import RegionsConfig, RegionSpec, simulate

RTT_MS = {"a:b": 40.0, "a:c": 200.0, "b:c": 180.0}
REGIONS = (RegionSpec(name="a", replicas=4, load=1.5), RegionSpec(name="b", replicas=8, load=0.5),
           RegionSpec(name="c", replicas=4, load=0.2))


def figures(p99: dict[str, float], share: dict[str, float]) -> dict[str, float]:
    """The four figures of the issue from per-region p99s and spill shares."""
    return {"a_interactive_p99_ms": round(p99.get("a", 0.0), 1), "b_interactive_p99_ms": round(p99.get("b", 0.0), 1),
            "spill_share_a_to_b": round(share.get("a->b", 0.0), 4),
            "spill_share_a_to_c": round(share.get("a->c", 0.0), 4)}


def run_sim(args: argparse.Namespace) -> dict[str, Any]:
    """The scenario in the simulator, with and without spill."""
    config = RegionsConfig(regions=REGIONS, rtt_ms=RTT_MS, budget_ms=args.budget_ms,
                           duration_seconds=args.seconds, seed=args.seed)
    spilled = simulate(config)
    local = simulate(dataclasses.replace(config, spill=False))
    return {**figures(spilled.p99_ms, spilled.spill_share),
            "c_interactive_p99_ms": round(spilled.p99_ms["c"], 1), "shed": spilled.shed,
            "requests": spilled.requests, "capacity_per_replica_rps": round(spilled.capacity_per_replica, 1),
            "without_spill": {**figures(local.p99_ms, local.spill_share), "shed": local.shed}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench.regions", description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("sim", "real", "both"), default="sim")
    p.add_argument("--seconds", type=float, default=60.0, help="virtual seconds (sim; default %(default)s)")
    p.add_argument("--real-seconds", type=float, default=40.0, help="load seconds (real; default %(default)s)")
    p.add_argument("--budget-ms", type=float, default=500.0)
    p.add_argument("--calibration", choices=("alone", "fleet"), default="fleet",
                   help="real: a replica's capacity measured with every region saturated at once, what it "
                        "serves while the scenario runs (fleet, default), or through region C alone (alone)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="bench-results/regions.json", help="JSON output (default %(default)s)")
    args = p.parse_args(argv)
    out = Path(args.out)
    results: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    results.update({"budget_ms": args.budget_ms, "rtt_ms": RTT_MS,
                    "regions": {r.name: {"replicas": r.replicas, "load": r.load} for r in REGIONS}})
    if args.mode in ("sim", "both"):
        results["sim"] = run_sim(args)
    if args.mode in ("real", "both"):
        try:
            from tools.bench.regions_real import run_real  # heavy: starts processes
        except ImportError as exc:
            print(f"real mode unavailable: {exc}", file=sys.stderr)
            return 2
        results["real"] = run_real(seconds=args.real_seconds, budget_ms=args.budget_ms, rtt_ms=RTT_MS,
                                   calibration=args.calibration)
    print(f"{'mode':6} {'A p99 ms':>9} {'B p99 ms':>9} {'A->B':>7} {'A->C':>7}  (budget {args.budget_ms:g} ms)")
    for mode in ("sim", "real"):
        if mode in results:
            r = results[mode]
            print(f"{mode:6} {r['a_interactive_p99_ms']:9.1f} {r['b_interactive_p99_ms']:9.1f} "
                  f"{r['spill_share_a_to_b']:7.3f} {r['spill_share_a_to_c']:7.3f}")
    if "sim" in results and "without_spill" in results["sim"]:
        w = results["sim"]["without_spill"]
        print(f"sim without spill: A p99 {w['a_interactive_p99_ms']:.1f} ms, B p99 {w['b_interactive_p99_ms']:.1f} ms, "
              f"shed {w.get('shed', {})}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
