"""Checks of domain values (names, addresses, registrations, reports, subscriptions), each naming the field.

Pure functions over the generated messages and :class:`ControlPlaneSettings`
bounds, called by the services and the records that take these values (the
domain checks its own input; :mod:`controlplane.api` only translates the
error to a status). Field paths follow the message structure as a proxy or agent author
reads it, e.g. ``register.replicas[2].address`` or ``subscribe.region``.

- names (node, replica id, model, proxy id): required, at most
  ``max_name_bytes`` (128) UTF-8 bytes, no whitespace or control characters;
- region: the same with ``max_region_bytes`` (64); version: ``max_version_bytes`` (64);
- address: ``host:port`` with a port in 1..65535; a replica's ``address`` may
  be empty when its ``http_address`` (OpenAI HTTP) is set, which is checked
  the same way when present; ``engine``: empty or one of :data:`ENGINES`;
- ``max_concurrency`` > 0; replica ids unique within a registration;
- at most ``max_replicas_per_node`` (64) replicas in a registration;
- a follower's report: at most ``max_agents`` nodes and ``max_watchers``
  regions, each node with at most ``max_replicas_per_node`` loads.

Cost: O(size of the message).
"""

from __future__ import annotations

from controlplane.config import ControlPlaneSettings
from ferry.errors import InvalidArgument
from ferry.grpcutil import split_address
from ferry.v1 import admin_pb2, fleet_pb2, tables_pb2

ENGINES = frozenset({"simulated", "triton", "vllm", "sglang", "trtllm"})  # ReplicaInfo.engine, when set


def check_name(value: str, field: str, max_bytes: int) -> None:
    """A required identifier: non-empty, bounded, printable without spaces."""
    if not value:
        raise InvalidArgument(field, "required")
    if len(value.encode()) > max_bytes:
        raise InvalidArgument(field, f"longer than {max_bytes} bytes")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise InvalidArgument(field, "must not contain whitespace or control characters")


def check_filter(value: str, field: str, max_bytes: int) -> None:
    """An optional filter: empty, or a valid name."""
    if value:
        check_name(value, field, max_bytes)


def check_address(value: str, field: str) -> None:
    if not value:
        raise InvalidArgument(field, "required (host:port)")
    try:
        _host, port = split_address(value)
    except ValueError as exc:
        raise InvalidArgument(field, f"{value!r} is not host:port") from exc
    if not 0 < port < 65536:
        raise InvalidArgument(field, f"port {port} out of range 1..65535")


def check_replica(info: fleet_pb2.ReplicaInfo, field: str, settings: ControlPlaneSettings,
                  known: frozenset[str] | None = None) -> None:
    """One replica's description, from a registration or a telemetry ``changed`` entry.

    With ``known`` (the catalog, when ``strict_catalog`` is on) its model must be one of them.
    """
    check_name(info.replica_id, f"{field}.replica_id", settings.max_name_bytes)
    check_name(info.model, f"{field}.model", settings.max_name_bytes)
    if known is not None and info.model not in known:
        raise InvalidArgument(f"{field}.model", f"unknown model {info.model!r}: not in the catalog ([[models]])")
    check_name(info.version, f"{field}.version", settings.max_version_bytes)
    if info.address or not info.http_address:  # a replica reached over OpenAI HTTP alone has no KServe address
        check_address(info.address, f"{field}.address")
    if info.http_address:
        check_address(info.http_address, f"{field}.http_address")
    if info.engine and info.engine not in ENGINES:
        raise InvalidArgument(f"{field}.engine", f"{info.engine!r} is not one of {', '.join(sorted(ENGINES))}")
    check_filter(info.kserve_model, f"{field}.kserve_model", settings.max_name_bytes)
    if info.max_concurrency <= 0:
        raise InvalidArgument(f"{field}.max_concurrency", "must be > 0")


def check_register(reg: fleet_pb2.Register, settings: ControlPlaneSettings,
                   known: frozenset[str] | None = None) -> None:
    check_name(reg.node, "register.node", settings.max_name_bytes)
    check_name(reg.region, "register.region", settings.max_region_bytes)
    if len(reg.replicas) > settings.max_replicas_per_node:
        raise InvalidArgument("register.replicas", f"more than {settings.max_replicas_per_node} replicas")
    if reg.standby and reg.replicas:
        raise InvalidArgument("register.standby", "a standby node registers no replica (it has no weights loaded)")
    seen: set[str] = set()
    for i, info in enumerate(reg.replicas):
        field = f"register.replicas[{i}]"
        check_replica(info, field, settings, known)
        if info.replica_id in seen:
            raise InvalidArgument(f"{field}.replica_id", f"{info.replica_id!r} appears twice")
        seen.add(info.replica_id)


def check_telemetry(telemetry: fleet_pb2.Telemetry, settings: ControlPlaneSettings,
                    known: frozenset[str] | None = None) -> None:
    """The replicas a telemetry message adds or changes; unknown ids in loads are handled by the fleet."""
    seen: set[str] = set()
    for i, info in enumerate(telemetry.changed):
        field = f"telemetry.changed[{i}]"
        check_replica(info, field, settings, known)
        if info.replica_id in seen:
            raise InvalidArgument(f"{field}.replica_id", f"{info.replica_id!r} appears twice")
        seen.add(info.replica_id)


def check_report(report: admin_pb2.FollowerReport, settings: ControlPlaneSettings) -> None:
    """A follower's report: bounded, its node and region names valid."""
    if len(report.members) > settings.max_agents:
        raise InvalidArgument("report.members", f"more than {settings.max_agents} nodes")
    if len(report.regions) > settings.max_watchers:
        raise InvalidArgument("report.regions", f"more than {settings.max_watchers} regions")
    for i, item in enumerate(report.members):
        check_name(item.node, f"report.members[{i}].node", settings.max_name_bytes)
        if len(item.loads) > settings.max_replicas_per_node:
            raise InvalidArgument(f"report.members[{i}].loads", f"more than {settings.max_replicas_per_node} replicas")
    for i, region in enumerate(report.regions):
        check_name(region, f"report.regions[{i}]", settings.max_region_bytes)
    if len(report.traffic) > settings.traffic_relay_rows:  # controlplane.traffic
        raise InvalidArgument("report.traffic", f"more than {settings.traffic_relay_rows} rows")


def check_subscribe(sub: tables_pb2.Subscribe, settings: ControlPlaneSettings) -> None:
    check_name(sub.proxy_id, "subscribe.proxy_id", settings.max_name_bytes)
    check_name(sub.region, "subscribe.region", settings.max_region_bytes)
