"""The fleet as the simulator sees it: fitted step parameters against the replicas' true settings.

Starts a control plane, a proxy and two nodes, each its own process, plain
text on loopback: node ``alpha`` runs two replicas of model ``alpha`` (one GPU
each) with the parameters :data:`KINDS` gives it, node ``beta`` two of model
``beta`` (two GPUs each) with others, none of them the defaults. It replays
the bundled Mooncake excerpt (``tools/data/mooncake_conversation_first2min.jsonl``,
through :mod:`tools.replay`: prompts from the trace's block ids, so shared
prefixes hit the replicas' prefix caches, answers capped at ``--max-output``)
over both models, waits for the last telemetry, then asks
``ferryctl engines --json`` and prints, per model and kind, each of the four
step parameters fitted against the true one with its standard error and the
relative error, the facts reported against the configured ones, and the fit's
relative RMS error and R². Writes ``bench-results/engines.json``.

Usage::

    python -m tools.bench.engines [--speedup 2] [--minutes 2] [--max-output 64] [--out bench-results/engines.json]

About 65 s on the 2-core machine at the default ``--speedup 2`` (the replay's minute, with no request shed);
at 4 some requests are shed and each kind has about a third fewer samples.
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tomli_w import dumps

from agent.replica.engine import EngineParams
from ferry.config import hash_api_key
from ferry.procs import Child, stop_all
from ferry_cli.ctl.engines import FACTS, STEP_PARAMS, fitted_params
from ferry_cli.up.ready import wait_routable
from tools.fetch_traces import BUNDLED

ROOT = Path(__file__).resolve().parents[2]

# model -> (GPUs per replica, the replicas' true engine parameters); none of them EngineParams' defaults
KINDS: dict[str, tuple[int, EngineParams]] = {
    "alpha": (1, EngineParams(max_running=24, max_queue=2048, kv_blocks_total=6000, kv_block_tokens=512,
                              prefix_cache_blocks=2048, prefill_base_seconds=0.003, prefill_seconds_per_token=12e-6,
                              decode_base_seconds=0.006, decode_seconds_per_request=0.0004, max_step_tokens=4096)),
    "beta": (2, EngineParams(max_running=16, max_queue=2048, kv_blocks_total=3000, kv_block_tokens=512,
                             prefix_cache_blocks=1024, prefill_base_seconds=0.005, prefill_seconds_per_token=25e-6,
                             decode_base_seconds=0.010, decode_seconds_per_request=0.0008, max_step_tokens=2048)),
}
REPLICAS_PER_NODE = 2


def replica_section(params: EngineParams) -> dict[str, Any]:
    """The ``[replica]`` section that makes a node's replicas run ``params``."""
    keys = ("max_running", "max_queue", "kv_blocks_total", "kv_block_tokens", "prefix_cache_blocks",
            "prefill_base_seconds", "prefill_seconds_per_token", "decode_base_seconds",
            "decode_seconds_per_request", "max_step_tokens")
    return {k: getattr(params, k) for k in keys}


def compare(row: dict[str, Any], true: EngineParams) -> dict[str, Any]:
    """Fitted against true, per parameter: values, standard error, relative error."""
    fitted = fitted_params(row)
    out: dict[str, Any] = {"model": row["model"], "kind": row["kind"], "replicas": row["replicas"],
                           "samples": row["samples"], "window_seconds": row["window_seconds"], "fit": row["fit"],
                           "unidentifiable": row["unidentifiable"], "params": {}}
    for name in STEP_PARAMS:
        value = row["params"].get(name)
        t = getattr(true, name)
        out["params"][name] = {"true": t, "fitted": value, "stderr": row["stderr"].get(name),
                               "relative_error": None if value is None else value / t - 1}
    for name in FACTS:
        out["params"][name] = {"true": getattr(true, name), "reported": row["params"].get(name),
                               "equal": getattr(fitted, name) == getattr(true, name)}
    return out


def print_comparison(c: dict[str, Any]) -> None:
    fit = c["fit"]
    print(f"\n{c['model']}  kind {c['kind']}  replicas {len(c['replicas'])}  {c['samples']} samples over "
          f"{c['window_seconds']} s  relative RMS {100 * (fit['relative_rms'] or 0):.2f}%  R² {fit['r2']}")
    print(f"  {'parameter':<28}{'true':>14}{'fitted':>14}{'stderr':>12}{'error':>9}")
    for name in STEP_PARAMS:
        p = c["params"][name]
        if p["fitted"] is None:
            print(f"  {name:<28}{p['true']:>14.6g}{'-':>14}{'-':>12}{'-':>9}  {c['unidentifiable'].get(name)}")
            continue
        se = "-" if p["stderr"] is None else f"{p['stderr']:.3g}"
        print(f"  {name:<28}{p['true']:>14.6g}{p['fitted']:>14.6g}{se:>12}{100 * p['relative_error']:>+8.2f}%")
    for name in FACTS:
        p = c["params"][name]
        print(f"  {name:<28}{p['true']:>14}{p['reported']!s:>14}{'':>12}{'ok' if p['equal'] else 'DIFFERS':>9}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    key = "fk_" + secrets.token_hex(16)
    token = secrets.token_hex(16)
    base = {"tenants": [{"name": "bench", "api_key_sha256": hash_api_key(key), "plan": "enterprise"}],
            "models": [{"name": m} for m in KINDS]}
    with tempfile.TemporaryDirectory(prefix="ferry-engines-") as tmp:
        work = Path(tmp)
        (work / "ferry.toml").write_text(dumps(base))
        children: list[Child] = []
        try:
            cp = Child("controlplane", ["controlplane", "--config", str(work / "ferry.toml"), "--insecure"], work,
                       env={"FERRY_ADMIN_TOKEN": token}).start()
            children.append(cp)
            cp_addr = cp.wait_ready()["grpc"]
            proxy = Child("proxy", ["proxy", "--control-plane", cp_addr, "--id", "bench-proxy", "--workers", "1",
                                    "--config", str(work / "ferry.toml"), "--insecure"], work).start()
            children.append(proxy)
            nodes = []
            for model, (gpus, params) in KINDS.items():
                config = work / f"{model}.toml"
                config.write_text(dumps({**base, "replica": replica_section(params)}))
                replicas = [arg for _ in range(REPLICAS_PER_NODE) for arg in ("--replica", f"{model}:v1")]
                nodes.append(Child(f"node-{model}", ["node", "--node", f"node-{model}", "--control-plane", cp_addr,
                                                     "--gpus", str(gpus * REPLICAS_PER_NODE), *replicas,
                                                     "--config", str(config), "--insecure"], work).start())
            children += nodes
            ready = proxy.wait_ready()
            ids = {r["replica_id"] for n in nodes for r in n.wait_ready()["replicas"]}
            wait_routable(cp_addr, ids, ready["proxy_id"], 30, children, admin_token=token)
            print(f"fleet up: {len(ids)} replicas; replaying {args.minutes} min of {BUNDLED.name} "
                  f"at speedup {args.speedup}", flush=True)
            started = time.monotonic()
            replay = subprocess.run(
                [sys.executable, "-m", "tools.replay", "--data-plane", ready["grpc"], "--api-key", key,
                 "--models", ",".join(KINDS), "--minutes", str(args.minutes), "--speedup", str(args.speedup),
                 "--max-output", str(args.max_output), "--timeout", "120",
                 "--time-limit", str(args.minutes * 60 / args.speedup + 5)],
                cwd=ROOT, capture_output=True, text=True, check=False)
            replay_seconds = time.monotonic() - started
            if "requests" not in replay.stdout:  # it exits 1 when some requests were shed: load enough, then
                raise SystemExit(f"replay failed:\n{replay.stdout}\n{replay.stderr}")
            time.sleep(2.0)  # the last intervals: sent within a telemetry interval, relayed within a tick
            reply = subprocess.run(
                [sys.executable, "-m", "ferry_cli.ctl.main", "--control-plane", cp_addr, "--admin-token", token,
                 "engines", "--json"], cwd=ROOT, capture_output=True, text=True, check=True)
            human = subprocess.run(
                [sys.executable, "-m", "ferry_cli.ctl.main", "--control-plane", cp_addr, "--admin-token", token,
                 "engines"], cwd=ROOT, capture_output=True, text=True, check=True)
        finally:
            stop_all(children)
    rows = json.loads(reply.stdout)["engines"]
    print("\n$ ferryctl engines\n" + human.stdout)
    comparisons = [compare(r, KINDS[r["model"]][1]) for r in rows if r["model"] in KINDS]
    for c in comparisons:
        print_comparison(c)
    worst = max((abs(p["relative_error"]) for c in comparisons for n, p in c["params"].items()
                 if n in STEP_PARAMS and p["relative_error"] is not None), default=None)
    print(f"\nworst relative error of a step parameter: {'-' if worst is None else f'{100 * worst:.2f}%'}")
    replay_tail = "\n".join(line for line in replay.stdout.strip().splitlines() if not line.startswith("["))
    print("\nthe replay's report:\n" + replay_tail)
    return {"trace": BUNDLED.name, "minutes": args.minutes, "speedup": args.speedup, "max_output": args.max_output,
            "replay_seconds": round(replay_seconds, 1), "kinds": comparisons, "worst_relative_error": worst,
            "replay_report_tail": replay_tail}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools.bench.engines", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--minutes", type=float, default=2.0, help="replay the first minutes of the trace (default 2)")
    p.add_argument("--speedup", type=float, default=2.0, help="divide arrival times by this (default 2)")
    p.add_argument("--max-output", type=int, default=64, help="cap on generated tokens per request (default 64)")
    p.add_argument("--out", default=str(ROOT / "bench-results" / "engines.json"))
    args = p.parse_args(argv)
    result = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
