"""The HTTP front door against the gRPC API: the same load through one proxy, requests/s and added latency.

Starts a control plane, a proxy (with ``--http-listen``) and one node with one
simulated replica whose engine costs almost nothing (1 ms steps, no prefill
cost, 1 output token), each its own process, as :mod:`tools.bench.overhead`
does. Then, in one run, the same request (prompt of 8 words, ``max_tokens`` 1,
interactive) over both fronts of the same proxy: gRPC ``Inference.Infer`` with
a prebuilt message over 4 channels, and ``POST /v1/completions`` with a
prebuilt JSON body through one aiohttp client session (keep-alive,
``--concurrency`` connections). For each: p50/p99 at one request in flight for
``--seconds``, then the closed-loop rate at ``--concurrency`` in flight. The
HTTP client is Python (aiohttp) where the gRPC one is the C core, so the HTTP
figures also carry more client cost on the same 2 cores: read them as an upper
bound of what the HTTP path adds. Writes ``bench-results/http.json``.

Run: ``python -m tools.bench.http [--seconds 5] [--concurrency 64]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from tomli_w import dumps

from ferry.cli.up.main import wait_routable
from ferry.config import hash_api_key
from ferry.procs import Child, stop_all
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tools.report import percentile

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "one two three four five six seven eight"
MODEL = "bench-model"


async def measure(call: Callable[[], Awaitable[Any]], concurrency: int, seconds: float) -> dict[str, float]:
    """Closed loop: ``concurrency`` workers call for ``seconds``; latency percentiles, rate and errors."""
    latencies: list[float] = []
    errors = 0
    stop_at = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal errors
        while time.monotonic() < stop_at:
            t0 = time.monotonic()
            try:
                await call()
                latencies.append(time.monotonic() - t0)
            except (grpc.aio.AioRpcError, aiohttp.ClientError, ValueError):
                errors += 1

    for _ in range(min(concurrency, 8)):  # warm-up
        await call()
    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.monotonic() - t0
    return {"p50_ms": round(percentile(latencies, 50) * 1000, 3), "p99_ms": round(percentile(latencies, 99) * 1000, 3),
            "rps": round(len(latencies) / elapsed, 1), "requests": len(latencies), "errors": errors}


async def bench(grpc_address: str, http_address: str, key: str, args: argparse.Namespace) -> dict[str, Any]:
    """Both fronts, one after the other, on the same proxy and replica."""
    channels = [grpc.aio.insecure_channel(grpc_address) for _ in range(4)]
    stubs = [inference_pb2_grpc.InferenceStub(c) for c in channels]
    message = inference_pb2.InferRequest(model=MODEL, tier=common_pb2.TIER_INTERACTIVE, prompt=PROMPT, max_tokens=1)
    meta = (("x-api-key", key),)
    body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 1}).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json", "x-ferry-tier": "interactive"}
    url = f"http://{http_address}/v1/completions"
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.concurrency))
    turn = [0]

    def grpc_call() -> Any:
        turn[0] += 1
        return stubs[turn[0] % len(stubs)].Infer(message, metadata=meta, timeout=10)

    async def http_call() -> None:
        async with session.post(url, data=body, headers=headers) as resp:
            answer = await resp.read()
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}: {answer[:200]!r}")

    out: dict[str, Any] = {}
    try:
        for name, call in (("grpc", grpc_call), ("http", http_call)):
            idle = await measure(call, 1, args.seconds)
            loaded = await measure(call, args.concurrency, args.seconds)
            out[name] = {"p50_ms": idle["p50_ms"], "p99_ms": idle["p99_ms"], "max_rps": loaded["rps"],
                         "loaded_p50_ms": loaded["p50_ms"], "loaded_p99_ms": loaded["p99_ms"],
                         "errors": idle["errors"] + loaded["errors"]}
    finally:
        await session.close()
        for c in channels:
            await c.close()
    out["added_p50_ms"] = round(out["http"]["p50_ms"] - out["grpc"]["p50_ms"], 3)
    out["added_p99_ms"] = round(out["http"]["p99_ms"] - out["grpc"]["p99_ms"], 3)
    out["throughput_ratio"] = round(out["http"]["max_rps"] / out["grpc"]["max_rps"], 3)
    out["server"] = f"aiohttp {aiohttp.__version__} on the proxy's asyncio loop"
    out["concurrency"] = args.concurrency
    out["seconds_per_measurement"] = args.seconds
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the fleet, measure both fronts, print the figures and write the JSON."""
    p = argparse.ArgumentParser(prog="bench_http", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--seconds", type=float, default=5.0, help="length of each measurement")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight for the throughput runs")
    p.add_argument("--out", default=str(ROOT / "bench-results" / "http.json"))
    args = p.parse_args(argv)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    key = "fk_" + secrets.token_hex(16)
    config = {
        "tenants": [{"name": "bench", "api_key_sha256": hash_api_key(key), "plan": "enterprise"}],
        "models": [{"name": MODEL}],
        "replica": {"max_running": 1024, "max_queue": 8192, "prefill_base_seconds": 0.0,
                    "prefill_seconds_per_token": 0.0, "decode_base_seconds": 0.001,
                    "decode_seconds_per_request": 0.0},
    }
    with tempfile.TemporaryDirectory(prefix="ferry-bench-") as tmp:
        work = Path(tmp)
        (work / "ferry.toml").write_text(dumps(config))
        cfg = ["--config", str(work / "ferry.toml"), "--insecure"]  # plain text on loopback
        children: list[Child] = []
        try:
            token = secrets.token_hex(16)  # the Admin API's, for wait_routable
            cp = Child("controlplane", ["controlplane", *cfg], work, env={"FERRY_ADMIN_TOKEN": token}).start()
            children.append(cp)
            cp_addr = cp.wait_ready()["grpc"]
            proxy = Child("proxy", ["proxy", "--control-plane", cp_addr, "--id", "bench-proxy",
                                    "--http-listen", "127.0.0.1:0", *cfg], work).start()
            node = Child("node", ["node", "--node", "bench-node", "--control-plane", cp_addr,
                                  "--replica", f"{MODEL}:v1", *cfg], work).start()
            children += [proxy, node]
            ready = proxy.wait_ready()
            replica = node.wait_ready()["replicas"][0]
            wait_routable(cp_addr, {replica["replica_id"]}, "bench-proxy", 30, children, admin_token=token)
            result = asyncio.run(bench(ready["grpc"], ready["http"], key, args))
        finally:
            stop_all(children)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for name in ("grpc", "http"):
        r = result[name]
        print(f"{name:<5} p50 {r['p50_ms']:7.3f} ms  p99 {r['p99_ms']:7.3f} ms  (1 in flight)   "
              f"max {r['max_rps']:8.1f} req/s  (p50 {r['loaded_p50_ms']:.1f} ms at {args.concurrency} in flight)"
              f"  errors {r['errors']}")
    print(f"HTTP adds p50 {result['added_p50_ms']:.3f} ms, p99 {result['added_p99_ms']:.3f} ms; "
          f"throughput ratio {result['throughput_ratio']:.3f}  -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
