"""The ``ferry`` command: runs components, the whole system, or one call.

``ferry up`` runs everything on one machine (see :mod:`ferry_cli.up.main`);
``ferry call`` sends one request; ``ferry controlplane``, ``ferry proxy``, ``ferry picker``, ``ferry envoy``,
``ferry node`` and ``ferry batch-runtime`` run one component each and forward
their arguments to the component's own ``main``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMPONENTS = {  # command: (module whose main runs it, help, arguments before and after the user's)
    "controlplane": ("controlplane.main", "the control plane: fleet membership, tables, Admin API", (), ()),
    "proxy": ("dataplane.main", "a data-plane proxy: the public Inference API", (), ()),
    "envoy": ("dataplane.envoy.main", "Envoy as the data plane, asking the pickers where each request goes", (), ()),
    # One process per picker, so that Envoy's ext_proc cluster holds several and one that dies takes only itself
    # out: the proxy's config, flags, table watch, ready file (with "picker"), readiness and drain.
    "picker": ("dataplane.main", "an endpoint picker: Envoy's external processor deciding each request",
               ("--picker",), ("--workers", "1")),
    "node": ("agent.main", "a node: its agent and simulated replicas", (), ()),
    "batch-runtime": ("agent.batch.main", "the fixed-batch runtime (a KServe v2 server)", (), ()),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "node":  # its simulated replicas also speak the peers' HTTP APIs (test scaffolding)
        from agent.main import main as node
        from tools.peers.replicaface import HttpFace

        return node(argv[1:], face=HttpFace)
    if argv and argv[0] in COMPONENTS:
        name, _text, before, after = COMPONENTS[argv[0]]
        return int(importlib.import_module(name).main([*before, *argv[1:], *after]))
    parser = argparse.ArgumentParser(prog="ferry", description="Ferry, an inference router for GPU fleets.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    from ferry_cli import call
    from ferry_cli.up import main as up

    up.add_arguments(sub.add_parser("up", help="run the whole system on this machine"))
    call.add_arguments(sub.add_parser("call", help="send one request to a data plane"))
    for name, (_module, text, _before, _after) in COMPONENTS.items():
        sub.add_parser(name, help=text, add_help=False)
    args = parser.parse_args(argv)
    if args.command == "up":
        return up.run(args)
    return call.run(args)


if __name__ == "__main__":
    sys.exit(main())
