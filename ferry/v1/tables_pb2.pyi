from ferry.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WatchRequest(_message.Message):
    __slots__ = ("subscribe", "ack", "report")
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    subscribe: Subscribe
    ack: Ack
    report: Report
    def __init__(self, subscribe: _Optional[_Union[Subscribe, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., report: _Optional[_Union[Report, _Mapping]] = ...) -> None: ...

class Report(_message.Message):
    __slots__ = ("window_seconds", "usage", "cache", "traffic", "traffic_dropped")
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_DROPPED_FIELD_NUMBER: _ClassVar[int]
    window_seconds: float
    usage: _containers.RepeatedCompositeFieldContainer[UsageSample]
    cache: _containers.RepeatedCompositeFieldContainer[CacheSample]
    traffic: _containers.RepeatedCompositeFieldContainer[TrafficRow]
    traffic_dropped: int
    def __init__(self, window_seconds: _Optional[float] = ..., usage: _Optional[_Iterable[_Union[UsageSample, _Mapping]]] = ..., cache: _Optional[_Iterable[_Union[CacheSample, _Mapping]]] = ..., traffic: _Optional[_Iterable[_Union[TrafficRow, _Mapping]]] = ..., traffic_dropped: _Optional[int] = ...) -> None: ...

class TrafficRow(_message.Message):
    __slots__ = ("arrival", "model", "tier", "tenant", "prompt_tokens", "completion_tokens", "cached_tokens", "max_tokens", "hash_ids", "ttft_seconds", "e2e_seconds", "replica_id", "branch", "outcome", "streamed", "proxy_id", "region")
    ARRIVAL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HASH_IDS_FIELD_NUMBER: _ClassVar[int]
    TTFT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    E2E_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    STREAMED_FIELD_NUMBER: _ClassVar[int]
    PROXY_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    arrival: float
    model: str
    tier: str
    tenant: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    max_tokens: int
    hash_ids: _containers.RepeatedScalarFieldContainer[int]
    ttft_seconds: float
    e2e_seconds: float
    replica_id: str
    branch: str
    outcome: str
    streamed: bool
    proxy_id: str
    region: str
    def __init__(self, arrival: _Optional[float] = ..., model: _Optional[str] = ..., tier: _Optional[str] = ..., tenant: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., max_tokens: _Optional[int] = ..., hash_ids: _Optional[_Iterable[int]] = ..., ttft_seconds: _Optional[float] = ..., e2e_seconds: _Optional[float] = ..., replica_id: _Optional[str] = ..., branch: _Optional[str] = ..., outcome: _Optional[str] = ..., streamed: _Optional[bool] = ..., proxy_id: _Optional[str] = ..., region: _Optional[str] = ...) -> None: ...

class CacheSample(_message.Message):
    __slots__ = ("model", "tenant", "deterministic", "duplicates", "duplicate_seconds", "window_seconds", "hits", "enabled")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DETERMINISTIC_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    model: str
    tenant: str
    deterministic: int
    duplicates: int
    duplicate_seconds: float
    window_seconds: float
    hits: int
    enabled: bool
    def __init__(self, model: _Optional[str] = ..., tenant: _Optional[str] = ..., deterministic: _Optional[int] = ..., duplicates: _Optional[int] = ..., duplicate_seconds: _Optional[float] = ..., window_seconds: _Optional[float] = ..., hits: _Optional[int] = ..., enabled: _Optional[bool] = ...) -> None: ...

class UsageSample(_message.Message):
    __slots__ = ("model", "tier", "requests", "errors", "shed", "spilled", "p99_seconds", "p50_seconds", "offered_per_second", "queued", "guard_seconds", "ttft_p50_seconds", "ttft_p99_seconds", "ttft_samples", "router_version", "router_mixed")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    SHED_FIELD_NUMBER: _ClassVar[int]
    SPILLED_FIELD_NUMBER: _ClassVar[int]
    P99_SECONDS_FIELD_NUMBER: _ClassVar[int]
    P50_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OFFERED_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    GUARD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TTFT_P50_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TTFT_P99_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TTFT_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    ROUTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUTER_MIXED_FIELD_NUMBER: _ClassVar[int]
    model: str
    tier: str
    requests: int
    errors: int
    shed: int
    spilled: int
    p99_seconds: float
    p50_seconds: float
    offered_per_second: float
    queued: int
    guard_seconds: float
    ttft_p50_seconds: float
    ttft_p99_seconds: float
    ttft_samples: int
    router_version: int
    router_mixed: bool
    def __init__(self, model: _Optional[str] = ..., tier: _Optional[str] = ..., requests: _Optional[int] = ..., errors: _Optional[int] = ..., shed: _Optional[int] = ..., spilled: _Optional[int] = ..., p99_seconds: _Optional[float] = ..., p50_seconds: _Optional[float] = ..., offered_per_second: _Optional[float] = ..., queued: _Optional[int] = ..., guard_seconds: _Optional[float] = ..., ttft_p50_seconds: _Optional[float] = ..., ttft_p99_seconds: _Optional[float] = ..., ttft_samples: _Optional[int] = ..., router_version: _Optional[int] = ..., router_mixed: _Optional[bool] = ...) -> None: ...

class Subscribe(_message.Message):
    __slots__ = ("proxy_id", "region", "have_version", "deltas")
    PROXY_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    HAVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    DELTAS_FIELD_NUMBER: _ClassVar[int]
    proxy_id: str
    region: str
    have_version: int
    deltas: bool
    def __init__(self, proxy_id: _Optional[str] = ..., region: _Optional[str] = ..., have_version: _Optional[int] = ..., deltas: _Optional[bool] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("version", "nonce", "applied", "error", "resync", "router_version", "router_refused", "router_error")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    ROUTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUTER_REFUSED_FIELD_NUMBER: _ClassVar[int]
    ROUTER_ERROR_FIELD_NUMBER: _ClassVar[int]
    version: int
    nonce: str
    applied: bool
    error: str
    resync: bool
    router_version: int
    router_refused: int
    router_error: str
    def __init__(self, version: _Optional[int] = ..., nonce: _Optional[str] = ..., applied: _Optional[bool] = ..., error: _Optional[str] = ..., resync: _Optional[bool] = ..., router_version: _Optional[int] = ..., router_refused: _Optional[int] = ..., router_error: _Optional[str] = ...) -> None: ...

class TableSnapshot(_message.Message):
    __slots__ = ("version", "nonce", "region", "computed_at", "models", "ring", "tier_quotas", "spill", "tenants", "tenants_managed", "delta", "router_configs", "router_assignments", "router_default")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_AT_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    RING_FIELD_NUMBER: _ClassVar[int]
    TIER_QUOTAS_FIELD_NUMBER: _ClassVar[int]
    SPILL_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    TENANTS_MANAGED_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    ROUTER_CONFIGS_FIELD_NUMBER: _ClassVar[int]
    ROUTER_ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    ROUTER_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    version: int
    nonce: str
    region: str
    computed_at: float
    models: _containers.RepeatedCompositeFieldContainer[ModelRoute]
    ring: RingParams
    tier_quotas: _containers.RepeatedCompositeFieldContainer[TierQuota]
    spill: _containers.RepeatedCompositeFieldContainer[SpillRoute]
    tenants: _containers.RepeatedCompositeFieldContainer[TenantRoute]
    tenants_managed: bool
    delta: TableDelta
    router_configs: _containers.RepeatedCompositeFieldContainer[RouterConfigText]
    router_assignments: _containers.RepeatedCompositeFieldContainer[RouterAssignment]
    router_default: int
    def __init__(self, version: _Optional[int] = ..., nonce: _Optional[str] = ..., region: _Optional[str] = ..., computed_at: _Optional[float] = ..., models: _Optional[_Iterable[_Union[ModelRoute, _Mapping]]] = ..., ring: _Optional[_Union[RingParams, _Mapping]] = ..., tier_quotas: _Optional[_Iterable[_Union[TierQuota, _Mapping]]] = ..., spill: _Optional[_Iterable[_Union[SpillRoute, _Mapping]]] = ..., tenants: _Optional[_Iterable[_Union[TenantRoute, _Mapping]]] = ..., tenants_managed: _Optional[bool] = ..., delta: _Optional[_Union[TableDelta, _Mapping]] = ..., router_configs: _Optional[_Iterable[_Union[RouterConfigText, _Mapping]]] = ..., router_assignments: _Optional[_Iterable[_Union[RouterAssignment, _Mapping]]] = ..., router_default: _Optional[int] = ...) -> None: ...

class TableDelta(_message.Message):
    __slots__ = ("base_version", "models", "removed_models", "ring_changed", "ring", "tier_quotas_changed", "tier_quotas", "spill", "removed_spill", "tenants", "removed_tenants", "tenants_managed", "ages", "router_changed", "router_configs", "router_assignments", "router_default")
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_MODELS_FIELD_NUMBER: _ClassVar[int]
    RING_CHANGED_FIELD_NUMBER: _ClassVar[int]
    RING_FIELD_NUMBER: _ClassVar[int]
    TIER_QUOTAS_CHANGED_FIELD_NUMBER: _ClassVar[int]
    TIER_QUOTAS_FIELD_NUMBER: _ClassVar[int]
    SPILL_FIELD_NUMBER: _ClassVar[int]
    REMOVED_SPILL_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_TENANTS_FIELD_NUMBER: _ClassVar[int]
    TENANTS_MANAGED_FIELD_NUMBER: _ClassVar[int]
    AGES_FIELD_NUMBER: _ClassVar[int]
    ROUTER_CHANGED_FIELD_NUMBER: _ClassVar[int]
    ROUTER_CONFIGS_FIELD_NUMBER: _ClassVar[int]
    ROUTER_ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    ROUTER_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    base_version: int
    models: _containers.RepeatedCompositeFieldContainer[ModelDelta]
    removed_models: _containers.RepeatedScalarFieldContainer[str]
    ring_changed: bool
    ring: RingParams
    tier_quotas_changed: bool
    tier_quotas: _containers.RepeatedCompositeFieldContainer[TierQuota]
    spill: _containers.RepeatedCompositeFieldContainer[SpillDelta]
    removed_spill: _containers.RepeatedScalarFieldContainer[str]
    tenants: _containers.RepeatedCompositeFieldContainer[TenantRoute]
    removed_tenants: _containers.RepeatedScalarFieldContainer[str]
    tenants_managed: bool
    ages: _containers.RepeatedCompositeFieldContainer[NodeAge]
    router_changed: bool
    router_configs: _containers.RepeatedCompositeFieldContainer[RouterConfigText]
    router_assignments: _containers.RepeatedCompositeFieldContainer[RouterAssignment]
    router_default: int
    def __init__(self, base_version: _Optional[int] = ..., models: _Optional[_Iterable[_Union[ModelDelta, _Mapping]]] = ..., removed_models: _Optional[_Iterable[str]] = ..., ring_changed: _Optional[bool] = ..., ring: _Optional[_Union[RingParams, _Mapping]] = ..., tier_quotas_changed: _Optional[bool] = ..., tier_quotas: _Optional[_Iterable[_Union[TierQuota, _Mapping]]] = ..., spill: _Optional[_Iterable[_Union[SpillDelta, _Mapping]]] = ..., removed_spill: _Optional[_Iterable[str]] = ..., tenants: _Optional[_Iterable[_Union[TenantRoute, _Mapping]]] = ..., removed_tenants: _Optional[_Iterable[str]] = ..., tenants_managed: _Optional[bool] = ..., ages: _Optional[_Iterable[_Union[NodeAge, _Mapping]]] = ..., router_changed: _Optional[bool] = ..., router_configs: _Optional[_Iterable[_Union[RouterConfigText, _Mapping]]] = ..., router_assignments: _Optional[_Iterable[_Union[RouterAssignment, _Mapping]]] = ..., router_default: _Optional[int] = ...) -> None: ...

class ModelDelta(_message.Message):
    __slots__ = ("model", "route", "replicas", "removed_replicas", "loads")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LOADS_FIELD_NUMBER: _ClassVar[int]
    model: str
    route: ModelRoute
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaRoute]
    removed_replicas: _containers.RepeatedScalarFieldContainer[str]
    loads: _containers.RepeatedCompositeFieldContainer[LoadUpdate]
    def __init__(self, model: _Optional[str] = ..., route: _Optional[_Union[ModelRoute, _Mapping]] = ..., replicas: _Optional[_Iterable[_Union[ReplicaRoute, _Mapping]]] = ..., removed_replicas: _Optional[_Iterable[str]] = ..., loads: _Optional[_Iterable[_Union[LoadUpdate, _Mapping]]] = ...) -> None: ...

class LoadUpdate(_message.Message):
    __slots__ = ("replica_id", "load", "telemetry_age_seconds")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    load: _common_pb2.ReplicaLoad
    telemetry_age_seconds: float
    def __init__(self, replica_id: _Optional[str] = ..., load: _Optional[_Union[_common_pb2.ReplicaLoad, _Mapping]] = ..., telemetry_age_seconds: _Optional[float] = ...) -> None: ...

class NodeAge(_message.Message):
    __slots__ = ("node", "telemetry_age_seconds")
    NODE_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    node: str
    telemetry_age_seconds: float
    def __init__(self, node: _Optional[str] = ..., telemetry_age_seconds: _Optional[float] = ...) -> None: ...

class SpillDelta(_message.Message):
    __slots__ = ("region", "route", "models", "removed_models")
    REGION_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_MODELS_FIELD_NUMBER: _ClassVar[int]
    region: str
    route: SpillRoute
    models: _containers.RepeatedCompositeFieldContainer[ModelDelta]
    removed_models: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, region: _Optional[str] = ..., route: _Optional[_Union[SpillRoute, _Mapping]] = ..., models: _Optional[_Iterable[_Union[ModelDelta, _Mapping]]] = ..., removed_models: _Optional[_Iterable[str]] = ...) -> None: ...

class TierQuota(_message.Message):
    __slots__ = ("tier", "reserved_share", "reserved_slots", "quota_slots", "lent_slots")
    TIER_FIELD_NUMBER: _ClassVar[int]
    RESERVED_SHARE_FIELD_NUMBER: _ClassVar[int]
    RESERVED_SLOTS_FIELD_NUMBER: _ClassVar[int]
    QUOTA_SLOTS_FIELD_NUMBER: _ClassVar[int]
    LENT_SLOTS_FIELD_NUMBER: _ClassVar[int]
    tier: str
    reserved_share: float
    reserved_slots: int
    quota_slots: int
    lent_slots: int
    def __init__(self, tier: _Optional[str] = ..., reserved_share: _Optional[float] = ..., reserved_slots: _Optional[int] = ..., quota_slots: _Optional[int] = ..., lent_slots: _Optional[int] = ...) -> None: ...

class RingParams(_message.Message):
    __slots__ = ("load_factor", "vnodes")
    LOAD_FACTOR_FIELD_NUMBER: _ClassVar[int]
    VNODES_FIELD_NUMBER: _ClassVar[int]
    load_factor: float
    vnodes: int
    def __init__(self, load_factor: _Optional[float] = ..., vnodes: _Optional[int] = ...) -> None: ...

class VersionWeight(_message.Message):
    __slots__ = ("version", "weight")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    version: str
    weight: float
    def __init__(self, version: _Optional[str] = ..., weight: _Optional[float] = ...) -> None: ...

class ModelRoute(_message.Message):
    __slots__ = ("model", "default_version", "replicas", "version_weights", "warming", "cache_enabled", "cache_proxies")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    VERSION_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    WARMING_FIELD_NUMBER: _ClassVar[int]
    CACHE_ENABLED_FIELD_NUMBER: _ClassVar[int]
    CACHE_PROXIES_FIELD_NUMBER: _ClassVar[int]
    model: str
    default_version: str
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaRoute]
    version_weights: _containers.RepeatedCompositeFieldContainer[VersionWeight]
    warming: _containers.RepeatedCompositeFieldContainer[WarmingVersion]
    cache_enabled: bool
    cache_proxies: int
    def __init__(self, model: _Optional[str] = ..., default_version: _Optional[str] = ..., replicas: _Optional[_Iterable[_Union[ReplicaRoute, _Mapping]]] = ..., version_weights: _Optional[_Iterable[_Union[VersionWeight, _Mapping]]] = ..., warming: _Optional[_Iterable[_Union[WarmingVersion, _Mapping]]] = ..., cache_enabled: _Optional[bool] = ..., cache_proxies: _Optional[int] = ...) -> None: ...

class WarmingVersion(_message.Message):
    __slots__ = ("version", "replicas")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    version: str
    replicas: int
    def __init__(self, version: _Optional[str] = ..., replicas: _Optional[int] = ...) -> None: ...

class ReplicaRoute(_message.Message):
    __slots__ = ("replica_id", "node", "region", "version", "address", "kserve_model", "max_concurrency", "kv_block_tokens", "max_context_tokens", "load", "telemetry_age_seconds", "inputs", "http_address", "engine")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    KSERVE_MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    HTTP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    node: str
    region: str
    version: str
    address: str
    kserve_model: str
    max_concurrency: int
    kv_block_tokens: int
    max_context_tokens: int
    load: _common_pb2.ReplicaLoad
    telemetry_age_seconds: float
    inputs: _containers.RepeatedScalarFieldContainer[str]
    http_address: str
    engine: str
    def __init__(self, replica_id: _Optional[str] = ..., node: _Optional[str] = ..., region: _Optional[str] = ..., version: _Optional[str] = ..., address: _Optional[str] = ..., kserve_model: _Optional[str] = ..., max_concurrency: _Optional[int] = ..., kv_block_tokens: _Optional[int] = ..., max_context_tokens: _Optional[int] = ..., load: _Optional[_Union[_common_pb2.ReplicaLoad, _Mapping]] = ..., telemetry_age_seconds: _Optional[float] = ..., inputs: _Optional[_Iterable[str]] = ..., http_address: _Optional[str] = ..., engine: _Optional[str] = ...) -> None: ...

class SpillRoute(_message.Message):
    __slots__ = ("region", "weight", "rtt_ms", "models", "batch_weight", "batch_only")
    REGION_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    RTT_MS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    BATCH_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    BATCH_ONLY_FIELD_NUMBER: _ClassVar[int]
    region: str
    weight: float
    rtt_ms: float
    models: _containers.RepeatedCompositeFieldContainer[ModelRoute]
    batch_weight: float
    batch_only: bool
    def __init__(self, region: _Optional[str] = ..., weight: _Optional[float] = ..., rtt_ms: _Optional[float] = ..., models: _Optional[_Iterable[_Union[ModelRoute, _Mapping]]] = ..., batch_weight: _Optional[float] = ..., batch_only: _Optional[bool] = ...) -> None: ...

class TenantRoute(_message.Message):
    __slots__ = ("name", "api_key_sha256", "plan", "tiers", "requests_per_second", "tokens_per_second", "max_concurrency")
    NAME_FIELD_NUMBER: _ClassVar[int]
    API_KEY_SHA256_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    name: str
    api_key_sha256: str
    plan: str
    tiers: _containers.RepeatedScalarFieldContainer[str]
    requests_per_second: float
    tokens_per_second: float
    max_concurrency: int
    def __init__(self, name: _Optional[str] = ..., api_key_sha256: _Optional[str] = ..., plan: _Optional[str] = ..., tiers: _Optional[_Iterable[str]] = ..., requests_per_second: _Optional[float] = ..., tokens_per_second: _Optional[float] = ..., max_concurrency: _Optional[int] = ...) -> None: ...

class RouterConfigText(_message.Message):
    __slots__ = ("version", "text", "digest")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    version: int
    text: str
    digest: str
    def __init__(self, version: _Optional[int] = ..., text: _Optional[str] = ..., digest: _Optional[str] = ...) -> None: ...

class RouterAssignment(_message.Message):
    __slots__ = ("proxy_id", "version")
    PROXY_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    proxy_id: str
    version: int
    def __init__(self, proxy_id: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...
