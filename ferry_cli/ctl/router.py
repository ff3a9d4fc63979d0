"""``ferryctl router``: router config rollouts (``Admin.RouterRollout``, ``GetRouter``, ``RouterDecide``).

::

    ferryctl router                                   # versions, the rollout, the test, each proxy's version
    ferryctl router rollout candidate.toml --canary 10 [--guard-ttft-p99 R] [--guard-errors PP]
        [--min-requests N] [--window-seconds S] [--min-seconds S] [--max-seconds S]
    ferryctl router promote | rollback [--reason TEXT]
    ferryctl router show [VERSION]                    # a version's text (default: the one proxies run)

The candidate file holds a ``[proxy]`` section of live keys only
(:mod:`ferry.routerconfig`); any other key is refused naming it. Human
output by default, ``--json`` for JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from ferry.v1 import admin_pb2
from ferry_cli.ctl.errors import UsageError
from ferry_cli.ctl.views import print_table

TIMEOUT = 30.0
HELP = ("router config rollouts: rollout FILE --canary P under a guard, promote, rollback, show [VERSION]; "
        "alone: status")
ACTIONS = ("status", "rollout", "promote", "rollback", "show")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``ferryctl router``."""
    parser.add_argument("action", nargs="?", default="status", choices=ACTIONS, help="default: status")
    parser.add_argument("target", nargs="?", default="", help="rollout: the candidate TOML file; show: a version")
    parser.add_argument("--canary", type=float, metavar="PERCENT", help="share of each region's proxies, (0, 100]")
    parser.add_argument("--guard-ttft-p99", type=float, metavar="R", default=0.0,
                        help="a window is bad when the canary's TTFT p99 exceeds R x the baseline's (1.25)")
    parser.add_argument("--guard-errors", type=float, metavar="PP", default=0.0,
                        help="... or its error rate the baseline's + PP percentage points (0.5)")
    parser.add_argument("--min-requests", type=int, default=0, help="requests per group for a window to count (200)")
    parser.add_argument("--window-seconds", type=float, default=0.0, help="one comparison window (5)")
    parser.add_argument("--min-seconds", type=float, default=0.0, help="no promotion before (60)")
    parser.add_argument("--max-seconds", type=float, default=0.0, help="undecided by then: rolled back (600)")
    parser.add_argument("--reason", default="", help="promote, rollback: why (logged, kept in the record)")


def rollout_row(view: admin_pb2.RouterRolloutView) -> dict[str, Any]:
    return {"id": view.id, "state": view.state, "baseline": view.baseline_version,
            "candidate": view.candidate_version, "canary_pct": round(view.canary_percent, 3),
            "windows": f"{view.bad_windows}/{view.windows} bad", "llr": round(view.llr, 2),
            "bounds": f"{view.promote_at:.2f}..{view.rollback_at:.2f}",
            "canary_ttft_p99": round(view.canary.ttft_p99_seconds, 4),
            "baseline_ttft_p99": round(view.baseline.ttft_p99_seconds, 4),
            "canary_req/err": f"{view.canary.requests}/{view.canary.errors}",
            "baseline_req/err": f"{view.baseline.requests}/{view.baseline.errors}"}


def _request(args: argparse.Namespace) -> admin_pb2.RouterRolloutRequest:
    if not args.target:
        raise UsageError("router rollout: name the candidate TOML file")
    if args.canary is None:
        raise UsageError("router rollout: --canary PERCENT is required")
    try:
        text = Path(args.target).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"router rollout: cannot read {args.target}: {exc}") from None
    guard = admin_pb2.RouterGuard(ttft_p99_ratio=args.guard_ttft_p99, error_increase_pp=args.guard_errors,
                                  min_requests=args.min_requests, window_seconds=args.window_seconds,
                                  min_seconds=args.min_seconds, max_seconds=args.max_seconds)
    return admin_pb2.RouterRolloutRequest(text=text, canary_percent=args.canary, guard=guard)


def _print_view(view: admin_pb2.RouterRolloutView, as_json: bool) -> None:
    if as_json:
        print(json.dumps(json_format.MessageToDict(view, preserving_proto_field_name=True), indent=2))
        return
    print(f"router rollout {view.id}: {view.state} ({view.reason})")
    print_table([rollout_row(view)], list(rollout_row(view)))


def cmd_router(stub: Any, args: argparse.Namespace) -> None:
    """Run one ``ferryctl router`` action."""
    action = args.action
    if action == "rollout":
        _print_view(stub.RouterRollout(_request(args), timeout=TIMEOUT).rollout, args.json)
        return
    if action in ("promote", "rollback"):
        kind = (admin_pb2.RouterDecideRequest.ACTION_PROMOTE if action == "promote"
                else admin_pb2.RouterDecideRequest.ACTION_ROLLBACK)
        reply = stub.RouterDecide(admin_pb2.RouterDecideRequest(action=kind, reason=args.reason), timeout=TIMEOUT)
        _print_view(reply.rollout, args.json)
        return
    if action == "show":
        version = 0
        if args.target:
            try:
                version = int(args.target)
            except ValueError:
                raise UsageError(f"router show: VERSION must be a number, not {args.target!r}") from None
        if not version:
            version = stub.GetRouter(admin_pb2.GetRouterRequest(), timeout=TIMEOUT).default_version
            if not version:
                print("version 0: every proxy runs its own file's [proxy] section")
                return
        config = stub.GetRouter(admin_pb2.GetRouterRequest(version=version), timeout=TIMEOUT).config
        if args.json:
            print(json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True), indent=2))
        else:
            print(f"# router config version {config.version}, sha256 {config.digest}, "
                  f"created {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(config.created_at))}")
            print(config.text, end="" if config.text.endswith("\n") else "\n")
        return
    reply = stub.GetRouter(admin_pb2.GetRouterRequest(), timeout=TIMEOUT)
    if args.json:
        print(json.dumps(json_format.MessageToDict(reply, preserving_proto_field_name=True), indent=2))
        return
    print(f"default version: {reply.default_version} (0: each proxy's file); "
          f"versions: {', '.join(str(c.version) for c in reply.configs) or 'none'}")
    if reply.HasField("rollout"):
        _print_view(reply.rollout, False)
    rows = [{"proxy": p.proxy_id, "region": p.region, "connected": p.connected, "canary": p.canary,
             "assigned": p.assigned_version, "applied": p.applied_version, "error": p.error} for p in reply.proxies]
    if rows:
        print_table(rows, list(rows[0]))
