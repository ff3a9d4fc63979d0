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
  :mod:`ferry_cli.ctl.tune`; local: no control plane, unless ``--since``);
- ``traffic export --since 1h [--model M] [-o FILE]``: the proxies' recorded traffic
  as a Mooncake-layout trace (:mod:`ferry_cli.ctl.traffic`);
- ``engines [--model M]``: per model and replica kind, the engine's step
  parameters fitted from telemetry with their errors (:mod:`ferry_cli.ctl.engines`);
- ``completion bash|zsh``: a shell completion script.

Every command is one row of :data:`COMMANDS` (:class:`Command`: its name,
help, the function that adds its own arguments, its handler over the Admin
API and its handler without one); :func:`build_parser` and :func:`main` are
built from that table alone. Adding a command is one module with its
arguments and handler, and one row.

Every command takes ``--control-plane host:port[,host:port…]`` (else every
control plane of ``--ready-file`` of ``ferry up``, else env
``FERRY_CONTROL_PLANE``, also a comma-separated list: each is asked in turn
until one answers; one whose call fails UNAVAILABLE and that accepts no
connection within :data:`~ferry_cli.ctl.client.CONNECT_TIMEOUT` is skipped as
unreachable), ``--admin-token TOKEN`` (else
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
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from ferry_cli import clienttls
from ferry_cli.ctl import board as ctlboard
from ferry_cli.ctl import cache as ctlcache
from ferry_cli.ctl import client, completion, fleet
from ferry_cli.ctl import engines as ctlengines
from ferry_cli.ctl import flow as ctlflow
from ferry_cli.ctl import rollout as ctlrollout
from ferry_cli.ctl import router as ctlrouter
from ferry_cli.ctl import scale as ctlscale
from ferry_cli.ctl import tenants as ctltenants
from ferry_cli.ctl import traffic as ctltraffic
from ferry_cli.ctl import tune as ctltune
from ferry_cli.ctl import whatif as ctlwhatif
from ferry_cli.ctl.client import TIMEOUT
from ferry_cli.ctl.errors import UsageError

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_DEPENDENCY = 0, 1, 2, 3
AWAY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

Remote = Callable[[Any, argparse.Namespace], None]  # (the Admin client, the parsed arguments)
Local = Callable[[argparse.Namespace], int]  # (the parsed arguments) -> exit code


@dataclass(frozen=True)
class Command:
    """One ferryctl command: its name, help, the function that adds its own arguments, and how it runs.

    ``remote`` runs over the Admin API of a control plane (the command then takes the connection options,
    ``--control-plane`` …, and its help is also its description); ``local`` runs here, without one.
    A command with both runs ``local`` unless ``remote_if`` says the arguments ask for the control plane.
    """

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    remote: Remote | None = None
    local: Local | None = None
    remote_if: Callable[[argparse.Namespace], bool] | None = None

    def __post_init__(self) -> None:
        if self.remote is None and self.local is None:
            raise ValueError(f"ferryctl command {self.name!r}: give remote, local or both")
        if self.remote_if is not None and (self.remote is None or self.local is None):
            raise ValueError(f"ferryctl command {self.name!r}: remote_if chooses between remote and local: give both")

    def needs_control_plane(self, args: argparse.Namespace) -> bool:
        """Whether these arguments run the command over the Admin API (else :attr:`local` runs)."""
        if self.local is None:
            return True
        return self.remote is not None and self.remote_if is not None and self.remote_if(args)


def _connected(handler: Callable[[Any, argparse.Namespace, ctlflow.Connect, float], None]) -> Remote:
    """A handler that also asks other control planes (the leader): given the same credentials and the timeout."""
    return lambda stub, args: handler(stub, args, client.connector(args), TIMEOUT)


def _recorded(run_local: Local) -> Remote:
    """``what-if`` or ``tune`` on the control plane's recording (``--since``)."""
    return lambda stub, args: ctlwhatif.remote(run_local, stub, args, client.connector(args), TIMEOUT)


def _since(args: argparse.Namespace) -> bool:
    return getattr(args, "since", None) is not None


def _completion(args: argparse.Namespace) -> int:
    print(completion.SHELLS[args.shell](build_parser()), end="")
    return 0


def _completion_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=sorted(completion.SHELLS))


def _board(stub: Any, args: argparse.Namespace) -> None:
    ctlboard.run(stub, args, fleet.gather_status, client.connector(args))


# Every command, in the order of ``ferryctl --help``.
COMMANDS: tuple[Command, ...] = (
    Command("status", "leader, control planes, store health, table versions and proxy lag",
            fleet.no_arguments, fleet.cmd_status),
    Command("replicas", "every replica: node, region, model, state, load, telemetry age",
            fleet.replicas_arguments, fleet.cmd_replicas),
    Command("nodes", "every node: GPUs allocated and free, replicas, agent, control plane, cordon",
            fleet.region_argument, fleet.cmd_nodes),
    Command("models", "every model: versions, replicas ready/total, GPUs each, allocations",
            fleet.no_arguments, fleet.cmd_models),
    Command("table", "table version per region and the version each proxy applied, or a diff of two versions",
            fleet.table_arguments, fleet.cmd_table),
    Command("drain", "take a replica out of the table; it finishes what it runs",
            fleet.replica_argument, fleet.cmd_drain),
    Command("undrain", "put a drained replica back", fleet.replica_argument, fleet.cmd_drain),
    Command("cordon", "take a node's replicas out of the table; they keep running what they run",
            fleet.node_argument, fleet.cmd_cordon),
    Command("uncordon", "put a cordoned node's replicas back", fleet.node_argument, fleet.cmd_cordon),
    Command("alloc", "place replicas that need GPUs of one node (all or nothing), draining small ones for room",
            fleet.alloc_arguments, fleet.cmd_alloc),
    Command("top", "live view per model and region: rate, p99, queue, utilisation, shed",
            fleet.top_arguments, fleet.cmd_top),
    Command("tiers", ctlflow.TIERS_HELP, ctlflow.tiers_arguments, _connected(ctlflow.cmd_tiers)),
    Command("spill", ctlflow.SPILL_HELP, ctlflow.spill_arguments, _connected(ctlflow.cmd_spill)),
    Command("rollout", "a model's version rollout: --canary share, --promote, --rollback; alone: list",
            ctlrollout.add_arguments, ctlrollout.cmd_rollout),
    Command("tenants", ctltenants.HELP, ctltenants.add_arguments, ctltenants.run),
    Command("scale", ctlscale.HELP, ctlscale.add_arguments, _connected(ctlscale.cmd_scale)),
    Command("board", ctlboard.HELP, ctlboard.add_arguments, _board),
    Command("cache", ctlcache.HELP, ctlcache.add_arguments, _connected(ctlcache.cmd_cache)),
    Command("what-if", ctlwhatif.HELP, ctlwhatif.add_arguments, _recorded(ctlwhatif.run), ctlwhatif.run, _since),
    Command("tune", ctltune.HELP, ctltune.add_arguments, _recorded(ctltune.run), ctltune.run, _since),
    Command("traffic", ctltraffic.HELP, ctltraffic.add_arguments, _connected(ctltraffic.run)),
    Command("router", ctlrouter.HELP, ctlrouter.add_arguments, ctlrouter.cmd_router),
    Command("engines", ctlengines.HELP, ctlengines.add_arguments, _connected(ctlengines.cmd_engines)),
    Command("completion", "print a shell completion script", _completion_arguments, local=_completion),
)
BY_NAME = {command.name: command for command in COMMANDS}


def _common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--control-plane", default=default, help="host:port (env FERRY_CONTROL_PLANE)")
    parser.add_argument("--ready-file", default=default, help="take the control plane and token from ferry up's "
                                                              "ready file")
    parser.add_argument("--admin-token", default=default, help=f"the Admin API token (env {client.TOKEN_ENV})")
    parser.add_argument("--tls-ca", default=default, help="CA of the control plane (mutual TLS; else the ready file's)")
    parser.add_argument("--tls-cert", default=default, help="client certificate (CN admin opens the Admin API)")
    parser.add_argument("--tls-key", default=default, help="the client certificate's key")
    parser.add_argument("--json", action="store_true", default=False if top else argparse.SUPPRESS,
                        help="machine-readable output")


def build_parser() -> argparse.ArgumentParser:
    """ferryctl's parser, one subcommand per row of :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(prog="ferryctl", description="Operate a Ferry fleet.")
    _common(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        if command.remote is not None:
            p = sub.add_parser(command.name, help=command.help, description=command.help)
            _common(p, top=False)
        else:
            p = sub.add_parser(command.name, help=command.help)
        command.arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = BY_NAME[args.command]
    if command.local is not None and not command.needs_control_plane(args):
        try:
            return command.local(args)
        except UsageError as exc:
            print(f"ferryctl: {exc}", file=sys.stderr)
            return EXIT_USAGE
    assert command.remote is not None
    address = ""
    try:
        args.addresses = client.addresses(args)
        args.skipped = {}  # address -> why it was not asked
        credentials = client.credentials(args)
        for address in args.addresses:
            with clienttls.sync_channel(address, credentials) as channel:
                try:
                    command.remote(client.AdminClient(channel, client.token(args)), args)
                    return EXIT_OK
                except grpc.RpcError as exc:
                    if exc.code() not in AWAY or client.reachable(channel):
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
