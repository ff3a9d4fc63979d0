"""``ferryctl scale [--region R]``: the scaling signals the leader computes (``Admin.GetScale``).

Two tables: per model and region the replicas there are (``current``,
``ready``), needed now (arrival rate, requests and tokens in flight, queue
wait against the TTFT target), needed for the next ramp (the same hours on
previous days, a start-up time ahead), ``desired`` (after the floor and the
scale-down cool-down) and ``promote`` (standby nodes to give the model now),
with the rates behind them; and per region the warm pool: standby nodes
(registered with no replica), how many to keep, and the measured start-up
and replacement times. Asked of the leader (pointed at a follower, ferryctl
asks the leader it names, :func:`ferry_cli.ctl.flow.leader`). ``--json``
prints ``{"models": [...], "regions": [...], "sampled_at"}``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ferry.v1 import admin_pb2
from ferry_cli.ctl.flow import Connect, human, leader
from ferry_cli.ctl.views import print_table

HELP = "per model and region: replicas needed now and for the next ramp, desired; per region: the warm pool"
MODEL_COLUMNS = ["model", "region", "current", "ready", "needed_now", "needed_for_ramp", "desired", "promote",
                 "rate_per_s", "forecast_per_s", "queue_wait_ms", "service_s"]
REGION_COLUMNS = ["region", "standby", "standby_to_keep", "startup_s", "replacement_s"]


def model_row(v: Any) -> dict[str, Any]:
    """One ``ScaleView`` as a row."""
    return {"model": v.model, "region": v.region, "current": v.current, "ready": v.ready,
            "needed_now": v.needed_now, "needed_for_ramp": v.needed_for_ramp, "desired": v.desired,
            "promote": v.promote, "rate_per_s": round(v.arrival_rate, 2), "forecast_per_s": round(v.forecast_rate, 2),
            "queue_wait_ms": round(v.queue_wait_seconds * 1000.0, 1), "service_s": round(v.service_seconds, 3)}


def region_row(v: Any) -> dict[str, Any]:
    """One ``StandbyView`` as a row."""
    return {"region": v.region, "standby": v.standby_nodes, "standby_to_keep": v.standby_to_keep,
            "startup_s": round(v.startup_seconds, 1), "replacement_s": round(v.replacement_seconds, 1)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``scale`` command's flags."""
    parser.add_argument("--region", default="", help="only this region")


def cmd_scale(stub: Any, args: argparse.Namespace, connect: Connect, timeout: float) -> None:
    """Print the leader's last scaling plan."""
    with leader(stub, connect, timeout) as target:
        reply = target.GetScale(admin_pb2.GetScaleRequest(region=args.region), timeout=timeout)
    models = [model_row(v) for v in reply.models]
    regions = [region_row(v) for v in reply.regions]
    if args.json:
        print(json.dumps({"models": models, "regions": regions, "sampled_at": reply.sampled_at,
                          "leading": reply.leading}, indent=2))
        return
    if not reply.leading:
        print("this control plane does not lead: it computes no plan (no leader reachable)")
    if not models and not regions:
        print("no plan yet: the leader plans every few seconds once it has replicas or traffic")
        return
    print_table(human(models), MODEL_COLUMNS)
    if regions:
        print()
        print_table(human(regions), REGION_COLUMNS)
