"""The response cache's evidence: the duplicate rate of a trace, offline, and two slices sent to ``ferry up``.

Offline (``python -m tools.cache_rate --trace PATH``): every request of the
trace goes through the proxy's own measurement
(:class:`dataplane.cache.measure.DuplicateMeter`, the same window and cap)
and decision (:func:`dataplane.cache.decide.decide`), in trace time. The
payload of a Mooncake row is its prompt, which the trace gives as its chained
block hashes and length (equal ids and length: the same prompt); ``max_tokens``
is not in the trace, so two payloads are measured: the prompt alone (every
repeat of a prompt a cache hit: an upper bound) and the prompt with the
output length (as if ``max_tokens`` were the length the answer had). The
trace says nothing about temperature: every request counts as
deterministic, which again bounds the rate from above. An Azure trace has no
prompt contents (:mod:`tools.trace` gives each row blocks of its own), so its
duplicate rate cannot be measured; the tool says so. Printed, and written as
JSON with ``--json-out``.

Online (``--ready-file up.json``): two slices, deterministic (temperature 0),
to a ``ferry up`` fleet, one model each, then the caller reads ``ferryctl
cache``:

- *classify* (``--classify-model``): ``--classify-requests`` requests over
  ``--classify-prompts`` distinct short prompts drawn with Zipf weights
  (exponent 1.1, seeded): the duplicate-heavy traffic of a classifier. It is
  synthetic: no public classification trace is bundled;
- *chat* (``--chat-model``): the first ``--chat-requests`` requests of the
  trace, each prompt a short text naming the digest of the trace row's
  prompt (its block ids and length), so two requests share a prompt exactly
  when the trace's do, without sending prompts of 12,000 words.

Bounded: ``--concurrency`` requests in flight, each with ``--timeout``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import sys
from pathlib import Path
from typing import Any

import grpc

from dataplane.cache.decide import CachePolicy, decide, share
from dataplane.cache.measure import DuplicateMeter
from ferry.process import read_ready_file
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tools import trace as tracefile
from tools.fetch_traces import BUNDLED, trace_file

WINDOW = 600.0    # the proxy's default cache_window_seconds
CAPACITY = 65_536  # the proxy's default cache_sketch_hashes
ZIPF = 1.1


def row_digest(row: tracefile.TraceRequest, *, with_output: bool) -> bytes:
    """The payload digest of a trace row: its block ids and length (and output length, with ``with_output``)."""
    h = hashlib.sha256(repr((row.hash_ids, row.input_tokens)).encode())
    if with_output:
        h.update(str(row.output_tokens).encode())
    return h.digest()


def measure(rows: list[tracefile.TraceRequest], *, with_output: bool, window: float = WINDOW,
            policy: CachePolicy | None = None) -> dict[str, Any]:
    """The trace through the proxy's meter and decision, in trace time: counts, share, tokens a cache saves."""
    policy = policy or CachePolicy()
    meter = DuplicateMeter(window=window, capacity=CAPACITY, max_rows=16)
    on = False
    on_requests = 0
    duplicates = tokens = 0
    highest = 0.0
    for row in rows:
        key = int.from_bytes(row_digest(row, with_output=with_output)[:8], "little")
        if meter.observe("trace", "tenant", key, row.offset, seconds=0.0):
            duplicates += 1
            tokens += row.input_tokens + row.output_tokens
        totals = meter.model_totals("trace", row.offset)
        on = decide(on, totals.deterministic, totals.duplicates, policy)
        on_requests += on
        if totals.deterministic >= policy.min_requests:
            highest = max(highest, share(totals.deterministic, totals.duplicates))
    total_tokens = sum(r.input_tokens + r.output_tokens for r in rows)
    return {
        "payload": "prompt + output length" if with_output else "prompt", "requests": len(rows),
        "duplicates": duplicates, "duplicate_share": share(len(rows), duplicates),
        "highest_window_share": highest, "duplicate_token_share": tokens / total_tokens if total_tokens else 0.0,
        "cache_on_share": on_requests / len(rows) if rows else 0.0, "window_seconds": window,
        "enable_above": policy.enable_above,
    }


def classify_slice(requests: int, prompts: int, seed: int) -> list[str]:
    """``requests`` prompts drawn from ``prompts`` distinct ones with Zipf weights (exponent :data:`ZIPF`)."""
    rng = random.Random(seed)
    texts = [f"classify the support ticket number {i}: is it billing, outage, or other?" for i in range(prompts)]
    weights = [1.0 / (i + 1) ** ZIPF for i in range(prompts)]
    return rng.choices(texts, weights, k=requests)


def chat_slice(rows: list[tracefile.TraceRequest]) -> list[str]:
    """One short prompt per trace row, equal exactly when the rows' prompts are."""
    return [f"continue the conversation {row_digest(r, with_output=False).hex()[:32]}" for r in rows]


async def send(data_plane: str, api_key: str, model: str, prompts: list[str], *, concurrency: int,
               deadline: float, max_tokens: int, stream_share: float = 0.5, seed: int = 1) -> dict[str, int]:
    """Send ``prompts`` to ``model`` at temperature 0 (a share as streams), ``concurrency`` at a time, each
    with a gRPC deadline of ``deadline`` seconds; counts by final status."""
    rng = random.Random(seed)
    counts: dict[str, int] = {}
    gate = asyncio.Semaphore(concurrency)
    metadata = (("x-api-key", api_key),)
    async with grpc.aio.insecure_channel(data_plane) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)

        async def one(prompt: str, stream: bool) -> None:
            request = inference_pb2.InferRequest(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0,
                                                 tier=common_pb2.TIER_STANDARD)
            async with gate:
                try:
                    if stream:
                        async for _ in stub.InferStream(request, metadata=metadata, timeout=deadline):
                            pass
                    else:
                        await stub.Infer(request, metadata=metadata, timeout=deadline)
                    status = "OK"
                except grpc.aio.AioRpcError as exc:
                    status = exc.code().name
            counts[status] = counts.get(status, 0) + 1

        await asyncio.gather(*(one(p, rng.random() < stream_share) for p in prompts))
    return counts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="cache_rate", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--trace", type=trace_file, default=str(BUNDLED), help="Mooncake JSONL (default: the excerpt)")
    p.add_argument("--window", type=float, default=WINDOW, help="seconds a payload counts as seen (default 600)")
    p.add_argument("--json-out", help="write the figures here as JSON")
    p.add_argument("--ready-file", help="send the two slices to this ferry up fleet instead")
    p.add_argument("--api-key", help="default: the ready file's first enterprise key")
    p.add_argument("--classify-model", default="chat-small")
    p.add_argument("--classify-requests", type=int, default=400)
    p.add_argument("--classify-prompts", type=int, default=40)
    p.add_argument("--chat-model", default="chat-large")
    p.add_argument("--chat-requests", type=int, default=346)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = tracefile.load(args.trace)
    if args.ready_file:
        ready = read_ready_file(args.ready_file) or {}
        keys = ready.get("api_keys") or {}
        key = args.api_key or keys.get("enterprise-1") or next(iter(keys.values()), "")
        plane = ready.get("data_plane", "")
        print(f"sending {args.classify_requests} classify requests to {args.classify_model} and the first "
              f"{args.chat_requests} requests of {args.trace} to {args.chat_model}", file=sys.stderr)
        common: dict[str, Any] = {"concurrency": args.concurrency, "deadline": args.timeout,
                                  "max_tokens": args.max_tokens}
        out: dict[str, Any] = {"classify": asyncio.run(send(plane, key, args.classify_model, classify_slice(
                   args.classify_requests, args.classify_prompts, args.seed), **common)),
               "chat": asyncio.run(send(plane, key, args.chat_model, chat_slice(rows[:args.chat_requests]), **common))}
    else:
        if not any(len(r.hash_ids) > 1 and r.hash_ids[1] < (1 << 40) for r in rows):
            print(f"{args.trace}: no prompt contents (an Azure trace): its duplicate rate cannot be measured",
                  file=sys.stderr)
            return 2
        print(f"{args.trace}: {len(rows)} requests over {rows[-1].offset / 60:.1f} min, window {args.window:g} s",
              file=sys.stderr)
        out = {"trace": Path(args.trace).name,
               "figures": [measure(rows, with_output=w, window=args.window) for w in (False, True)]}
    print(json.dumps(out, indent=2))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
