"""``ferryctl cache [--model M] [--by-tenant]``: the measured duplicate rate and what a response cache saves.

Per model (and per (model, tenant) with ``--by-tenant``), over the proxies'
sliding windows (``Admin.GetCache``, merged by
:mod:`controlplane.tables.cachestats`): deterministic requests completed per
second, the share of them that repeated a payload the same proxy had seen
within the window, the GPU-seconds those duplicates took (what a cache would
have saved: per second and over the window), the cache hits per second, and
on how many of the reporting proxies the cache is on. Asked of the leader
(it holds every proxy's report; :func:`ferry_cli.ctl.flow.leader`). Human
table by default; ``--json`` prints the rows as a JSON list.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ferry.v1 import admin_pb2
from ferry_cli.ctl.flow import Connect, human, leader
from ferry_cli.ctl.views import print_table

HELP = "per model (or tenant): duplicate rate of deterministic requests, GPU-seconds a cache saves, cache on/off"
COLUMNS = ["model", "tenant", "deterministic_per_s", "duplicate_share", "saved_gpu_s_per_s", "saved_gpu_s",
           "hits_per_s", "cache", "window_s"]


def row(v: Any) -> dict[str, Any]:
    """One ``CacheView`` as a display row (``cache``: on / off / partial, with proxies on of reporting)."""
    state = "on" if v.proxies_enabled == v.proxies and v.proxies else ("off" if not v.proxies_enabled else "partial")
    return {
        "model": v.model, "tenant": v.tenant or "*", "deterministic_per_s": round(v.deterministic_rate, 2),
        "duplicate_share": round(v.duplicate_share, 4), "saved_gpu_s_per_s": round(v.saved_gpu_seconds_per_s, 3),
        "saved_gpu_s": round(v.saved_gpu_seconds, 1), "hits_per_s": round(v.hit_rate, 2),
        "cache": f"{state} ({v.proxies_enabled}/{v.proxies})", "window_s": round(v.window_seconds, 1),
        "deterministic": v.deterministic, "duplicates": v.duplicates, "hits": v.hits,
    }


def cmd_cache(stub: Any, args: argparse.Namespace, connect: Connect, timeout: float) -> None:
    """Ask the leader for the rows and print them."""
    with leader(stub, connect, timeout) as target:
        reply = target.GetCache(admin_pb2.GetCacheRequest(model=args.model, by_tenant=args.by_tenant),
                                timeout=timeout)
    rows = [row(v) for v in reply.rows]
    if args.json:
        print(json.dumps(rows, indent=2))
    elif rows:
        print_table(human(rows), COLUMNS)
    else:
        print("no measurement yet: no proxy has reported a deterministic request (temperature 0 or a seed)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``ferryctl cache``'s arguments."""
    parser.add_argument("--model", default="", help="only this model")
    parser.add_argument("--by-tenant", action="store_true", help="one row per (model, tenant)")
