"""Proxy overhead: the same load against one simulated replica directly and through the proxy.

On the rig of :mod:`tools.bench.rig` (one cheap simulated replica behind one
proxy, each its own process). Both paths use raw gRPC stubs with a prebuilt request, so the
client's own cost is the same; the only difference is the proxy hop (auth,
validation, pick, forwarding over KServe v2 with tritonclient).

For each path: latency p50/p99 at concurrency 1 (one request at a time, for
``--seconds``), then the throughput at ``--concurrency`` requests in flight over
4 channels (closed loop). One load-generating process on a 2-core machine caps
both rates (about 3.6 k calls/s, docs/design.md, "Numbers to design for"); the ratio is what to read.

``--workers N`` (N > 1) adds a second proxy, ``ferry proxy --workers N``, in
front of the same replica in the same run, and measures both proxies the same
way over ``--channels`` connections each (64, as many as calls in flight; a
local subchannel pool per channel, so each is its own TCP connection and the
kernel can spread them over the workers; each calling task keeps its own
connection, so the closed loop sends more calls where they return sooner,
as many independent clients would, instead of an equal share to each
connection whatever worker it landed on): the rate of N workers over one, their latencies added to
the direct path, and how the requests split over the workers (each worker's
``ferry_proxy_requests_total``), and the CPU each process spent per request
(``/proc/PID/stat``: each proxy over its own requests, the replica's node and
the load generator over both proxies'). The load generator, the replica and
the workers share the machine's cores, so the ratio is bounded by the CPU
left to the proxies, not by the proxies alone.
``--trace`` runs the proxies with every request traced (:mod:`dataplane.tracing`),
exported to an OTLP receiver in the load generator that only counts the traces
(:class:`ferry_cli.up.traces.TraceSink`): run it with and without to read
tracing's cost per request (docs/operations.md, Traces).
Writes ``bench-results/overhead.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ferry.procs import cpu_seconds
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from ferry_cli.up.traces import TraceSink, proxy_settings
from tools.bench.rig import PROMPT, ROOT, Fleet, compare, difference, one_replica_fleet, print_rows


def _bytes_tensor(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(4, "little") + data


def direct_request(model: str, tokens: int = 1) -> Any:
    """The KServe v2 request of the benchmark's prompt and ``tokens`` output tokens (1), for the replica itself."""
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, datatype in (("text_input", "BYTES"), ("max_tokens", "INT32")):
        tensor = request.inputs.add()
        tensor.name, tensor.datatype = name, datatype
        tensor.shape.extend([1, 1])
    request.outputs.add().name = "text_output"
    request.raw_input_contents.extend([_bytes_tensor(PROMPT), np.array([tokens], dtype=np.int32).tobytes()])
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


def served(metrics: str) -> float:
    """Requests one proxy (or worker) answered OK, from its ``/metrics``."""
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("ferry_proxy_requests_total{") and 'status="OK"' in line)


async def bench_workers(fleet: Fleet, args: argparse.Namespace) -> dict[str, Any]:
    """One proxy of one worker against one of ``args.workers``, same replica and run, ``args.channels`` each."""
    many = fleet.others[0]
    options = [("grpc.use_local_subchannel_pool", 1)]  # one TCP connection per channel
    channels = {name: [grpc.aio.insecure_channel(ready["grpc"], options=options) for _ in range(args.channels)]
                for name, ready in (("one_worker", fleet.proxy), (f"{args.workers}_workers", many))}
    stubs = {name: [inference_pb2_grpc.InferenceStub(c) for c in chs] for name, chs in channels.items()}
    request = inference_pb2.InferRequest(model=fleet.replica["model"], tier=common_pb2.TIER_INTERACTIVE,
                                         prompt=PROMPT, max_tokens=1)
    meta = (("x-api-key", fleet.key),)
    def caller(name: str) -> Any:
        bound: dict[int, Any] = {}  # each calling task keeps one connection: a faster worker takes more calls

        def call() -> Any:
            task = id(asyncio.current_task())
            stub = bound.get(task)
            if stub is None:
                stub = bound[task] = stubs[name][len(bound) % args.channels]
            return stub.Infer(request, metadata=meta, timeout=10)
        return call

    pids = {"one_worker": [fleet.proxy["pid"]], f"{args.workers}_workers": [w["pid"] for w in many["workers"]],
            "replica_node": [fleet.node_pid], "load_generator": [os.getpid()]}
    cpu_before = {name: sum(cpu_seconds(p) or 0.0 for p in ps) for name, ps in pids.items()}
    ok_before = {"one_worker": served(fleet.proxy["metrics"])}
    before = [served(w["metrics"]) for w in many["workers"]]
    try:
        out = await compare([(name, caller(name)) for name in stubs], args.concurrency, args.seconds)
    finally:
        for chs in channels.values():
            for c in chs:
                await c.close()
    counts = [served(w["metrics"]) - b for w, b in zip(many["workers"], before, strict=True)]
    requests = {"one_worker": served(fleet.proxy["metrics"]) - ok_before["one_worker"],
                f"{args.workers}_workers": sum(counts)}
    used = {name: sum(cpu_seconds(p) or 0.0 for p in ps) - cpu_before[name] for name, ps in pids.items()}
    everything = sum(requests.values())
    # CPU milliseconds per request: each proxy over its own requests; the replica and the generator over all.
    out["cpu_ms_per_request"] = {name: round(1000 * used[name] / max(1.0, requests.get(name, everything)), 3)
                                 for name in pids}
    out["worker_share"] = [round(c / max(1.0, sum(counts)), 3) for c in counts]
    out["channels"] = args.channels
    out["workers"] = args.workers
    out["rate_ratio"] = round(out[f"{args.workers}_workers"]["max_rps"] / out["one_worker"]["max_rps"], 3)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the rig, measure both paths, print the figures and write the JSON."""
    p = argparse.ArgumentParser(prog="bench_overhead", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--seconds", type=float, default=5.0, help="length of each measurement")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight for the throughput runs")
    p.add_argument("--workers", type=int, default=1,
                   help="also measure a proxy of N workers (ferry proxy --workers N) against one of one worker")
    p.add_argument("--channels", type=int, default=64,
                   help="connections per proxy in the workers comparison (each calling task keeps one)")
    p.add_argument("--trace", action="store_true",
                   help="trace every request (dataplane.tracing) to an OTLP receiver in this process, which "
                        "counts what it is sent (ferry_cli.up.traces)")
    p.add_argument("--out", default=str(ROOT / "bench-results" / "overhead.json"))
    args = p.parse_args(argv)
    if not 1 <= args.workers <= 64 or not 1 <= args.channels <= 256:
        p.error("--workers must be 1 to 64 and --channels 1 to 256")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    more = [["--workers", str(args.workers)]] if args.workers > 1 else []
    sink = TraceSink(None) if args.trace else None
    sections = {"proxy": proxy_settings(sink.start(), {})} if sink is not None else None
    try:
        with one_replica_fleet(more_proxies=more, sections=sections) as fleet:
            result = asyncio.run(bench(fleet, args))
            if more:
                result["workers"] = asyncio.run(bench_workers(fleet, args))
    finally:
        if sink is not None:
            sink.stop()
    if sink is not None:
        result["traces_received"] = sink.printed
    result["cpus"] = os.cpu_count()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print_rows(result, ("direct", "proxied"))
    print(f"added p50 {result['added_p50_ms']:.3f} ms, added p99 {result['added_p99_ms']:.3f} ms, "
          f"throughput ratio {result['throughput_ratio']:.3f}")
    if more:
        w = result["workers"]
        many = f"{args.workers}_workers"
        print_rows(w, ("one_worker", many))
        for name in ("one_worker", many):
            print(f"{name}: added p50 {w[name]['p50_ms'] - result['direct']['p50_ms']:.3f} ms, added p99 "
                  f"{w[name]['p99_ms'] - result['direct']['p99_ms']:.3f} ms over direct")
        print(f"{args.workers} workers against one: {w['rate_ratio']:.3f}x the rate over {args.channels} "
              f"connections; requests per worker {w['worker_share']}")
        print(f"CPU ms per request: {w['cpu_ms_per_request']}")
    if sink is not None:
        print(f"traced: {sink.printed} traces received by the OTLP receiver")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
