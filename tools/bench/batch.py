"""The batch runtime behind Ferry in real time: open-loop random load through the proxy, real processes.

``python -m tools.bench.batch`` starts a control plane, a proxy and one node
running the batch runtime (``ferry node --batch-runtime``) on ``--gpus``
simulated GPUs with the reference backend ``batchstring`` (about 100 ms per
batch, up to 100 inputs), each its own process on loopback. It then offers
load to the proxy's ``Inference.Infer`` with API keys (a paid and a free
tenant, alternating; tier standard, so the proxy retries nothing):

- **open loop, exponential gaps**: arrival times drawn up front (seeded), each request
  sent at its time whatever the earlier ones are doing, bounded by
  ``--max-inflight`` (arrivals beyond it are counted, not sent); it stops by
  itself after ``--seconds`` plus the answers still due (``--timeout``);
- **rates**: each of ``--rates`` in turn (default 1000, then 800, 600, 400,
  stopping at the first that *works*, or all with ``--all-rates``). A rate
  works with no error, answers to ≥ 97 % of the arrivals, P95 ≤ ``--p95-ms``,
  and the generator on schedule (P99 send lag ≤ 20 ms). A rate that fails only on send lag means the load generator,
  not the runtime, ran out of CPU: on a 2-core machine the generator, the
  proxy and the node share the cores, so the CPU each used is reported;
- **kill** (on unless ``--no-kill``): one more run with a GPU killed half-way
  through by the fault injector (the reserved model ``ferry.fault`` on the
  runtime's address), at ``--kill-rate`` or else the highest rate that worked
  capped at 80 % of what the GPUs left carry at full batches (two GPUs:
  800/s; at 1,000/s the one GPU left would run at ρ = 1, its queue growing
  without bound, which says N + 1 GPUs, not that a request was lost); lost answers
  (requests without their own answer) and duplicated ones (answers the
  runtime gave beyond those the clients received, or an answer that is not
  the request's own) must both be 0.

Per run: P50/P95/P99/max end-to-end latency (from the scheduled arrival, so a
late generator is not hidden), the achieved send and answer rates, errors by
status, the batch fill (mean requests per batch and flushes by reason, from
the runtime's ``ferry_batch_size`` histogram), and the CPU cores each process
used, with the machine's load average before and after (other work on a
shared machine takes cores from all three). Writes
``bench-results/batch.json``; exits 1 if the kill run lost or duplicated an
answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc.aio as triton
from tomli_w import dumps
from tritonclient.grpc import InferInput

from agent.batch.reference import transform
from agent.batch.server import FAULT_MODEL
from agent.scrape import Samples, parse
from ferry.config import hash_api_key
from ferry.procs import Child, cpu_seconds, stop_all
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from ferry_cli.up.ready import wait_routable
from tools.report import percentile

ROOT = Path(__file__).resolve().parents[2]
MODEL = "batchstring"
MAX_SEND_LAG_S = 0.02
PER_GPU_RATE = 1000.0  # the reference contract: 100 inputs per 100 ms batch
MIN_ANSWER_SHARE = 0.97


def scrape(address: str) -> Samples:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        return Samples(parse(response.read().decode()))


def batch_counts(samples: Samples) -> dict[str, float]:
    labels = {"model": MODEL}
    out = {"sum": samples.get("ferry_batch_size_sum", **labels) or 0.0,
           "count": samples.get("ferry_batch_size_count", **labels) or 0.0,
           "answered": samples.get("nv_inference_request_success", **labels) or 0.0,
           "requeued": samples.get("ferry_batch_requeued_total", **labels) or 0.0,
           "aborted": samples.get("ferry_batch_aborted_total", **labels) or 0.0}
    for reason in ("size", "time", "retry"):
        out[reason] = samples.get("ferry_batch_flushes_total", model=MODEL, reason=reason) or 0.0
    return out


async def fault(address: str, command: str) -> dict[str, Any]:
    tensor = InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([command.encode()], dtype=object))
    async with triton.InferenceServerClient(address) as client:
        result = await client.infer(FAULT_MODEL, [tensor])
    return dict(json.loads(result.as_numpy("text_output").reshape(-1)[0]))


async def kill_running_batch(address: str, attempts: int = 50) -> dict[str, Any]:
    """Kill the GPU of the oldest running batch; when none runs, give that GPU back and try again."""
    report: dict[str, Any] = {}
    for _ in range(attempts):
        report = await fault(address, "kill")
        if report["batch_id"] is not None:
            return report
        await fault(address, f"restore {report['gpu']}")
        await asyncio.sleep(0.002)  # pacing between attempts, not a wait for readiness
    return report


async def offer(stubs: list[Any], keys: list[str], rate: float, args: argparse.Namespace, tag: str,
                kill_at: float | None, runtime_address: str) -> dict[str, Any]:
    """One open-loop run (exponential gaps); returns what the clients saw."""
    rng = random.Random(args.seed)
    times, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= args.seconds:
            break
        times.append(t)
    requests = [inference_pb2.InferRequest(model=MODEL, prompt=f"{tag}-{i}", max_tokens=1,
                                           tier=common_pb2.TIER_STANDARD) for i in range(len(times))]
    metas = [(("x-api-key", key),) for key in keys]
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    lags: list[float] = []
    status: Counter[str] = Counter()
    retry_after: list[str] = []
    wrong = not_sent = inflight = 0
    kill: dict[str, Any] = {}

    async def one(i: int, scheduled: float) -> None:
        nonlocal wrong, inflight
        try:
            reply = await stubs[i % len(stubs)].Infer(requests[i], metadata=metas[i % len(metas)],
                                                      timeout=args.timeout)
            latencies.append(loop.time() - scheduled)
            status["OK"] += 1
            wrong += reply.text != transform(requests[i].prompt)
        except grpc.aio.AioRpcError as exc:
            status[exc.code().name] += 1
            retry_after.extend(v for k, v in (exc.trailing_metadata() or ()) if k == "retry-after")
        finally:
            inflight -= 1

    async def killer(at: float) -> None:
        await asyncio.sleep(max(0.0, at - loop.time()))
        kill.update(await kill_running_batch(runtime_address))
        kill["at_s"] = round(loop.time() - start, 3)

    tasks: set[asyncio.Task[None]] = set()
    start = loop.time() + 0.05
    if kill_at is not None:
        tasks.add(asyncio.create_task(killer(start + kill_at)))
    i = 0
    while i < len(times):
        now = loop.time()
        while i < len(times) and start + times[i] <= now:
            lags.append(now - (start + times[i]))
            if inflight >= args.max_inflight:
                not_sent += 1
            else:
                inflight += 1
                task = asyncio.create_task(one(i, start + times[i]))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            i += 1
        if i < len(times):
            await asyncio.sleep(max(0.0, start + times[i] - loop.time()))
    sent_for = loop.time() - start
    await asyncio.gather(*tasks)
    sent = len(times) - not_sent
    return {"target_rate": rate, "seconds": args.seconds, "arrivals": len(times), "sent": sent,
            "not_sent_inflight_bound": not_sent, "send_rate": round(sent / sent_for, 1),
            "answer_rate": round(status["OK"] / args.seconds, 1),
            "errors": {k: v for k, v in status.items() if k != "OK"}, "ok": status["OK"], "wrong_answers": wrong,
            "retry_after_seen": sorted(set(retry_after))[:5],
            "latency_ms": {f"p{q}": round(percentile(latencies, q) * 1e3, 1) for q in (50, 95, 99)}
            | {"max": round(max(latencies, default=0.0) * 1e3, 1)},
            "send_lag_ms": {"p50": round(percentile(lags, 50) * 1e3, 2), "p99": round(percentile(lags, 99) * 1e3, 2),
                            "max": round(max(lags, default=0.0) * 1e3, 2)},
            "kill": kill or None}


async def run_one(stubs: list[Any], keys: list[str], rate: float, args: argparse.Namespace, fleet: dict[str, Any],
                  tag: str, kill: bool) -> dict[str, Any]:
    """A run with the runtime's counters and every process's CPU before and after."""
    before = batch_counts(scrape(fleet["metrics"]))
    pids = {name: pid for name, pid in fleet["pids"].items()} | {"load_generator": os.getpid()}
    cpu0, wall0, load0 = {n: cpu_seconds(p) or 0.0 for n, p in pids.items()}, time.monotonic(), os.getloadavg()[0]
    result = await offer(stubs, keys, rate, args, tag, args.seconds / 2 if kill else None, fleet["address"])
    wall = time.monotonic() - wall0
    result["cpu_cores"] = {n: round(((cpu_seconds(p) or 0.0) - cpu0[n]) / wall, 2) for n, p in pids.items()}
    result["machine_loadavg_1m"] = {"before": round(load0, 2), "after": round(os.getloadavg()[0], 2)}
    after = batch_counts(scrape(fleet["metrics"]))
    delta = {k: after[k] - before[k] for k in after}
    result["batch"] = {"mean_size": round(delta["sum"] / delta["count"], 1) if delta["count"] else 0.0,
                       "batches": int(delta["count"]),
                       "flushes": {r: int(delta[r]) for r in ("size", "time", "retry")}}
    result["runtime_answered"] = int(delta["answered"])
    if kill:
        result["lost"] = result["sent"] - result["ok"]
        result["duplicated"] = max(0, result["runtime_answered"] - result["ok"]) + result["wrong_answers"]
        result["requeued"], result["aborted_batches"] = int(delta["requeued"]), int(delta["aborted"])
    why = []
    if result["errors"] or result["wrong_answers"]:
        why.append(f"errors {result['errors']}")
    if result["ok"] < MIN_ANSWER_SHARE * result["arrivals"]:
        why.append(f"answered {result['ok']} of {result['arrivals']} arrivals")
    if result["latency_ms"]["p95"] > args.p95_ms:
        why.append(f"P95 {result['latency_ms']['p95']} ms over {args.p95_ms:g} ms")
    if result["send_lag_ms"]["p99"] > MAX_SEND_LAG_S * 1e3:
        why.append(f"load generator behind schedule (P99 send lag {result['send_lag_ms']['p99']} ms)")
    result["works"], result["why_not"] = not why, why
    return result


def start_fleet(work: Path, args: argparse.Namespace, keys: dict[str, str]) -> tuple[list[Child], dict[str, Any]]:
    config = {"tenants": [{"name": name, "api_key_sha256": hash_api_key(key), "plan": name}
                          for name, key in keys.items()]}
    (work / "ferry.toml").write_text(dumps(config))
    cfg = ["--config", str(work / "ferry.toml"), "--insecure"]  # plain text on loopback
    children: list[Child] = []
    token = secrets.token_hex(16)  # the Admin API's, for wait_routable
    cp = Child("controlplane", ["controlplane", *cfg], work, env={"FERRY_ADMIN_TOKEN": token}).start()
    children.append(cp)
    cp_addr = cp.wait_ready()["grpc"]
    proxy = Child("proxy", ["proxy", "--workers", "1", "--control-plane", cp_addr, "--id", "bench-proxy", *cfg],
                  work).start()
    node = Child("node", ["node", "--node", "bench-node", "--control-plane", cp_addr, "--gpus", str(args.gpus),
                          "--batch-runtime", "--allow-fault-injection", *cfg], work).start()
    children += [proxy, node]
    data_plane = proxy.wait_ready()["grpc"]
    ready = node.wait_ready()
    wait_routable(cp_addr, {r["replica_id"] for r in ready["replicas"]}, "bench-proxy", 30, children,
                  admin_token=token)
    return children, {"data_plane": data_plane, **ready["batch_runtime"],
                      "pids": {c.name: c.pid for c in children}}


async def bench(args: argparse.Namespace, fleet: dict[str, Any], keys: dict[str, str]) -> dict[str, Any]:
    channels = [grpc.aio.insecure_channel(fleet["data_plane"]) for _ in range(4)]
    stubs = [inference_pb2_grpc.InferenceStub(c) for c in channels]
    key_list = list(keys.values())
    for i in range(20):  # warm-up: channels connected, first batches run
        await stubs[i % 4].Infer(inference_pb2.InferRequest(model=MODEL, prompt="warm", max_tokens=1),
                                 metadata=(("x-api-key", key_list[0]),), timeout=10)
    runs = []
    for n, rate in enumerate(args.rates):
        run = await run_one(stubs, key_list, rate, args, fleet, f"r{n}", kill=False)
        runs.append(run)
        print_run(run)
        if run["works"] and not args.all_rates:
            break
    working = [r["target_rate"] for r in runs if r["works"]]
    out: dict[str, Any] = {"runs": runs, "highest_working_rate": max(working, default=None)}
    if args.kill:
        survivable = 0.8 * (args.gpus - 1) * PER_GPU_RATE
        rate = args.kill_rate or min(max(working, default=min(args.rates)), survivable)
        out["kill"] = await run_one(stubs, key_list, rate, args, fleet, "kill", kill=True)
        print_run(out["kill"])
    for c in channels:
        await c.close()
    return out


def print_run(r: dict[str, Any]) -> None:
    lat, lag, cpu = r["latency_ms"], r["send_lag_ms"], r["cpu_cores"]
    print(f"{r['target_rate']:>6g}/s offered: sent {r['send_rate']:.0f}/s, answered {r['answer_rate']:.0f}/s, "
          f"P50 {lat['p50']:.0f} P95 {lat['p95']:.0f} P99 {lat['p99']:.0f} ms, fill {r['batch']['mean_size']}, "
          f"errors {r['errors'] or 0}, send lag P99 {lag['p99']} ms, CPU cores {cpu}, "
          f"load average {r['machine_loadavg_1m']['before']} -> {r['machine_loadavg_1m']['after']}")
    if r.get("kill"):
        print(f"        GPU {r['kill']['gpu']} killed at {r['kill']['at_s']} s: requeued {r['requeued']}, "
              f"lost {r['lost']}, duplicated {r['duplicated']}")
    print(f"        {'works' if r['works'] else 'does not work: ' + '; '.join(r['why_not'])}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench.batch", description=__doc__.splitlines()[0])
    p.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[1000, 800, 600, 400],
                   help="offered rates to try in turn, requests/s (default 1000,800,600,400)")
    p.add_argument("--all-rates", action="store_true", help="run every rate, not only down to the first that works")
    p.add_argument("--seconds", type=float, default=10.0, help="arrivals per run, seconds (default %(default)s)")
    p.add_argument("--gpus", type=int, default=2, help="GPUs of the node (default %(default)s)")
    p.add_argument("--p95-ms", type=float, default=500.0, help="latency budget a run must hold (default %(default)s)")
    p.add_argument("--max-inflight", type=int, default=5000, help="bound on requests in flight (default %(default)s)")
    p.add_argument("--timeout", type=float, default=10.0, help="deadline of each request, s (default %(default)s)")
    p.add_argument("--no-kill", dest="kill", action="store_false", help="skip the run with a GPU killed")
    p.add_argument("--kill-rate", type=float, help="rate of the run with a GPU killed (default: see above)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "bench-results" / "batch.json"))
    args = p.parse_args(argv)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    keys = {plan: "fk_" + secrets.token_hex(16) for plan in ("paid", "free")}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="ferry-bench-batch-") as tmp:
        children: list[Child] = []
        try:
            children, fleet = start_fleet(Path(tmp), args, keys)
            result = asyncio.run(bench(args, fleet, keys))
        finally:
            stop_all(children)
    result["setup"] = {"gpus": args.gpus, "model": MODEL, "backend": "agent.batch.reference:batchstring",
                       "batch_ms": 100, "max_batch": 100, "max_wait_ms": "derived from a 500 ms budget (50)",
                       "tier": "standard", "tenants": list(keys), "seconds_per_run": args.seconds,
                       "cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load_before],
                       "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"highest rate that works: {result['highest_working_rate']}/s -> {args.out}")
    kill = result.get("kill")
    return 1 if kill and (kill["lost"] or kill["duplicated"]) else 0


if __name__ == "__main__":
    sys.exit(main())
