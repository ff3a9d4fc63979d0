"""``ferryctl``: the operator's command line, over the control plane's Admin API.

Commands: ``replicas``, ``table``, ``drain ID``, ``undrain ID``, ``status``
(leader, control planes, store health, table version per region and each
proxy's lag: it asks the given control plane, then every other control plane
it names, and merges their proxies). Every command
takes ``--control-plane host:port`` (env ``FERRY_CONTROL_PLANE``, or
``--ready-file`` of ``ferry up``) and ``--json``. Human tables by default.
Exit codes: 0 done, 1 the control plane refused (the status is printed),
2 usage error or the control plane is unreachable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from google.protobuf import json_format

from ferry.process import read_ready_file
from ferry.v1 import admin_pb2, admin_pb2_grpc, common_pb2

TIMEOUT = 5.0


def _state(value: int) -> str:
    return str(common_pb2.ReplicaState.Name(value)).removeprefix("REPLICA_STATE_").lower()


def _common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--control-plane", default=default, help="host:port (env FERRY_CONTROL_PLANE)")
    parser.add_argument("--ready-file", default=default, help="take the control plane from ferry up's ready file")
    parser.add_argument("--json", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="machine-readable output")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ferryctl", description="Operate a Ferry fleet.")
    _common(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("replicas", help="every replica: node, region, model, state, load, telemetry age")
    p.add_argument("--model", default="")
    p.add_argument("--region", default="")
    _common(p, top=False)
    p = sub.add_parser("table", help="table version per region and the version each proxy applied")
    p.add_argument("--region", default="")
    _common(p, top=False)
    p = sub.add_parser("status", help="leader, control planes, store health, table versions and proxy lag")
    _common(p, top=False)
    for name, text in (("drain", "take a replica out of the table; it finishes what it runs"),
                       ("undrain", "put a drained replica back")):
        p = sub.add_parser(name, help=text)
        p.add_argument("replica_id", metavar="ID")
        _common(p, top=False)
    return parser


def _address(args: argparse.Namespace) -> str:
    if args.control_plane:
        return str(args.control_plane)
    if args.ready_file:
        ready = read_ready_file(args.ready_file) or {}
        if ready.get("control_plane"):
            return str(ready["control_plane"])
    env = os.environ.get("FERRY_CONTROL_PLANE")
    if env:
        return env
    raise SystemExit("ferryctl: give --control-plane host:port (or set FERRY_CONTROL_PLANE)")


def _to_dict(message: Any) -> dict[str, Any]:
    data: dict[str, Any] = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return data


def _replica_row(r: Any) -> dict[str, Any]:
    return {
        "id": r.replica_id, "node": r.node, "region": r.region, "model": r.model, "version": r.version,
        "address": r.address, "state": _state(r.state), "drain_requested": r.drain_requested,
        "in_table": r.in_table, "queue": r.load.queued, "running": r.load.running,
        "free_kv": r.load.kv_blocks_free, "total_kv": r.load.kv_blocks_total,
        "telemetry_age_s": round(r.telemetry_age_seconds, 3),
    }


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """Print ``rows`` as an aligned text table with the given columns."""
    cells = [[str(row.get(c, "")) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


def cmd_replicas(stub: Any, args: argparse.Namespace) -> None:
    reply = stub.ListReplicas(admin_pb2.ListReplicasRequest(model=args.model, region=args.region), timeout=TIMEOUT)
    rows = [_replica_row(r) for r in reply.replicas]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_table(rows, ["id", "node", "region", "model", "version", "state", "in_table", "queue", "running",
                           "free_kv", "telemetry_age_s"])


def cmd_table(stub: Any, args: argparse.Namespace) -> None:
    reply = stub.GetTable(admin_pb2.GetTableRequest(region=args.region), timeout=TIMEOUT)
    if args.json:
        print(json.dumps(_to_dict(reply), indent=2))
        return
    print_table([{"region": t.region, "version": t.version, "replicas": t.replicas, "models": ",".join(t.models)}
                 for t in reply.regions], ["region", "version", "replicas", "models"])
    print()
    print_table([{"proxy": p.proxy_id, "region": p.region, "applied": p.applied_version, "lag": p.lag_versions,
                  "connected": p.connected, "last_ack_s": round(p.last_ack_age_seconds, 1),
                  "last_error": p.last_error} for p in reply.proxies],
                ["proxy", "region", "applied", "lag", "connected", "last_ack_s", "last_error"])


def cmd_drain(stub: Any, args: argparse.Namespace) -> None:
    method = stub.Drain if args.command == "drain" else stub.Undrain
    reply = method(admin_pb2.DrainRequest(replica_id=args.replica_id), timeout=TIMEOUT)
    row = _replica_row(reply.replica)
    if args.json:
        print(json.dumps(row, indent=2))
    else:
        print(f"{args.command}: {row['id']} is {row['state']}"
              f"{' (drain requested)' if row['drain_requested'] else ''}, in table: {row['in_table']}")


def merge_status(first: Any, answers: dict[str, Any], unreachable: dict[str, str]) -> dict[str, Any]:
    """One view of the control side from each control plane's GetStatus (``first`` answered the call).

    Tables and counts come from the leader's answer when it answered; proxies from the control plane
    each one watches from, with ``leader_version`` and ``synced`` (applied the leader's version).
    """
    leader = answers.get(first.leader_id) if first.leader_id else None
    main = leader if leader is not None else first
    versions = {t.region: t.version for t in main.regions}
    planes = []
    for view in first.control_planes:
        answer = answers.get(view.id)
        planes.append({
            "id": view.id, "address": view.address, "leader": view.id == first.leader_id,
            "role": answer.role if answer is not None else "", "reachable": answer is not None,
            "error": unreachable.get(view.id, ""), "agents": answer.agents if answer is not None else 0,
            "store_healthy": answer.store.healthy if answer is not None else None,
        })
    proxies = []
    for cp_id, answer in sorted(answers.items()):
        for p in answer.proxies:
            proxies.append({
                "proxy_id": p.proxy_id, "region": p.region, "control_plane": cp_id,
                "applied_version": p.applied_version, "lag_versions": p.lag_versions,
                "leader_version": versions.get(p.region, 0),
                "synced": p.applied_version == versions.get(p.region, -1), "connected": p.connected,
                "last_ack_age_s": round(p.last_ack_age_seconds, 3), "last_error": p.last_error,
            })
    store = first.store
    return {
        "answered_by": first.control_plane_id,
        "leader": {"id": first.leader_id, "address": first.leader_address, "term": main.term}
        if first.leader_id else None,
        "store": {"backend": store.backend, "endpoint": store.endpoint, "healthy": store.healthy,
                  "error": store.error, "revision": store.revision,
                  "last_ok_age_s": round(store.last_ok_age_seconds, 3)},
        "control_planes": planes,
        "regions": [{"region": t.region, "version": t.version, "replicas": t.replicas, "models": list(t.models),
                     "computed_at": t.computed_at} for t in main.regions],
        "proxies": sorted(proxies, key=lambda p: (p["proxy_id"], not p["connected"])),
        "members": main.members, "drains": main.drains, "allocations": main.allocations,
    }


def cmd_status(stub: Any, args: argparse.Namespace) -> None:
    first = stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=TIMEOUT)
    answers: dict[str, Any] = {first.control_plane_id: first}
    unreachable: dict[str, str] = {}
    for view in first.control_planes:
        if view.id in answers or not view.address:
            continue
        try:
            with grpc.insecure_channel(view.address) as channel:
                answers[view.id] = admin_pb2_grpc.AdminStub(channel).GetStatus(admin_pb2.GetStatusRequest(),
                                                                               timeout=2.0)
        except grpc.RpcError as exc:
            unreachable[view.id] = f"{exc.code().name}: {exc.details()}"
    status = merge_status(first, answers, unreachable)
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
    print()
    print_table(status["control_planes"], ["id", "address", "role", "reachable", "agents", "store_healthy", "error"])
    print()
    print_table(status["regions"], ["region", "version", "replicas"])
    print()
    print_table(status["proxies"], ["proxy_id", "region", "control_plane", "applied_version", "leader_version",
                                    "lag_versions", "synced", "connected", "last_ack_age_s", "last_error"])


COMMANDS: dict[str, Callable[[Any, argparse.Namespace], None]] = {
    "replicas": cmd_replicas, "table": cmd_table, "drain": cmd_drain, "undrain": cmd_drain, "status": cmd_status,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    address = _address(args)
    with grpc.insecure_channel(address) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        try:
            COMMANDS[args.command](stub, args)
        except grpc.RpcError as exc:
            code = exc.code()
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                print(f"ferryctl: control plane {address} unreachable ({code.name}): {exc.details()}",
                      file=sys.stderr)
                return 2
            print(f"ferryctl: {code.name}: {exc.details()}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
