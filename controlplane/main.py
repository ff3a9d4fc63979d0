"""``ferry controlplane``: run one control plane until SIGTERM or SIGINT.

Flags: ``--listen`` (gRPC, default 127.0.0.1:0), ``--metrics-listen``
(Prometheus, default 127.0.0.1:0), ``--ready-file`` (JSON ``{"grpc",
"metrics", "pid", "id"}`` written atomically once it serves),
``--config`` (TOML: the ``[controlplane]`` section and the ``[[models]]``
catalog), ``--id`` (overrides ``controlplane.id``). Exit codes: 0 after a
clean stop, 2 for a bad config or flag, 1 when it cannot start.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys

from prometheus_client import REGISTRY

from controlplane.config import ControlPlaneSettings
from controlplane.server import ControlPlane
from ferry.config import ModelConfig, load_file
from ferry.errors import ConfigError, FerryError
from ferry.metrics import start_metrics_server
from ferry.process import stop_event, write_ready_file

log = logging.getLogger("controlplane")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ferry controlplane", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:0", help="gRPC address host:port (default %(default)s)")
    parser.add_argument("--metrics-listen", default="127.0.0.1:0", help="metrics address host:port")
    parser.add_argument("--ready-file", default=None, help="write {grpc, metrics, pid, id} here once serving")
    parser.add_argument("--config", default=None, help="TOML config file")
    parser.add_argument("--id", default=None, help="this control plane's id (default: controlplane.id)")
    parser.add_argument("--log-level", default="INFO", help="logging level (default %(default)s)")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace, settings: ControlPlaneSettings, catalog: tuple[ModelConfig, ...]) -> int:
    stop = stop_event()
    cp = ControlPlane(settings, catalog=catalog, registry=REGISTRY)
    try:
        port = await cp.start(args.listen)
    except (OSError, FerryError) as exc:
        log.error("cannot start: %s", exc)
        return 1
    try:
        host = args.listen.rpartition(":")[0]
        metrics_port = start_metrics_server(args.metrics_listen)
        metrics_host = args.metrics_listen.rpartition(":")[0]
        write_ready_file(args.ready_file, {
            "grpc": f"{host}:{port}", "metrics": f"{metrics_host}:{metrics_port}", "pid": os.getpid(),
            "id": settings.id,
        })
        log.info("control plane %s serving on %s:%d", settings.id, host, port)
        await stop.wait()
        log.info("stopping")
    finally:
        await cp.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_file(args.config)
        settings = config.section(ControlPlaneSettings, "controlplane")
        if args.id is not None:
            settings = dataclasses.replace(settings, id=args.id)
    except ConfigError as exc:
        print(f"ferry controlplane: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(serve(args, settings, config.models))


if __name__ == "__main__":
    sys.exit(main())
