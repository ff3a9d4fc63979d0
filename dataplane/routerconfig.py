"""The router config a proxy runs: its file's ``[proxy]`` section, or the version the table assigns it.

The table carries the router config versions of its region
(``TableSnapshot.router_configs``: version, TOML text, digest), the proxies
that run another than the default (``router_assignments``) and the default
(``router_default``; 0: each proxy's own file). After each table applied,
:meth:`RouterConfigs.follow` finds this proxy's version; when it is not the
one running, it lays the version's keys over the file's settings
(:func:`overlay`: :func:`ferry.routerconfig.parse`, then each part rebuilt
with its own checks, so a bad value is refused naming ``proxy.<key>``) and
calls :meth:`dataplane.router.Router.reconfigure` between two requests: no
request is dropped, no state is lost. A refused version is remembered (the
last one only) so later tables do not parse it again; the proxy keeps
running what it ran. What the table watch acks
(``Ack.router_version``, ``router_refused``, ``router_error``) is the
triple :meth:`follow` returns.

The usage window is told the version in force (:meth:`dataplane.usage.UsageWindow.router`),
so the control plane compares windows of one config each.

Cost: nothing per request; per table, a scan of the assignments (a handful)
and, on a change only, one TOML parse and a settings rebuild.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from dataplane.config import ProxySettings, _owners, _parts
from ferry.config import from_mapping
from ferry.errors import ConfigError
from ferry.logs import event
from ferry.routerconfig import digest, parse
from ferry.v1 import tables_pb2

log = logging.getLogger("ferry.proxy.router")


def overlay(base: ProxySettings, values: Mapping[str, Any]) -> ProxySettings:
    """``base`` with the live keys ``values`` laid over it; raises ConfigError naming ``proxy.<key>``."""
    owners, parts = _owners(), _parts()
    by_part: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        by_part.setdefault(owners[key], {})[key] = value
    changed: dict[str, Any] = {}
    for part, given in by_part.items():
        current = getattr(base, part)
        merged = {f.name: getattr(current, f.name) for f in dataclasses.fields(current)}
        merged.update(given)
        changed[part] = from_mapping(parts[part], merged, "proxy")
    settings = dataclasses.replace(base, **changed)
    settings.outliers.params()  # the outlier detector's own checks (naming proxy.outlier)
    settings.retries.budget()
    return settings


def settings_for(base: ProxySettings, text: str) -> ProxySettings:
    """The settings a config version's ``text`` makes of the file's ``base``; raises ConfigError."""
    return overlay(base, parse(text))


class RouterConfigs:
    """Which router config version this proxy runs, and the switch between them (see the module docstring)."""

    def __init__(self, file: ProxySettings, apply: Callable[[ProxySettings], None], *,
                 on_version: Callable[[int], None] | None = None) -> None:
        self.file = file  # version 0
        self._apply = apply
        self._on_version = on_version
        self.version = 0
        self.refused: tuple[int, str] | None = None  # the last version refused and why

    def assigned(self, snapshot: tables_pb2.TableSnapshot, proxy_id: str) -> int:
        """The version ``snapshot`` assigns ``proxy_id``."""
        for assignment in snapshot.router_assignments:
            if assignment.proxy_id == proxy_id:
                return int(assignment.version)
        return int(snapshot.router_default)

    def follow(self, snapshot: tables_pb2.TableSnapshot, proxy_id: str) -> tuple[int, int, str]:
        """Run the version ``snapshot`` assigns; returns (version running, version refused or 0, why)."""
        wanted = self.assigned(snapshot, proxy_id)
        if wanted == self.version:
            return self.version, 0, ""
        if self.refused is not None and wanted == self.refused[0]:
            return self.version, wanted, self.refused[1]
        try:
            settings = self._settings(snapshot, wanted)
        except ConfigError as exc:
            self.refused = (wanted, str(exc))
            event(log, "router_config_refused", logging.WARNING, version=wanted, running=self.version,
                  reason=str(exc))
            return self.version, wanted, str(exc)
        self._apply(settings)
        event(log, "router_config_applied", version=wanted, previous=self.version)
        self.version = wanted
        if self._on_version is not None:
            self._on_version(wanted)
        return self.version, 0, ""

    def _settings(self, snapshot: tables_pb2.TableSnapshot, version: int) -> ProxySettings:
        if version == 0:
            return self.file
        for config in snapshot.router_configs:
            if config.version == version:
                if config.digest and digest(config.text) != config.digest:
                    raise ConfigError("router.digest", f"version {version}: the text does not match its digest")
                return settings_for(self.file, config.text)
        raise ConfigError("router.version", f"version {version} is assigned but not in the table")
