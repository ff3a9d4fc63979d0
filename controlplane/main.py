"""``ferry controlplane``: run one control plane until SIGTERM or SIGINT.

Flags: ``--listen`` (gRPC, default 127.0.0.1:0), ``--metrics-listen``
(Prometheus, default 127.0.0.1:0), ``--ready-file`` (JSON ``{"grpc",
"metrics", "pid", "id"}`` written atomically once it serves),
``--config`` (TOML: the ``[controlplane]`` section, the ``[[models]]``
catalog and the ``[[tenants]]`` seeded into an empty store, :mod:`controlplane.api.tenants`),
``--id`` (overrides ``controlplane.id``; every control plane on one store needs its own),
``--store`` (``memory://``, the default: the embedded store, one control plane alone;
or ``etcd://host:port``: the fleet's state in etcd, and an election among every control plane on it),
``--admin-token-file`` (a file holding the Admin API's token; else env ``FERRY_ADMIN_TOKEN``, else
``controlplane.admin_token_sha256``: see :mod:`controlplane.api.auth`;
without any, every Admin call is refused), ``--join-token-file`` (the agents'
join token; else env ``FERRY_JOIN_TOKEN``, else ``controlplane.join_token_sha256``:
see :mod:`controlplane.api.join`), and either ``--tls-ca``, ``--tls-cert``,
``--tls-key`` (mutual TLS on the port and to the leader) or ``--insecure``
(plain text; with neither it refuses to start, exit 2). On SIGTERM or SIGINT its gRPC health turns NOT_SERVING,
it serves on for ``controlplane.drain_delay_seconds``, then stops with
``drain_grace_seconds`` for calls in flight; its health is SERVING only while
its store answers and a leader is known (:mod:`controlplane.server`). Exit codes: 0 after
a clean stop, 2 for a bad config or flag, 1 when it cannot start (the store
did not answer within ``store_timeout_seconds``, or the port is taken).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys

from prometheus_client import REGISTRY

from controlplane.api import auth as adminauth
from controlplane.api import join
from controlplane.api.auth import AdminAuth
from controlplane.api.join import JoinCheck
from controlplane.config import ControlPlaneSettings
from controlplane.server import ControlPlane
from controlplane.services.scaling import ScalingSettings
from controlplane.store.etcd import EtcdStore, parse_endpoint
from ferry import logs, tls
from ferry.config import ModelConfig, TenantConfig, load_file
from ferry.errors import ConfigError, FerryError
from ferry.metrics import start_metrics_server
from ferry.process import stop_event, write_ready_file
from ferry.tls import TLSConfig

log = logging.getLogger("controlplane")

MEMORY = ("memory://", "memory", "")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ferry controlplane", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:0", help="gRPC address host:port (default %(default)s)")
    parser.add_argument("--advertise", default="",
                        help="host:port the other control planes reach this one at (default: the --listen host and "
                             "the bound port); set it when listening on 0.0.0.0")
    parser.add_argument("--metrics-listen", default="127.0.0.1:0", help="metrics address host:port")
    parser.add_argument("--ready-file", default=None, help="write {grpc, metrics, pid, id} here once serving")
    parser.add_argument("--config", default=None, help="TOML config file")
    parser.add_argument("--id", default=None, help="this control plane's id (default: controlplane.id)")
    parser.add_argument("--store", default="memory://", help="memory:// (default) or etcd://host:port")
    parser.add_argument("--admin-token-file", default=None,
                        help="file holding the Admin API token (else env FERRY_ADMIN_TOKEN, else the config's hash)")
    parser.add_argument("--join-token-file", default=None,
                        help="file holding the agents' join token (else env FERRY_JOIN_TOKEN, else the config's hash)")
    parser.add_argument("--traffic-dir", default=None,
                        help="keep the recorded traffic here (default: controlplane.traffic_dir; empty: in memory)")
    parser.add_argument("--log-level", default="INFO", help="logging level (default %(default)s)")
    logs.add_argument(parser)
    tls.add_arguments(parser)
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace, settings: ControlPlaneSettings, catalog: tuple[ModelConfig, ...],
                admin_auth: AdminAuth | None = None, transport: TLSConfig | None = None,
                joining: JoinCheck | None = None, tenants: tuple[TenantConfig, ...] = (),
                scaling: ScalingSettings | None = None) -> int:
    stop = stop_event()
    store = open_store(args.store, settings)
    cp = ControlPlane(settings, catalog=catalog, registry=REGISTRY, store=store, elect=isinstance(store, EtcdStore),
                      admin_auth=admin_auth, tls=transport, join_check=joining, tenants=tenants, scaling=scaling)
    try:
        port = await cp.start(args.listen, advertise=args.advertise)
    except (OSError, FerryError) as exc:
        log.error("cannot start: %s", exc)
        if store is not None:
            await store.close()
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
        times = settings.drain()
        log.info("draining: NOT_SERVING, serving %g s more, then %g s for calls in flight", times.delay, times.grace)
        await cp.drain(times)
    finally:
        await cp.stop()  # after drain(), nothing left to stop
        if store is not None:
            await store.close()
    return 0


def check_store_url(url: str) -> None:
    """``memory://`` or ``etcd://host:port``; ConfigError naming ``--store`` otherwise."""
    if url in MEMORY:
        return
    try:
        if not url.startswith("etcd://"):
            raise ValueError(url)
        parse_endpoint(url)
    except ValueError as exc:
        raise ConfigError("--store", f"{url!r}: expected memory:// or etcd://host:port[,host:port...] ({exc})") from exc


def open_store(url: str, settings: ControlPlaneSettings) -> EtcdStore | None:
    """The store named by ``--store``: None for ``memory://`` (the control plane makes its own); etcd with the
    ``store_*`` keys' TLS and user (ConfigError naming the key)."""
    if url in MEMORY:
        return None
    return EtcdStore(url, timeout=settings.store_timeout_seconds, access=settings.store_access())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    try:
        config = load_file(args.config)
        settings = config.section(ControlPlaneSettings, "controlplane")
        scaling = config.section(ScalingSettings, "scaling")  # the scaling plan's targets (controlplane.scaling)
        if args.id is not None:
            settings = dataclasses.replace(settings, id=args.id)
        if args.traffic_dir is not None:  # the recorded traffic's segments (controlplane.traffic)
            settings = dataclasses.replace(settings, traffic_dir=args.traffic_dir)
        check_store_url(args.store)
        if args.store not in MEMORY:
            settings.store_access()  # the store_* keys' files and password, refused here naming the key
        admin_auth = adminauth.load(settings.admin_token_sha256, args.admin_token_file)
        transport = tls.from_args(args)
        joining = join.load(settings.join_token_sha256, args.join_token_file, mutual_tls=transport is not None)
    except ConfigError as exc:
        print(f"ferry controlplane: {exc}", file=sys.stderr)
        return 2
    if not admin_auth.sha256:
        log.warning("no admin token (--admin-token-file, FERRY_ADMIN_TOKEN or controlplane.admin_token_sha256): "
                    "the Admin API refuses every call")
    elif admin_auth.token is None and args.store not in MEMORY:
        log.warning("only the admin token's sha256 is known: this control plane cannot follow a leader "
                    "(Admin.Follow needs the token itself: --admin-token-file or FERRY_ADMIN_TOKEN)")
    if joining.open:
        log.warning("no join token (--join-token-file, FERRY_JOIN_TOKEN or controlplane.join_token_sha256) and "
                    "no mutual TLS: any agent may register")
    return asyncio.run(serve(args, settings, config.models, admin_auth, transport, joining, config.tenants,
                             scaling))


if __name__ == "__main__":
    sys.exit(main())
