"""``ferry proxy``: run one data-plane proxy until SIGTERM or SIGINT.

Flags (every address ``host:port``, port 0 for any free one):

- ``--listen`` (default ``127.0.0.1:0``): the public Inference API;
- ``--http-listen`` (default ``[proxy] http_listen``, else none): the
  OpenAI-compatible HTTP API (:mod:`dataplane.api.http`);
- ``--metrics-listen`` (default ``127.0.0.1:0``): Prometheus ``/metrics``;
- ``--ready-file PATH``: written once serving, as
  ``{"grpc", "metrics", "pid", "proxy_id", "region"}``, plus ``"http"`` when
  the HTTP API serves (docs/CONTRACTS.md);
- ``--control-plane HOST:PORT[,HOST:PORT…]``: where to watch the table;
- ``--region`` (default from the config, ``local``), ``--id`` (default
  ``<hostname>-<pid>``), ``--config PATH`` (TOML; see ferry.config);
- ``--tls-ca``, ``--tls-cert``, ``--tls-key`` (TLS on the public port, mutual
  TLS to the control planes and replicas; ``--replica-plaintext`` keeps the
  replicas in plain text) or ``--insecure``: one of them is required;
- ``--picker``: also serve Envoy's ``ExternalProcessor`` on the same port, the
  endpoint picker Envoy asks per request (:mod:`dataplane.epp`); the ready
  file then adds ``"picker"``;
- ``--workers N`` (default: the cores this process may use, within a
  container's CPU quota): N proxy processes on the
  same ports, each with its own table watch and id ``{id}-{k}``, supervised
  (:mod:`dataplane.workers`, whose ready file adds ``workers``); 1 runs the
  proxy in this process.

On SIGTERM or SIGINT it drains (:meth:`dataplane.server.Proxy.drain`): gRPC
health NOT_SERVING at once, requests still served for ``[proxy]
drain_delay_seconds``, then no new request on either front door and those in
flight given ``drain_grace_seconds``. Its health is NOT_SERVING until the
first table is applied.

Exit status: 0 after a clean stop, 2 on a config or flag error.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from dataplane import workers
from dataplane.config import ProxyConfig, load, parse_addresses
from dataplane.server import Proxy
from ferry import logs, tls
from ferry.config import ModelConfig
from ferry.errors import ConfigError
from ferry.metrics import start_metrics_server
from ferry.process import stop_event, write_ready_file
from ferry.tls import TLSConfig
from ferry.tokens import Tokenizers

log = logging.getLogger("ferry.proxy")


def parser() -> argparse.ArgumentParser:
    """The flags of ``ferry proxy``."""
    p = argparse.ArgumentParser(prog="ferry proxy", description="Run a Ferry data-plane proxy.")
    p.add_argument("--listen", default="127.0.0.1:0", help="host:port of the Inference API (default %(default)s)")
    p.add_argument("--http-listen", default=None,
                   help="host:port of the OpenAI-compatible HTTP API (default: [proxy] http_listen, else none)")
    p.add_argument("--metrics-listen", default="127.0.0.1:0", help="host:port of /metrics (default %(default)s)")
    p.add_argument("--ready-file", default=None, help="write the bound addresses here as JSON once serving")
    p.add_argument("--control-plane", default="", help="HOST:PORT[,HOST:PORT...] of the control planes")
    p.add_argument("--region", default=None, help="the proxy's region (default: config, else 'local')")
    p.add_argument("--config", default=None, help="TOML config file (tenants, limits, [proxy])")
    logs.add_argument(p)
    p.add_argument("--id", dest="proxy_id", default=None, help="proxy id (default: hostname-pid)")
    p.add_argument("--workers", type=int, default=workers.default_workers(),
                   help="proxy processes sharing the ports with SO_REUSEPORT (dataplane.workers; "
                        "default: the cores usable, within the CPU quota: %(default)s here)")
    p.add_argument("--picker", action="store_true",
                   help="also serve Envoy's ExternalProcessor on the --listen port: the endpoint picker "
                        "(dataplane.epp; `ferry picker` is this flag with one worker)")
    p.add_argument("--picker-end", default=None,
                   help="how the picker hears a request ended: report (Envoy's access-log reports) or stream "
                        "(the processor stream's end: a Gateway's Envoy); default [proxy] picker_end, else report")
    p.add_argument("--replica-plaintext", action="store_true",
                   help="with TLS, still reach the replicas in plain text (replicas that serve no TLS)")
    tls.add_arguments(p)
    return p


def load_tokenizers(models: Sequence[ModelConfig]) -> Tokenizers:
    """Each catalog model's ``tokenizer`` file (ferry.tokens); raises ConfigError naming the model at fault."""
    try:
        return Tokenizers.load((m.name, m.tokenizer) for m in models)
    except ValueError as exc:
        raise ConfigError("models.tokenizer", str(exc)) from exc


async def serve(config: ProxyConfig, args: argparse.Namespace, control_planes: tuple[str, ...],
                transport: TLSConfig | None = None, tokenizers: Tokenizers | None = None) -> int:
    """Start the proxy and its metrics server, write the ready file, wait for a stop signal."""
    stop = stop_event()
    proxy = Proxy(
        settings=config.settings, tenants=config.tenants, limits=config.limits, control_planes=control_planes,
        tls=transport, replica_tls=not args.replica_plaintext, tokenizers=tokenizers, models=config.models,
        guardrails=config.guardrails,
    )
    port = await proxy.start(args.listen, picker=args.picker)
    http_listen = args.http_listen if args.http_listen is not None else config.settings.http.http_listen
    http_port = await proxy.start_http(http_listen) if http_listen else 0
    metrics_port = start_metrics_server(args.metrics_listen)
    host = args.listen.rpartition(":")[0]
    metrics_host = args.metrics_listen.rpartition(":")[0]
    settings = config.settings
    addresses = {"http": f"{http_listen.rpartition(':')[0]}:{http_port}"} if http_listen else {}
    write_ready_file(args.ready_file, {
        "grpc": f"{host}:{port}",
        **addresses,
        "metrics": f"{metrics_host}:{metrics_port}",
        "pid": os.getpid(),
        "proxy_id": settings.proxy_id,
        "region": settings.region,
        **({"picker": f"{host}:{port}"} if args.picker else {}),
    })
    log.info("proxy %s serving region %s on %s:%d", settings.proxy_id, settings.region, host, port)
    if not control_planes:
        log.warning("no --control-plane given: no table will arrive and requests get UNAVAILABLE")
    await stop.wait()
    times = settings.server.drain()
    log.info("proxy %s draining: NOT_SERVING, serving %g s more, then %g s for calls in flight",
             settings.proxy_id, times.delay, times.grace)
    await proxy.drain(times)
    log.info("proxy %s stopped", settings.proxy_id)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``ferry proxy``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    logs.configure(logging.INFO, args.log_format)
    try:
        config = load(args.config, region=args.region, proxy_id=args.proxy_id, picker_end=args.picker_end)
        control_planes = parse_addresses(args.control_plane)
        checked = [("--listen", args.listen), ("--metrics-listen", args.metrics_listen)]
        if args.http_listen or config.settings.http.http_listen:
            checked.append(("--http-listen", args.http_listen or config.settings.http.http_listen))
        for flag, value in checked:
            host, sep, port = value.rpartition(":")
            if not sep or not host or not port.isdigit() or int(port) > 65535:
                raise ConfigError(flag, f"address {value!r}: expected host:port (port 0 for any)")
        transport = tls.from_args(args)
        tokenizers = load_tokenizers(config.models)
        if not 1 <= args.workers <= workers.MAX_WORKERS:
            raise ConfigError("--workers", f"must be 1 to {workers.MAX_WORKERS}")
    except ConfigError as exc:
        print(f"ferry proxy: {exc}", file=sys.stderr)
        return 2
    if args.workers > 1:
        return workers.run(argv, args, config, args.workers)
    for model, tokenizer in tokenizers.names().items():
        log.info("model %s counts tokens with %s", model, tokenizer)
    return asyncio.run(serve(config, args, control_planes, transport, tokenizers))


if __name__ == "__main__":
    sys.exit(main())
