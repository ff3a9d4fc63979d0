"""``ferryctl``: the operator's command line, over the control plane's Admin API.

Commands (``ferryctl COMMAND --help`` for each; docs/operations.md has examples):

- ``status``: leader, control planes, store health, table version per region,
  each proxy's lag (asks every control plane it names and merges them);
- ``replicas [--model M] [--region R]``: every replica, its state and load;
- ``nodes [--region R]``: GPUs, GPUs allocated and free, replicas, agent
  stream and the control plane holding it, cordon (asked of the leader when
  pointed at a follower: only the leader hears of every agent stream);
- ``models``: default version, versions, replicas ready/total, GPUs each,
  allocation slots and waiting requests;
- ``table [--region R] [--diff V1 V2]``: table versions and proxies, or what
  changed between two kept versions (0 0: the last change);
- ``drain ID`` / ``undrain ID``: a replica out of (back into) the tables;
- ``cordon NODE`` / ``uncordon NODE``: a node's replicas out of (back into)
  the tables, running work untouched;
- ``alloc MODEL --gpus 8 --replicas N``, ``alloc --list [MODEL]``,
  ``alloc --release ID``: gang allocation;
- ``top [--iterations N] [--interval S] [--by-tier]``: live view per model
  and region (and tier): rate, p99, queue, utilisation, shed (:mod:`ferry_cli.ctl.top`);
- ``tiers [--region R]``, ``spill [--region R]``: tier quotas and region
  spill with the proxies' rates (:mod:`ferry_cli.ctl.flow`);
- ``rollout MODEL --version V --canary P | --promote | --rollback``, ``rollout``:
  a model's version rollout (:mod:`ferry_cli.ctl.rollout`);
- ``router [rollout FILE --canary P | promote | rollback | show [VERSION]]``:
  router config rollouts under a guard (:mod:`ferry_cli.ctl.router`);
- ``tenants [list]``, ``tenants add NAME --plan P --tiers a,b --rps N --tps N
  --concurrency N (--api-key K | --api-key-sha256 H | --generate-key)``,
  ``tenants set NAME …``, ``tenants remove NAME``: the tenants kept in the
  store and pushed to the proxies (:mod:`ferry_cli.ctl.tenants`);
- ``scale [--region R]``: replicas needed now and for the next ramp, desired,
  standby nodes to keep (:mod:`ferry_cli.ctl.scale`);
- ``board [--out DIR] [--watch --interval S --count N]``: the fleet drawn as
  SVG and PNG, every flow with its live rate (:mod:`ferry_cli.ctl.board`);
- ``cache [--model M] [--by-tenant]``: the duplicate rate the proxies measure and
  the GPU-seconds a response cache saves, cache on/off (:mod:`ferry_cli.ctl.cache`);
- ``what-if --traffic FILE --config FILE``, ``tune --traffic FILE``: recorded
  traffic replayed through the fleet simulator, a config against the
  baseline, or a search for a better one (:mod:`ferry_cli.ctl.whatif`,
  :mod:`ferry_cli.ctl.tune`; local: no control plane, see :data:`LOCAL`);
- ``traffic export --since 1h [--model M] [-o FILE]``: the proxies' recorded traffic
  as a Mooncake-layout trace (:mod:`ferry_cli.ctl.traffic`);
- ``engines [--model M]``: per model and replica kind, the engine's step
  parameters fitted from telemetry with their errors (:mod:`ferry_cli.ctl.engines`);
- ``completion bash|zsh``: a shell completion script.

Every command takes ``--control-plane host:port[,host:port…]`` (else every
control plane of ``--ready-file`` of ``ferry up``, else env
``FERRY_CONTROL_PLANE``, also a comma-separated list: each is asked in turn
until one answers; one whose call fails UNAVAILABLE and that accepts no
connection within :data:`CONNECT_TIMEOUT` is skipped as unreachable), ``--admin-token TOKEN`` (else
the ready file's ``admin_token``, else env ``FERRY_ADMIN_TOKEN``; sent as
``authorization: Bearer TOKEN``), ``--tls-ca``/``--tls-cert``/``--tls-key``
(mutual TLS; else the ready file's ``tls`` section; a certificate of common
name ``admin`` needs no token) and ``--json`` (JSON on stdout; ``top``:
one object per line and frame). Human tables by default. Exit codes
(:data:`EXIT_OK` …): 0 done; 1 the control plane refused (the status and its
message are printed, e.g. UNAUTHENTICATED saying how to pass the token); 2
usage error, or no control plane reachable; 3 a control plane answered but
could not do it now because something it needs is away (UNAVAILABLE from a
reachable control plane: its store, or the leader): nothing was changed,
retry later.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf import json_format

from ferry.process import read_ready_file
from ferry.v1 import admin_pb2, admin_pb2_grpc
from ferry_cli import clienttls
from ferry_cli.ctl import board as ctlboard
from ferry_cli.ctl import cache as ctlcache
from ferry_cli.ctl import completion
from ferry_cli.ctl import engines as ctlengines
from ferry_cli.ctl import flow as ctlflow
from ferry_cli.ctl import rollout as ctlrollout
from ferry_cli.ctl import router as ctlrouter
from ferry_cli.ctl import scale as ctlscale
from ferry_cli.ctl import tenants as ctltenants
from ferry_cli.ctl import top as ctltop
from ferry_cli.ctl import traffic as ctltraffic
from ferry_cli.ctl import tune as ctltune
from ferry_cli.ctl import whatif as ctlwhatif
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

TIMEOUT = 5.0
ALLOC_TIMEOUT = 30.0
CONNECT_TIMEOUT = 2.0  # seconds to wait for a control plane to accept a connection before trying the next
TOKEN_ENV = "FERRY_ADMIN_TOKEN"
EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_DEPENDENCY = 0, 1, 2, 3
AWAY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def admin_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata that carries the admin token."""
    return (("authorization", f"Bearer {token}"),) if token else ()


class AdminClient:
    """An ``Admin`` stub whose every call carries the admin token."""

    def __init__(self, channel: grpc.Channel, token: str | None) -> None:
        self._stub = admin_pb2_grpc.AdminStub(channel)
        self._metadata = admin_metadata(token)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return functools.partial(getattr(self._stub, name), metadata=self._metadata)


def _common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--control-plane", default=default, help="host:port (env FERRY_CONTROL_PLANE)")
    parser.add_argument("--ready-file", default=default, help="take the control plane and token from ferry up's "
                                                              "ready file")
    parser.add_argument("--admin-token", default=default, help=f"the Admin API token (env {TOKEN_ENV})")
    parser.add_argument("--tls-ca", default=default, help="CA of the control plane (mutual TLS; else the ready file's)")
    parser.add_argument("--tls-cert", default=default, help="client certificate (CN admin opens the Admin API)")
    parser.add_argument("--tls-key", default=default, help="the client certificate's key")
    parser.add_argument("--json", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="machine-readable output")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ferryctl", description="Operate a Ferry fleet.")
    _common(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text, description=text)
        _common(p, top=False)
        return p

    add("status", "leader, control planes, store health, table versions and proxy lag")
    p = add("replicas", "every replica: node, region, model, state, load, telemetry age")
    p.add_argument("--model", default="")
    p.add_argument("--region", default="")
    add("nodes", "every node: GPUs allocated and free, replicas, agent, control plane, cordon").add_argument(
        "--region", default="")
    add("models", "every model: versions, replicas ready/total, GPUs each, allocations")
    p = add("table", "table version per region and the version each proxy applied, or a diff of two versions")
    p.add_argument("--region", default="")
    p.add_argument("--diff", nargs=2, type=int, metavar=("V1", "V2"),
                   help="what changed from V1 to V2 (0 0: the last change; see kept_versions)")
    for name, text in (("drain", "take a replica out of the table; it finishes what it runs"),
                       ("undrain", "put a drained replica back")):
        add(name, text).add_argument("replica_id", metavar="ID")
    for name, text in (("cordon", "take a node's replicas out of the table; they keep running what they run"),
                       ("uncordon", "put a cordoned node's replicas back")):
        add(name, text).add_argument("node", metavar="NODE")
    p = add("alloc", "place replicas that need GPUs of one node (all or nothing), draining small ones for room")
    p.add_argument("model", nargs="?", metavar="MODEL", help="the model (with --list: a filter)")
    p.add_argument("--gpus", type=int, default=0, help="GPUs each replica needs (default: the model's)")
    p.add_argument("--replicas", type=int, default=1, help="how many replicas (default 1)")
    p.add_argument("--version", default="", help="model version (default: the model's default)")
    p.add_argument("--region", default="", help="only nodes of this region")
    p.add_argument("--list", action="store_true", help="list allocation slots and waiting requests")
    p.add_argument("--release", metavar="ID", help="remove an allocation slot or waiting request")
    p = add("top", "live view per model and region: rate, p99, queue, utilisation, shed")
    p.add_argument("--iterations", type=int, default=0, help="frames to show, then exit (default: until Ctrl-C)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between frames (default 1)")
    p.add_argument("--by-tier", action="store_true", help="also a row per tier under each model")
    ctlflow.add_commands(add)  # tiers, spill
    ctlrollout.add_arguments(add("rollout", "a model's version rollout: --canary share, --promote, --rollback; "
                                            "alone: list"))
    ctltenants.add_arguments(add("tenants", ctltenants.HELP))
    ctlscale.add_arguments(add("scale", ctlscale.HELP))
    ctlboard.add_arguments(add("board", ctlboard.HELP))
    ctlcache.add_arguments(add)  # cache
    ctlwhatif.add_arguments(add("what-if", ctlwhatif.HELP))
    ctltune.add_arguments(add("tune", ctltune.HELP))
    ctltraffic.add_arguments(add)  # traffic export
    ctlrouter.add_arguments(add("router", ctlrouter.HELP))
    ctlengines.add_arguments(add)  # engines
    p = sub.add_parser("completion", help="print a shell completion script")
    p.add_argument("shell", choices=sorted(completion.SHELLS))
    return parser


def _ready(args: argparse.Namespace) -> dict[str, Any]:
    return (read_ready_file(args.ready_file) or {}) if args.ready_file else {}


def _addresses(args: argparse.Namespace) -> list[str]:
    """The control planes to try, in order: ``--control-plane`` (comma-separated), the ready file's, the env's."""
    ready = _ready(args)
    given: Any = (args.control_plane or ready.get("control_planes") or ready.get("control_plane")
                  or os.environ.get("FERRY_CONTROL_PLANE"))
    items = given.split(",") if isinstance(given, str) else [str(a) for a in given or ()]
    addresses = list(dict.fromkeys(a.strip() for a in items if a.strip()))
    if not addresses:
        raise UsageError("give --control-plane host:port[,host:port...], --ready-file, or set FERRY_CONTROL_PLANE")
    return addresses


def _reachable(channel: grpc.Channel) -> bool:
    """Whether the channel's control plane accepts a connection within :data:`CONNECT_TIMEOUT`."""
    try:
        grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT)
    except grpc.FutureTimeoutError:
        return False
    return True


def _credentials(args: argparse.Namespace) -> grpc.ChannelCredentials | None:
    try:
        return clienttls.credentials(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key, ready=_ready(args))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def _token(args: argparse.Namespace) -> str | None:
    token = args.admin_token or _ready(args).get("admin_token") or os.environ.get(TOKEN_ENV)
    return str(token) if token else None


def _to_dict(message: Any) -> dict[str, Any]:
    data: dict[str, Any] = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return data


def _emit(args: argparse.Namespace, data: Any, show: Callable[[], None]) -> None:
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        show()


def cmd_replicas(stub: Any, args: argparse.Namespace) -> None:
    reply = stub.ListReplicas(admin_pb2.ListReplicasRequest(model=args.model, region=args.region), timeout=TIMEOUT)
    rows = [replica_row(r) for r in reply.replicas]
    _emit(args, rows, lambda: print_table(rows, ["id", "node", "region", "model", "version", "state", "in_table",
                                                 "cordoned", "queue", "running", "free_kv", "telemetry_age_s"]))


def cmd_nodes(stub: Any, args: argparse.Namespace) -> None:
    request = admin_pb2.ListNodesRequest(region=args.region)
    reply = None
    status = stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=TIMEOUT)
    if status.role == "follower" and status.leader_address:  # only the leader hears of every agent stream
        try:
            with clienttls.sync_channel(status.leader_address, _credentials(args)) as channel:
                reply = AdminClient(channel, _token(args)).ListNodes(request, timeout=TIMEOUT)
        except grpc.RpcError:
            reply = None  # the follower's own view, then
    if reply is None:
        reply = stub.ListNodes(request, timeout=TIMEOUT)
    rows = [node_row(n) for n in reply.nodes]
    _emit(args, rows, lambda: print_table(rows, ["node", "region", "gpus", "gpus_allocated", "gpus_free", "replicas",
                                                 "slots", "agent_connected", "control_plane", "cordoned", "live",
                                                 "heard_s"]))


def cmd_models(stub: Any, args: argparse.Namespace) -> None:
    rows = [model_row(m) for m in stub.ListModels(admin_pb2.ListModelsRequest(), timeout=TIMEOUT).models]
    _emit(args, rows, lambda: print_table(rows, ["model", "default_version", "versions", "ready", "total",
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
        _emit(args, data, show)
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
    _emit(args, _to_dict(reply), show_table)


def cmd_drain(stub: Any, args: argparse.Namespace) -> None:
    method = stub.Drain if args.command == "drain" else stub.Undrain
    row = replica_row(method(admin_pb2.DrainRequest(replica_id=args.replica_id), timeout=TIMEOUT).replica)
    _emit(args, row, lambda: print(f"{args.command}: {row['id']} is {row['state']}"
                                   f"{' (drain requested)' if row['drain_requested'] else ''}, "
                                   f"in table: {row['in_table']}"))


def cmd_cordon(stub: Any, args: argparse.Namespace) -> None:
    method = stub.Cordon if args.command == "cordon" else stub.Uncordon
    row = node_row(method(admin_pb2.CordonRequest(node=args.node), timeout=TIMEOUT).node)
    what = ("cordoned: its replicas left the table and keep running what they run" if row["cordoned"]
            else "not cordoned: its ready replicas are back in the table")
    _emit(args, row, lambda: print(f"{args.command}: node {row['node']} is {what} ({row['replicas']} replicas)"))


def cmd_alloc(stub: Any, args: argparse.Namespace) -> None:
    if sum((args.list, args.release is not None, args.model is not None and not args.list)) != 1:
        raise UsageError("alloc: give MODEL (to allocate), --list [MODEL] or --release ID")
    if args.release is not None:
        reply = stub.Release(admin_pb2.ReleaseRequest(replica_id=args.release), timeout=TIMEOUT)
        data = {"released": reply.released, "undrained": list(reply.undrained)}
        _emit(args, data, lambda: print(f"released {args.release}; undrained: "
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
    _emit(args, data, show)


def gather_status(stub: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Every control plane's GetStatus merged (:func:`ferry_cli.ctl.views.merge_status`), the dead ones shown."""
    first = stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=TIMEOUT)
    answers: dict[str, Any] = {first.control_plane_id: first}
    unreachable: dict[str, str] = {}
    for view in first.control_planes:
        if view.id in answers or not view.address:
            continue
        try:
            with clienttls.sync_channel(view.address, _credentials(args)) as channel:
                answers[view.id] = AdminClient(channel, _token(args)).GetStatus(admin_pb2.GetStatusRequest(),
                                                                                timeout=2.0)
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
    supervised = supervision_rows(_ready(args))  # ferry up's children, from its ready file (no RPC)
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
    with ctlflow.leader(stub, functools.partial(_at, args), TIMEOUT) as target:  # the leader has every proxy
        ctltop.run(target, iterations=args.iterations, interval=args.interval, as_json=args.json, timeout=TIMEOUT,
                   by_tier=args.by_tier, proxies=lambda: gather_status(stub, args)["proxies"], summary=proxy_summary)


@contextlib.contextmanager
def _at(args: argparse.Namespace, address: str) -> Iterator[AdminClient]:
    """An Admin client of the control plane at ``address``, with the same credentials and token."""
    with clienttls.sync_channel(address, _credentials(args)) as channel:
        yield AdminClient(channel, _token(args))


def cmd_flow(stub: Any, args: argparse.Namespace) -> None:
    ctlflow.COMMANDS[args.command](stub, args, functools.partial(_at, args), TIMEOUT)


def cmd_cache(stub: Any, args: argparse.Namespace) -> None:
    ctlcache.cmd_cache(stub, args, functools.partial(_at, args), TIMEOUT)


COMMANDS: dict[str, Callable[[Any, argparse.Namespace], None]] = {
    "replicas": cmd_replicas, "nodes": cmd_nodes, "models": cmd_models, "table": cmd_table, "drain": cmd_drain,
    "undrain": cmd_drain, "cordon": cmd_cordon, "uncordon": cmd_cordon, "alloc": cmd_alloc, "status": cmd_status,
    "top": cmd_top, "tiers": cmd_flow, "spill": cmd_flow, "cache": cmd_cache,
    "rollout": ctlrollout.cmd_rollout, "tenants": ctltenants.run, "router": ctlrouter.cmd_router,
    "board": lambda stub, args: ctlboard.run(stub, args, gather_status, functools.partial(_at, args)),
    "scale": lambda stub, args: ctlscale.cmd_scale(stub, args, functools.partial(_at, args), TIMEOUT),
    "what-if": lambda stub, args: ctlwhatif.remote(ctlwhatif.run, stub, args, functools.partial(_at, args), TIMEOUT),
    "tune": lambda stub, args: ctlwhatif.remote(ctltune.run, stub, args, functools.partial(_at, args), TIMEOUT),
    "traffic": lambda stub, args: ctltraffic.run(stub, args, functools.partial(_at, args), TIMEOUT),
    "engines": lambda stub, args: ctlengines.cmd_engines(stub, args, functools.partial(_at, args), TIMEOUT),
}

# Commands that run here, on files, without the Admin API: checked before any control plane is looked for.
LOCAL: dict[str, Callable[[argparse.Namespace], int]] = {"what-if": ctlwhatif.run, "tune": ctltune.run}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "completion":
        print(completion.SHELLS[args.shell](parser), end="")
        return 0
    if args.command in LOCAL and getattr(args, "since", None) is None:  # --since: the control plane's recording
        try:
            return LOCAL[args.command](args)
        except UsageError as exc:
            print(f"ferryctl: {exc}", file=sys.stderr)
            return EXIT_USAGE
    address = ""
    try:
        args.addresses = _addresses(args)
        args.skipped = {}  # address -> why it was not asked
        credentials = _credentials(args)
        for address in args.addresses:
            with clienttls.sync_channel(address, credentials) as channel:
                try:
                    COMMANDS[args.command](AdminClient(channel, _token(args)), args)
                    return EXIT_OK
                except grpc.RpcError as exc:
                    if exc.code() not in AWAY or _reachable(channel):
                        raise
                    args.skipped[address] = f"unreachable: {exc.code().name}: {exc.details()}"
        print(f"ferryctl: control plane {', '.join(args.addresses)} unreachable: "
              f"{'; '.join(args.skipped.values())}", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        print(f"ferryctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except grpc.RpcError as exc:
        code = exc.code()
        if code in AWAY:  # the control plane accepts connections: what failed is behind it (its store, the leader)
            print(f"ferryctl: the control plane at {address} answered, but what it needs (its store, or the "
                  f"leader) is away ({code.name}); nothing was changed, retry when it is back: {exc.details()}",
                  file=sys.stderr)
            return EXIT_DEPENDENCY
        print(f"ferryctl: {code.name}: {exc.details()}", file=sys.stderr)
        return EXIT_REFUSED

if __name__ == "__main__":
    sys.exit(main())
