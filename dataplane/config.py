"""Settings of the data-plane proxy: the ``[proxy]`` section of the config file, one part per component.

The section's keys are flat (``max_inflight``, ``queue_bounds``, …); each
belongs to the narrow frozen part of the component that reads it, and
:class:`ProxySettings` composes the parts with the proxy's id and region:

- ``server`` (:class:`ServerSettings`): the router's request bounds;
- ``queues`` (:class:`dataplane.admission.settings.QueueSettings`): the tier queues and their admission,
  tenant ceilings and shards (:class:`dataplane.admission.gate.Admission`);
- ``pick`` (:class:`PickSettings`, :mod:`dataplane.pick.settings`): the decision
  (:meth:`dataplane.pick.state.PickState.from_settings`);
- ``outliers`` (:class:`OutlierSettings`): outlier ejection;
- ``retries`` (:class:`dataplane.failover.settings.RetrySettings`): retries, the retry budget and
  stream continuation (:class:`dataplane.failover.recover.Failover`);
- ``regions`` (:class:`dataplane.regions.settings.RegionSettings`): spill to other regions;
- ``coldstart`` (:class:`dataplane.admission.settings.ColdStartSettings`):
  :class:`dataplane.admission.coldwait.ColdStarts`;
- ``idempotency`` (:class:`IdempotencySettings`);
- ``table`` (:class:`dataplane.table.settings.TableSettings`): the table holder's bounds and ring;
- ``watch`` (:class:`dataplane.table.settings.WatchSettings`): the table watch and its usage reports;
- ``http`` (:class:`HttpSettings`): the OpenAI-compatible HTTP front door
  (:mod:`dataplane.api.http`), off unless ``http_listen`` is set;
- ``cache`` (:class:`dataplane.cache.settings.CacheSettings`): the duplicate measurement and the
  response cache (:mod:`dataplane.cache`);
- ``picker`` (:class:`PickerSettings`): the endpoint picker that Envoy asks
  per request (:mod:`dataplane.epp`): fallbacks (2) and the body buffered.
- ``tracing`` (:class:`dataplane.tracing.TraceSettings`): request traces exported over OTLP
  (:mod:`dataplane.tracing`), off unless ``trace_endpoint`` is set.
- ``record`` (:class:`dataplane.record.settings.RecordSettings`): the traffic recorder
  (:mod:`dataplane.record`): ``record_rate`` (1.0) of the requests, at most
  ``record_max_rows`` (20,000) waiting, ``record_report_rows`` (2,000) per usage report.

Each part is declared beside the component it configures (``settings.py`` of
its package; the trace settings in :mod:`dataplane.tracing`), so that no
component imports this module: it is the composition, above them all. The
server's, the pick's, the idempotency keys', the HTTP front door's and the
endpoint picker's parts are declared here.

Read with :func:`load`, or ``ProxySettings.from_section(mapping)`` (each key
routed to the part with a field of its name, values validated as
:func:`ferry.config.from_mapping` does); each part checks its own keys and
raises ConfigError naming ``proxy.<key>``. Code reads the parts
(``settings.queues.queue_bounds``); a flat read (``settings.queue_bounds``)
still works at run time for callers of the flat settings, unseen by the
type checker. Tenants and request limits come from the shared ``[[tenants]]`` and
``[limits]`` sections (:class:`ferry.config.FileConfig`). Flags override a few
fields (:func:`load`). Every field has a default, so a proxy runs without a
file; unknown keys fail at load time with their dotted name.

Defaults: region ``local``; on SIGTERM the proxy's health turns NOT_SERVING,
it serves on for ``drain_delay_seconds`` (0), then takes no new request and
lets those in flight finish within ``drain_grace_seconds`` (60 s)
(:mod:`ferry.readiness`); a request without a gRPC deadline gets 300 s; a
stream whose client has not taken a chunk for ``stream_unread_timeout_seconds``
(30 s) ends RESOURCE_EXHAUSTED, cancelled upstream (:mod:`dataplane.api.service`);
the allocator trimmed once RSS grew by ``memory_trim_growth_mib`` (32; 0: off)
since the last trim, checked every second (:mod:`dataplane.memory`);
at most 4096 requests in flight per proxy (then RESOURCE_EXHAUSTED with a
retry-after of 1 s); two attempts (one retry) for the interactive tier only,
retries within a budget of 10 % of requests plus 10 a second (10 s window), a
stream cut mid-way continued on another replica at most twice; outlier
ejection after 5 failures in a row or 5x the peers' decode or prefill rate, for 2 s
doubling to 60 s, at most 10 % of a model's replicas (at least one); a
replica that refused a connection out of the pick at once, until a table
carries newer telemetry for it or ``unreachable_probe_seconds`` (5 s,
doubling to ``unreachable_max_probe_seconds``, 60 s) pass
(:mod:`dataplane.pick.unreachable`); a request that never reached a replica,
or whose connection broke before any output, retried in every tier;
a warning when the table has not been refreshed for 10 s; telemetry older
than 1 s starts to cost score and counts as saturated at 6 s; reconnects to
the control plane back off from 0.1 s, doubling, to 5 s, with jitter.

The decision (:mod:`dataplane.pick.decide`): prefix keys at depths 1, 2, 4, 8 and 16
blocks of 512 tokens (``prefix_depths``); a hot-prefix sketch of 256 keys
decayed every 1,024 requests; a ring with load factor 1.25 and 128 points
per replica (the table's ring parameters override both), its key shares
from loads smoothed over 10 s; a walk of at most 8 replicas; 65,536 keys
remembered with their replica (``placements``); a new key placed on the
least busy of its walk's first four replicas when that saves 3 x the learned
advantage x the mean prompt of backlog (``place_factor``); a detour factor
of 24 (:mod:`dataplane.pick.state`). Region spill (:mod:`dataplane.regions.choice`): an
interactive request the weights keep home spills on queue when it would
wait here more than ``spill_queue_ms`` (100 ms) and the round trip; no
spill on queue fills more than ``spill_headroom`` (1.25) times the target's slots.

Admission (:mod:`dataplane.admission.queues`, :mod:`dataplane.admission.gate`): tier queues
bounded at 256 / 512 / 4,096 (interactive / standard / batch) and 8,192 per
model, queue timeouts 2 / 10 / 60 s, reserved shares 0.7 / 0.2 / 0.1 until a
table brings the control plane's, free plans limited to half a queue, DRR
quantum 512 tokens; lower tiers leave the interactive dispatch rate x
``interactive_headroom_seconds`` (0.2 s) slots free, at most
``interactive_headroom_max_share`` (0.1) of them; a tenant runs at most
``tenant_ceiling`` (1.0) x its weighted share of its tier; a tenant left at
that ceiling with work waiting is confined to whole replicas of its own, the
others kept off them, on at most ``tenant_shard_max_share`` (0.5; 0 turns it
off) of the replicas, for ``tenant_shard_hold_seconds`` (1 s) after it was last
seen heavy (:mod:`dataplane.admission.sharding`); ``interactive_replica_share`` (0: off) of each
model's replicas (whole, rounded down, at least one left) run interactive work
only (:mod:`dataplane.admission.avoid`; set it alike on every proxy); the proxy dispatches
``admission_capacity_share`` (1.0)
of the replicas' concurrency; idempotency keys kept 300 s, 10,000 at most.

Cold start (:mod:`dataplane.admission.coldstart`): a replica is expected to warm up in
``coldstart_warmup_seconds`` (30 s); a request for a version with replicas
warming and none ready waits when that fits its tier's queue timeout and
deadline, else ends UNAVAILABLE with a retry-after of the warm-up left.

Usage reports (:mod:`dataplane.usage`): every ``usage_report_seconds`` (1 s;
0: none) on the table watch, at most ``usage_max_rows`` (1,024) model and
tier rows each. A control plane older than the reports ends the watch on
the first one: upgrade control planes first, or set 0 meanwhile.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dataplane.admission.settings import ColdStartSettings, QueueSettings
from dataplane.cache.settings import CacheSettings
from dataplane.failover.settings import RetrySettings
from dataplane.pick.settings import OutlierSettings, PickSettings
from dataplane.record.settings import RecordSettings
from dataplane.regions.settings import RegionSettings
from dataplane.table.settings import TableSettings, WatchSettings
from dataplane.tracing import TraceSettings
from ferry.config import (
    FileConfig,
    GuardrailConfig,
    Limits,
    ModelConfig,
    TenantConfig,
    at_least_zero,
    from_mapping,
    load_file,
    positive,
)
from ferry.errors import ConfigError
from ferry.readiness import DrainTimes


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """The request bounds of the router: default deadline, in-flight bound and its retry-after, anonymous use."""

    default_deadline_seconds: float = 300.0
    max_inflight: int = 4096
    retry_after_seconds: float = 1.0
    allow_anonymous: bool = False  # serve requests without a key as tenant "anonymous" (local use only)
    stream_unread_timeout_seconds: float = 30.0  # a stream chunk the client has not taken in this long ends it
    memory_trim_growth_mib: int = 32  # malloc_trim once RSS grew this much since the last trim (dataplane.memory)
    drain_delay_seconds: float = 0.0  # on SIGTERM: NOT_SERVING, then still serve this long (load balancers update)
    drain_grace_seconds: float = 60.0  # then take no new request and let those in flight finish this long

    def __post_init__(self) -> None:
        positive("proxy", {"default_deadline_seconds": self.default_deadline_seconds, "max_inflight": self.max_inflight,
                           "retry_after_seconds": self.retry_after_seconds,
                           "stream_unread_timeout_seconds": self.stream_unread_timeout_seconds})
        at_least_zero("proxy", {"memory_trim_growth_mib": self.memory_trim_growth_mib})
        self.drain()

    def drain(self) -> DrainTimes:
        """How the proxy stops on SIGTERM (:class:`ferry.readiness.DrainTimes`; ConfigError naming the key)."""
        return DrainTimes.checked(self.drain_delay_seconds, self.drain_grace_seconds, "proxy")


@dataclasses.dataclass(frozen=True, kw_only=True)
class IdempotencySettings:
    """The idempotency keys' bounds (:class:`dataplane.intake.idempotency.Idempotency`)."""

    idempotency_entries: int = 10_000
    idempotency_ttl_seconds: float = 300.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class HttpSettings:
    """The HTTP front door's address and bounds (:mod:`dataplane.api.http`): body, headers, connections, streams."""

    http_listen: str = ""  # host:port of the HTTP API; empty: no HTTP front door (the --http-listen flag overrides)
    http_max_body_bytes: int = 8 * 1024 * 1024  # a larger body is 413 naming "body"
    http_max_line_bytes: int = 8190  # the request line; longer: 400
    http_max_header_bytes: int = 8190  # one header field; longer: 400
    http_max_headers: int = 64  # header fields per request; more: 400
    http_max_connections: int = 1024  # open connections; a request on one beyond is 503 and the connection closed
    http_max_streams: int = 4096  # requests in flight over HTTP; beyond: 429 with Retry-After
    http_keepalive_seconds: float = 15.0  # a connection idle this long (before its first request too) is closed
    http_write_timeout_seconds: float = 30.0  # a reader that takes longer to accept one chunk is cut off
    # a body field OpenAI's API does not define: false, left out and counted (ferry_proxy_ignored_fields_total);
    # true, a 400 naming it (both HTTP paths: the front door and the endpoint picker)
    http_strict_fields: bool = False

    def __post_init__(self) -> None:
        positive("proxy", {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                           if f.name not in ("http_listen", "http_strict_fields")})


PICKER_ENDS = ("report", "stream")  # PickerSettings.picker_end


@dataclasses.dataclass(frozen=True, kw_only=True)
class PickerSettings:
    """The endpoint picker's part (:mod:`dataplane.epp`): what it answers a forwarder such as Envoy."""

    picker_fallbacks: int = 2  # endpoints after the chosen one, for the forwarder to try when it is not reached
    picker_max_body_bytes: int = 8 * 1024 * 1024  # a request body buffered to decide on; larger: 413 naming "body"
    picker_max_wait_seconds: float = 29.0  # longest a request waits in the picker (under Envoy's max message timeout)
    # how the picker hears that a request ended: "report" (Envoy's access-log reports, dataplane.epp.ends), or
    # "stream" (the end of the processor stream: for a forwarder that sends no reports and keeps the stream open)
    picker_end: str = "report"

    def __post_init__(self) -> None:
        if not 0 <= self.picker_fallbacks <= 8:
            raise ConfigError("proxy.picker_fallbacks", "must be 0 to 8")
        if self.picker_end not in PICKER_ENDS:
            raise ConfigError("proxy.picker_end", "must be report or stream")
        positive("proxy", {"picker_max_body_bytes": self.picker_max_body_bytes,
                           "picker_max_wait_seconds": self.picker_max_wait_seconds})


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProxySettings:
    """The ``[proxy]`` section: the proxy's id and region, and one part per component; see the module docstring."""

    proxy_id: str = ""  # empty: "<hostname>-<pid>" (see resolved())
    region: str = "local"
    server: ServerSettings = dataclasses.field(default_factory=ServerSettings)
    queues: QueueSettings = dataclasses.field(default_factory=QueueSettings)
    pick: PickSettings = dataclasses.field(default_factory=PickSettings)
    outliers: OutlierSettings = dataclasses.field(default_factory=OutlierSettings)
    retries: RetrySettings = dataclasses.field(default_factory=RetrySettings)
    regions: RegionSettings = dataclasses.field(default_factory=RegionSettings)
    coldstart: ColdStartSettings = dataclasses.field(default_factory=ColdStartSettings)
    idempotency: IdempotencySettings = dataclasses.field(default_factory=IdempotencySettings)
    table: TableSettings = dataclasses.field(default_factory=TableSettings)
    watch: WatchSettings = dataclasses.field(default_factory=WatchSettings)
    http: HttpSettings = dataclasses.field(default_factory=HttpSettings)
    cache: CacheSettings = dataclasses.field(default_factory=CacheSettings)
    picker: PickerSettings = dataclasses.field(default_factory=PickerSettings)
    tracing: TraceSettings = dataclasses.field(default_factory=TraceSettings)
    record: RecordSettings = dataclasses.field(default_factory=RecordSettings)

    def __post_init__(self) -> None:
        if not self.region:
            raise ConfigError("proxy.region", "must not be empty")

    @classmethod
    def from_section(cls, data: Mapping[str, Any], where: str = "proxy") -> ProxySettings:
        """Build from the flat keys of the ``[proxy]`` section (or keyword values of the same names).

        Each key goes to the part that has a field of its name, coerced as the
        file's values are (:func:`ferry.config.from_mapping`); an unknown key
        raises ConfigError naming it and the known ones.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(where, "must be a table")
        owners = _owners()
        parts = _parts()
        routed: dict[str, dict[str, Any]] = {name: {} for name in (*parts, "")}
        for key, value in data.items():
            if key not in owners:
                raise ConfigError(f"{where}.{key}", f"unknown key (known: {', '.join(sorted(owners))})")
            routed[owners[key]][key] = value
        base = from_mapping(cls, routed.pop(""), where)
        built: dict[str, Any] = {name: from_mapping(parts[name], values, where)
                                 for name, values in routed.items() if values}
        return dataclasses.replace(base, **built)

    def resolved(self) -> ProxySettings:
        """These settings with an empty ``proxy_id`` replaced by ``<hostname>-<pid>``."""
        if self.proxy_id:
            return self
        return dataclasses.replace(self, proxy_id=f"{socket.gethostname()}-{os.getpid()}")


IDENTITY = ("proxy_id", "region")  # the keys ProxySettings holds itself; every other field is a part


@functools.cache
def _parts() -> dict[str, type[Any]]:
    """:class:`ProxySettings` field -> the class of its part."""
    hints = typing.get_type_hints(ProxySettings)
    return {f.name: hints[f.name] for f in dataclasses.fields(ProxySettings) if f.name not in IDENTITY}


@functools.cache
def _owners() -> dict[str, str]:
    """Flat key -> the :class:`ProxySettings` field of the part holding it ("" for the identity keys)."""
    owners = dict.fromkeys(IDENTITY, "")
    for name, part in _parts().items():
        for f in dataclasses.fields(part):
            assert f.name not in owners, f.name  # a key belongs to one part
            owners[f.name] = name
    return owners


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProxyConfig:
    """Everything a proxy reads from its config file, flags applied."""

    settings: ProxySettings
    tenants: tuple[TenantConfig, ...]
    limits: Limits
    models: tuple[ModelConfig, ...] = ()  # the catalog: each model's tokenizer file (ferry.tokens) and chat_template
    guardrails: tuple[GuardrailConfig, ...] = ()  # safety hooks on prompts and answers (dataplane.guard)


def load(
    path: str | Path | None,
    *,
    region: str | None = None,
    proxy_id: str | None = None,
    picker_end: str | None = None,
) -> ProxyConfig:
    """Read the config file (None: defaults) and apply the flag overrides; raises ConfigError."""
    file: FileConfig = load_file(path)
    settings = ProxySettings.from_section(file.sections.get("proxy", {}))
    if region:
        settings = dataclasses.replace(settings, region=region)
    if proxy_id:
        settings = dataclasses.replace(settings, proxy_id=proxy_id)
    if picker_end is not None:
        if picker_end not in PICKER_ENDS:
            raise ConfigError("--picker-end", f"must be one of {', '.join(PICKER_ENDS)}, not {picker_end!r}")
        settings = dataclasses.replace(settings, picker=PickerSettings(**{
            **dataclasses.asdict(settings.picker), "picker_end": picker_end}))
    return ProxyConfig(settings=settings.resolved(), tenants=file.tenants, limits=file.limits, models=file.models,
                       guardrails=file.guardrails)


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
