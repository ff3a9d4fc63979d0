"""``ferryctl tiers`` and ``ferryctl spill``: how traffic flows between tiers and between regions.

- ``tiers [--region R]``: per region and tier, the table's tier quota
  (reserved share; reserved, quota and lent slots) and what the proxies
  report over their last window (requests ended and offered per second,
  waiting in their tier queues, p99, shed share) (``Admin.GetTiers``);
- ``spill [--region R]``: per region pair, the spill weight and round trip
  of the source's table, and the rate its proxies spill (``Admin.GetSpill``;
  a fleet of one region has no pairs).

Both, and ``top``, ask the leader: it holds every proxy's report (followers
relay theirs, :mod:`controlplane.tables.usage`). Pointed at a follower, ferryctl
reads the leader's address from ``GetStatus`` and asks it (the follower's
own answer when the leader cannot be reached). Human tables by default;
``--json`` prints the rows as a JSON list.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import grpc

from ferry.v1 import admin_pb2
from ferry_cli.ctl.views import print_table

Connect = Callable[[str], AbstractContextManager[Any]]
TIER_COLUMNS = ["region", "tier", "reserved_share", "reserved", "quota", "lent", "rate_per_s", "offered_per_s",
                "queue", "p99_ms", "shed"]
SPILL_COLUMNS = ["source", "target", "weight", "rtt_ms", "spilled_per_s"]


def p99_ms(seconds: float) -> float | None:
    """A p99 in milliseconds for display; None when no request was answered in the window."""
    return round(seconds * 1000.0, 1) if seconds > 0 else None


def human(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with None shown as ``-``."""
    return [{k: "-" if v is None else v for k, v in row.items()} for row in rows]


@contextlib.contextmanager
def leader(stub: Any, connect: Connect, timeout: float) -> Iterator[Any]:
    """The leader's Admin client when ``stub`` is a follower's that names a reachable leader, else ``stub``."""
    status = stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=timeout)
    with contextlib.ExitStack() as stack:
        target = stub
        if status.role == "follower" and status.leader_address:
            other = stack.enter_context(connect(status.leader_address))
            try:
                other.GetStatus(admin_pb2.GetStatusRequest(), timeout=min(timeout, 2.0))
                target = other
            except grpc.RpcError:
                pass  # the follower's own view, then
        yield target


def tier_row(t: Any) -> dict[str, Any]:
    return {
        "region": t.region, "tier": t.tier, "reserved_share": round(t.reserved_share, 3),
        "reserved": t.reserved_slots, "quota": t.quota_slots, "lent": t.lent_slots,
        "rate_per_s": round(t.request_rate, 2), "offered_per_s": round(t.offered_rate, 2), "queue": t.queued,
        "p99_ms": p99_ms(t.p99_seconds), "shed": round(t.shed_rate, 4),
    }


def spill_row(p: Any) -> dict[str, Any]:
    return {"source": p.source, "target": p.target, "weight": round(p.weight, 4), "rtt_ms": round(p.rtt_ms, 1),
            "spilled_per_s": round(p.spilled_rate, 2)}


def _show(args: argparse.Namespace, rows: list[dict[str, Any]], columns: list[str], empty: str) -> None:
    if args.json:
        print(json.dumps(rows, indent=2))
    elif rows:
        print_table(human(rows), columns)
    else:
        print(empty)


def cmd_tiers(stub: Any, args: argparse.Namespace, connect: Connect, timeout: float) -> None:
    with leader(stub, connect, timeout) as target:
        reply = target.GetTiers(admin_pb2.GetTiersRequest(region=args.region), timeout=timeout)
    _show(args, [tier_row(t) for t in reply.tiers], TIER_COLUMNS, "no tiers: no table carries tier quotas yet")


def cmd_spill(stub: Any, args: argparse.Namespace, connect: Connect, timeout: float) -> None:
    with leader(stub, connect, timeout) as target:
        reply = target.GetSpill(admin_pb2.GetSpillRequest(region=args.region), timeout=timeout)
    _show(args, [spill_row(p) for p in reply.pairs], SPILL_COLUMNS,
          "no region pairs: one region, or no round trips configured (region_rtt_ms)")


TIERS_HELP = "per region and tier: quota (reserved, lent) and the proxies' rate, queue, p99, shed"
SPILL_HELP = "per region pair: spill weight, round trip and the rate spilled"


def tiers_arguments(parser: argparse.ArgumentParser) -> None:
    """``ferryctl tiers``'s arguments."""
    parser.add_argument("--region", default="", help="only this region")


def spill_arguments(parser: argparse.ArgumentParser) -> None:
    """``ferryctl spill``'s arguments."""
    parser.add_argument("--region", default="", help="only pairs from this region")
