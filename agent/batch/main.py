"""``ferry batch-runtime``: serve a fixed-batch function as a KServe v2 replica.

Hosts ``--function module:function`` (default the reference ``batchstring``)
as ``--model`` with its contract (``--max-batch``, ``--gpus-per-batch``,
``--batch-ms``) on a node of ``--gpus`` simulated GPUs. ``max_wait`` is
derived from ``--budget-ms`` (see :mod:`agent.batch.budget`) unless
``--max-wait-ms`` overrides it. ``--gang-model NAME`` also hosts the same
function as a model that needs all the node's GPUs per batch, so one node
serves a small and a large model. Writes ``--ready-file`` as JSON
``{"address", "metrics", "pid", "models"}`` once it serves; stops cleanly on
SIGTERM and SIGINT. ``--tls-ca``/``--tls-cert``/``--tls-key`` serve mutual TLS
(callers show a certificate of the CA), ``--insecure`` plain text; one is required.

This runs the runtime alone, reachable by address. To put it behind the
proxy, run it inside a node instead: ``ferry node --batch-runtime`` takes the
same flags with a ``batch-`` prefix and registers the models with the
control plane (:mod:`agent.main`, docs/batch.md).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from agent.batch.host import HostedRuntime, RuntimeSpec, add_arguments, spec_from_args
from ferry import logs, tls
from ferry.errors import ConfigError
from ferry.grpcutil import split_address
from ferry.process import stop_event, write_ready_file
from ferry.tls import TLSConfig

log = logging.getLogger("ferry.batch")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ferry batch-runtime", description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:0", help="KServe gRPC address (default %(default)s)")
    p.add_argument("--metrics-listen", default="127.0.0.1:0", help="Prometheus address (default %(default)s)")
    p.add_argument("--ready-file", help="write the bound addresses here as JSON once serving")
    p.add_argument("--gpus", type=int, default=8, help="the node's GPUs (default %(default)s)")
    add_arguments(p)
    tls.add_arguments(p)
    logs.add_argument(p)
    return p


async def run(spec: RuntimeSpec, args: argparse.Namespace, transport: TLSConfig | None = None) -> int:
    host, port = split_address(args.listen)
    metrics_host, metrics_port = split_address(args.metrics_listen)
    if metrics_host != host:
        raise ConfigError("metrics_listen", f"must be on the host of --listen ({host})")
    stop = stop_event()
    hosted = await HostedRuntime.start(spec, host=host, port=port, metrics_port=metrics_port, tls=transport)
    try:
        write_ready_file(args.ready_file, {"address": hosted.address, "metrics": hosted.metrics_address,
                                           "pid": os.getpid(), "models": hosted.runtime.models})
        log.info("batch runtime serving %s on %s (max_wait %.1f ms)", hosted.runtime.models, hosted.address,
                 spec.contracts()[0].max_wait_s * 1e3)
        await stop.wait()
    finally:
        await hosted.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(logging.INFO, args.log_format)
    try:
        spec = spec_from_args(args, gpus=args.gpus)
        transport = tls.from_args(args)
        return asyncio.run(run(spec, args, transport))
    except (ConfigError, ValueError) as exc:
        print(f"ferry batch-runtime: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
