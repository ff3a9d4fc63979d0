"""``ferryctl traffic export --since 1h [--model M] [-o FILE]``: the recorded traffic as a Mooncake-layout trace.

Asks the leader (:func:`ferry_cli.ctl.flow.leader`; it keeps every proxy's
rows, :mod:`controlplane.traffic`) for ``Admin.ExportTraffic`` and writes one
JSON object a line (to ``-o FILE``, else stdout), sorted by arrival, in the
layout the simulator and ``tools.replay`` read (:func:`tools.trace.load`):

- ``timestamp``: milliseconds from the first exported row's arrival (an integer);
- ``input_length``: prompt tokens; ``output_length``: completion tokens;
- ``hash_ids``: the prompt's chained 512-token block hashes (64-bit integers; every block, up to the
  proxy's ``record_max_blocks``, 4,096, those past the 16th as sketches; none with a ``prefix_key``);

and the rest of the row under these names: ``arrival`` (unix seconds), ``model``, ``tier``, ``tenant`` (16 hex
characters), ``max_tokens``, ``cached_tokens``, ``ttft_ms`` (null when unknown), ``e2e_ms``, ``replica``,
``branch``, ``outcome`` (the gRPC status name), ``streamed``, ``proxy``, ``region`` (:data:`KEYS`, in order).

On stderr: how many rows, from how many proxies, the span of their arrivals, how many rows were dropped
within it (by the proxies' recorders, or a relay's full outbox) and whether ``--max-rows`` cut the export.
``--since`` takes a duration: ``90s``, ``30m``, ``1h``, ``2d`` (or seconds as a plain number).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import re
import sys
from collections.abc import Iterable
from typing import IO, Any

from ferry.v1 import admin_pb2, tables_pb2
from ferry_cli.ctl.flow import Connect, leader

HELP = "the proxies' recorded traffic: export it as a Mooncake-layout trace (JSON Lines)"
KEYS = ("timestamp", "input_length", "output_length", "hash_ids", "arrival", "model", "tier", "tenant", "max_tokens",
        "cached_tokens", "ttft_ms", "e2e_ms", "replica", "branch", "outcome", "streamed", "proxy", "region")
UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
EXPORT_TIMEOUT = 600.0  # seconds a whole export may take


def parse_duration(text: str) -> float:
    """Seconds of ``90s``, ``30m``, ``1h``, ``2d`` or a plain number of seconds; ValueError naming the form."""
    found = DURATION.fullmatch(text.strip())
    seconds = float(found.group(1)) * UNITS[found.group(2) or "s"] if found else 0.0
    if not seconds > 0:
        raise ValueError(f"{text!r}: expected a positive duration such as 90s, 30m, 1h or 2d")
    return seconds


def duration_arg(text: str) -> float:
    """argparse's ``type`` of a duration flag (``--since``): :func:`parse_duration`, its error as argparse's."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def trace_lines(rows: Iterable[tables_pb2.TrafficRow]) -> list[dict[str, Any]]:
    """The rows as trace objects (the module docstring), sorted by arrival."""
    ordered = sorted(rows, key=lambda r: r.arrival)
    start = ordered[0].arrival if ordered else 0.0
    return [{
        "timestamp": round((r.arrival - start) * 1000.0), "input_length": r.prompt_tokens,
        "output_length": r.completion_tokens, "hash_ids": list(r.hash_ids), "arrival": r.arrival,
        "model": r.model, "tier": r.tier, "tenant": r.tenant, "max_tokens": r.max_tokens,
        "cached_tokens": r.cached_tokens, "ttft_ms": _ms(r.ttft_seconds) if r.HasField("ttft_seconds") else None,
        "e2e_ms": _ms(r.e2e_seconds), "replica": r.replica_id, "branch": r.branch, "outcome": r.outcome,
        "streamed": r.streamed, "proxy": r.proxy_id, "region": r.region,
    } for r in ordered]


def summary(lines: list[dict[str, Any]], dropped: int, truncated: bool) -> str:
    """What was exported, in words (stdout with ``-o``, else stderr; ``--json -o``: the same as JSON)."""
    if not lines:
        span = "no rows"
    else:
        first, last = lines[0]["arrival"], lines[-1]["arrival"]
        when = [dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S") for t in (first, last)]
        span = (f"{len(lines)} rows from {len({row['proxy'] for row in lines})} proxies, arrivals {when[0]} to "
                f"{when[1]} UTC ({last - first:.1f} s)")
    cut = "; cut at --max-rows (the newest left out)" if truncated else ""
    return f"exported {span}; {dropped} rows dropped within the span (recorders' or relays' buffers full){cut}"


def fetch(stub: Any, connect: Connect, timeout: float, *, since: float, model: str = "",
          max_rows: int = 0) -> tuple[list[dict[str, Any]], int, bool]:
    """The leader's rows of the last ``since`` seconds as trace lines (:func:`trace_lines`), the rows dropped
    within the span, and whether ``max_rows`` cut the answer (``ferryctl traffic export``, what-if, tune)."""
    request = admin_pb2.ExportTrafficRequest(since_seconds=since, model=model, max_rows=max_rows)
    rows: list[tables_pb2.TrafficRow] = []
    dropped, truncated = 0, False
    with leader(stub, connect, timeout) as target:
        for batch in target.ExportTraffic(request, timeout=EXPORT_TIMEOUT):
            rows.extend(batch.rows)
            dropped += batch.dropped
            truncated = truncated or batch.truncated
    return trace_lines(rows), dropped, truncated


def export(stub: Any, args: argparse.Namespace, connect: Connect, timeout: float) -> None:
    """Ask the leader for the rows and write the trace."""
    lines, dropped, truncated = fetch(stub, connect, timeout, since=args.since, model=args.model,
                                      max_rows=args.max_rows)
    with contextlib.ExitStack() as stack:
        out: IO[str] = stack.enter_context(open(args.output, "w", encoding="utf-8")) if args.output else sys.stdout
        for line in lines:
            out.write(json.dumps(line, separators=(",", ":")) + "\n")
    if not args.output:  # the rows are the output: what was exported goes to stderr
        print(summary(lines, dropped, truncated), file=sys.stderr)
    elif args.json:
        print(json.dumps({"rows": len(lines), "proxies": len({line["proxy"] for line in lines}),
                          "first_arrival": lines[0]["arrival"] if lines else None,
                          "last_arrival": lines[-1]["arrival"] if lines else None,
                          "dropped": dropped, "truncated": truncated, "output": args.output}, indent=2))
    else:
        print(summary(lines, dropped, truncated) + f"; written to {args.output}")


def run(stub: Any, args: argparse.Namespace, connect: Connect, timeout: float) -> None:
    """``ferryctl traffic ACTION``."""
    if args.traffic_command == "export":
        export(stub, args, connect, timeout)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``ferryctl traffic``'s actions and their arguments (``export``)."""
    sub = parser.add_subparsers(dest="traffic_command", required=True, metavar="ACTION")
    e = sub.add_parser("export", help="write the recorded rows as JSON Lines (Mooncake's trace layout plus fields)",
                       description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("--since", type=duration_arg, required=True, help="rows that arrived within this long: 90s, 30m, 1h")
    e.add_argument("--model", default="", help="only this model")
    e.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="with -o: say what was exported as JSON on stdout")
    e.add_argument("-o", "--output", default="", help="write here (default: stdout)")
    e.add_argument("--max-rows", type=int, default=0, help="at most this many rows, oldest first (default: the "
                                                            "control plane's traffic_export_max_rows)")
