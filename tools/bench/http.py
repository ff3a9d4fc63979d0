"""The HTTP front door against the gRPC API: the same load through one proxy, requests/s and added latency.

On the rig of :mod:`tools.bench.rig` (one cheap simulated replica behind one
proxy, here with ``--http-listen``), in one run, the same request (prompt of 8
words, ``max_tokens`` 1, interactive) over both fronts of the same proxy: gRPC ``Inference.Infer`` with
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
import sys
from pathlib import Path
from typing import Any

import aiohttp
import grpc

from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tools.bench.rig import MODEL, PROMPT, ROOT, Fleet, compare, difference, one_replica_fleet, print_rows


async def bench(fleet: Fleet, args: argparse.Namespace) -> dict[str, Any]:
    """Both fronts, one after the other, on the same proxy and replica."""
    channels = [grpc.aio.insecure_channel(fleet.proxy["grpc"]) for _ in range(4)]
    stubs = [inference_pb2_grpc.InferenceStub(c) for c in channels]
    message = inference_pb2.InferRequest(model=MODEL, tier=common_pb2.TIER_INTERACTIVE, prompt=PROMPT, max_tokens=1)
    meta = (("x-api-key", fleet.key),)
    body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 1}).encode()
    headers = {"Authorization": f"Bearer {fleet.key}", "Content-Type": "application/json",
               "x-ferry-tier": "interactive"}
    url = f"http://{fleet.proxy['http']}/v1/completions"
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

    try:
        out = await compare([("grpc", grpc_call), ("http", http_call)], args.concurrency, args.seconds)
    finally:
        await session.close()
        for c in channels:
            await c.close()
    difference(out, "grpc", "http")
    out["server"] = f"aiohttp {aiohttp.__version__} on the proxy's asyncio loop"
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the rig, measure both fronts, print the figures and write the JSON."""
    p = argparse.ArgumentParser(prog="bench_http", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--seconds", type=float, default=5.0, help="length of each measurement")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight for the throughput runs")
    p.add_argument("--out", default=str(ROOT / "bench-results" / "http.json"))
    args = p.parse_args(argv)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    with one_replica_fleet(["--http-listen", "127.0.0.1:0"]) as fleet:
        result = asyncio.run(bench(fleet, args))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print_rows(result, ("grpc", "http"))
    print(f"HTTP adds p50 {result['added_p50_ms']:.3f} ms, p99 {result['added_p99_ms']:.3f} ms; "
          f"throughput ratio {result['throughput_ratio']:.3f}  -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
