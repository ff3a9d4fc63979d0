"""Proxy overhead: the same load against one simulated replica directly and through the proxy.

On the rig of :mod:`tools.bench.rig` (one cheap simulated replica behind one
proxy, each its own process). Both paths use raw gRPC stubs with a prebuilt request, so the
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
import sys
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tools.bench.rig import PROMPT, ROOT, Fleet, compare, difference, one_replica_fleet, print_rows


def _bytes_tensor(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(4, "little") + data


def direct_request(model: str) -> Any:
    """The KServe v2 request of the benchmark's prompt and one output token, for the replica itself."""
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, datatype in (("text_input", "BYTES"), ("max_tokens", "INT32")):
        tensor = request.inputs.add()
        tensor.name, tensor.datatype = name, datatype
        tensor.shape.extend([1, 1])
    request.outputs.add().name = "text_output"
    request.raw_input_contents.extend([_bytes_tensor(PROMPT), np.array([1], dtype=np.int32).tobytes()])
    return request


async def bench(fleet: Fleet, args: argparse.Namespace) -> dict[str, Any]:
    """The replica called directly, then through the proxy: the same prompt, 4 channels each."""
    replica = fleet.replica
    channels_d = [grpc.aio.insecure_channel(replica["address"]) for _ in range(4)]
    channels_p = [grpc.aio.insecure_channel(fleet.proxy["grpc"]) for _ in range(4)]
    direct = [service_pb2_grpc.GRPCInferenceServiceStub(c) for c in channels_d]
    proxied = [inference_pb2_grpc.InferenceStub(c) for c in channels_p]
    d_req = direct_request(replica.get("kserve_model") or replica["model"])
    p_req = inference_pb2.InferRequest(model=replica["model"], tier=common_pb2.TIER_INTERACTIVE,
                                       prompt=PROMPT, max_tokens=1)
    meta = (("x-api-key", fleet.key),)
    turn = [0]

    def pick(stubs: list[Any]) -> Any:
        turn[0] += 1
        return stubs[turn[0] % len(stubs)]

    def d_call() -> Any:
        return pick(direct).ModelInfer(d_req, timeout=10)

    def p_call() -> Any:
        return pick(proxied).Infer(p_req, metadata=meta, timeout=10)

    try:
        out = await compare([("direct", d_call), ("proxied", p_call)], args.concurrency, args.seconds)
    finally:
        for c in channels_d + channels_p:
            await c.close()
    difference(out, "direct", "proxied")
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the rig, measure both paths, print the figures and write the JSON."""
    p = argparse.ArgumentParser(prog="bench_overhead", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--seconds", type=float, default=5.0, help="length of each measurement")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight for the throughput runs")
    p.add_argument("--out", default=str(ROOT / "bench-results" / "overhead.json"))
    args = p.parse_args(argv)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    with one_replica_fleet() as fleet:
        result = asyncio.run(bench(fleet, args))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print_rows(result, ("direct", "proxied"))
    print(f"added p50 {result['added_p50_ms']:.3f} ms, added p99 {result['added_p99_ms']:.3f} ms, "
          f"throughput ratio {result['throughput_ratio']:.3f}  -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
