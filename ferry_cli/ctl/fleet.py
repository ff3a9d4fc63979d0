"""ferryctl's commands over the fleet's records: status, replicas, nodes, models, table, drain, cordon, alloc, top.

Each command is an argument-adding function (``*_arguments``, for the
parser) and a handler ``cmd_*(stub, args)`` over the Admin API, both named in
:data:`ferry_cli.ctl.main.COMMANDS`; rows and tables come from
:mod:`ferry_cli.ctl.views`. ``status`` asks every control plane the first one
names and merges their answers (:func:`gather_status`); ``nodes`` and ``top``
ask the leader (only it hears every agent stream and every proxy).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import json_format

from ferry.v1 import admin_pb2
from ferry_cli.ctl import client
from ferry_cli.ctl import flow as ctlflow
from ferry_cli.ctl import top as ctltop
from ferry_cli.ctl.client import TIMEOUT
from ferry_cli.ctl.errors import UsageError
from ferry_cli.ctl.views import (
    change_row,
    merge_status,
    model_row,
    node_row,
    pending_row,
    print_table,
    replica_row,
    slot_row,
    supervision_rows,
)

ALLOC_TIMEOUT = 30.0


def no_arguments(parser: argparse.ArgumentParser) -> None:
    """A command with no arguments of its own (only the connection options every command takes)."""


def replicas_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="")
    parser.add_argument("--region", default="")


def region_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--region", default="")


def table_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--region", default="")
    parser.add_argument("--diff", nargs=2, type=int, metavar=("V1", "V2"),
                        help="what changed from V1 to V2 (0 0: the last change; see kept_versions)")


def replica_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("replica_id", metavar="ID")


def node_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("node", metavar="NODE")


def alloc_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", metavar="MODEL", help="the model (with --list: a filter)")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs each replica needs (default: the model's)")
    parser.add_argument("--replicas", type=int, default=1, help="how many replicas (default 1)")
    parser.add_argument("--version", default="", help="model version (default: the model's default)")
    parser.add_argument("--region", default="", help="only nodes of this region")
    parser.add_argument("--list", action="store_true", help="list allocation slots and waiting requests")
    parser.add_argument("--release", metavar="ID", help="remove an allocation slot or waiting request")


def top_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--iterations", type=int, default=0, help="frames to show, then exit (default: until Ctrl-C)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between frames (default 1)")
    parser.add_argument("--by-tier", action="store_true", help="also a row per tier under each model")


def to_dict(message: Any) -> dict[str, Any]:
    data: dict[str, Any] = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return data


def emit(args: argparse.Namespace, data: Any, show: Callable[[], None]) -> None:
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        show()


def cmd_replicas(stub: Any, args: argparse.Namespace) -> None:
    reply = stub.ListReplicas(admin_pb2.ListReplicasRequest(model=args.model, region=args.region), timeout=TIMEOUT)
    rows = [replica_row(r) for r in reply.replicas]
    emit(args, rows, lambda: print_table(rows, ["id", "node", "region", "model", "version", "state", "in_table",
                                                 "cordoned", "queue", "running", "free_kv", "telemetry_age_s"]))


def cmd_nodes(stub: Any, args: argparse.Namespace) -> None:
    request = admin_pb2.ListNodesRequest(region=args.region)
    reply = None
    status = stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=TIMEOUT)
    if status.role == "follower" and status.leader_address:  # only the leader hears of every agent stream
        try:
            with client.at(args, status.leader_address) as leader:
                reply = leader.ListNodes(request, timeout=TIMEOUT)
        except grpc.RpcError:
            reply = None  # the follower's own view, then
    if reply is None:
        reply = stub.ListNodes(request, timeout=TIMEOUT)
    rows = [node_row(n) for n in reply.nodes]
    emit(args, rows, lambda: print_table(rows, ["node", "region", "gpus", "gpus_allocated", "gpus_free", "replicas",
                                                 "slots", "agent_connected", "control_plane", "cordoned", "live",
                                                 "heard_s"]))


def cmd_models(stub: Any, args: argparse.Namespace) -> None:
    rows = [model_row(m) for m in stub.ListModels(admin_pb2.ListModelsRequest(), timeout=TIMEOUT).models]
    emit(args, rows, lambda: print_table(rows, ["model", "default_version", "versions", "ready", "total",
                                                 "gpus_each", "slots", "pending", "tokenizer"]))


def cmd_table(stub: Any, args: argparse.Namespace) -> None:
    if args.diff:
        request = admin_pb2.DiffTableRequest(region=args.region, from_version=max(0, args.diff[0]),
                                             to_version=max(0, args.diff[1]))
        diff = stub.DiffTable(request, timeout=TIMEOUT)
        data = {"region": diff.region, "from_version": diff.from_version, "to_version": diff.to_version,
                "kept_versions": list(diff.kept_versions), "changes": [change_row(c) for c in diff.changes]}

        def show() -> None:
            print(f"region {diff.region}: version {diff.from_version} -> {diff.to_version}, "
                  f"{len(diff.changes)} changes (kept: {', '.join(str(v) for v in diff.kept_versions)})")
            print_table(data["changes"], ["change", "model", "replica_id", "detail"])
        emit(args, data, show)
        return
    reply = stub.GetTable(admin_pb2.GetTableRequest(region=args.region), timeout=TIMEOUT)

    def show_table() -> None:
        print_table([{"region": t.region, "version": t.version, "replicas": t.replicas, "models": list(t.models)}
                     for t in reply.regions], ["region", "version", "replicas", "models"])
        print()
        print_table([{"proxy": p.proxy_id, "region": p.region, "applied": p.applied_version, "lag": p.lag_versions,
                      "connected": p.connected, "last_ack_s": round(p.last_ack_age_seconds, 1),
                      "last_error": p.last_error} for p in reply.proxies],
                    ["proxy", "region", "applied", "lag", "connected", "last_ack_s", "last_error"])
    emit(args, to_dict(reply), show_table)


def cmd_drain(stub: Any, args: argparse.Namespace) -> None:
    method = stub.Drain if args.command == "drain" else stub.Undrain
    row = replica_row(method(admin_pb2.DrainRequest(replica_id=args.replica_id), timeout=TIMEOUT).replica)
    emit(args, row, lambda: print(f"{args.command}: {row['id']} is {row['state']}"
                                   f"{' (drain requested)' if row['drain_requested'] else ''}, "
                                   f"in table: {row['in_table']}"))


def cmd_cordon(stub: Any, args: argparse.Namespace) -> None:
    method = stub.Cordon if args.command == "cordon" else stub.Uncordon
    row = node_row(method(admin_pb2.CordonRequest(node=args.node), timeout=TIMEOUT).node)
    what = ("cordoned: its replicas left the table and keep running what they run" if row["cordoned"]
            else "not cordoned: its ready replicas are back in the table")
    emit(args, row, lambda: print(f"{args.command}: node {row['node']} is {what} ({row['replicas']} replicas)"))


def cmd_alloc(stub: Any, args: argparse.Namespace) -> None:
    if sum((args.list, args.release is not None, args.model is not None and not args.list)) != 1:
        raise UsageError("alloc: give MODEL (to allocate), --list [MODEL] or --release ID")
    if args.release is not None:
        reply = stub.Release(admin_pb2.ReleaseRequest(replica_id=args.release), timeout=TIMEOUT)
        data = {"released": reply.released, "undrained": list(reply.undrained)}
        emit(args, data, lambda: print(f"released {args.release}; undrained: "
                                        f"{', '.join(reply.undrained) or 'nothing'}"))
        return
    if args.list:
        listing = stub.ListAllocations(admin_pb2.ListAllocationsRequest(model=args.model or ""), timeout=TIMEOUT)
        slots, pending = listing.slots, listing.pending
    else:
        request = admin_pb2.AllocateRequest(model=args.model, version=args.version, gpus=max(0, args.gpus),
                                            replicas=max(0, args.replicas), region=args.region)
        answer = stub.Allocate(request, timeout=ALLOC_TIMEOUT)
        slots, pending = answer.placed, answer.pending
    data = {"slots": [slot_row(s) for s in slots], "pending": [pending_row(p) for p in pending]}

    def show() -> None:
        print_table(data["slots"], ["replica_id", "node", "model", "gpus", "state", "displaces", "drain_cost"])
        if data["pending"]:
            print()
            print_table(data["pending"], ["request_id", "model", "gpus", "age_s", "reason"])
    emit(args, data, show)


def gather_status(stub: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Every control plane's GetStatus merged (:func:`ferry_cli.ctl.views.merge_status`), the dead ones shown."""
    first = stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=TIMEOUT)
    answers: dict[str, Any] = {first.control_plane_id: first}
    unreachable: dict[str, str] = {}
    for view in first.control_planes:
        if view.id in answers or not view.address:
            continue
        try:
            with client.at(args, view.address) as other:
                answers[view.id] = other.GetStatus(admin_pb2.GetStatusRequest(), timeout=2.0)
        except grpc.RpcError as exc:
            unreachable[view.id] = f"{exc.code().name}: {exc.details()}"
    known = {view.address for view in first.control_planes}
    skipped: dict[str, str] = getattr(args, "skipped", {})
    missing = {address: skipped.get(address, "not registered in the store (stopped or dead)")
               for address in getattr(args, "addresses", ()) if address not in known}  # given but gone from the store
    return merge_status(first, answers, unreachable, missing=missing)


def proxy_summary(proxies: list[dict[str, Any]]) -> str:
    """One line: proxies connected, and each disconnected one (whose traffic no figure shows)."""
    gone = sorted({p["proxy_id"] for p in proxies if not p["connected"]} - {p["proxy_id"] for p in proxies
                                                                                if p["connected"]})
    live = len({p["proxy_id"] for p in proxies if p["connected"]})
    text = f"proxies: {live} connected"
    if gone:
        text += f", {len(gone)} DISCONNECTED ({', '.join(gone)}): their traffic is in no figure"
    return text


def cmd_status(stub: Any, args: argparse.Namespace) -> None:
    status = gather_status(stub, args)
    supervised = supervision_rows(client.ready(args))  # ferry up's children, from its ready file (no RPC)
    if supervised:
        status["supervision"] = supervised
    if args.json:
        print(json.dumps(status, indent=2))
        return
    leader = status["leader"]
    store = status["store"]
    where = f" {store['endpoint']}" if store["endpoint"] else ""
    health = "healthy" if store["healthy"] else f"UNREACHABLE ({store['error']})"
    print(f"leader: {leader['id']} at {leader['address']} (term {leader['term']})" if leader else "leader: none")
    print(f"store: {store['backend']}{where} {health}, revision {store['revision']}")
    print(f"fleet: {status['members']} live nodes, {status['drains']} drains, {status['allocations']} allocations")
    print(proxy_summary(status["proxies"]))
    print()
    print_table(status["control_planes"], ["id", "address", "role", "reachable", "agents", "store_healthy", "error"])
    print()
    print_table(status["regions"], ["region", "version", "replicas"])
    print()
    print_table(status["proxies"], ["proxy_id", "region", "control_plane", "applied_version", "leader_version",
                                    "lag_versions", "synced", "connected", "last_ack_age_s", "last_error"])
    if supervised:
        print()
        print_table(supervised, ["component", "pid", "restarts", "given_up"])


def cmd_top(stub: Any, args: argparse.Namespace) -> None:
    if args.iterations < 0 or args.interval <= 0:
        raise UsageError("top: --iterations must be >= 0 and --interval > 0")
    with ctlflow.leader(stub, client.connector(args), TIMEOUT) as target:  # the leader has every proxy
        ctltop.run(target, iterations=args.iterations, interval=args.interval, as_json=args.json, timeout=TIMEOUT,
                   by_tier=args.by_tier, proxies=lambda: gather_status(stub, args)["proxies"], summary=proxy_summary)
