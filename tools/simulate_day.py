"""A 24-hour replay of the scaling plan: GPU-hours against peak capacity all day, the morning ramp's TTFT p99.

The day (:mod:`tools.sim.day`): a diurnal curve of arrivals with the trace's
request mix, the control plane's own plan
(:func:`controlplane.scaling.plan.plan`) every minute with the history of
the days before, machines started from the standby pool or new; the morning
ramp replayed in the fleet simulator on the replicas the plan had ready.
Compared: the plan without history (reactive) and the peak kept all day.

Writes ``bench-results/day.json`` (``--out``) and ``day.png`` beside it, and
prints the figures. Example (the full run of docs/evaluation.md)::

    python -m tools.simulate_day
    python -m tools.simulate_day --peak-replicas 4 --sample-every 1800 --sample-seconds 30   # quicker
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from ferry.errors import FerryError
from tools.fetch_traces import BUNDLED, trace_file
from tools.sim import workload
from tools.sim.day import DayConfig, simulate
from tools.sim.dayplot import plot_day


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="simulate_day", description=__doc__.splitlines()[0] if __doc__ else "")
    d = DayConfig()
    p.add_argument("--trace", type=trace_file, default=str(BUNDLED),
                   help="the request mix (default: the bundled excerpt; docs/traces.md)")
    p.add_argument("--peak-replicas", type=float, default=d.peak_replicas,
                   help="the peak's demand in replicas at the target utilisation")
    p.add_argument("--gpus-per-replica", type=int, default=d.gpus_per_replica)
    p.add_argument("--startup-seconds", type=float, default=d.startup_seconds,
                   help="weights streamed onto a standby machine until the replica is ready")
    p.add_argument("--replacement-seconds", type=float, default=d.replacement_seconds,
                   help="a new machine, ordered until it is there")
    p.add_argument("--days", type=int, default=d.days, help="days replayed; the last is measured")
    p.add_argument("--sample-every", type=float, default=d.sample_every_seconds,
                   help="seconds between the ramp's windows replayed in the engines")
    p.add_argument("--sample-seconds", type=float, default=d.sample_seconds, help="measured seconds per window")
    p.add_argument("--warmup-seconds", type=float, default=d.warmup_seconds, help="unmeasured lead of each window")
    p.add_argument("--ttft-target", type=float, default=d.targets.ttft_target_seconds,
                   help="the interactive TTFT p99 target in seconds (the plan's queue-wait trigger, the ramp's test)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", default="bench-results/day.json")
    return p.parse_args(argv)


def summary(report: dict[str, Any]) -> str:
    """The figures, one line each."""
    g, r = report["gpu_hours"], report["ramp"]
    lines = [
        f"peak: {report['peak_rate']:.1f} req/s, {report['peak_replicas']} replicas; one replica sustains "
        f"{report['mix']['replica_rate']:.2f} req/s of the mix",
        f"GPU-hours over the day: scaled {g['scaled']:.0f}, reactive {g['reactive']:.0f}, "
        f"peak all day {g['peak_all_day']:.0f} (saved {100 * report['saved_share']:.1f} %)",
    ]
    for name, ramp in r.items():
        p99 = ramp["ttft_p99_s"]
        lines.append(f"morning ramp TTFT p99, {name}: {'miss' if p99 is None else f'{p99:.2f} s'} over "
                     f"{ramp['requests']} requests ({ramp['misses']} refused), target {report['ttft_target_s']:g} s: "
                     f"{'within' if ramp['within_target'] else 'over'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        targets = dataclasses.replace(DayConfig().targets, ttft_target_seconds=args.ttft_target)
        config = DayConfig(targets=targets, peak_replicas=args.peak_replicas, gpus_per_replica=args.gpus_per_replica,
                           startup_seconds=args.startup_seconds, replacement_seconds=args.replacement_seconds,
                           days=args.days, sample_every_seconds=args.sample_every, sample_seconds=args.sample_seconds,
                           warmup_seconds=args.warmup_seconds, seed=args.seed)
    except (ValueError, FerryError) as exc:
        print(f"simulate_day: {exc}", file=sys.stderr)
        return 2
    requests = workload.requests(args.trace)
    print(f"the request mix of {args.trace}: {len(requests)} requests", file=sys.stderr)
    started = time.monotonic()
    report = {"trace": Path(args.trace).name, **simulate(config, requests)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    png = plot_day(report, out.with_suffix(".png"))
    print(summary(report))
    print(f"wrote {out} and {png} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
