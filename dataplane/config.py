"""Settings of the data-plane proxy: the ``[proxy]`` section of the config file.

Read with ``ferry.config.load_file(path).section(ProxySettings, "proxy")``;
tenants and request limits come from the shared ``[[tenants]]`` and
``[limits]`` sections (:class:`ferry.config.FileConfig`). Flags override a few
fields (:func:`load`). Every field has a default, so a proxy runs without a
file; unknown keys fail at load time with their dotted name.

Defaults: region ``local``; a request without a gRPC deadline gets 300 s;
at most 4096 requests in flight per proxy (then RESOURCE_EXHAUSTED with a
retry-after of 1 s); two attempts (one retry) for the interactive tier only;
a warning when the table has not been refreshed for 10 s; telemetry older
than 1 s starts to cost score and counts as saturated at 6 s; reconnects to
the control plane back off from 0.1 s, doubling, to 5 s, with jitter.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Sequence
from pathlib import Path

from ferry.config import TIERS, FileConfig, Limits, TenantConfig, load_file
from ferry.errors import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProxySettings:
    """The ``[proxy]`` section; see the module docstring for the defaults."""

    proxy_id: str = ""  # empty: "<hostname>-<pid>" (see resolved())
    region: str = "local"
    default_deadline_seconds: float = 300.0
    max_inflight: int = 4096
    retry_after_seconds: float = 1.0
    max_attempts: int = 2
    retry_tiers: tuple[str, ...] = ("interactive",)
    allow_anonymous: bool = False  # serve requests without a key as tenant "anonymous" (local use only)
    table_stale_warn_seconds: float = 10.0
    telemetry_fresh_seconds: float = 1.0
    telemetry_stale_seconds: float = 6.0
    reconnect_initial_seconds: float = 0.1
    reconnect_max_seconds: float = 5.0
    max_table_replicas: int = 100_000
    max_table_models: int = 10_000

    def __post_init__(self) -> None:
        positive = {
            "default_deadline_seconds": self.default_deadline_seconds,
            "max_inflight": self.max_inflight,
            "retry_after_seconds": self.retry_after_seconds,
            "max_attempts": self.max_attempts,
            "table_stale_warn_seconds": self.table_stale_warn_seconds,
            "reconnect_initial_seconds": self.reconnect_initial_seconds,
            "reconnect_max_seconds": self.reconnect_max_seconds,
            "max_table_replicas": self.max_table_replicas,
            "max_table_models": self.max_table_models,
        }
        for key, value in positive.items():
            if not value > 0:  # also rejects NaN
                raise ConfigError(f"proxy.{key}", "must be positive")
        if not 0 <= self.telemetry_fresh_seconds < self.telemetry_stale_seconds:
            raise ConfigError("proxy.telemetry_stale_seconds", "must exceed telemetry_fresh_seconds (>= 0)")
        if self.reconnect_max_seconds < self.reconnect_initial_seconds:
            raise ConfigError("proxy.reconnect_max_seconds", "must be at least reconnect_initial_seconds")
        for tier in self.retry_tiers:
            if tier not in TIERS:
                raise ConfigError("proxy.retry_tiers", f"unknown tier {tier!r} (known: {', '.join(TIERS)})")
        if not self.region:
            raise ConfigError("proxy.region", "must not be empty")

    def resolved(self) -> ProxySettings:
        """These settings with an empty ``proxy_id`` replaced by ``<hostname>-<pid>``."""
        if self.proxy_id:
            return self
        return dataclasses.replace(self, proxy_id=f"{socket.gethostname()}-{os.getpid()}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProxyConfig:
    """Everything a proxy reads from its config file, flags applied."""

    settings: ProxySettings
    tenants: tuple[TenantConfig, ...]
    limits: Limits


def load(
    path: str | Path | None,
    *,
    region: str | None = None,
    proxy_id: str | None = None,
) -> ProxyConfig:
    """Read the config file (None: defaults) and apply the flag overrides; raises ConfigError."""
    file: FileConfig = load_file(path)
    settings = file.section(ProxySettings, "proxy")
    if region:
        settings = dataclasses.replace(settings, region=region)
    if proxy_id:
        settings = dataclasses.replace(settings, proxy_id=proxy_id)
    return ProxyConfig(settings=settings.resolved(), tenants=file.tenants, limits=file.limits)


def parse_addresses(value: str | Sequence[str]) -> tuple[str, ...]:
    """``HOST:PORT[,HOST:PORT…]`` (or a list of them) to a tuple; raises ConfigError naming the bad one."""
    items = value.split(",") if isinstance(value, str) else list(value)
    out: list[str] = []
    for raw in items:
        address = raw.strip()
        if not address:
            continue
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError("control_plane", f"address {address!r}: expected host:port")
        out.append(address)
    return tuple(out)
