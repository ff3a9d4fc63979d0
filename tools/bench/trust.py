"""Routing you can trust before you ship it: record, fit, what-if and tune against what really happens.

``python -m tools.bench.trust`` runs, in one session, on the simulated
replicas of :mod:`tools.peers` (eight in one process, engine ``--engine
KEY=VALUE``, each with ``ferry up --triton`` in front: an agent beside each,
a control plane, one proxy; the setup whose simulator figures
docs/evaluation.md validates), with the slice of a trace the peers bench
replays (default minutes 10 to 14 of the Mooncake conversation trace, at
``--load`` 0.8 of the fleet's capacity, every request streamed, output capped
at ``--max-output`` 32 tokens):

1. **Fidelity.** The first slice replayed live through the proxy, whose
   recorder keeps every request (``record_rate`` 1.0, the default). Then, as an
   operator would: ``ferryctl traffic export --since 1h`` (the recording) and
   ``ferryctl engines --json`` (the engine parameters the control plane fitted
   from the replicas' telemetry). Printed: each fitted step parameter against
   the replicas' true setting (relative error; target 10 %), and the
   what-if of the running config on the recording, against itself
   (:func:`tools.sim.whatif.compare`), beside what the replay measured at the
   client and what the proxy recorded: TTFT p50 and p99 (target 15 %),
   end-to-end p99, hit ratio.
2. **Tuning out of sample.** ``tune`` on that recording with the fitted
   fleet (:func:`tools.sim.tune.tune`: its own split, its held-out check);
   then the next slice of the trace (by default minutes 14 to 18), never
   seen by the tuning, replayed live twice on fresh replicas, under the
   default config and under the tuned one (the search's best even when tune
   judged it not significant: the bench says which), and what-if's
   prediction for that slice (the trace rows at the replay's speed-up, the
   fitted fleet, default against tuned) set beside the live outcome.

``--mix conversations`` replaces the trace with a mix made to be sensitive to
the routing policy (:func:`conversation_mix`): ``--rate`` (10) requests a
second, turns of ``--conversations`` (200) conversations under one shared
first block, each turn adding 1 to 3 blocks of 512 tokens to its
conversation's prompt (a new conversation starts with 4 to 12 blocks, and
one past 40 blocks starts over), outputs of 10 to 60 tokens; run on small
replicas (``--engine max_running=16 --engine prefix_cache_blocks=1024``,
four of them) whose caches cannot hold every conversation, so where a
conversation's next turn goes decides its prefill. Each slice is
``--minutes`` of it, the second following the first.

CPU per request of the proxy (``/proc``) is printed for each live run, and
the recorder's cost (``python -m tools.bench.recorder``) set against it.
Everything is bounded: each replay by ``--time-limit`` and ``--timeout``,
each start by ``--startup-timeout``. Writes ``bench-results/trust.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dataplane.config import ProxySettings
from tools import trace as tracefile
from tools.bench.peers import DEFAULT_WINDOW, choose_trace, slice_rows, speedup_for
from tools.bench.whatif import error as rel
from tools.peers import load, routers
from tools.peers.procs import CpuMeter, ProcFailed
from tools.report import percentile
from tools.sim import tune as tuning
from tools.sim import whatif
from tools.simulate import engine_params

ROOT = Path(__file__).resolve().parents[2]
STEP_PARAMS = ("prefill_base_seconds", "prefill_seconds_per_token", "decode_base_seconds",
               "decode_seconds_per_request")
FACTS = ("kv_blocks_total", "kv_block_tokens", "max_running", "max_step_tokens", "prefix_cache_blocks")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tools.bench.trust", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--trace", default=None, help="Mooncake JSONL (default: $FERRY_MOONCAKE_TRACE, else the excerpt)")
    p.add_argument("--start-minute", type=float, default=None, help=f"first slice (default {DEFAULT_WINDOW[0]:g})")
    p.add_argument("--minutes", type=float, default=None, help=f"each slice (default {DEFAULT_WINDOW[1]:g})")
    p.add_argument("--limit", type=int, default=2000, help="requests per slice at most")
    p.add_argument("--mix", choices=("trace", "conversations"), default="trace",
                   help="the trace's slices, or the policy-sensitive conversation mix (conversation_mix)")
    p.add_argument("--rate", type=float, default=10.0, help="conversations: requests a second")
    p.add_argument("--conversations", type=int, default=200, help="conversations: how many")
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--engine", action="append", default=[], metavar="KEY=VALUE", help="replica engine parameter")
    p.add_argument("--load", type=float, default=0.8, help="share of the fleet's capacity (sets the speed-up)")
    p.add_argument("--speedup", type=float, default=None, help="instead of --load")
    p.add_argument("--max-output", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--time-limit", type=float, default=None, help="per replay (default: its span + 60 s)")
    p.add_argument("--startup-timeout", type=float, default=120.0)
    p.add_argument("--budget", type=int, default=24, help="tune's simulator runs")
    p.add_argument("--phases", default="fidelity,tuning", help="fidelity, tuning (tuning needs fidelity's record)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workdir", default=str(ROOT / "bench-results" / "trust"))
    p.add_argument("--out", default=str(ROOT / "bench-results" / "trust.json"))
    return p.parse_args(argv)


def ferryctl(ready: Path, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """``ferryctl --ready-file READY ARGS`` as an operator runs it; raises with its stderr on failure."""
    done = subprocess.run([sys.executable, "-m", "ferry_cli.ctl.main", "--ready-file", str(ready), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if done.returncode:
        raise ProcFailed(f"ferryctl {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()[-800:]}")
    return done


def live_figures(outcomes: Sequence[load.Outcome]) -> dict[str, Any]:
    """TTFT p50 / p99 and end-to-end p50 / p99 (ms) of the answered requests, and the failures by status."""
    ok = [o for o in outcomes if o.status == "OK" and o.ttft_s is not None]
    ttft = [1e3 * o.ttft_s for o in ok if o.ttft_s is not None]
    e2e = [1e3 * o.e2e_s for o in ok]
    failed: dict[str, int] = {}
    for o in outcomes:
        if o.status != "OK":
            failed[o.status] = failed.get(o.status, 0) + 1

    def r(values: list[float], p: float) -> float | None:
        return round(percentile(values, p), 1) if values else None
    return {"requests": len(outcomes), "answered": len(ok), "failed": failed,
            "ttft_p50_ms": r(ttft, 50), "ttft_p99_ms": r(ttft, 99), "e2e_p50_ms": r(e2e, 50), "e2e_p99_ms": r(e2e, 99)}


@dataclasses.dataclass
class LiveRun:
    """One replay through ``ferry up`` in front of fresh replicas, and what was gathered from it."""

    figures: dict[str, Any]
    proxy_cpu_ms_per_request: float | None
    recording: Path | None = None
    engines: dict[str, Any] | None = None


def live(args: argparse.Namespace, rows: Sequence[tracefile.TraceRequest], speedup: float, workdir: Path,
         *, config: Path | None, gather: bool) -> LiveRun:
    """Replay ``rows`` at ``speedup`` through Ferry (``config``'s ``[proxy]``) on fresh replicas; with ``gather``,
    export the recording and the fitted engines with ferryctl before stopping."""
    workdir.mkdir(parents=True, exist_ok=True)
    planned = load.plan(rows, speedup=speedup, max_output=args.max_output)
    span = planned[-1].due_s if planned else 0.0
    limits = load.Limits(concurrency=args.concurrency, timeout=args.timeout,
                         time_limit=args.time_limit or span + 60.0)
    replicas = routers.Replicas(args.replicas, workdir, engine=args.engine, timeout=args.startup_timeout)
    replicas.start()
    try:
        running = routers.start_ferry(replicas, workdir, timeout=args.startup_timeout,
                                      config=str(config) if config else None)
        try:
            meter = CpuMeter({"proxy": running.roles["proxy"]})
            meter.start()
            outcomes, _ = load.run_sync(running.target(), planned, limits)
            cpu = meter.stop()
            figures = live_figures(outcomes)
            proxy_ms = round(1e3 * cpu["proxy"] / len(outcomes), 3) if outcomes else None
            run = LiveRun(figures, proxy_ms)
            if gather:
                ready = workdir / "up.json"
                run.recording = workdir / "recorded.jsonl"
                deadline = time.monotonic() + 30.0
                while True:  # the last rows ride on the proxy's next usage report
                    ferryctl(ready, "traffic", "export", "--since", "1h", "-o", str(run.recording))
                    got = sum(1 for _ in run.recording.open())
                    if got >= len(outcomes) or time.monotonic() > deadline:
                        break
                    time.sleep(1.0)
                run.engines = json.loads(ferryctl(ready, "engines", "--json").stdout)
                (workdir / "engines.json").write_text(json.dumps(run.engines, indent=2) + "\n")
        finally:
            running.stop()
    finally:
        replicas.stop()
    return run


def fit_errors(engines: dict[str, Any], truth: dict[str, Any]) -> list[dict[str, Any]]:
    """Each fitted parameter of each (model, kind) against the replicas' true setting."""
    out = []
    for row in engines.get("engines", []):
        for name in (*STEP_PARAMS, *FACTS):
            fitted = row.get("params", {}).get(name)
            out.append({"model": row.get("model"), "kind": row.get("kind"), "param": name, "fitted": fitted,
                        "true": truth[name], "relative_error": rel(fitted, truth[name]),
                        "stderr": row.get("stderr", {}).get(name), "samples": row.get("samples")})
    return out


def trace_rows(rows: Sequence[tracefile.TraceRequest], speedup: float, max_output: int) -> list[whatif.Row]:
    """A trace slice as what-if reads it, at the replay's speed-up and output cap (no recorded latencies)."""
    start = rows[0].offset if rows else 0.0
    return whatif.parse_rows({"timestamp": 1e3 * (r.offset - start) / speedup, "input_length": r.input_tokens,
                              "output_length": max(1, min(r.output_tokens, max_output)),
                              "hash_ids": list(r.hash_ids)} for r in rows)


def proxy_toml(changes: dict[str, Any], path: Path) -> Path:
    """A config file whose ``[proxy]`` section is ``changes``."""
    path.write_text(tuning.proposal_toml(changes, "tuned by tools.bench.trust"))
    return path


def conversation_mix(n: int, *, rate: float, conversations: int, seed: int) -> list[tracefile.TraceRequest]:
    """``n`` requests at ``rate`` a second: turns of ``conversations`` conversations (the module docstring).

    Each turn picks a conversation uniformly (``random.Random(seed)``); its block ids extend the
    conversation's (fresh ids for the new blocks), under block 0 shared by all."""
    rng = random.Random(seed)
    turns: dict[int, list[int]] = {}
    fresh = 1
    out = []
    for i in range(n):
        c = rng.randrange(conversations)
        ids = turns.get(c)
        grow = rng.randint(4, 12) if ids is None or len(ids) > 40 else rng.randint(1, 3)
        ids = [0] if ids is None or len(ids) > 40 else ids
        ids = [*ids, *range(fresh, fresh + grow)]
        fresh += grow
        turns[c] = ids
        out.append(tracefile.TraceRequest(i / rate, len(ids) * 512 - rng.randint(0, 200), rng.randint(10, 60),
                                          tuple(ids)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.mix == "conversations":
        path, minutes, start = Path(f"conversations(rate={args.rate:g}, {args.conversations})"), \
            args.minutes or 4.0, 0.0
        per_slice = round(args.rate * 60 * minutes)
        rows = conversation_mix(2 * per_slice, rate=args.rate, conversations=args.conversations, seed=args.seed)
        first = rows[:per_slice]
        second = [dataclasses.replace(r, offset=r.offset - rows[per_slice].offset) for r in rows[per_slice:]]
        speedup, capacity = 1.0, None
    else:
        path, full = choose_trace(args.trace)
        start = args.start_minute if args.start_minute is not None else (DEFAULT_WINDOW[0] if full else 0.0)
        minutes = args.minutes if args.minutes is not None else (DEFAULT_WINDOW[1] if full else 1.0)
        first = slice_rows(path, start, minutes, args.limit)
        second = slice_rows(path, start + minutes, minutes, args.limit)
        speedup, capacity = speedup_for(args, first)
    truth = dataclasses.asdict(engine_params(args.engine))
    workdir = Path(args.workdir)
    phases = set(args.phases.split(","))
    report: dict[str, Any] = {"bench": "trust", "trace": path.name, "window_minutes": [start, minutes],
                              "replicas": args.replicas, "engine": truth, "speedup": round(speedup, 3),
                              "capacity_rps": capacity, "max_output": args.max_output, "seed": args.seed}
    print(f"{path}: slices of {minutes:g} min from minute {start:g} ({len(first)} and {len(second)} requests); "
          f"{args.replicas} replicas; speed-up x{speedup:.2f}")
    default = ProxySettings()

    fid = live(args, first, speedup, workdir / "fidelity", config=None, gather=True)
    assert fid.recording is not None and fid.engines is not None
    recorded = whatif.read_rows(fid.recording)
    fleet = whatif.parse_fleet(fid.engines)
    started = time.monotonic()
    same = whatif.compare(recorded, fleet, default, default, seed=args.seed, resamples=200)
    sim = {m["metric"]: m["baseline"] for m in same["metrics"]}
    fits = fit_errors(fid.engines, truth)
    report["fidelity"] = {"live": fid.figures, "recorded": same["recorded"], "simulated": sim,
                          "rows_recorded": len(recorded), "proxy_cpu_ms_per_request": fid.proxy_cpu_ms_per_request,
                          "whatif_wall_s": round(time.monotonic() - started, 2), "fit": fits,
                          "errors": {k: {"vs_live": rel(sim.get(k), fid.figures.get(k)),
                                         "vs_recorded": rel(sim.get(k), (same["recorded"] or {}).get(k))}
                                     for k in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p99_ms")}}
    print(f"\nfidelity: {fid.figures['requests']} requests replayed, {fid.figures['answered']} answered, "
          f"failed {fid.figures['failed'] or 'none'}; {len(recorded)} rows recorded; proxy "
          f"{fid.proxy_cpu_ms_per_request} ms CPU a request")
    print(f"{'figure':<12} {'live':>9} {'recorded':>9} {'what-if':>9} {'vs live':>8} {'vs rec.':>8}")
    for k in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p99_ms", "hit_ratio"):
        lv, rc, sm = fid.figures.get(k), (same["recorded"] or {}).get(k), sim.get(k)
        print(f"{k:<12} {'-' if lv is None else lv:>9} {'-' if rc is None else rc:>9} {'-' if sm is None else sm:>9} "
              f"{_pct(rel(sm, lv)):>8} {_pct(rel(sm, rc)):>8}")
    print(f"\n{'fitted parameter':<28} {'fitted':>12} {'true':>12} {'error':>8}")
    for f in fits:
        print(f"{f['param']:<28} {_num(f['fitted']):>12} {_num(f['true']):>12} {_pct(f['relative_error']):>8}")

    if "tuning" in phases and second:
        tuned = tuning.tune(recorded, fleet, default, budget=args.budget, seed=args.seed, resamples=500)
        changes = tuned["proposal"] or tuned["fit"]["best_changes"]
        report["tuning"] = {"verdict": tuned["verdict"], "proposal": tuned["proposal"],
                            "fit": tuned["fit"], "held_out": {k: v for k, v in tuned["held_out"].items()
                                                              if k != "comparison"}}
        print(f"\ntune on the recording: {tuned['verdict']}")
        if changes:
            candidate = whatif.with_changes(default, changes)
            predicted = whatif.compare(trace_rows(second, speedup, args.max_output), fleet, default, candidate,
                                       seed=args.seed, resamples=500)
            base = live(args, second, speedup, workdir / "second-default", config=None, gather=False)
            tuned_run = live(args, second, speedup, workdir / "second-tuned",
                             config=proxy_toml(changes, workdir / "tuned.toml"), gather=False)
            outcome = {k: rel(tuned_run.figures.get(k), base.figures.get(k))
                       for k in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p99_ms")}
            report["tuning"].update({
                "changes": changes, "significant": tuned["proposal"] is not None,
                "predicted": predicted["metrics"], "live_default": base.figures, "live_tuned": tuned_run.figures,
                "live_change": outcome})
            print(f"second slice, default against {changes} "
                  f"({'proposed' if tuned['proposal'] else 'the search best, not significant'}):")
            print(f"{'figure':<12} {'default':>9} {'tuned':>9} {'live':>8} {'predicted':>10} {'95 % interval':>20}")
            for m in predicted["metrics"]:
                k = m["metric"]
                if k not in outcome:
                    continue
                print(f"{k:<12} {base.figures.get(k)!s:>9} {tuned_run.figures.get(k)!s:>9} {_pct(outcome[k]):>8} "
                      f"{_pct(None if m['estimate'] is None else m['estimate'] - 1):>10} "
                      f"[{_pct(None if m['low'] is None else m['low'] - 1)}, "
                      f"{_pct(None if m['high'] is None else m['high'] - 1)}]")
        else:
            print("nothing to run live: the search found no change at all")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    sys.exit(main())
