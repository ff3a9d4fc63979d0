"""``ferryctl rollout``: a model's version rollout (``Admin.Rollout``, ``Admin.ListRollouts``).

::

    ferryctl rollout MODEL --version V --canary P   # P % of the requests naming no version to V
    ferryctl rollout MODEL --promote                # everything to the canary version, now the default
    ferryctl rollout MODEL --rollback               # everything back to the stable version
    ferryctl rollout [MODEL]                        # the rollouts (of MODEL), with the share now per region

Human table by default, ``--json`` for JSON. The share shown is the one the
tables give now: a canary whose replicas are not ready yet gets none.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ferry.v1 import admin_pb2
from ferry_cli.ctl.errors import UsageError
from ferry_cli.ctl.views import print_table

TIMEOUT = 10.0
COLUMNS = ["model", "state", "stable", "canary", "canary_pct", "default", "ready", "share"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``ferryctl rollout``."""
    parser.add_argument("model", nargs="?", metavar="MODEL", help="the model (alone: show its rollout)")
    parser.add_argument("--version", default="", help="the new version (with --canary)")
    parser.add_argument("--canary", type=float, metavar="PERCENT",
                        help="share of the requests naming no version to --version, 0..100")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--promote", action="store_true", help="send everything to the canary version")
    what.add_argument("--rollback", action="store_true", help="send everything back to the stable version")


def rollout_row(view: Any) -> dict[str, Any]:
    """One rollout as a row: the record, ready replicas stable/canary, and the canary share per region."""
    regions = list(view.regions)
    return {
        "model": view.model, "state": view.state, "stable": view.stable_version, "canary": view.canary_version,
        "canary_pct": round(view.canary_percent, 3), "default": view.default_version,
        "ready": [f"{r.region}={r.stable_ready}/{r.canary_ready}" for r in regions],
        "share": [f"{r.region}={r.canary_share * 100:.1f}%" for r in regions],
        "updated_at": view.updated_at,
        "regions": [{"region": r.region, "stable_ready": r.stable_ready, "canary_ready": r.canary_ready,
                     "canary_share": r.canary_share} for r in regions],
    }


def _request(args: argparse.Namespace) -> admin_pb2.RolloutRequest | None:
    """The change the arguments ask for (None: a listing); raises UsageError for a contradiction."""

    action = args.promote or args.rollback or args.canary is not None
    if not action:
        if args.version:
            raise UsageError("rollout: --version goes with --canary PERCENT")
        return None
    if args.model is None:
        raise UsageError("rollout: name the MODEL")
    if args.canary is not None:
        if args.promote or args.rollback:
            raise UsageError("rollout: --canary does not go with --promote or --rollback")
        if not args.version:
            raise UsageError("rollout: --canary needs --version V (the new version)")
        return admin_pb2.RolloutRequest(model=args.model, version=args.version, canary_percent=args.canary,
                                        action=admin_pb2.RolloutRequest.ACTION_CANARY)
    kind = admin_pb2.RolloutRequest.ACTION_PROMOTE if args.promote else admin_pb2.RolloutRequest.ACTION_ROLLBACK
    return admin_pb2.RolloutRequest(model=args.model, version=args.version, action=kind)


def cmd_rollout(stub: Any, args: argparse.Namespace) -> None:
    """Change a rollout, or list them."""
    request = _request(args)
    if request is None:
        reply = stub.ListRollouts(admin_pb2.ListRolloutsRequest(model=args.model or ""), timeout=TIMEOUT)
        rows = [rollout_row(v) for v in reply.rollouts]
        if args.json:
            print(json.dumps(rows, indent=2))
        elif rows:
            print_table(rows, COLUMNS)
        else:
            print(f"no rollout{f' of {args.model}' if args.model else ''}")
        return
    row = rollout_row(stub.Rollout(request, timeout=TIMEOUT).rollout)
    if args.json:
        print(json.dumps(row, indent=2))
        return
    if row["state"] == "canary":
        head = f"{row['canary_pct']:g} % of {row['model']} to {row['canary']}, the rest to {row['stable']}"
    elif row["state"] == "promoted":
        head = f"{row['model']}: promoted {row['canary']}, now the default (was {row['stable']})"
    else:
        head = f"{row['model']}: rolled back to {row['stable']} (from {row['canary']})"
    print(f"rollout: {head}")
    print_table([row], COLUMNS)
