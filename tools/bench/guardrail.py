"""What the guardrail hooks cost: the same requests with and without the reference hook, through one proxy.

On the rig of :mod:`tools.bench.rig` (one cheap simulated replica behind one
proxy, each its own process) with the reference hook ``python -m
tools.guardrail`` (one process, two rules) configured by tier, in one run:

- ``none``: unary, interactive: no hook;
- ``prompt``: unary, standard: a prompt hook (one call before the forward);
- ``output``: unary, batch: an output hook (one call on the whole answer);
- ``stream_none`` and ``stream_output``: a stream of ``--tokens`` tokens,
  interactive (no hook) and batch (an output hook every ``--window`` tokens:
  ``tokens / window`` calls, each holding its window back), time to the
  last chunk; ``first_*``: the time to the first chunk.

Each at one request in flight for ``--seconds`` (p50, p99), then at
``--concurrency`` in flight (the rate), one after the other
(:func:`tools.bench.rig.compare`); the differences against ``none`` are
what a hook adds. Writes ``bench-results/guardrail.json``.

Run: ``python -m tools.bench.guardrail [--seconds 3] [--concurrency 16] [--tokens 32] [--window 16]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from ferry.procs import Child, stop_all
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tools.bench.rig import MODEL, PROMPT, ROOT, Fleet, compare, difference, one_replica_fleet
from tools.report import percentile


async def bench(fleet: Fleet, args: argparse.Namespace) -> dict[str, Any]:
    """Every call of the module doc, one after the other, on the same proxy, replica and hook."""
    channel = grpc.aio.insecure_channel(fleet.proxy["grpc"])
    stub = inference_pb2_grpc.InferenceStub(channel)
    meta = (("x-api-key", fleet.key),)
    firsts: dict[str, list[float]] = {"stream_none": [], "stream_output": []}

    def unary(tier: common_pb2.Tier) -> Any:
        message = inference_pb2.InferRequest(model=MODEL, tier=tier, prompt=PROMPT, max_tokens=1)
        return lambda: stub.Infer(message, metadata=meta, timeout=10)

    def stream(name: str, tier: common_pb2.Tier) -> Any:
        message = inference_pb2.InferRequest(model=MODEL, tier=tier, prompt=PROMPT, max_tokens=args.tokens)

        async def call() -> None:
            t0 = time.monotonic()
            first = True
            async for _ in stub.InferStream(message, metadata=meta, timeout=10):
                if first:
                    firsts[name].append(time.monotonic() - t0)
                    first = False
        return call

    try:
        out = await compare([
            ("none", unary(common_pb2.TIER_INTERACTIVE)),
            ("prompt", unary(common_pb2.TIER_STANDARD)),
            ("output", unary(common_pb2.TIER_BATCH)),
            ("stream_none", stream("stream_none", common_pb2.TIER_INTERACTIVE)),
            ("stream_output", stream("stream_output", common_pb2.TIER_BATCH)),
        ], args.concurrency, args.seconds)
    finally:
        await channel.close()
    for name in ("prompt", "output"):
        part: dict[str, Any] = {"none": out["none"], name: out[name]}
        difference(part, "none", name)
        out[f"{name}_added"] = {k: part[k] for k in ("added_p50_ms", "added_p99_ms", "throughput_ratio")}
    part = {"none": out["stream_none"], "output": out["stream_output"]}
    difference(part, "none", "output")
    out["stream_output_added"] = {k: part[k] for k in ("added_p50_ms", "added_p99_ms", "throughput_ratio")}
    for name, values in firsts.items():
        out[name]["first_chunk_p50_ms"] = round(percentile(values, 50) * 1000, 3)
    out["tokens"], out["window"] = args.tokens, args.window
    return out


def main(argv: list[str] | None = None) -> int:
    """Start the hook and the rig, measure, print the figures and write the JSON."""
    p = argparse.ArgumentParser(prog="python -m tools.bench.guardrail", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=3.0, help="length of each measurement")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight for the throughput runs")
    p.add_argument("--tokens", type=int, default=32, help="tokens of each streamed answer")
    p.add_argument("--window", type=int, default=16, help="the output hook's every_tokens")
    p.add_argument("--out", default=str(ROOT / "bench-results" / "guardrail.json"))
    args = p.parse_args(argv)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    with tempfile.TemporaryDirectory(prefix="ferry-bench-guard-") as tmp:
        hook = Child("guardrail", ["--deny", "forbidden", "--redact", "secret"], Path(tmp), module="tools.guardrail")
        try:
            address = hook.start().wait_ready(30)["address"]
            sections = {"guardrails": [
                {"name": "prompt", "address": address, "stage": "prompt", "tiers": ["standard"]},
                {"name": "output", "address": address, "stage": "output", "tiers": ["batch"],
                 "every_tokens": args.window},
            ]}
            with one_replica_fleet(sections=sections) as fleet:
                result = asyncio.run(bench(fleet, args))
        finally:
            stop_all([hook])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for name in ("none", "prompt", "output", "stream_none", "stream_output"):
        r = result[name]
        extra = f"  first chunk p50 {r['first_chunk_p50_ms']:.2f} ms" if "first_chunk_p50_ms" in r else ""
        print(f"{name:<14} p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  max {r['max_rps']:7.1f} req/s"
              f"  errors {r['errors']}{extra}")
    for name in ("prompt_added", "output_added", "stream_output_added"):
        print(f"{name:<20} {result[name]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
