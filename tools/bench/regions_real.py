"""The regions scenario with real processes: ``python -m tools.bench.regions --mode real``.

Starts one control plane (with ``region_rtt_ms``), a proxy per region
(``simulate_region_rtt``: a spilled forward waits the configured round trip)
and one node per replica (``--region``), on loopback ports 0, in a temporary
folder; waits until every proxy routes to its region's replicas; then sends
open-loop random interactive requests to each region's proxy at
``load x capacity`` for ``seconds`` (40 s from :mod:`tools.bench.regions`,
the first 40 % not measured: the spill weights converge meanwhile), and
stops every process it started, by PID.

Fast replicas so that a 2-core machine can saturate a region: 16 batch
slots, 8-token answers, 20 ms decode steps (about 170 ms a request).
Region sizes: A 1 replica, B 2, C 1 (B twice A, as in the simulated run).
Pools of 16 and 32 slots, not fewer: B ends at about 85 % of its capacity
with A's excess, and the queueing tail of memoryless arrivals at that load on
4 or 8 slots alone is near or past the budget, whatever the routing
(measured: 8-slot replicas gave p99s of 390 to 1,300 ms from run to run). A replica's
capacity is measured before the load (:func:`calibrate`), on the path the
load takes (proxy, gRPC, the replica's steps in real time), twice: with every
region's proxy saturated at once (twice its slots in flight, closed loop,
3 s), the answers per second of a replica while the whole fleet runs, which
is what it can serve during the scenario on one shared machine
(``calibration="fleet"``, the default); and through region C's proxy alone
(``"alone"``: higher, as C then has the cores to itself). The engine
model's figure (:func:`tools.sim.regions.replica_capacity`) is reported
beside them. The control plane's capacity seed (``spill_service_ms``) is the
replica's decode steps and a prefill; it then measures capacities itself
from the proxies' reports (:mod:`controlplane.regions.weights`).

The load generator runs with the garbage collector off (a collection pause
would release its pending arrivals as one burst). ``trace``: per 2 s of
arrivals, A's and B's p99, A's share served in B and the control plane's
A->B weight (read from its metrics every 0.5 s).

Latency is measured at the client: arrival at its region's proxy to the
answer, including the simulated round trip of a spilled request. The spill
share is the share of a region's answers whose ``region`` is another one.
"""

from __future__ import annotations

import gc
import random
import secrets
import tempfile
import threading
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
from tomli_w import dumps

from agent.replica.engine import EngineParams
from ferry.config import hash_api_key
from ferry.procs import Child, stop_all
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from ferry_cli.up.ready import wait_routable
from tools.sim.regions import replica_capacity

REPLICA = {"max_running": 16, "decode_base_seconds": 0.02, "decode_seconds_per_request": 0.0,
           "prefill_base_seconds": 0.002, "prefill_seconds_per_token": 1e-5}
MAX_TOKENS = 8
SIZES = {"a": (1, 1.5), "b": (2, 0.5), "c": (1, 0.2)}  # region -> (replicas, load)
WARMUP_SHARE = 0.4  # the first 40 % of the load is not measured: the weights converge meanwhile


def _start(workdir: Path, rtt_ms: Mapping[str, float], key: str,
           service_ms: float) -> tuple[list[Child], dict[str, str]]:
    config = {"tenants": [{"name": "bench", "api_key_sha256": hash_api_key(key), "plan": "enterprise"}],
              "models": [{"name": "chat", "min_gpus": 1}],
              "controlplane": {"region_rtt_ms": dict(rtt_ms), "grace_seconds": 3.0,
                               "spill_service_ms": round(service_ms, 1)},
              "proxy": {"simulate_region_rtt": True}, "replica": REPLICA}
    path = workdir / "ferry.toml"
    path.write_text(dumps(config))
    token = "fat_" + secrets.token_hex(8)
    (workdir / "admin-token").write_text(token)
    children: list[Child] = []

    def spawn(name: str, argv: list[str]) -> Child:
        child = Child(name, [*argv, "--config", str(path), "--insecure"], workdir).start()
        children.append(child)
        return child

    cp = spawn("controlplane", ["controlplane", "--listen", "127.0.0.1:0",
                                "--admin-token-file", str(workdir / "admin-token")])
    address = cp.wait_ready()["grpc"]
    proxies = {r: spawn(f"proxy-{r}", ["proxy", "--workers", "1", "--control-plane", address, "--region", r,
                                                  "--id", f"proxy-{r}"])
               for r in SIZES}
    expected: dict[str, set[str]] = {r: set() for r in SIZES}
    for region, (replicas, _) in SIZES.items():
        for i in range(replicas):
            name = f"{region}-node{i}"
            spawn(name, ["node", "--node", name, "--region", region, "--control-plane", address, "--replica", "chat"])
            expected[region].add(f"{name}-r0")
    for child in children:
        child.wait_ready()
    for region, child in proxies.items():
        wait_routable(address, expected[region], child.ready["proxy_id"], 60.0, children, admin_token=token)
    return children, {r: str(c.ready["grpc"]) for r, c in proxies.items()}


def _weights(metrics: str, stop: threading.Event, out: list[tuple[float, float]]) -> None:
    """Poll the control plane's A->B spill weight every 0.5 s (the trace)."""
    while not stop.wait(0.5):
        try:
            with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=2) as reply:
                text = reply.read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("ferry_controlplane_spill_weight{") and 'source="a"' in line and 'target="b"' in line:
                out.append((time.monotonic(), float(line.rsplit(" ", 1)[1])))


def _trace(samples: list[tuple[float, float, str, str]], weights: list[tuple[float, float]], start: float,
           seconds: float, window: float = 2.0) -> list[dict[str, float]]:
    """Per ``window`` of arrivals: A's and B's p99 (ms), A's share served in B, the mean A->B weight."""
    rows = []
    t = 0.0
    while t < seconds:
        lo, hi = start + t, start + t + window
        a = [e for s, e, r, _ in samples if lo <= s < hi and r == "a"]
        b = [e for s, e, r, _ in samples if lo <= s < hi and r == "b"]
        spilled = sum(1 for s, _, r, w in samples if lo <= s < hi and r == "a" and w == "b")
        ws = [w for at, w in weights if lo <= at < hi]
        rows.append({"t": t, "a_p99": round(_p99(a), 1), "b_p99": round(_p99(b), 1),
                     "a_to_b": round(spilled / max(1, len(a)), 3), "weight": round(sum(ws) / max(1, len(ws)), 3)})
        t += window
    return rows


def _load(addresses: dict[str, str], key: str, capacity: float, seconds: float) -> dict[str, Any]:
    rng = random.Random(1)
    lock = threading.Lock()
    samples: list[tuple[float, float, str, str]] = []  # (arrival, ms, home region, serving region)
    latencies: dict[str, list[float]] = {r: [] for r in SIZES}
    served: dict[str, dict[str, int]] = {r: {} for r in SIZES}
    failed: dict[str, int] = {}
    measure_from = time.monotonic() + seconds * WARMUP_SHARE
    channels = {r: grpc.insecure_channel(a) for r, a in addresses.items()}
    stubs = {r: inference_pb2_grpc.InferenceStub(c) for r, c in channels.items()}
    request = inference_pb2.InferRequest(model="chat", prompt="a b c d", max_tokens=MAX_TOKENS,
                                         tier=common_pb2.TIER_INTERACTIVE)
    pending: list[Any] = []

    def done(region: str, started: float, future: Any) -> None:
        elapsed = time.monotonic() - started
        with lock:
            try:
                reply = future.result()
                samples.append((started, elapsed * 1000.0, region, reply.region))
            except grpc.RpcError as exc:
                if started < measure_from:
                    return
                failed[f"{region}:{exc.code().name}"] = failed.get(f"{region}:{exc.code().name}", 0) + 1
                return
            if started < measure_from:
                return
            latencies[region].append(elapsed * 1000.0)
            served[region][reply.region] = served[region].get(reply.region, 0) + 1

    rates = {r: load * replicas * capacity for r, (replicas, load) in SIZES.items()}
    total = sum(rates.values())
    gc.collect()
    gc.disable()  # no collector pause in the generator: a pause would release its arrivals as one burst
    end = time.monotonic() + seconds
    next_at = time.monotonic()
    while next_at < end:
        next_at += rng.expovariate(total)
        time.sleep(max(0.0, next_at - time.monotonic()))  # open-loop arrivals: pacing, not a readiness wait
        region = rng.choices(list(rates), weights=list(rates.values()))[0]
        started = time.monotonic()
        future = stubs[region].Infer.future(request, metadata=(("x-api-key", key),), timeout=10)
        future.add_done_callback(lambda f, r=region, s=started: done(r, s, f))
        pending.append(future)
    for future in pending:
        try:
            future.result()
        except grpc.RpcError:
            pass
    gc.enable()
    for channel in channels.values():
        channel.close()
    return {"latencies": latencies, "served": served, "failed": failed, "rates": rates, "samples": samples}


def calibrate(addresses: Mapping[str, str], key: str, slots: Mapping[str, int], seconds: float = 3.0) -> float:
    """Answers per second and replica from the regions' own replicas, every region's proxy in ``slots`` kept
    saturated at once (2 x its slots in flight, closed loop); see the module docstring."""
    channels = {r: grpc.insecure_channel(addresses[r]) for r in slots}
    request = inference_pb2.InferRequest(model="chat", prompt="a b c d", max_tokens=MAX_TOKENS,
                                         tier=common_pb2.TIER_INTERACTIVE)
    done = 0
    lock = threading.Lock()
    start = time.monotonic()
    measure_from, end = start + 0.5, start + 0.5 + seconds

    def worker(region: str) -> None:
        nonlocal done
        stub = inference_pb2_grpc.InferenceStub(channels[region])
        while time.monotonic() < end:
            try:
                reply = stub.Infer(request, metadata=(("x-api-key", key),), timeout=10)
            except grpc.RpcError:  # shed at a saturated proxy: try again
                time.sleep(0.05)
                continue
            if time.monotonic() >= measure_from and reply.region == region:
                with lock:
                    done += 1

    threads = [threading.Thread(target=worker, args=(r,)) for r, n in slots.items() for _ in range(2 * n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for channel in channels.values():
        channel.close()
    replicas = sum(SIZES[r][0] for r in slots)
    return done / seconds / replicas


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0


def run_real(*, seconds: float, budget_ms: float, rtt_ms: Mapping[str, float],
             calibration: str = "fleet") -> dict[str, Any]:
    """Run the scenario with real processes; returns the figures (see the module docstring)."""
    modelled = replica_capacity(EngineParams(**REPLICA), 4, MAX_TOKENS)  # type: ignore[arg-type]
    key = "fk_" + secrets.token_hex(8)
    with tempfile.TemporaryDirectory(prefix="ferry-regions-") as tmp:
        # A request's time in a replica: its decode steps and a prefill (the control plane's capacity seed).
        service_ms = 1000.0 * (MAX_TOKENS * REPLICA["decode_base_seconds"] + REPLICA["prefill_base_seconds"])
        children, addresses = _start(Path(tmp), rtt_ms, key, service_ms)
        try:
            per_replica = int(REPLICA["max_running"])
            alone = calibrate(addresses, key, {"c": per_replica * SIZES["c"][0]})
            busy = calibrate(addresses, key, {r: per_replica * n for r, (n, _) in SIZES.items()})
            capacity = busy if calibration == "fleet" else alone
            stop, weights = threading.Event(), list[tuple[float, float]]()
            poller = threading.Thread(target=_weights, args=(children[0].ready["metrics"], stop, weights))
            poller.start()
            start = time.monotonic()
            try:
                result = _load(addresses, key, capacity, seconds)
            finally:
                stop.set()
                poller.join()
        finally:
            stop_all(children)
    served_a = result["served"]["a"]
    total_a = max(1, sum(served_a.values()))
    return {
        "a_interactive_p99_ms": round(_p99(result["latencies"]["a"]), 1),
        "b_interactive_p99_ms": round(_p99(result["latencies"]["b"]), 1),
        "c_interactive_p99_ms": round(_p99(result["latencies"]["c"]), 1),
        "spill_share_a_to_b": round(served_a.get("b", 0) / total_a, 4),
        "spill_share_a_to_c": round(served_a.get("c", 0) / total_a, 4),
        "failed": result["failed"], "offered_rps": {r: round(v, 1) for r, v in result["rates"].items()},
        "capacity_per_replica_rps": round(capacity, 1), "calibration": calibration,
        "capacity_alone_per_replica_rps": round(alone, 1), "capacity_fleet_busy_per_replica_rps": round(busy, 1),
        "modelled_capacity_per_replica_rps": round(modelled, 1),
        "seconds": seconds, "budget_ms": budget_ms,
        "trace": _trace(result["samples"], weights, start, seconds),
    }
