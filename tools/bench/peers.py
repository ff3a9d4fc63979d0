"""Ferry against the peer routers in real time: the same simulated replicas, the same trace slice, the same load.

For each router of ``--routers`` (default: ``ferry`` (the Python relay),
``ferry:envoy`` (Envoy forwarding OpenAI HTTP to the replicas' HTTP faces,
two endpoint pickers deciding), ``sglang:cache_aware``,
``sglang:round_robin``, ``vllm:cache_aware``, ``vllm:consistent_hash``), in
turn: start ``--replicas`` fresh simulated replicas (empty prefix caches;
:mod:`tools.peers.replicas`, engine ``--engine KEY=VALUE``), start the router
in front of them (:mod:`tools.peers.routers`), replay the slice through it
with one load generator for all (:mod:`tools.peers.load`: every request
streamed, sent at its scheduled time, the same prompts), then stop both.

- **Trace**: ``--trace``, else the file named by ``$FERRY_MOONCAKE_TRACE``
  (the public Mooncake conversation trace, ``conversation_trace.jsonl`` of
  the FAST'25 release: ``python -m tools.fetch_traces`` puts it in
  ``traces/mooncake_conversation_trace.jsonl``), else the bundled two-minute excerpt
  ``tools/data/mooncake_conversation_first2min.jsonl`` (the output says
  which). Window: ``--start-minute`` / ``--minutes``, default minutes 10
  to 14 when the trace is that long (784 requests of the full trace), else
  the whole trace; at most ``--limit`` requests.
- **Load**: ``--load`` (0.8) of the fleet's capacity for this slice and
  engine, measured by :func:`tools.sim.capacity.measure` (round robin,
  saturated; the slice's requests tiled with fresh block ids until there are
  enough to keep every replica full, output capped as the replay caps it),
  gives the speed-up: ``load x capacity / the slice's own rate``.
  ``--speedup`` sets it directly instead.
- **Output cap**: ``--max-output`` 32 tokens: the replicas and the routers
  share one small machine, and streaming hundreds of tokens per request would
  measure the machine, not the routing.
- **Bounds**: ``--concurrency`` (256) requests in flight, ``--timeout`` (60 s)
  per request, nothing sent after ``--time-limit`` (default the slice's
  replay time + 60 s), each start bounded by ``--startup-timeout``.

Per router: requests sent and answered; TTFT (first chunk with text) and
end-to-end p50 / p90 / p99 over answered requests (nearest rank); errors and
refusals by status; the prefix-hit ratio the replicas measured (their
``ferry_replica_prefix_hit_blocks_total`` over ``…_lookup_blocks_total``,
differences over the replay, all replicas summed) and its ratio to the
infinite-cache limit; the busiest replica's answered requests over the mean
(``nv_inference_request_success``); CPU seconds per 1,000 requests of each
role of the router (Ferry's relay: proxy, control plane, agents, the
``ferry up`` launcher; Ferry's Envoy path: the Envoy binary, each picker,
the ``ferry envoy`` wrapper, the idle relay proxy, control plane, agents,
launcher; a peer: its process tree), of the replicas and of this client,
from ``/proc`` before and after the replay, and ``data_path``: the roles
every request crosses (the relay's proxy; Envoy + the pickers; a peer's
router), with control plane and agents apart; the machine's 1-minute load
average, sampled every second of the replay.

**Pass criteria** of Ferry's paths (:func:`criteria`, printed and written
under ``criteria``), against the peers measured in the same run: TTFT p99 at
most 0.8x the best peer's, end-to-end p99 at most the best peer's, hit ratio
at least 0.97x the infinite-cache limit, no errors (every request sent
answered OK), and data-path CPU per 1,000 requests at most 0.5x
``sglang:cache_aware``'s router.

The **infinite-cache limit** is computed over exactly the prompts sent: the
chained 512-word block hashes of each prompt (:func:`ferry.tokens.block_hashes`,
what the replicas hash), with one infinite cache shared by all replicas,
leading blocks already seen over all blocks, in sending order: the replicas'
unit.

Writes a table on stdout, ``--json-out`` (``bench-results/peers.json``) and
``--plot`` (``bench-results/peers-ttft.png``: TTFT p50 / p90 / p99 per
router). Logs of every process go under ``--workdir``
(``bench-results/peers-work``). Exits 1 if a router could not be measured
(the others still are), 2 on bad arguments.

Cost: the run is real time, one replay per router (with the default window on
the full trace: 784 requests at a speed-up of about 6, some 40 s each, plus
start and stop); building the prompts and their hashes takes a few seconds.

Example::

    python -m tools.bench.peers
    python -m tools.bench.peers --routers ferry,sglang:cache_aware --minutes 2
    python -m tools.bench.peers --routers ferry,ferry:envoy,sglang:cache_aware,vllm:cache_aware
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dataplane.config import ProxySettings
from ferry.config import load_file
from ferry.tokens import BLOCK_TOKENS, block_hashes
from tools import trace as tracefile
from tools.fetch_traces import trace_file
from tools.peers import load, routers, simulated
from tools.peers.procs import CpuMeter, ProcFailed, cpu_seconds
from tools.report import percentile
from tools.sim import capacity
from tools.sim.fleet import FleetConfig
from tools.sim.workload import FRESH_BASE, SimRequest, cached_lead, rate
from tools.simulate import engine_params

ROOT = Path(__file__).resolve().parents[2]
TRACE_ENV = "FERRY_MOONCAKE_TRACE"
BUNDLED = ROOT / "tools" / "data" / "mooncake_conversation_first2min.jsonl"
DEFAULT_ROUTERS = "ferry,ferry:envoy,sglang:cache_aware,sglang:round_robin,vllm:cache_aware,vllm:consistent_hash"
DEFAULT_WINDOW = (10.0, 4.0)  # minutes 10 to 14 of the full trace
PERCENTILES = (50, 90, 99)
TTFT_P99_VS_BEST_PEER = 0.8
HIT_VS_LIMIT = 0.97
CPU_VS_SGLANG = 0.5
CPU_REFERENCE = "sglang:cache_aware"


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tools.bench.peers", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--trace", type=trace_file,
                   help=f"Mooncake JSONL (default ${TRACE_ENV}, then the bundled excerpt; full trace: "
                        "python -m tools.fetch_traces)")
    p.add_argument("--start-minute", type=float, default=None, help="window start (default 10, or 0 on a short trace)")
    p.add_argument("--minutes", type=_positive, default=None, help="window length (default 4, or the whole trace)")
    p.add_argument("--limit", type=int, default=100_000, help="at most this many requests")
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--load", type=_positive, default=0.8, help="share of the fleet's measured capacity")
    p.add_argument("--speedup", type=_positive, default=None, help="set the speed-up instead of --load")
    p.add_argument("--max-output", type=int, default=32, help="cap on generated tokens per request")
    p.add_argument("--engine", action="append", default=[], metavar="KEY=VALUE", help="replica engine parameter")
    p.add_argument("--routers", default=DEFAULT_ROUTERS, help=f"comma-separated (default {DEFAULT_ROUTERS})")
    p.add_argument("--concurrency", type=int, default=256, help="requests in flight at most")
    p.add_argument("--timeout", type=_positive, default=60.0, help="per request, seconds")
    p.add_argument("--time-limit", type=_positive, default=None, help="send nothing after this many seconds")
    p.add_argument("--startup-timeout", type=_positive, default=180.0, help="seconds for each start")
    p.add_argument("--ferry-config", help="a config file for ferry up (default: none, Ferry's defaults)")
    p.add_argument("--json-out", default="bench-results/peers.json")
    p.add_argument("--plot", default="bench-results/peers-ttft.png")
    p.add_argument("--workdir", default="bench-results/peers-work", help="logs of every process")
    args = p.parse_args(argv)
    if args.replicas < 1 or args.max_output < 1 or args.limit < 1 or args.concurrency < 1:
        p.error("--replicas, --max-output, --limit and --concurrency must be at least 1")
    try:
        routers.parse_routers(args.routers)
    except ValueError as exc:
        p.error(str(exc))
    return args


def choose_trace(given: str | None) -> tuple[Path, bool]:
    """The trace to replay and whether it is the bundled excerpt's fallback (False) or a chosen file (True)."""
    if given:
        return Path(given), Path(given).resolve() != BUNDLED.resolve()
    candidate = os.environ.get(TRACE_ENV)
    if candidate and Path(candidate).is_file():
        return Path(candidate), True
    return BUNDLED, False


def window(args: argparse.Namespace, *, full: bool) -> tuple[float, float | None]:
    """(start minute, minutes or None for all) of the slice: the flags, else the default for this trace."""
    start = args.start_minute if args.start_minute is not None else (DEFAULT_WINDOW[0] if full else 0.0)
    minutes = args.minutes if args.minutes is not None else (DEFAULT_WINDOW[1] if full else None)
    return start, minutes


def slice_rows(path: Path, start: float, minutes: float | None, limit: int) -> list[tracefile.TraceRequest]:
    rows = tracefile.load(path)
    end = math.inf if minutes is None else (start + minutes) * 60.0
    return [r for r in rows if start * 60.0 <= r.offset < end][:limit]


def capacity_sample(rows: Sequence[tracefile.TraceRequest], *, need: int, max_output: int) -> list[SimRequest]:
    """``need`` requests of the slice's mix for the saturation run: the slice, then copies with fresh block ids."""
    out: list[SimRequest] = []
    copy = 0
    while len(out) < need and rows:
        shift = 0 if copy == 0 else FRESH_BASE + copy * (1 << 32)
        for r in rows:
            if len(out) == need:
                break
            ids = tuple(h + shift for h in r.hash_ids)
            out.append(SimRequest(len(out), 0.0, r.input_tokens, max(1, min(r.output_tokens, max_output)), ids))
        copy += 1
    return out


def speedup_for(args: argparse.Namespace, rows: Sequence[tracefile.TraceRequest]) -> tuple[float, float | None]:
    """(speed-up, measured capacity in requests/s or None when ``--speedup`` was given)."""
    if args.speedup is not None:
        return args.speedup, None
    engine = engine_params(args.engine)
    per_replica = max(250, 3 * engine.max_running)
    sample = capacity_sample(rows, need=per_replica * args.replicas, max_output=args.max_output)
    fleet = FleetConfig(replicas=args.replicas, proxies=1, engine=engine)
    cap = capacity.measure(sample, fleet, per_replica=per_replica)
    own = rate([SimRequest(i, r.offset, r.input_tokens, 1, ()) for i, r in enumerate(rows)])
    return args.load * cap / own, cap


def infinite_cache_limit(blocks: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Leading blocks already seen by one infinite cache shared by all, over all blocks, in sending order."""
    seen: set[int] = set()
    hit = total = 0
    for hashes in blocks:
        hit, total = hit + cached_lead(hashes, seen), total + len(hashes)
    return {"hit_blocks": hit, "lookup_blocks": total, "ratio": round(hit / total, 4) if total else 0.0}


# -- one router -------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class LoadSampler:
    """The 1-minute load average every second of a replay."""

    samples: list[float] = dataclasses.field(default_factory=list)

    async def run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            await asyncio.sleep(1.0)


def measure_router(spec: routers.RouterSpec, args: argparse.Namespace, planned: list[load.Planned],
                   limits: load.Limits, workdir: Path) -> dict[str, Any]:
    """Start fresh replicas and the router, replay, stop both; the router's figures."""
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    replicas = routers.Replicas(args.replicas, workdir, engine=args.engine, timeout=args.startup_timeout)
    started = time.monotonic()
    try:
        replicas.start()
        running = routers.start_router(spec, replicas, workdir, timeout=args.startup_timeout,
                                       ferry_config=args.ferry_config)
        try:
            ready_s = time.monotonic() - started
            before = replicas.counters()
            meter = CpuMeter({**running.roles, "replicas": [replicas.pid]})
            solo = {name: cpu_seconds(pid) for name, pid in running.solo.items()}
            client = cpu_seconds(os.getpid())
            sampler = LoadSampler()
            meter.start()
            outcomes, elapsed = load.run_sync(running.target(), planned, limits, beside=sampler.run)
            cpu = meter.stop()
            cpu.update({name: round(cpu_seconds(pid) - solo[name], 3) for name, pid in running.solo.items()})
            cpu["client"] = round(cpu_seconds(os.getpid()) - client, 3)
            after = replicas.counters()
            counters = routers.proxy_counters(running)
        finally:
            running.stop()
    finally:
        replicas.stop()
    row = summarize(spec, outcomes, elapsed, before, after, cpu, sampler.samples, ready_s, workdir,
                    data_path=running.data_path)
    if running.info.get("envoy_pid"):
        row["envoy_pid"] = running.info["envoy_pid"]
    if counters:
        row["proxy_counters"] = counters
    return row


def summarize(spec: routers.RouterSpec, outcomes: list[load.Outcome], elapsed: float,
              before: list[routers.ReplicaCounters], after: list[routers.ReplicaCounters], cpu: dict[str, float],
              load_samples: list[float], ready_s: float, workdir: Path,
              data_path: Sequence[str] = ()) -> dict[str, Any]:
    sent = [o for o in outcomes if o.status != "NOT_SENT"]
    ok = [o for o in sent if o.status == "OK"]
    ttft = [o.ttft_s for o in ok if o.ttft_s is not None]
    e2e = [o.e2e_s for o in ok]
    errors = Counter(o.status for o in sent if o.status != "OK")
    details = {status: next(o.detail for o in sent if o.status == status) for status in errors}
    hits = sum(a.hit_blocks - b.hit_blocks for a, b in zip(after, before, strict=True))
    lookups = sum(a.lookup_blocks - b.lookup_blocks for a, b in zip(after, before, strict=True))
    served = [a.success - b.success for a, b in zip(after, before, strict=True)]
    failed = sum(a.failure - b.failure for a, b in zip(after, before, strict=True))
    mean_served = sum(served) / len(served) if served else 0.0
    router_roles = [k for k in cpu if k not in ("replicas", "client")]
    cpu = {**cpu, "router_total": round(sum(cpu[k] for k in router_roles), 3)}
    if data_path:
        cpu["data_path"] = round(sum(cpu.get(k, 0.0) for k in data_path), 3)
    per_k = {k: round(v * 1000 / len(sent), 2) if sent else None for k, v in cpu.items()}

    def ms(values: list[float]) -> dict[str, float | None]:
        return {f"p{p}": (round(percentile(values, p) * 1000, 1) if values else None) for p in PERCENTILES}

    return {
        "router": spec.label, "requests": len(sent), "ok": len(ok), "not_sent": len(outcomes) - len(sent),
        "ttft_ms": ms(ttft), "e2e_ms": ms(e2e), "late_ms": ms([max(0.0, o.late_s) for o in sent]),
        "errors": dict(errors), "refusals": sum(n for s, n in errors.items() if s in load.REFUSALS),
        "error_details": details,
        "prefix_hit_ratio": round(hits / lookups, 4) if lookups else None,
        "hit_blocks": hits, "lookup_blocks": lookups,
        "replica_requests": served, "replica_failures": failed,
        "max_mean_requests": round(max(served) / mean_served, 3) if mean_served else None,
        "cpu_seconds": cpu, "cpu_seconds_per_1k": per_k,
        "load_average": {"mean": round(sum(load_samples) / len(load_samples), 2) if load_samples else None,
                         "max": round(max(load_samples), 2) if load_samples else None},
        "elapsed_s": round(elapsed, 1), "startup_s": round(ready_s, 1), "logs": str(workdir),
        "data_path_roles": list(data_path),
    }


def criteria(report: dict[str, Any], limit_ratio: float) -> dict[str, dict[str, Any]]:
    """The pass criteria (module doc) of each Ferry path measured, against the peers of the same run."""
    measured = [r for r in report["routers"] if "failed" not in r]
    peers = [r for r in measured if not r["router"].startswith("ferry")]
    best_ttft = min((r["ttft_ms"]["p99"] for r in peers if r["ttft_ms"]["p99"] is not None), default=None)
    best_e2e = min((r["e2e_ms"]["p99"] for r in peers if r["e2e_ms"]["p99"] is not None), default=None)
    reference = next((r for r in peers if r["router"] == CPU_REFERENCE), None)
    ref_cpu = reference["cpu_seconds_per_1k"].get("data_path") if reference else None
    out: dict[str, dict[str, Any]] = {}
    for r in measured:
        if not r["router"].startswith("ferry"):
            continue
        ttft, e2e, hit = r["ttft_ms"]["p99"], r["e2e_ms"]["p99"], r["prefix_hit_ratio"]
        cpu = r["cpu_seconds_per_1k"].get("data_path")

        def check(value: float | None, bound: float | None, *, at_least: bool = False) -> dict[str, Any]:
            ok = None if value is None or bound is None else (value >= bound if at_least else value <= bound)
            return {"value": value, "bound": None if bound is None else round(bound, 3), "pass": ok}

        out[r["router"]] = {
            "ttft_p99_ms": check(ttft, None if best_ttft is None else TTFT_P99_VS_BEST_PEER * best_ttft),
            "e2e_p99_ms": check(e2e, best_e2e),
            "hit_ratio": check(hit, HIT_VS_LIMIT * limit_ratio if limit_ratio else None, at_least=True),
            "errors": {"value": r["requests"] - r["ok"], "bound": 0, "pass": r["ok"] == r["requests"]},
            "cpu_s_per_1k_data_path": check(cpu, None if ref_cpu is None else CPU_VS_SGLANG * ref_cpu),
        }
    return out


def print_criteria(report: dict[str, Any]) -> None:
    """One line per criterion of each Ferry path: value, bound, PASS / FAIL (or n/a without a peer to compare)."""
    names = {"ttft_p99_ms": f"TTFT p99 <= {TTFT_P99_VS_BEST_PEER}x best peer's (ms)",
             "e2e_p99_ms": "e2e p99 <= best peer's (ms)",
             "hit_ratio": f"hit ratio >= {HIT_VS_LIMIT}x the infinite-cache limit",
             "errors": "requests not answered OK == 0",
             "cpu_s_per_1k_data_path": f"data-path CPU s/1k <= {CPU_VS_SGLANG}x {CPU_REFERENCE}'s router"}
    for router, checks in report["criteria"].items():
        roles: list[str] = next((r.get("data_path_roles") or [] for r in report["routers"] if r["router"] == router),
                                [])
        print(f"criteria for {router} (data path: {' + '.join(roles)}):")
        for key, check in checks.items():
            verdict = "n/a" if check["pass"] is None else ("PASS" if check["pass"] else "FAIL")
            print(f"  {verdict:<4}  {names[key]}: {check['value']} vs {check['bound']}")


# -- report -----------------------------------------------------------------------------------------------------------

def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def print_table(report: dict[str, Any]) -> None:
    limit = report["infinite_cache_limit"]["ratio"]
    header = ["router", "req", "ok", "TTFT p50", "TTFT p99", "e2e p50", "e2e p99", "errors (refusals)",
              "hit", "hit/limit", "max/mean", "CPU s/1k data path", "CPU s/1k router", "CPU s/1k by role",
              "CPU s/1k replicas", "load avg"]
    rows = []
    for r in report["routers"]:
        if "failed" in r:
            rows.append([r["router"], "failed: " + r["failed"].splitlines()[0][:100]] + [""] * (len(header) - 2))
            continue
        per_k = r["cpu_seconds_per_1k"]
        roles = ", ".join(f"{k} {v:.1f}" for k, v in per_k.items()
                          if k not in ("router_total", "data_path", "replicas", "client") and v is not None)
        errors = ", ".join(f"{k} {v}" for k, v in sorted(r["errors"].items())) or "0"
        hit = r["prefix_hit_ratio"]
        rows.append([
            r["router"], str(r["requests"]), str(r["ok"]), _fmt(r["ttft_ms"]["p50"]), _fmt(r["ttft_ms"]["p99"]),
            _fmt(r["e2e_ms"]["p50"]), _fmt(r["e2e_ms"]["p99"]), f"{errors} ({r['refusals']})",
            _fmt(hit, 3), _fmt(hit / limit if hit is not None and limit else None, 2),
            _fmt(r["max_mean_requests"], 2), _fmt(per_k.get("data_path"), 2), _fmt(per_k["router_total"], 1),
            roles, _fmt(per_k["replicas"], 1),
            _fmt(r["load_average"]["mean"], 1)])
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    print(f"infinite-cache limit over the {report['requests']} prompts sent: {limit:.3f} "
          f"({report['infinite_cache_limit']['hit_blocks']:,} of {report['infinite_cache_limit']['lookup_blocks']:,} "
          "blocks); TTFT and e2e in ms over answered requests")


def _rel(sim: float | None, real: float | None) -> float | None:
    """(sim - real) / real, rounded; None when either is missing."""
    return round((sim - real) / real, 3) if sim is not None and real else None


def print_sim(report: dict[str, Any]) -> None:
    """The simulator beside the real run: TTFT p50 / p99 and hit ratio per router, and the two rankings."""
    print()
    print("router                  sim policy     sim TTFT p50  real  diff   sim TTFT p99  real  diff   sim hit  real")
    for r in report["routers"]:
        if "sim" not in r:
            continue
        sim, diff = r["sim"], r["sim_vs_real"]
        print(f"{r['router']:<23} {sim['policy']:<14} {_fmt(sim['ttft_p50_ms']):>12} {_fmt(r['ttft_ms']['p50']):>5} "
              f"{_fmt(diff['p50'], 2):>5} {_fmt(sim['ttft_p99_ms']):>14} {_fmt(r['ttft_ms']['p99']):>5} "
              f"{_fmt(diff['p99'], 2):>5} {_fmt(sim['hit_ratio'], 3):>8} {_fmt(r['prefix_hit_ratio'], 3):>5}")
    ranking = report["ranking"]
    print(f"ranking by TTFT p99: real {' < '.join(ranking['real'])}; simulator {' < '.join(ranking['sim'])}"
          f" ({'the same order' if ranking['agree'] else 'ordered differently: ' + str(ranking['disagree'])}; routers "
          f"the simulator models alike are not compared); floor p99 {report['ttft_floor_ms'].get('p99')} ms")


def plot_ttft(report: dict[str, Any], path: Path) -> None:
    """Grouped bars: TTFT p50 / p90 / p99 per router (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in report["routers"] if "failed" not in r and r["ttft_ms"]["p50"] is not None]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(PERCENTILES)
    for k, (p, colour) in enumerate(zip(PERCENTILES, ("tab:blue", "tab:orange", "tab:red"), strict=True)):
        xs = [i + (k - 1) * width for i in range(len(measured))]
        ys = [r["ttft_ms"][f"p{p}"] for r in measured]
        ax.bar(xs, ys, width, color=colour, label=f"p{p}")
        for x, y in zip(xs, ys, strict=True):
            ax.annotate(f"{y:,.0f}", (x, y), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(measured)), [r["router"] for r in measured], fontsize=8)
    ax.set_yscale("log")
    ax.set(ylabel="time to first token (ms)",
           title=f"TTFT per router: {report['requests']} requests of {report['trace']}, "
                 f"{report['replicas']} replicas, x{report['speedup']:.2f}")
    ax.grid(True, which="both", axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- main -------------------------------------------------------------------------------------------------------------

def source_state() -> dict[str, Any]:
    """The commit measured and the files changed beside it (the working tree is what runs)."""
    def git(*argv: str) -> str:
        try:
            done = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
        except OSError:
            return ""
        return done.stdout if done.returncode == 0 else ""
    changed = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines() if line[3:]]
    return {"commit": git("rev-parse", "HEAD").strip(), "changed_files": changed}


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # so that every started process is stopped on the way out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    began = time.monotonic()
    specs = routers.parse_routers(args.routers)
    trace, full = choose_trace(args.trace)
    if not trace.is_file():
        print(f"bench_peers: no trace at {trace}: run `python -m tools.fetch_traces`", file=sys.stderr)
        return 2
    rows = tracefile.load(trace)
    full = full and bool(rows) and rows[-1].offset >= sum(DEFAULT_WINDOW) * 60.0
    start, minutes = window(args, full=full)
    rows = slice_rows(trace, start, minutes, args.limit)
    if len(rows) < 2:
        print(f"bench_peers: the window holds {len(rows)} requests of {trace}", file=sys.stderr)
        return 2
    for kind in sorted({s.kind for s in specs} - {"ferry"}):
        routers.ensure_peer(kind)
    speedup, cap = speedup_for(args, rows)
    planned = load.plan(rows, speedup=speedup, max_output=args.max_output)
    span = planned[-1].due_s
    limits = load.Limits(concurrency=args.concurrency, timeout=args.timeout,
                         time_limit=args.time_limit or span + 60.0)
    blocks = [block_hashes(p.prompt, BLOCK_TOKENS) for p in planned]
    limit = infinite_cache_limit(blocks)
    engine = engine_params(args.engine)
    sim_reqs = simulated.requests([p.due_s for p in planned], [r.input_tokens for r in rows],
                                  [p.max_tokens for p in planned], blocks)
    floor = simulated.ttft_floor(sim_reqs, engine)
    settings = (ProxySettings.from_section(load_file(args.ferry_config).sections.get("proxy", {}))
                if args.ferry_config else ProxySettings())
    what = "the bundled excerpt" if trace.resolve() == BUNDLED.resolve() else "the full trace"
    window_text = f"minutes {start:g} to {start + minutes:g}" if minutes is not None else f"from minute {start:g}"
    print(f"bench_peers: {len(rows)} requests of {trace} ({what}, {window_text}), {args.replicas} replicas, "
          f"max output {args.max_output}, speed-up x{speedup:.2f}"
          + (f" ({args.load:g} of a measured capacity of {cap:.1f} requests/s)" if cap else "")
          + f", {span:.0f} s of replay per router; infinite-cache limit {limit['ratio']:.3f}; TTFT floor "
          f"(own prefill, infinite cache) p50 {floor.get('p50', 0):.0f} ms, p99 {floor.get('p99', 0):.0f} ms",
          flush=True)
    report: dict[str, Any] = {
        "trace": trace.name, "trace_path": str(trace), "trace_kind": what, "start_minute": start, "minutes": minutes,
        "requests": len(planned), "replicas": args.replicas, "engine": dataclasses.asdict(engine_params(args.engine)),
        "max_output": args.max_output, "load": None if args.speedup else args.load, "capacity_rps": cap,
        "speedup": speedup, "limits": dataclasses.asdict(limits), "infinite_cache_limit": limit,
        "ttft_floor_ms": floor,
        "source": source_state(), "routers": [],
    }
    failures = 0
    for spec in specs:
        print(f"bench_peers: {spec.label} ...", file=sys.stderr, flush=True)
        try:
            row = measure_router(spec, args, planned, limits, Path(args.workdir) / spec.label.replace(":", "-"))
            if row["prefix_hit_ratio"] is not None and limit["ratio"]:
                row["hit_vs_limit"] = round(row["prefix_hit_ratio"] / limit["ratio"], 3)
            sim = simulated.simulate(spec.label, sim_reqs, replicas=args.replicas, engine=engine, settings=settings)
            if sim is not None:
                row["sim"] = {k: sim[k] for k in ("policy", "ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms",
                                                  "hit_ratio", "rejected", "branches")}
                row["sim_vs_real"] = {p: _rel(sim[f"ttft_{p}_ms"], row["ttft_ms"][p]) for p in ("p50", "p99")}
        except (ProcFailed, OSError, ValueError) as exc:
            failures += 1
            row = {"router": spec.label, "failed": str(exc)}
            print(f"bench_peers: {spec.label} failed: {exc}", file=sys.stderr, flush=True)
        report["routers"].append(row)
        if "failed" not in row:
            print(f"bench_peers: {spec.label}: {row['ok']}/{row['requests']} answered, TTFT p50 "
                  f"{_fmt(row['ttft_ms']['p50'])} ms, p99 {_fmt(row['ttft_ms']['p99'])} ms, hit "
                  f"{_fmt(row['prefix_hit_ratio'], 3)}", file=sys.stderr, flush=True)
    report["wall_s"] = round(time.monotonic() - began, 1)
    measured = [r for r in report["routers"] if "failed" not in r]
    report["ranking"] = {
        "real": simulated.ranking({r["router"]: r["ttft_ms"] for r in measured}),
        "sim": simulated.ranking({r["router"]: {"p50": r["sim"]["ttft_p50_ms"], "p99": r["sim"]["ttft_p99_ms"]}
                                  for r in measured if "sim" in r}),
    }
    report["ranking"]["disagree"] = simulated.disagreements(report["ranking"]["real"], report["ranking"]["sim"])
    report["ranking"]["agree"] = not report["ranking"]["disagree"]
    report["criteria"] = criteria(report, limit["ratio"])
    print()
    print_table(report)
    print_sim(report)
    print_criteria(report)
    print(f"wall time {report['wall_s']:.0f} s")
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    plot_ttft(report, Path(args.plot))
    print(f"wrote {out} and {args.plot}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
