"""``ferry call``: send one request to a data plane and print the answer.

Exits 0 on success; otherwise prints ``STATUS_NAME: details`` on standard
error and exits 1 (2 for a usage error). ``--ready-file`` takes the data plane
and an API key from the ready file of ``ferry up`` (and, after ``ferry up
--tls``, the CA to verify the proxy's certificate; else ``--tls-ca``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import grpc
from google.protobuf import json_format

from ferry.process import read_ready_file
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from ferry_cli import clienttls

TIERS = {"interactive": common_pb2.TIER_INTERACTIVE, "standard": common_pb2.TIER_STANDARD,
         "batch": common_pb2.TIER_BATCH}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-plane", help="host:port of a proxy (or take it from --ready-file)")
    parser.add_argument("--ready-file", help="the ready file of ferry up: data plane and an API key")
    parser.add_argument("--api-key", default=os.environ.get("FERRY_API_KEY"), help="API key (env FERRY_API_KEY)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--version", default="")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--tier", choices=sorted(TIERS), default="interactive")
    parser.add_argument("--prefix-key", default="")
    parser.add_argument("--idempotency-key", default="")
    parser.add_argument("--stream", action="store_true", help="use InferStream and print chunks as they come")
    parser.add_argument("--timeout", type=float, default=60.0, help="deadline in seconds")
    parser.add_argument("--json", action="store_true", help="print the response as JSON")
    parser.add_argument("--tls-ca", default=None, help="CA of the proxy's TLS certificate (else the ready file's)")


def _resolve(args: argparse.Namespace) -> tuple[str, str]:
    data_plane, key = args.data_plane, args.api_key
    ready = (read_ready_file(args.ready_file) or {}) if args.ready_file else {}
    try:
        args.credentials = clienttls.credentials(ca=args.tls_ca, ready=ready, client_cert=False)
    except ValueError as exc:
        raise SystemExit(f"ferry call: {exc}") from exc
    if args.ready_file:
        data_plane = data_plane or ready.get("data_plane")
        keys = ready.get("api_keys") or {}
        key = key or next(iter(keys.values()), None)
    if not data_plane:
        raise SystemExit("ferry call: give --data-plane or --ready-file")
    return data_plane, key or ""


def run(args: argparse.Namespace) -> int:
    data_plane, key = _resolve(args)
    request = inference_pb2.InferRequest(
        model=args.model, version=args.version, tier=TIERS[args.tier], prompt=args.prompt,
        max_tokens=args.max_tokens, prefix_key=args.prefix_key, idempotency_key=args.idempotency_key)
    metadata = (("x-api-key", key),) if key else ()
    started = time.monotonic()
    with clienttls.sync_channel(data_plane, args.credentials) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        try:
            if args.stream:
                return _stream(stub, request, metadata, args, started)
            response = stub.Infer(request, metadata=metadata, timeout=args.timeout)
        except grpc.RpcError as exc:
            print(f"{exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    _print(response, args.json, time.monotonic() - started)
    return 0


def _stream(stub: Any, request: Any, metadata: Any, args: argparse.Namespace, started: float) -> int:
    summary = None
    for chunk in stub.InferStream(request, metadata=metadata, timeout=args.timeout):
        if chunk.final:
            summary = chunk.summary
        elif not args.json:
            print(chunk.text, end="", flush=True)
    if summary is None:
        print("UNKNOWN: stream ended without a final chunk", file=sys.stderr)
        return 1
    if args.json:
        _print(summary, True, time.monotonic() - started)
    else:
        print()
        _print(summary, False, time.monotonic() - started, text=False)
    return 0


def _print(response: Any, as_json: bool, elapsed: float, *, text: bool = True) -> None:
    if as_json:
        data = json_format.MessageToDict(response, preserving_proto_field_name=True,
                                         always_print_fields_with_no_presence=True)
        print(json.dumps(data, indent=2))
        return
    if text:
        print(response.text)
    print(f"-- {response.completion_tokens} tokens from {response.replica_id} ({response.region}) "
          f"in {elapsed * 1000:.0f} ms, ttft {response.ttft_seconds * 1000:.0f} ms, "
          f"cached {response.cached_prompt_tokens}/{response.prompt_tokens} prompt tokens, "
          f"attempts {response.attempts}, request {response.request_id}", file=sys.stderr)
