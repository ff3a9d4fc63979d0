"""Check the fleet simulator against the real system: the same replicas, trace slice and policy, compared.

Each real run starts a fresh ``ferry up`` (one control plane, one proxy,
``--replicas`` simulated replicas of one model on nodes of two, every
component its own process over loopback, the engine parameters of
``--engine`` in its ``[replica]`` section), replays the first ``--minutes``
of the trace at ``--speedup`` through it with :mod:`tools.replay` (every
request streamed and interactive, output capped at ``--max-output``, TTFT
taken by the client at the first chunk), and stops it. The simulator then
runs the same slice, speed-up, cap and engine on as many replicas behind
one proxy, table and telemetry every 0.5 s as ``ferry up`` has them, with
``--seeds`` seeds pooled. The report gives TTFT p50 and p99 of both and
their relative difference, and the machine's load average during each run
(other processes on a shared machine slow the real replicas, whose steps
are timed by the wall clock, not the simulator's).

Writes ``bench-results/validate-<trace stem>.json``.

Example::

    python -m tools.sim.validate --trace ../shared/traces/mooncake_conversation_trace.jsonl \\
        --replicas 4 --minutes 5 --speedup 3 --max-output 32
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ferry.cli.tomlw import dumps
from tools.sim import workload
from tools.sim.fleet import Fleet, FleetConfig
from tools.sim.policies import POLICIES
from tools.sim.report import summarize
from tools.simulate import engine_params

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tools.sim.validate", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--trace", required=True)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--speedup", type=float, default=3.0)
    p.add_argument("--max-output", type=int, default=32)
    p.add_argument("--engine", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--runs", type=int, default=1, help="real runs, each on a fresh fleet")
    p.add_argument("--seeds", type=int, default=3, help="simulator seeds, pooled")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def _real_run(args: argparse.Namespace, config: dict[str, Any], workdir: Path, index: int) -> dict[str, Any]:
    run_dir = workdir / f"run{index}"
    run_dir.mkdir()
    (run_dir / "ferry.toml").write_text(dumps(config))
    ready = run_dir / "up.json"
    up = subprocess.Popen(
        [sys.executable, "-m", "ferry", "up", "--replicas", str(args.replicas), "--replicas-per-node", "2",
         "--models", "chat", "--config", str(run_dir / "ferry.toml"), "--ready-file", str(ready),
         "--workdir", str(run_dir / "work")],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not ready.exists():
            if up.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"ferry up did not get ready (exit {up.returncode}); see {run_dir / 'work'}")
            time.sleep(0.2)
        out = run_dir / "replay.json"
        load_before = os.getloadavg()[0]
        subprocess.run(
            [sys.executable, "-m", "tools.replay", "--ready-file", str(ready), "--trace", args.trace,
             "--minutes", str(args.minutes), "--speedup", str(args.speedup), "--max-output", str(args.max_output),
             "--tiers", "interactive=1", "--stream-share", "1", "--models", "chat", "--limit", "100000",
             "--time-limit", str(args.minutes * 60 / args.speedup + 30), "--json-out", str(out)],
            cwd=ROOT, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        report: dict[str, Any] = json.loads(out.read_text())
        report["load_average"] = round((load_before + os.getloadavg()[0]) / 2, 2)
        return report
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(30)
        except subprocess.TimeoutExpired:
            up.kill()


def _diff(sim: float, real: float) -> float:
    return round((sim - real) / real, 3) if real else float("nan")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    engine = engine_params(args.engine)
    config: dict[str, Any] = {"models": [{"name": "chat", "default_version": "v1", "min_gpus": 1}],
                              "replica": dataclasses.asdict(engine)}
    requests = workload.scale(workload.requests(args.trace, minutes=args.minutes, max_output=args.max_output),
                              1.0 / args.speedup)
    fleet = FleetConfig(replicas=args.replicas, proxies=1, engine=engine)
    sim = summarize([Fleet(dataclasses.replace(fleet, seed=s), POLICIES["ferry"], requests).run()
                     for s in range(1, args.seeds + 1)])
    runs = []
    with tempfile.TemporaryDirectory(prefix="ferry-validate-") as tmp:
        for i in range(args.runs):
            real = _real_run(args, config, Path(tmp), i)
            runs.append({
                "requests": real["requests"], "errors": real["errors"], "load_average": real["load_average"],
                "ttft_p50_ms": real["ttft"]["p50_ms"], "ttft_p99_ms": real["ttft"]["p99_ms"],
                "hit_ratio": real["prefix_hit_ratio"],
                "sim_vs_real_p50": _diff(sim["ttft_p50_ms"], real["ttft"]["p50_ms"]),
                "sim_vs_real_p99": _diff(sim["ttft_p99_ms"], real["ttft"]["p99_ms"]),
            })
            print(f"real run {i + 1}: TTFT p50 {runs[-1]['ttft_p50_ms']} ms, p99 {runs[-1]['ttft_p99_ms']} ms, "
                  f"hit {real['prefix_hit_ratio']:.3f}, load average {real['load_average']}", flush=True)
    print(f"simulator:  TTFT p50 {sim['ttft_p50_ms']} ms, p99 {sim['ttft_p99_ms']} ms, hit {sim['hit_ratio']:.3f}")
    report = {"trace": Path(args.trace).name, "replicas": args.replicas, "minutes": args.minutes,
              "speedup": args.speedup, "max_output": args.max_output, "engine": dataclasses.asdict(engine),
              "requests": len(requests), "simulator": {k: sim[k] for k in ("ttft_p50_ms", "ttft_p99_ms", "hit_ratio",
                                                                           "e2e_p50_ms", "e2e_p99_ms")},
              "real": runs}
    out = Path(args.out or f"bench-results/validate-{Path(args.trace).stem}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
