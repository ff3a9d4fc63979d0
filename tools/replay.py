"""Replay a trace against a Ferry data plane and report what happened.

Arrival times are divided by ``--speedup``; prompts are synthesized from the
trace's block ids (``ferry.tokens.prompt_from_blocks``: 512 words a block), so
requests that share block ids in the trace share the same prompt prefix.
Every request is bounded: at most ``--limit`` requests, ``--concurrency`` in
flight (arrivals wait beyond that, and the report says how late they were
sent), each with a ``--timeout`` deadline, and the whole run by
``--time-limit``. The report (printed, and written as JSON with ``--json-out``)
gives requests, errors by status, latency and time-to-first-token
p50/p95/p99, throughput, and requests and prefix-cache hit ratio per replica.

Example::

    python -m tools.fetch_traces   # once: the full public traces into traces/ (docs/traces.md)
    python -m tools.replay --ready-file up.json --trace traces/mooncake_conversation_trace.jsonl \\
        --minutes 2 --speedup 4 --max-output 32 --json-out bench-results/demo.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from ferry.process import read_ready_file
from ferry.tokens import prompt_from_blocks
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tools import plots
from tools import trace as tracefile
from tools.fetch_traces import BUNDLED, trace_file
from tools.progress import Progress
from tools.report import Result, print_report, summarize

TIERS = {"interactive": common_pb2.TIER_INTERACTIVE, "standard": common_pb2.TIER_STANDARD,
         "batch": common_pb2.TIER_BATCH}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="replay", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--trace", type=trace_file, default=str(BUNDLED),
                   help="Azure CSV or Mooncake JSONL file (default: the bundled excerpt; full traces: "
                        "python -m tools.fetch_traces)")
    p.add_argument("--data-plane", help="host:port of a proxy")
    p.add_argument("--ready-file", help="ferry up's ready file (data plane, API keys, models)")
    p.add_argument("--api-key", help="API key (default: the first enterprise key of the ready file)")
    p.add_argument("--models", help="comma-separated models to spread requests over (default: the ready file's)")
    p.add_argument("--minutes", type=float, default=2.0, help="replay the first minutes of the trace")
    p.add_argument("--limit", type=int, default=2000, help="at most this many requests")
    p.add_argument("--speedup", type=float, default=4.0, help="divide arrival times by this")
    p.add_argument("--max-output", type=int, default=32, help="cap on generated tokens per request")
    p.add_argument("--tiers", default="interactive=0.6,standard=0.3,batch=0.1", help="tier mix")
    p.add_argument("--stream-share", type=float, default=0.5, help="share of requests sent as streams")
    p.add_argument("--concurrency", type=int, default=256, help="requests in flight at most")
    p.add_argument("--timeout", type=float, default=60.0, help="deadline per request, seconds")
    p.add_argument("--time-limit", type=float, default=110.0, help="stop sending after this many seconds")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json-out", help="write the report here as JSON")
    p.add_argument("--plots", help="write PNG plots with this path prefix (e.g. bench-results/demo)")
    return p.parse_args(argv)


def _mix(spec: str) -> list[tuple[str, float]]:
    out = []
    for part in spec.split(","):
        name, _, share = part.partition("=")
        if name not in TIERS:
            raise SystemExit(f"--tiers: unknown tier {name!r}")
        out.append((name, float(share or 1)))
    return out


class Replayer:
    """Sends the trace's requests on schedule with bounded concurrency and collects results."""

    def __init__(self, args: argparse.Namespace, data_plane: str, api_key: str, models: list[str]) -> None:
        self.args = args
        self.data_plane = data_plane
        self.metadata = (("x-api-key", api_key),)
        self.models = models
        self.rng = random.Random(args.seed)
        self.tiers = _mix(args.tiers)
        self.results: list[Result] = []
        self.sem = asyncio.Semaphore(args.concurrency)
        self.start = time.monotonic()

    async def run(self, rows: list[tracefile.TraceRequest]) -> float:
        channels = [grpc.aio.insecure_channel(self.data_plane, options=[
            ("grpc.max_send_message_length", 16 << 20), ("grpc.max_receive_message_length", 16 << 20)])
            for _ in range(4)]
        stubs = [inference_pb2_grpc.InferenceStub(c) for c in channels]
        progress = Progress(len(rows), "requests")
        start = self.start = time.monotonic()
        tasks = []
        try:
            for i, row in enumerate(rows):
                due = start + row.offset / self.args.speedup
                if due - start > self.args.time_limit:
                    break
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                await self.sem.acquire()
                tasks.append(asyncio.create_task(self._one(stubs[i % len(stubs)], i, row, due, progress)))
            await asyncio.gather(*tasks)
        finally:
            progress.close()
            for c in channels:
                await c.close()
        return time.monotonic() - start

    def _request(self, i: int, row: tracefile.TraceRequest) -> tuple[Any, str, bool]:
        tier = self.rng.choices([t for t, _ in self.tiers], [w for _, w in self.tiers])[0]
        stream = self.rng.random() < self.args.stream_share
        model = self.models[(row.hash_ids[1] if len(row.hash_ids) > 1 else i) % len(self.models)]
        request = inference_pb2.InferRequest(
            model=model, tier=TIERS[tier], prompt=prompt_from_blocks(list(row.hash_ids), row.input_tokens),
            max_tokens=max(1, min(row.output_tokens, self.args.max_output)), idempotency_key=f"replay-{i}")
        return request, tier, stream

    async def _one(self, stub: Any, i: int, row: tracefile.TraceRequest, due: float, progress: Progress) -> None:
        request, tier, stream = self._request(i, row)
        sent = time.monotonic()
        result = Result(index=i, model=request.model, tier=tier, stream=stream, late_s=sent - due,
                        sent_s=sent - self.start)
        try:
            if stream:
                first = None
                async for chunk in stub.InferStream(request, metadata=self.metadata, timeout=self.args.timeout):
                    if first is None:
                        first = time.monotonic() - sent
                    if chunk.final:
                        result.fill(chunk.summary)
                result.ttft_s = first
            else:
                result.fill(await stub.Infer(request, metadata=self.metadata, timeout=self.args.timeout))
            result.status = "OK"
        except grpc.aio.AioRpcError as exc:
            result.status = exc.code().name
            result.detail = exc.details() or ""
        result.latency_s = time.monotonic() - sent
        self.results.append(result)
        self.sem.release()
        progress.update(errors=sum(r.status != "OK" for r in self.results))


def resolve(args: argparse.Namespace) -> tuple[str, str, list[str]]:
    ready = (read_ready_file(args.ready_file) or {}) if args.ready_file else {}
    data_plane = args.data_plane or ready.get("data_plane")
    keys = ready.get("api_keys") or {}
    key = args.api_key or keys.get("enterprise-1") or next(iter(keys.values()), None)
    models = (args.models.split(",") if args.models else ready.get("models")) or []
    if not data_plane or not key or not models:
        raise SystemExit("replay: need a data plane, an API key and models (flags or --ready-file)")
    return data_plane, key, models


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data_plane, key, models = resolve(args)
    rows = tracefile.load(args.trace, minutes=args.minutes, limit=args.limit)
    print(f"replaying {len(rows)} requests of {args.trace} (first {args.minutes:g} min, "
          f"x{args.speedup:g} speed) against {data_plane}", file=sys.stderr)
    replayer = Replayer(args, data_plane, key, models)
    elapsed = asyncio.run(replayer.run(rows))
    report = summarize(replayer.results, elapsed)
    report["trace"] = Path(args.trace).name
    report["speedup"] = args.speedup
    print_report(report)
    if args.plots:
        report["plots"] = [str(p) for p in plots.write_all(replayer.results, Path(args.plots))]
        print("plots: " + ", ".join(report["plots"]))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
