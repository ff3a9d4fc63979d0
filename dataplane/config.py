"""Settings of the data-plane proxy: the ``[proxy]`` section of the config file, one part per component.

The section's keys are flat (``max_inflight``, ``queue_bounds``, …); each
belongs to the narrow frozen part of the component that reads it, and
:class:`ProxySettings` composes the parts with the proxy's id and region:

- ``server`` (:class:`ServerSettings`): the router's request bounds;
- ``queues`` (:class:`QueueSettings`): the tier queues and their admission,
  tenant ceilings and shards (:class:`dataplane.admission.gate.Admission`);
- ``pick`` (:class:`PickSettings`, :mod:`dataplane.pick.settings`): the decision
  (:meth:`dataplane.pick.picker.PickState.from_settings`);
- ``outliers`` (:class:`OutlierSettings`): outlier ejection;
- ``retries`` (:class:`RetrySettings`): retries, the retry budget and
  stream continuation (:class:`dataplane.failover.recover.Failover`);
- ``regions`` (:class:`RegionSettings`): spill to other regions;
- ``coldstart`` (:class:`ColdStartSettings`): :class:`dataplane.admission.coldwait.ColdStarts`;
- ``idempotency`` (:class:`IdempotencySettings`);
- ``table`` (:class:`TableSettings`): the table holder's bounds and ring;
- ``watch`` (:class:`WatchSettings`): the table watch and its usage reports;
- ``http`` (:class:`HttpSettings`): the OpenAI-compatible HTTP front door
  (:mod:`dataplane.api.http`), off unless ``http_listen`` is set;
- ``cache`` (:class:`CacheSettings`): the duplicate measurement and the
  response cache (:mod:`dataplane.cache`);
- ``picker`` (:class:`PickerSettings`): the endpoint picker that Envoy asks
  per request (:mod:`dataplane.epp`): fallbacks (2) and the body buffered.
- ``tracing`` (:class:`TraceSettings`): request traces exported over OTLP
  (:mod:`dataplane.tracing`), off unless ``trace_endpoint`` is set.
- ``record`` (:class:`RecordSettings`): the traffic recorder
  (:mod:`dataplane.record`): ``record_rate`` (1.0) of the requests, at most
  ``record_max_rows`` (20,000) waiting, ``record_report_rows`` (2,000) per usage report.

Read with :func:`load`, or ``ProxySettings.from_section(mapping)`` (each key
routed to the part with a field of its name, values coerced as
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
of 24 (:mod:`dataplane.pick.picker`). Region spill (:mod:`dataplane.regions.choice`): an
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

from dataplane.admission.queues import QueueParams
from dataplane.cache.decide import MODES as CACHE_MODES
from dataplane.cache.decide import CachePolicy
from dataplane.failover.budget import RetryBudget
from dataplane.pick.ring import DEFAULT_LOAD_FACTOR, DEFAULT_VNODES
from dataplane.pick.settings import OutlierSettings, PickSettings
from dataplane.table.local import MAX_VNODES, TableParams
from ferry.config import (
    TIERS,
    FileConfig,
    GuardrailConfig,
    Limits,
    ModelConfig,
    TenantConfig,
    from_mapping,
    load_file,
)
from ferry.errors import ConfigError
from ferry.readiness import DrainTimes


def _positive(values: Mapping[str, float]) -> None:
    """Raise ConfigError naming the first key whose value is not above 0 (NaN included)."""
    for key, value in values.items():
        if not value > 0:  # also rejects NaN
            raise ConfigError(f"proxy.{key}", "must be positive")


def _at_least_zero(values: Mapping[str, float]) -> None:
    """Raise ConfigError naming the first key whose value is below 0 (NaN included)."""
    for key, value in values.items():
        if not value >= 0:
            raise ConfigError(f"proxy.{key}", "must be >= 0")


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
        _positive({"default_deadline_seconds": self.default_deadline_seconds, "max_inflight": self.max_inflight,
                   "retry_after_seconds": self.retry_after_seconds,
                   "stream_unread_timeout_seconds": self.stream_unread_timeout_seconds})
        _at_least_zero({"memory_trim_growth_mib": self.memory_trim_growth_mib})
        self.drain()

    def drain(self) -> DrainTimes:
        """How the proxy stops on SIGTERM (:class:`ferry.readiness.DrainTimes`; ConfigError naming the key)."""
        return DrainTimes.checked(self.drain_delay_seconds, self.drain_grace_seconds, "proxy")


@dataclasses.dataclass(frozen=True, kw_only=True)
class QueueSettings:
    """The tier queues' settings (:mod:`dataplane.admission.queues`, ``.gate``), per tier in TIERS order."""

    admission: bool = True
    admission_capacity_share: float = 1.0   # share of the fleet's concurrency this proxy dispatches
    queue_bounds: tuple[int, ...] = (256, 512, 4096)
    queue_timeouts: tuple[float, ...] = (2.0, 10.0, 60.0)
    queue_max_total: int = 8192
    tier_reserved: tuple[float, ...] = (0.7, 0.2, 0.1)
    free_queue_share: float = 0.5
    fair_quantum_tokens: int = 512
    interactive_headroom_seconds: float = 0.2  # lower tiers leave interactive rate x this many slots free
    interactive_headroom_max_share: float = 0.1  # ... at most this share of the slots
    tenant_ceiling: float = 1.0  # a tenant runs at most this x its weighted share of its tier (0: no ceiling)
    tenant_shard_max_share: float = 0.5  # heavy tenants' shards cover at most this share of the replicas (0: off)
    tenant_shard_hold_seconds: float = 1.0  # a tenant stays confined this long after it was last seen heavy
    interactive_replica_share: float = 0.0  # this share of each model's replicas runs interactive only (0: off)
    tenant_metric_labels: int = 100  # tenants named in the per-tenant admission metrics; the rest are "_other"

    def __post_init__(self) -> None:
        _positive({"tenant_metric_labels": self.tenant_metric_labels})
        for key, tiered in (("queue_bounds", self.queue_bounds), ("queue_timeouts", self.queue_timeouts),
                            ("tier_reserved", self.tier_reserved)):
            if len(tiered) != len(TIERS) or not all(v >= 0 for v in tiered):
                raise ConfigError(f"proxy.{key}", f"must be {len(TIERS)} values >= 0 ({', '.join(TIERS)})")
        for key, share in (("interactive_headroom_seconds", self.interactive_headroom_seconds),
                           ("interactive_headroom_max_share", self.interactive_headroom_max_share),
                           ("tenant_ceiling", self.tenant_ceiling),
                           ("tenant_shard_max_share", self.tenant_shard_max_share),
                           ("tenant_shard_hold_seconds", self.tenant_shard_hold_seconds),
                           ("interactive_replica_share", self.interactive_replica_share)):
            if not share >= 0 or (key.endswith("share") and share > 1):  # also rejects NaN
                raise ConfigError(f"proxy.{key}", "must be >= 0" + (" and <= 1" if key.endswith("share") else ""))
        if not 0 < self.admission_capacity_share <= 1 or not 0 < self.free_queue_share <= 1:
            raise ConfigError("proxy.admission_capacity_share", "shares must be in (0, 1]")

    def timeouts(self) -> dict[str, float]:
        """Queue timeout per tier."""
        return dict(zip(TIERS, self.queue_timeouts, strict=True))

    def queue_params(self) -> QueueParams:
        """What the tier queues need of these settings."""
        return QueueParams(bounds=dict(zip(TIERS, self.queue_bounds, strict=True)),
                           timeouts=self.timeouts(),
                           max_queued=self.queue_max_total, free_share=self.free_queue_share,
                           quantum=self.fair_quantum_tokens, headroom_seconds=self.interactive_headroom_seconds,
                           headroom_max_share=self.interactive_headroom_max_share, tenant_ceiling=self.tenant_ceiling,
                           shard_max_share=self.tenant_shard_max_share,
                           shard_hold_seconds=self.tenant_shard_hold_seconds,
                           interactive_replica_share=self.interactive_replica_share,
                           reserved=dict(zip(TIERS, self.tier_reserved, strict=True)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetrySettings:
    """Retries and stream continuation (:func:`dataplane.failover.recover.retry_reason`, ``.budget``)."""

    max_attempts: int = 2
    retry_tiers: tuple[str, ...] = ("interactive",)
    retry_budget_ratio: float = 0.1  # retries and continuations at most 10 % of requests per window …
    retry_budget_min_per_second: float = 10.0  # … plus this many per second (dataplane.failover.budget)
    retry_budget_window_seconds: float = 10.0
    max_continuations: int = 2  # a stream cut mid-way is continued at most this often (dataplane.failover.continuation)

    def __post_init__(self) -> None:
        _positive({"max_attempts": self.max_attempts, "retry_budget_window_seconds": self.retry_budget_window_seconds})
        for tier in self.retry_tiers:
            if tier not in TIERS:
                raise ConfigError("proxy.retry_tiers", f"unknown tier {tier!r} (known: {', '.join(TIERS)})")
        _at_least_zero({"retry_budget_ratio": self.retry_budget_ratio,
                        "retry_budget_min_per_second": self.retry_budget_min_per_second,
                        "max_continuations": self.max_continuations})

    def budget(self) -> RetryBudget:
        """A fresh retry budget of these settings."""
        return RetryBudget(ratio=self.retry_budget_ratio, min_per_second=self.retry_budget_min_per_second,
                           window_seconds=self.retry_budget_window_seconds)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RegionSettings:
    """Spill to other regions (:mod:`dataplane.regions.choice`, the region step) and the simulated round trip."""

    spill_queue_ms: float = 100.0  # spill on queue when the local wait would exceed this and the rtt (regions.choice)
    spill_headroom: float = 1.25  # a spill target's slots x this: what spills may fill there (as this proxy sees)
    simulate_region_rtt: bool = False  # sleep a spill target's rtt_ms before a cross-region forward (one machine)

    def __post_init__(self) -> None:
        if not self.spill_queue_ms >= 0 or not 0 < self.spill_headroom <= 4:
            raise ConfigError("proxy.spill_queue_ms", "need spill_queue_ms >= 0 and 0 < spill_headroom <= 4")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ColdStartSettings:
    """Cold start's settings (:class:`dataplane.admission.coldwait.ColdStarts`)."""

    coldstart_warmup_seconds: float = 30.0  # expected warm-up of a replica: sizes a cold start's retry-after

    def __post_init__(self) -> None:
        _positive({"coldstart_warmup_seconds": self.coldstart_warmup_seconds})


@dataclasses.dataclass(frozen=True, kw_only=True)
class IdempotencySettings:
    """The idempotency keys' bounds (:class:`dataplane.api.idempotency.Idempotency`)."""

    idempotency_entries: int = 10_000
    idempotency_ttl_seconds: float = 300.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class TableSettings:
    """The table holder's bounds and ring defaults (:class:`dataplane.table.local.TableParams`)."""

    max_table_replicas: int = 100_000
    max_table_models: int = 10_000
    load_factor: float = DEFAULT_LOAD_FACTOR
    ring_vnodes: int = DEFAULT_VNODES
    load_smoothing_seconds: float = 10.0

    def __post_init__(self) -> None:
        _positive({"max_table_replicas": self.max_table_replicas, "max_table_models": self.max_table_models,
                   "load_smoothing_seconds": self.load_smoothing_seconds})
        if not self.load_factor > 1.0:
            raise ConfigError("proxy.load_factor", "must be above 1")
        if not 0 < self.ring_vnodes <= MAX_VNODES:
            raise ConfigError("proxy.ring_vnodes", f"must be 1..{MAX_VNODES}")

    def table_params(self) -> TableParams:
        """What the table holder needs of these settings."""
        return TableParams(max_models=self.max_table_models, max_replicas=self.max_table_replicas,
                           load_factor=self.load_factor, vnodes=self.ring_vnodes,
                           smoothing_seconds=self.load_smoothing_seconds)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WatchSettings:
    """The table watch (:class:`dataplane.table.watch.TableWatcher`) and the usage reports it carries."""

    table_stale_warn_seconds: float = 10.0
    reconnect_initial_seconds: float = 0.1
    reconnect_max_seconds: float = 5.0
    usage_report_seconds: float = 1.0  # a usage report on the table watch this often (dataplane.usage); 0: none
    usage_max_rows: int = 1024  # (model, tier) rows per report

    def __post_init__(self) -> None:
        _positive({"table_stale_warn_seconds": self.table_stale_warn_seconds,
                   "reconnect_initial_seconds": self.reconnect_initial_seconds,
                   "reconnect_max_seconds": self.reconnect_max_seconds, "usage_max_rows": self.usage_max_rows})
        if self.reconnect_max_seconds < self.reconnect_initial_seconds:
            raise ConfigError("proxy.reconnect_max_seconds", "must be at least reconnect_initial_seconds")
        if not 0 <= self.usage_report_seconds <= 60:
            raise ConfigError("proxy.usage_report_seconds", "must be 0 (no reports) to 60")


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
        _positive({f.name: getattr(self, f.name) for f in dataclasses.fields(self)
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
        _positive({"picker_max_body_bytes": self.picker_max_body_bytes,
                   "picker_max_wait_seconds": self.picker_max_wait_seconds})


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecordSettings:
    """The traffic recorder (:mod:`dataplane.record`): which requests are recorded, and its bounds."""

    record_rate: float = 1.0  # share of requests recorded (by a hash of the request id; 0: none, 1: all)
    record_max_rows: int = 20_000  # rows waiting for a report; a further sampled request is dropped, counted
    record_report_rows: int = 2_000  # rows per usage report (the rest wait for the next)
    record_report_bytes: int = 1 << 20  # ... and serialized bytes per report (at least one row)
    record_max_blocks: int = 4096  # a recorded prompt's block hashes: all its 512-token blocks up to this many
    # (the decision hashes only its deepest prefix depth; the simulator needs every block to replay the cache)

    def __post_init__(self) -> None:
        if not 0 <= self.record_rate <= 1:  # also rejects NaN
            raise ConfigError("proxy.record_rate", "must be 0..1")
        _positive({"record_max_rows": self.record_max_rows, "record_report_rows": self.record_report_rows,
                   "record_report_bytes": self.record_report_bytes,
                   "record_max_blocks": self.record_max_blocks})


@dataclasses.dataclass(frozen=True, kw_only=True)
class TraceSettings:
    """Request traces (:mod:`dataplane.tracing`): W3C ``traceparent`` in, OTLP over gRPC out; off unless
    ``trace_endpoint`` is set (then nothing is read, allocated or sent per request)."""

    trace_endpoint: str = ""  # host:port of an OTLP/gRPC collector (its port 4317, say); empty: tracing off
    trace_sample_ratio: float = 1.0  # share of requests traced that bring no traceparent (a caller's flag rules)
    trace_insecure: bool = False  # plain text to the collector; else TLS, checked against trace_ca or the system's
    trace_ca: str = ""  # PEM file of the CA that signed the collector's certificate (empty: the system's roots)
    trace_queue_spans: int = 2048  # finished spans waiting for export; a trace that does not fit is dropped, counted
    trace_batch_spans: int = 512  # spans per Export call (a batch is sent as soon as this many wait)
    trace_flush_seconds: float = 1.0  # what waits is sent at least this often
    trace_export_timeout_seconds: float = 5.0  # an Export call's deadline; its spans are dropped, counted, past it

    def __post_init__(self) -> None:
        if self.trace_endpoint:
            host, sep, port = self.trace_endpoint.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError("proxy.trace_endpoint", f"{self.trace_endpoint!r}: expected host:port")
        if not 0 <= self.trace_sample_ratio <= 1:
            raise ConfigError("proxy.trace_sample_ratio", "must be 0..1")
        if self.trace_insecure and self.trace_ca:
            raise ConfigError("proxy.trace_ca", "a CA with trace_insecure: choose TLS or plain text")
        _positive({"trace_queue_spans": self.trace_queue_spans, "trace_batch_spans": self.trace_batch_spans,
                   "trace_flush_seconds": self.trace_flush_seconds,
                   "trace_export_timeout_seconds": self.trace_export_timeout_seconds})
        if self.trace_batch_spans > self.trace_queue_spans:
            raise ConfigError("proxy.trace_batch_spans", "must be at most trace_queue_spans")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CacheSettings:
    """The duplicate measurement and the response cache (:mod:`dataplane.cache`).

    Measured: deterministic requests (temperature 0 or a seed) over a sliding
    window of ``cache_window_seconds`` (600 s), in a set of at most
    ``cache_sketch_hashes`` (65,536) payload hashes and ``cache_max_rows``
    (1,024) (model, tenant) rows. Decided per model (``cache_mode`` ``auto``;
    ``off`` measures only): on when the duplicate share exceeds
    ``cache_enable_above`` (0.05), off again below ``cache_disable_below``
    (0.03), with at least ``cache_min_requests`` (200) deterministic requests
    in the window. The cache: at most ``cache_max_entries`` (10,000) answers
    and ``cache_max_bytes`` (64 MiB), each kept ``cache_ttl_seconds`` (300 s).
    """

    cache_mode: str = "auto"
    cache_enable_above: float = 0.05
    cache_disable_below: float = 0.03
    cache_min_requests: int = 200
    cache_window_seconds: float = 600.0
    cache_sketch_hashes: int = 65_536
    cache_max_rows: int = 1024
    cache_max_entries: int = 10_000
    cache_max_bytes: int = 64 * 1024 * 1024
    cache_ttl_seconds: float = 300.0

    def __post_init__(self) -> None:
        if self.cache_mode not in CACHE_MODES:
            raise ConfigError("proxy.cache_mode", f"must be one of {', '.join(CACHE_MODES)}")
        for key in ("cache_enable_above", "cache_disable_below"):
            value = getattr(self, key)
            if not 0 <= value <= 1:
                raise ConfigError(f"proxy.{key}", "must be 0..1")
        if self.cache_disable_below > self.cache_enable_above:
            raise ConfigError("proxy.cache_disable_below", "must be at most cache_enable_above")
        _at_least_zero({"cache_min_requests": self.cache_min_requests})
        _positive({"cache_window_seconds": self.cache_window_seconds, "cache_sketch_hashes": self.cache_sketch_hashes,
                   "cache_max_rows": self.cache_max_rows, "cache_max_entries": self.cache_max_entries,
                   "cache_max_bytes": self.cache_max_bytes, "cache_ttl_seconds": self.cache_ttl_seconds})
        if self.cache_window_seconds > 86_400:
            raise ConfigError("proxy.cache_window_seconds", "must be at most 86400")
        if self.cache_sketch_hashes > 16_777_216:
            raise ConfigError("proxy.cache_sketch_hashes", "must be at most 16777216")

    def policy(self) -> CachePolicy:
        """The on/off thresholds (:func:`dataplane.cache.decide.decide`)."""
        return CachePolicy(enable_above=self.cache_enable_above, disable_below=self.cache_disable_below,
                           min_requests=self.cache_min_requests, mode=self.cache_mode)


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
