"""Proxy overhead: the same load against one simulated replica directly and through the proxy.

Starts a control plane, a proxy and one node with one simulated replica whose
engine costs almost nothing (1 ms steps, no prefill cost, 1 output token), each
its own process. Both paths use raw gRPC stubs with a prebuilt request, so the
client's own cost is the same; the only difference is the proxy hop (auth,
validation, pick, forwarding over KServe v2 with tritonclient).

For each path: latency p50/p99 at concurrency 1 (one request at a time, for
``--seconds``), then the throughput at ``--concurrency`` requests in flight over
4 channels (closed loop). One load-generating process on a 2-core machine caps
both rates (about 3.6 k calls/s, docs/design.md, "Numbers to design for"); the ratio is what to read.
Writes ``bench-results/overhead.json``.
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

import grpc
import numpy as np
from tomli_w import dumps
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ferry.cli.up.main import wait_routable
from ferry.config import hash_api_key
from ferry.procs import Child, stop_all
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tools.report import percentile

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "one two three four five six seven eight"


def _bytes_tensor(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(4, "little") + data


def direct_request(model: str) -> Any:
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, datatype in (("text_input", "BYTES"), ("max_tokens", "INT32")):
        tensor = request.inputs.add()
        tensor.name, tensor.datatype = name, datatype
        tensor.shape.extend([1, 1])
    request.outputs.add().name = "text_output"
    request.raw_input_contents.extend([_bytes_tensor(PROMPT), np.array([1], dtype=np.int32).tobytes()])
    return request


async def measure(call: Callable[[], Awaitable[Any]], concurrency: int, seconds: float) -> dict[str, float]:
    """Closed loop: ``concurrency`` workers call for ``seconds``; latency percentiles and rate."""
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
            except grpc.aio.AioRpcError:
                errors += 1

    for _ in range(min(concurrency, 8)):  # warm-up
        await call()
    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.monotonic() - t0
    return {"p50_ms": round(percentile(latencies, 50) * 1000, 3), "p99_ms": round(percentile(latencies, 99) * 1000, 3),
            "rps": round(len(latencies) / elapsed, 1), "requests": len(latencies), "errors": errors}


async def bench(replica: dict[str, Any], data_plane: str, key: str, args: argparse.Namespace) -> dict[str, Any]:
    channels_d = [grpc.aio.insecure_channel(replica["address"]) for _ in range(4)]
    channels_p = [grpc.aio.insecure_channel(data_plane) for _ in range(4)]
    direct = [service_pb2_grpc.GRPCInferenceServiceStub(c) for c in channels_d]
    proxied = [inference_pb2_grpc.InferenceStub(c) for c in channels_p]
    d_req = direct_request(replica.get("kserve_model") or replica["model"])
    p_req = inference_pb2.InferRequest(model=replica["model"], tier=common_pb2.TIER_INTERACTIVE,
                                       prompt=PROMPT, max_tokens=1)
    meta = (("x-api-key", key),)
    turn = [0]

    def pick(stubs: list[Any]) -> Any:
        turn[0] += 1
        return stubs[turn[0] % len(stubs)]

    def d_call() -> Any:
        return pick(direct).ModelInfer(d_req, timeout=10)

    def p_call() -> Any:
        return pick(proxied).Infer(p_req, metadata=meta, timeout=10)

    out: dict[str, Any] = {}
    for name, call in (("direct", d_call), ("proxied", p_call)):
        idle = await measure(call, 1, args.seconds)
        loaded = await measure(call, args.concurrency, args.seconds)
        out[name] = {"p50_ms": idle["p50_ms"], "p99_ms": idle["p99_ms"], "max_rps": loaded["rps"],
                     "loaded_p50_ms": loaded["p50_ms"], "loaded_p99_ms": loaded["p99_ms"],
                     "errors": idle["errors"] + loaded["errors"]}
    for c in channels_d + channels_p:
        await c.close()
    out["added_p50_ms"] = round(out["proxied"]["p50_ms"] - out["direct"]["p50_ms"], 3)
    out["added_p99_ms"] = round(out["proxied"]["p99_ms"] - out["direct"]["p99_ms"], 3)
    out["throughput_ratio"] = round(out["proxied"]["max_rps"] / out["direct"]["max_rps"], 3)
    out["concurrency"] = args.concurrency
    out["seconds_per_measurement"] = args.seconds
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_overhead", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--seconds", type=float, default=5.0, help="length of each measurement")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight for the throughput runs")
    p.add_argument("--out", default=str(ROOT / "bench-results" / "overhead.json"))
    args = p.parse_args(argv)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    key = "fk_" + secrets.token_hex(16)
    config = {
        "tenants": [{"name": "bench", "api_key_sha256": hash_api_key(key), "plan": "enterprise"}],
        "models": [{"name": "bench-model"}],
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
            proxy = Child("proxy", ["proxy", "--control-plane", cp_addr, "--id", "bench-proxy", *cfg], work).start()
            node = Child("node", ["node", "--node", "bench-node", "--control-plane", cp_addr,
                                  "--replica", "bench-model:v1", *cfg], work).start()
            children += [proxy, node]
            data_plane = proxy.wait_ready()["grpc"]
            replica = node.wait_ready()["replicas"][0]
            wait_routable(cp_addr, {replica["replica_id"]}, "bench-proxy", 30, children, admin_token=token)
            result = asyncio.run(bench(replica, data_plane, key, args))
        finally:
            stop_all(children)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for name in ("direct", "proxied"):
        r = result[name]
        print(f"{name:<8} p50 {r['p50_ms']:7.3f} ms  p99 {r['p99_ms']:7.3f} ms  (1 in flight)   "
              f"max {r['max_rps']:8.1f} req/s  (p50 {r['loaded_p50_ms']:.1f} ms at {args.concurrency} in flight)")
    print(f"added p50 {result['added_p50_ms']:.3f} ms, added p99 {result['added_p99_ms']:.3f} ms, "
          f"throughput ratio {result['throughput_ratio']:.3f}  -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
