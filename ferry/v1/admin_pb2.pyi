from ferry.v1 import common_pb2 as _common_pb2
from ferry.v1 import tables_pb2 as _tables_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListReplicasRequest(_message.Message):
    __slots__ = ("model", "region")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    model: str
    region: str
    def __init__(self, model: _Optional[str] = ..., region: _Optional[str] = ...) -> None: ...

class ReplicaView(_message.Message):
    __slots__ = ("replica_id", "node", "region", "model", "version", "address", "state", "drain_requested", "load", "telemetry_age_seconds", "in_table", "cordoned")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DRAIN_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    IN_TABLE_FIELD_NUMBER: _ClassVar[int]
    CORDONED_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    node: str
    region: str
    model: str
    version: str
    address: str
    state: _common_pb2.ReplicaState
    drain_requested: bool
    load: _common_pb2.ReplicaLoad
    telemetry_age_seconds: float
    in_table: bool
    cordoned: bool
    def __init__(self, replica_id: _Optional[str] = ..., node: _Optional[str] = ..., region: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., address: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.ReplicaState, str]] = ..., drain_requested: _Optional[bool] = ..., load: _Optional[_Union[_common_pb2.ReplicaLoad, _Mapping]] = ..., telemetry_age_seconds: _Optional[float] = ..., in_table: _Optional[bool] = ..., cordoned: _Optional[bool] = ...) -> None: ...

class ListReplicasResponse(_message.Message):
    __slots__ = ("replicas",)
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaView]
    def __init__(self, replicas: _Optional[_Iterable[_Union[ReplicaView, _Mapping]]] = ...) -> None: ...

class GetTableRequest(_message.Message):
    __slots__ = ("region",)
    REGION_FIELD_NUMBER: _ClassVar[int]
    region: str
    def __init__(self, region: _Optional[str] = ...) -> None: ...

class ProxyView(_message.Message):
    __slots__ = ("proxy_id", "region", "applied_version", "lag_versions", "connected", "last_ack_age_seconds", "last_error")
    PROXY_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    APPLIED_VERSION_FIELD_NUMBER: _ClassVar[int]
    LAG_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    LAST_ACK_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    proxy_id: str
    region: str
    applied_version: int
    lag_versions: int
    connected: bool
    last_ack_age_seconds: float
    last_error: str
    def __init__(self, proxy_id: _Optional[str] = ..., region: _Optional[str] = ..., applied_version: _Optional[int] = ..., lag_versions: _Optional[int] = ..., connected: _Optional[bool] = ..., last_ack_age_seconds: _Optional[float] = ..., last_error: _Optional[str] = ...) -> None: ...

class RegionTable(_message.Message):
    __slots__ = ("region", "version", "computed_at", "replicas", "models")
    REGION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_AT_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    region: str
    version: int
    computed_at: float
    replicas: int
    models: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, region: _Optional[str] = ..., version: _Optional[int] = ..., computed_at: _Optional[float] = ..., replicas: _Optional[int] = ..., models: _Optional[_Iterable[str]] = ...) -> None: ...

class GetTableResponse(_message.Message):
    __slots__ = ("regions", "proxies")
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    PROXIES_FIELD_NUMBER: _ClassVar[int]
    regions: _containers.RepeatedCompositeFieldContainer[RegionTable]
    proxies: _containers.RepeatedCompositeFieldContainer[ProxyView]
    def __init__(self, regions: _Optional[_Iterable[_Union[RegionTable, _Mapping]]] = ..., proxies: _Optional[_Iterable[_Union[ProxyView, _Mapping]]] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("replica_id",)
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    def __init__(self, replica_id: _Optional[str] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("replica",)
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    replica: ReplicaView
    def __init__(self, replica: _Optional[_Union[ReplicaView, _Mapping]] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ControlPlaneView(_message.Message):
    __slots__ = ("id", "address", "leader", "following", "last_report_age_seconds")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    FOLLOWING_FIELD_NUMBER: _ClassVar[int]
    LAST_REPORT_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    leader: bool
    following: bool
    last_report_age_seconds: float
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ..., leader: _Optional[bool] = ..., following: _Optional[bool] = ..., last_report_age_seconds: _Optional[float] = ...) -> None: ...

class StoreView(_message.Message):
    __slots__ = ("backend", "endpoint", "healthy", "error", "last_ok_age_seconds", "revision")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_OK_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    backend: str
    endpoint: str
    healthy: bool
    error: str
    last_ok_age_seconds: float
    revision: int
    def __init__(self, backend: _Optional[str] = ..., endpoint: _Optional[str] = ..., healthy: _Optional[bool] = ..., error: _Optional[str] = ..., last_ok_age_seconds: _Optional[float] = ..., revision: _Optional[int] = ...) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("control_plane_id", "role", "leader_id", "leader_address", "term", "control_planes", "store", "regions", "proxies", "members", "drains", "allocations", "agents")
    CONTROL_PLANE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    CONTROL_PLANES_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    PROXIES_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    DRAINS_FIELD_NUMBER: _ClassVar[int]
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    control_plane_id: str
    role: str
    leader_id: str
    leader_address: str
    term: int
    control_planes: _containers.RepeatedCompositeFieldContainer[ControlPlaneView]
    store: StoreView
    regions: _containers.RepeatedCompositeFieldContainer[RegionTable]
    proxies: _containers.RepeatedCompositeFieldContainer[ProxyView]
    members: int
    drains: int
    allocations: int
    agents: int
    def __init__(self, control_plane_id: _Optional[str] = ..., role: _Optional[str] = ..., leader_id: _Optional[str] = ..., leader_address: _Optional[str] = ..., term: _Optional[int] = ..., control_planes: _Optional[_Iterable[_Union[ControlPlaneView, _Mapping]]] = ..., store: _Optional[_Union[StoreView, _Mapping]] = ..., regions: _Optional[_Iterable[_Union[RegionTable, _Mapping]]] = ..., proxies: _Optional[_Iterable[_Union[ProxyView, _Mapping]]] = ..., members: _Optional[int] = ..., drains: _Optional[int] = ..., allocations: _Optional[int] = ..., agents: _Optional[int] = ...) -> None: ...

class FollowerReport(_message.Message):
    __slots__ = ("control_plane_id", "members", "regions", "proxy_usage", "traffic", "traffic_dropped")
    CONTROL_PLANE_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    PROXY_USAGE_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_DROPPED_FIELD_NUMBER: _ClassVar[int]
    control_plane_id: str
    members: _containers.RepeatedCompositeFieldContainer[MemberReport]
    regions: _containers.RepeatedScalarFieldContainer[str]
    proxy_usage: _containers.RepeatedCompositeFieldContainer[ProxyUsageReport]
    traffic: _containers.RepeatedCompositeFieldContainer[_tables_pb2.TrafficRow]
    traffic_dropped: int
    def __init__(self, control_plane_id: _Optional[str] = ..., members: _Optional[_Iterable[_Union[MemberReport, _Mapping]]] = ..., regions: _Optional[_Iterable[str]] = ..., proxy_usage: _Optional[_Iterable[_Union[ProxyUsageReport, _Mapping]]] = ..., traffic: _Optional[_Iterable[_Union[_tables_pb2.TrafficRow, _Mapping]]] = ..., traffic_dropped: _Optional[int] = ...) -> None: ...

class ProxyUsageReport(_message.Message):
    __slots__ = ("proxy_id", "region", "age_seconds", "report")
    PROXY_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    proxy_id: str
    region: str
    age_seconds: float
    report: _tables_pb2.Report
    def __init__(self, proxy_id: _Optional[str] = ..., region: _Optional[str] = ..., age_seconds: _Optional[float] = ..., report: _Optional[_Union[_tables_pb2.Report, _Mapping]] = ...) -> None: ...

class MemberReport(_message.Message):
    __slots__ = ("node", "connected", "heard_seconds_ago", "loads", "engine_samples")
    NODE_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    HEARD_SECONDS_AGO_FIELD_NUMBER: _ClassVar[int]
    LOADS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    node: str
    connected: bool
    heard_seconds_ago: float
    loads: _containers.RepeatedCompositeFieldContainer[_common_pb2.ReplicaLoad]
    engine_samples: _containers.RepeatedCompositeFieldContainer[_common_pb2.EngineSample]
    def __init__(self, node: _Optional[str] = ..., connected: _Optional[bool] = ..., heard_seconds_ago: _Optional[float] = ..., loads: _Optional[_Iterable[_Union[_common_pb2.ReplicaLoad, _Mapping]]] = ..., engine_samples: _Optional[_Iterable[_Union[_common_pb2.EngineSample, _Mapping]]] = ...) -> None: ...

class LeaderUpdate(_message.Message):
    __slots__ = ("leader_id", "table")
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    leader_id: str
    table: _tables_pb2.TableSnapshot
    def __init__(self, leader_id: _Optional[str] = ..., table: _Optional[_Union[_tables_pb2.TableSnapshot, _Mapping]] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ("region",)
    REGION_FIELD_NUMBER: _ClassVar[int]
    region: str
    def __init__(self, region: _Optional[str] = ...) -> None: ...

class NodeView(_message.Message):
    __slots__ = ("node", "region", "gpus", "gpus_allocated", "gpus_free", "replica_ids", "agent_connected", "control_plane", "cordoned", "live", "heard_seconds_ago", "slots")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPUS_ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    GPUS_FREE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_IDS_FIELD_NUMBER: _ClassVar[int]
    AGENT_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    CONTROL_PLANE_FIELD_NUMBER: _ClassVar[int]
    CORDONED_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    HEARD_SECONDS_AGO_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    node: str
    region: str
    gpus: int
    gpus_allocated: int
    gpus_free: int
    replica_ids: _containers.RepeatedScalarFieldContainer[str]
    agent_connected: bool
    control_plane: str
    cordoned: bool
    live: bool
    heard_seconds_ago: float
    slots: int
    def __init__(self, node: _Optional[str] = ..., region: _Optional[str] = ..., gpus: _Optional[int] = ..., gpus_allocated: _Optional[int] = ..., gpus_free: _Optional[int] = ..., replica_ids: _Optional[_Iterable[str]] = ..., agent_connected: _Optional[bool] = ..., control_plane: _Optional[str] = ..., cordoned: _Optional[bool] = ..., live: _Optional[bool] = ..., heard_seconds_ago: _Optional[float] = ..., slots: _Optional[int] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeView]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeView, _Mapping]]] = ...) -> None: ...

class CordonRequest(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: str
    def __init__(self, node: _Optional[str] = ...) -> None: ...

class CordonResponse(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: NodeView
    def __init__(self, node: _Optional[_Union[NodeView, _Mapping]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelView(_message.Message):
    __slots__ = ("model", "default_version", "versions", "replicas_ready", "replicas_total", "gpus_each", "slots", "pending", "tokenizer")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_READY_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    GPUS_EACH_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    model: str
    default_version: str
    versions: _containers.RepeatedScalarFieldContainer[str]
    replicas_ready: int
    replicas_total: int
    gpus_each: int
    slots: int
    pending: int
    tokenizer: str
    def __init__(self, model: _Optional[str] = ..., default_version: _Optional[str] = ..., versions: _Optional[_Iterable[str]] = ..., replicas_ready: _Optional[int] = ..., replicas_total: _Optional[int] = ..., gpus_each: _Optional[int] = ..., slots: _Optional[int] = ..., pending: _Optional[int] = ..., tokenizer: _Optional[str] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelView]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelView, _Mapping]]] = ...) -> None: ...

class GetUsageRequest(_message.Message):
    __slots__ = ("by_tier",)
    BY_TIER_FIELD_NUMBER: _ClassVar[int]
    by_tier: bool
    def __init__(self, by_tier: _Optional[bool] = ...) -> None: ...

class UsageRow(_message.Message):
    __slots__ = ("model", "region", "replicas_ready", "replicas", "queued", "running", "kv_utilisation", "gpu_utilisation", "requests_total", "telemetry_age_seconds", "request_rate", "p99_seconds", "shed_rate", "error_rate", "tier", "guard_seconds")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_READY_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    KV_UTILISATION_FIELD_NUMBER: _ClassVar[int]
    GPU_UTILISATION_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_RATE_FIELD_NUMBER: _ClassVar[int]
    P99_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SHED_RATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_RATE_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    GUARD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    model: str
    region: str
    replicas_ready: int
    replicas: int
    queued: int
    running: int
    kv_utilisation: float
    gpu_utilisation: float
    requests_total: int
    telemetry_age_seconds: float
    request_rate: float
    p99_seconds: float
    shed_rate: float
    error_rate: float
    tier: str
    guard_seconds: float
    def __init__(self, model: _Optional[str] = ..., region: _Optional[str] = ..., replicas_ready: _Optional[int] = ..., replicas: _Optional[int] = ..., queued: _Optional[int] = ..., running: _Optional[int] = ..., kv_utilisation: _Optional[float] = ..., gpu_utilisation: _Optional[float] = ..., requests_total: _Optional[int] = ..., telemetry_age_seconds: _Optional[float] = ..., request_rate: _Optional[float] = ..., p99_seconds: _Optional[float] = ..., shed_rate: _Optional[float] = ..., error_rate: _Optional[float] = ..., tier: _Optional[str] = ..., guard_seconds: _Optional[float] = ...) -> None: ...

class GetUsageResponse(_message.Message):
    __slots__ = ("rows", "sampled_at")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_AT_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[UsageRow]
    sampled_at: float
    def __init__(self, rows: _Optional[_Iterable[_Union[UsageRow, _Mapping]]] = ..., sampled_at: _Optional[float] = ...) -> None: ...

class DiffTableRequest(_message.Message):
    __slots__ = ("region", "from_version", "to_version")
    REGION_FIELD_NUMBER: _ClassVar[int]
    FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    TO_VERSION_FIELD_NUMBER: _ClassVar[int]
    region: str
    from_version: int
    to_version: int
    def __init__(self, region: _Optional[str] = ..., from_version: _Optional[int] = ..., to_version: _Optional[int] = ...) -> None: ...

class ReplicaChange(_message.Message):
    __slots__ = ("model", "replica_id", "change", "detail")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    model: str
    replica_id: str
    change: str
    detail: str
    def __init__(self, model: _Optional[str] = ..., replica_id: _Optional[str] = ..., change: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class DiffTableResponse(_message.Message):
    __slots__ = ("region", "from_version", "to_version", "changes", "kept_versions")
    REGION_FIELD_NUMBER: _ClassVar[int]
    FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    TO_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    KEPT_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    region: str
    from_version: int
    to_version: int
    changes: _containers.RepeatedCompositeFieldContainer[ReplicaChange]
    kept_versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, region: _Optional[str] = ..., from_version: _Optional[int] = ..., to_version: _Optional[int] = ..., changes: _Optional[_Iterable[_Union[ReplicaChange, _Mapping]]] = ..., kept_versions: _Optional[_Iterable[int]] = ...) -> None: ...

class AllocateRequest(_message.Message):
    __slots__ = ("model", "version", "gpus", "replicas", "region")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    gpus: int
    replicas: int
    region: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., gpus: _Optional[int] = ..., replicas: _Optional[int] = ..., region: _Optional[str] = ...) -> None: ...

class SlotView(_message.Message):
    __slots__ = ("replica_id", "node", "region", "model", "version", "gpus", "state", "displaces", "requested_at", "placed_at", "drain_cost")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DISPLACES_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    PLACED_AT_FIELD_NUMBER: _ClassVar[int]
    DRAIN_COST_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    node: str
    region: str
    model: str
    version: str
    gpus: _containers.RepeatedScalarFieldContainer[int]
    state: str
    displaces: _containers.RepeatedScalarFieldContainer[str]
    requested_at: float
    placed_at: float
    drain_cost: float
    def __init__(self, replica_id: _Optional[str] = ..., node: _Optional[str] = ..., region: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., gpus: _Optional[_Iterable[int]] = ..., state: _Optional[str] = ..., displaces: _Optional[_Iterable[str]] = ..., requested_at: _Optional[float] = ..., placed_at: _Optional[float] = ..., drain_cost: _Optional[float] = ...) -> None: ...

class PendingView(_message.Message):
    __slots__ = ("request_id", "model", "version", "gpus", "region", "age_seconds", "reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    version: str
    gpus: int
    region: str
    age_seconds: float
    reason: str
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., gpus: _Optional[int] = ..., region: _Optional[str] = ..., age_seconds: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class AllocateResponse(_message.Message):
    __slots__ = ("placed", "pending")
    PLACED_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    placed: _containers.RepeatedCompositeFieldContainer[SlotView]
    pending: _containers.RepeatedCompositeFieldContainer[PendingView]
    def __init__(self, placed: _Optional[_Iterable[_Union[SlotView, _Mapping]]] = ..., pending: _Optional[_Iterable[_Union[PendingView, _Mapping]]] = ...) -> None: ...

class ListAllocationsRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class ListAllocationsResponse(_message.Message):
    __slots__ = ("slots", "pending")
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    slots: _containers.RepeatedCompositeFieldContainer[SlotView]
    pending: _containers.RepeatedCompositeFieldContainer[PendingView]
    def __init__(self, slots: _Optional[_Iterable[_Union[SlotView, _Mapping]]] = ..., pending: _Optional[_Iterable[_Union[PendingView, _Mapping]]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("replica_id",)
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    def __init__(self, replica_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released", "undrained")
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    UNDRAINED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    undrained: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, released: _Optional[bool] = ..., undrained: _Optional[_Iterable[str]] = ...) -> None: ...

class TenantView(_message.Message):
    __slots__ = ("name", "api_key_sha256", "plan", "tiers", "requests_per_second", "tokens_per_second", "max_concurrency", "updated_at")
    NAME_FIELD_NUMBER: _ClassVar[int]
    API_KEY_SHA256_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    api_key_sha256: str
    plan: str
    tiers: _containers.RepeatedScalarFieldContainer[str]
    requests_per_second: float
    tokens_per_second: float
    max_concurrency: int
    updated_at: float
    def __init__(self, name: _Optional[str] = ..., api_key_sha256: _Optional[str] = ..., plan: _Optional[str] = ..., tiers: _Optional[_Iterable[str]] = ..., requests_per_second: _Optional[float] = ..., tokens_per_second: _Optional[float] = ..., max_concurrency: _Optional[int] = ..., updated_at: _Optional[float] = ...) -> None: ...

class ListTenantsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTenantsResponse(_message.Message):
    __slots__ = ("tenants", "managed", "max_tenants")
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    MANAGED_FIELD_NUMBER: _ClassVar[int]
    MAX_TENANTS_FIELD_NUMBER: _ClassVar[int]
    tenants: _containers.RepeatedCompositeFieldContainer[TenantView]
    managed: bool
    max_tenants: int
    def __init__(self, tenants: _Optional[_Iterable[_Union[TenantView, _Mapping]]] = ..., managed: _Optional[bool] = ..., max_tenants: _Optional[int] = ...) -> None: ...

class PutTenantRequest(_message.Message):
    __slots__ = ("tenant", "api_key", "fields", "create_only")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    API_KEY_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    CREATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    tenant: TenantView
    api_key: str
    fields: _containers.RepeatedScalarFieldContainer[str]
    create_only: bool
    def __init__(self, tenant: _Optional[_Union[TenantView, _Mapping]] = ..., api_key: _Optional[str] = ..., fields: _Optional[_Iterable[str]] = ..., create_only: _Optional[bool] = ...) -> None: ...

class PutTenantResponse(_message.Message):
    __slots__ = ("tenant", "created")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    tenant: TenantView
    created: bool
    def __init__(self, tenant: _Optional[_Union[TenantView, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class DeleteTenantRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteTenantResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class GetTiersRequest(_message.Message):
    __slots__ = ("region",)
    REGION_FIELD_NUMBER: _ClassVar[int]
    region: str
    def __init__(self, region: _Optional[str] = ...) -> None: ...

class TierView(_message.Message):
    __slots__ = ("region", "tier", "reserved_share", "reserved_slots", "quota_slots", "lent_slots", "request_rate", "queued", "p99_seconds", "shed_rate", "offered_rate")
    REGION_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    RESERVED_SHARE_FIELD_NUMBER: _ClassVar[int]
    RESERVED_SLOTS_FIELD_NUMBER: _ClassVar[int]
    QUOTA_SLOTS_FIELD_NUMBER: _ClassVar[int]
    LENT_SLOTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_RATE_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    P99_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SHED_RATE_FIELD_NUMBER: _ClassVar[int]
    OFFERED_RATE_FIELD_NUMBER: _ClassVar[int]
    region: str
    tier: str
    reserved_share: float
    reserved_slots: int
    quota_slots: int
    lent_slots: int
    request_rate: float
    queued: int
    p99_seconds: float
    shed_rate: float
    offered_rate: float
    def __init__(self, region: _Optional[str] = ..., tier: _Optional[str] = ..., reserved_share: _Optional[float] = ..., reserved_slots: _Optional[int] = ..., quota_slots: _Optional[int] = ..., lent_slots: _Optional[int] = ..., request_rate: _Optional[float] = ..., queued: _Optional[int] = ..., p99_seconds: _Optional[float] = ..., shed_rate: _Optional[float] = ..., offered_rate: _Optional[float] = ...) -> None: ...

class GetTiersResponse(_message.Message):
    __slots__ = ("tiers", "sampled_at")
    TIERS_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_AT_FIELD_NUMBER: _ClassVar[int]
    tiers: _containers.RepeatedCompositeFieldContainer[TierView]
    sampled_at: float
    def __init__(self, tiers: _Optional[_Iterable[_Union[TierView, _Mapping]]] = ..., sampled_at: _Optional[float] = ...) -> None: ...

class GetSpillRequest(_message.Message):
    __slots__ = ("region",)
    REGION_FIELD_NUMBER: _ClassVar[int]
    region: str
    def __init__(self, region: _Optional[str] = ...) -> None: ...

class SpillView(_message.Message):
    __slots__ = ("source", "target", "weight", "rtt_ms", "spilled_rate")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    RTT_MS_FIELD_NUMBER: _ClassVar[int]
    SPILLED_RATE_FIELD_NUMBER: _ClassVar[int]
    source: str
    target: str
    weight: float
    rtt_ms: float
    spilled_rate: float
    def __init__(self, source: _Optional[str] = ..., target: _Optional[str] = ..., weight: _Optional[float] = ..., rtt_ms: _Optional[float] = ..., spilled_rate: _Optional[float] = ...) -> None: ...

class GetSpillResponse(_message.Message):
    __slots__ = ("pairs", "sampled_at")
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_AT_FIELD_NUMBER: _ClassVar[int]
    pairs: _containers.RepeatedCompositeFieldContainer[SpillView]
    sampled_at: float
    def __init__(self, pairs: _Optional[_Iterable[_Union[SpillView, _Mapping]]] = ..., sampled_at: _Optional[float] = ...) -> None: ...

class RolloutRequest(_message.Message):
    __slots__ = ("model", "version", "canary_percent", "action")
    class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ACTION_UNSPECIFIED: _ClassVar[RolloutRequest.Action]
        ACTION_CANARY: _ClassVar[RolloutRequest.Action]
        ACTION_PROMOTE: _ClassVar[RolloutRequest.Action]
        ACTION_ROLLBACK: _ClassVar[RolloutRequest.Action]
    ACTION_UNSPECIFIED: RolloutRequest.Action
    ACTION_CANARY: RolloutRequest.Action
    ACTION_PROMOTE: RolloutRequest.Action
    ACTION_ROLLBACK: RolloutRequest.Action
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    canary_percent: float
    action: RolloutRequest.Action
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., canary_percent: _Optional[float] = ..., action: _Optional[_Union[RolloutRequest.Action, str]] = ...) -> None: ...

class RolloutRegion(_message.Message):
    __slots__ = ("region", "stable_ready", "canary_ready", "canary_share")
    REGION_FIELD_NUMBER: _ClassVar[int]
    STABLE_READY_FIELD_NUMBER: _ClassVar[int]
    CANARY_READY_FIELD_NUMBER: _ClassVar[int]
    CANARY_SHARE_FIELD_NUMBER: _ClassVar[int]
    region: str
    stable_ready: int
    canary_ready: int
    canary_share: float
    def __init__(self, region: _Optional[str] = ..., stable_ready: _Optional[int] = ..., canary_ready: _Optional[int] = ..., canary_share: _Optional[float] = ...) -> None: ...

class RolloutView(_message.Message):
    __slots__ = ("model", "stable_version", "canary_version", "canary_percent", "state", "updated_at", "default_version", "regions")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_VERSION_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    model: str
    stable_version: str
    canary_version: str
    canary_percent: float
    state: str
    updated_at: float
    default_version: str
    regions: _containers.RepeatedCompositeFieldContainer[RolloutRegion]
    def __init__(self, model: _Optional[str] = ..., stable_version: _Optional[str] = ..., canary_version: _Optional[str] = ..., canary_percent: _Optional[float] = ..., state: _Optional[str] = ..., updated_at: _Optional[float] = ..., default_version: _Optional[str] = ..., regions: _Optional[_Iterable[_Union[RolloutRegion, _Mapping]]] = ...) -> None: ...

class RolloutResponse(_message.Message):
    __slots__ = ("rollout",)
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    rollout: RolloutView
    def __init__(self, rollout: _Optional[_Union[RolloutView, _Mapping]] = ...) -> None: ...

class ListRolloutsRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class ListRolloutsResponse(_message.Message):
    __slots__ = ("rollouts",)
    ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    rollouts: _containers.RepeatedCompositeFieldContainer[RolloutView]
    def __init__(self, rollouts: _Optional[_Iterable[_Union[RolloutView, _Mapping]]] = ...) -> None: ...

class GetScaleRequest(_message.Message):
    __slots__ = ("region",)
    REGION_FIELD_NUMBER: _ClassVar[int]
    region: str
    def __init__(self, region: _Optional[str] = ...) -> None: ...

class ScaleView(_message.Message):
    __slots__ = ("model", "region", "current", "ready", "needed_now", "needed_for_ramp", "desired", "promote", "arrival_rate", "forecast_rate", "queue_wait_seconds", "service_seconds")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    NEEDED_NOW_FIELD_NUMBER: _ClassVar[int]
    NEEDED_FOR_RAMP_FIELD_NUMBER: _ClassVar[int]
    DESIRED_FIELD_NUMBER: _ClassVar[int]
    PROMOTE_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_RATE_FIELD_NUMBER: _ClassVar[int]
    FORECAST_RATE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SERVICE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    model: str
    region: str
    current: int
    ready: int
    needed_now: int
    needed_for_ramp: int
    desired: int
    promote: int
    arrival_rate: float
    forecast_rate: float
    queue_wait_seconds: float
    service_seconds: float
    def __init__(self, model: _Optional[str] = ..., region: _Optional[str] = ..., current: _Optional[int] = ..., ready: _Optional[int] = ..., needed_now: _Optional[int] = ..., needed_for_ramp: _Optional[int] = ..., desired: _Optional[int] = ..., promote: _Optional[int] = ..., arrival_rate: _Optional[float] = ..., forecast_rate: _Optional[float] = ..., queue_wait_seconds: _Optional[float] = ..., service_seconds: _Optional[float] = ...) -> None: ...

class StandbyView(_message.Message):
    __slots__ = ("region", "standby_nodes", "standby_to_keep", "startup_seconds", "replacement_seconds")
    REGION_FIELD_NUMBER: _ClassVar[int]
    STANDBY_NODES_FIELD_NUMBER: _ClassVar[int]
    STANDBY_TO_KEEP_FIELD_NUMBER: _ClassVar[int]
    STARTUP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REPLACEMENT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    region: str
    standby_nodes: int
    standby_to_keep: int
    startup_seconds: float
    replacement_seconds: float
    def __init__(self, region: _Optional[str] = ..., standby_nodes: _Optional[int] = ..., standby_to_keep: _Optional[int] = ..., startup_seconds: _Optional[float] = ..., replacement_seconds: _Optional[float] = ...) -> None: ...

class GetScaleResponse(_message.Message):
    __slots__ = ("models", "regions", "sampled_at", "leading")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_AT_FIELD_NUMBER: _ClassVar[int]
    LEADING_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ScaleView]
    regions: _containers.RepeatedCompositeFieldContainer[StandbyView]
    sampled_at: float
    leading: bool
    def __init__(self, models: _Optional[_Iterable[_Union[ScaleView, _Mapping]]] = ..., regions: _Optional[_Iterable[_Union[StandbyView, _Mapping]]] = ..., sampled_at: _Optional[float] = ..., leading: _Optional[bool] = ...) -> None: ...

class GetCacheRequest(_message.Message):
    __slots__ = ("model", "by_tenant")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BY_TENANT_FIELD_NUMBER: _ClassVar[int]
    model: str
    by_tenant: bool
    def __init__(self, model: _Optional[str] = ..., by_tenant: _Optional[bool] = ...) -> None: ...

class CacheView(_message.Message):
    __slots__ = ("model", "tenant", "deterministic_rate", "duplicate_share", "saved_gpu_seconds_per_s", "saved_gpu_seconds", "hit_rate", "proxies", "proxies_enabled", "window_seconds", "deterministic", "duplicates", "hits")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DETERMINISTIC_RATE_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_SHARE_FIELD_NUMBER: _ClassVar[int]
    SAVED_GPU_SECONDS_PER_S_FIELD_NUMBER: _ClassVar[int]
    SAVED_GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    PROXIES_FIELD_NUMBER: _ClassVar[int]
    PROXIES_ENABLED_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DETERMINISTIC_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    model: str
    tenant: str
    deterministic_rate: float
    duplicate_share: float
    saved_gpu_seconds_per_s: float
    saved_gpu_seconds: float
    hit_rate: float
    proxies: int
    proxies_enabled: int
    window_seconds: float
    deterministic: int
    duplicates: int
    hits: int
    def __init__(self, model: _Optional[str] = ..., tenant: _Optional[str] = ..., deterministic_rate: _Optional[float] = ..., duplicate_share: _Optional[float] = ..., saved_gpu_seconds_per_s: _Optional[float] = ..., saved_gpu_seconds: _Optional[float] = ..., hit_rate: _Optional[float] = ..., proxies: _Optional[int] = ..., proxies_enabled: _Optional[int] = ..., window_seconds: _Optional[float] = ..., deterministic: _Optional[int] = ..., duplicates: _Optional[int] = ..., hits: _Optional[int] = ...) -> None: ...

class GetCacheResponse(_message.Message):
    __slots__ = ("rows", "sampled_at")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_AT_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[CacheView]
    sampled_at: float
    def __init__(self, rows: _Optional[_Iterable[_Union[CacheView, _Mapping]]] = ..., sampled_at: _Optional[float] = ...) -> None: ...

class ExportTrafficRequest(_message.Message):
    __slots__ = ("since_seconds", "model", "max_rows")
    SINCE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_ROWS_FIELD_NUMBER: _ClassVar[int]
    since_seconds: float
    model: str
    max_rows: int
    def __init__(self, since_seconds: _Optional[float] = ..., model: _Optional[str] = ..., max_rows: _Optional[int] = ...) -> None: ...

class ExportTrafficBatch(_message.Message):
    __slots__ = ("rows", "dropped", "truncated")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[_tables_pb2.TrafficRow]
    dropped: int
    truncated: bool
    def __init__(self, rows: _Optional[_Iterable[_Union[_tables_pb2.TrafficRow, _Mapping]]] = ..., dropped: _Optional[int] = ..., truncated: _Optional[bool] = ...) -> None: ...

class RouterGuard(_message.Message):
    __slots__ = ("ttft_p99_ratio", "error_increase_pp", "min_requests", "min_seconds", "max_seconds", "window_seconds")
    TTFT_P99_RATIO_FIELD_NUMBER: _ClassVar[int]
    ERROR_INCREASE_PP_FIELD_NUMBER: _ClassVar[int]
    MIN_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ttft_p99_ratio: float
    error_increase_pp: float
    min_requests: int
    min_seconds: float
    max_seconds: float
    window_seconds: float
    def __init__(self, ttft_p99_ratio: _Optional[float] = ..., error_increase_pp: _Optional[float] = ..., min_requests: _Optional[int] = ..., min_seconds: _Optional[float] = ..., max_seconds: _Optional[float] = ..., window_seconds: _Optional[float] = ...) -> None: ...

class RouterRolloutRequest(_message.Message):
    __slots__ = ("text", "canary_percent", "guard")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    CANARY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    GUARD_FIELD_NUMBER: _ClassVar[int]
    text: str
    canary_percent: float
    guard: RouterGuard
    def __init__(self, text: _Optional[str] = ..., canary_percent: _Optional[float] = ..., guard: _Optional[_Union[RouterGuard, _Mapping]] = ...) -> None: ...

class RouterRolloutResponse(_message.Message):
    __slots__ = ("rollout",)
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    rollout: RouterRolloutView
    def __init__(self, rollout: _Optional[_Union[RouterRolloutView, _Mapping]] = ...) -> None: ...

class GetRouterRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class RouterConfigView(_message.Message):
    __slots__ = ("version", "digest", "created_at", "text")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    version: int
    digest: str
    created_at: float
    text: str
    def __init__(self, version: _Optional[int] = ..., digest: _Optional[str] = ..., created_at: _Optional[float] = ..., text: _Optional[str] = ...) -> None: ...

class RouterGroupFigures(_message.Message):
    __slots__ = ("requests", "errors", "ttft_p99_seconds", "ttft_p50_seconds")
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    TTFT_P99_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TTFT_P50_SECONDS_FIELD_NUMBER: _ClassVar[int]
    requests: int
    errors: int
    ttft_p99_seconds: float
    ttft_p50_seconds: float
    def __init__(self, requests: _Optional[int] = ..., errors: _Optional[int] = ..., ttft_p99_seconds: _Optional[float] = ..., ttft_p50_seconds: _Optional[float] = ...) -> None: ...

class RouterRolloutView(_message.Message):
    __slots__ = ("id", "baseline_version", "candidate_version", "canary_percent", "guard", "state", "reason", "started_at", "updated_at", "decided_at", "llr", "rollback_at", "promote_at", "windows", "bad_windows", "canary", "baseline")
    ID_FIELD_NUMBER: _ClassVar[int]
    BASELINE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    GUARD_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    LLR_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_AT_FIELD_NUMBER: _ClassVar[int]
    PROMOTE_AT_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    BAD_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    BASELINE_FIELD_NUMBER: _ClassVar[int]
    id: int
    baseline_version: int
    candidate_version: int
    canary_percent: float
    guard: RouterGuard
    state: str
    reason: str
    started_at: float
    updated_at: float
    decided_at: float
    llr: float
    rollback_at: float
    promote_at: float
    windows: int
    bad_windows: int
    canary: RouterGroupFigures
    baseline: RouterGroupFigures
    def __init__(self, id: _Optional[int] = ..., baseline_version: _Optional[int] = ..., candidate_version: _Optional[int] = ..., canary_percent: _Optional[float] = ..., guard: _Optional[_Union[RouterGuard, _Mapping]] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., started_at: _Optional[float] = ..., updated_at: _Optional[float] = ..., decided_at: _Optional[float] = ..., llr: _Optional[float] = ..., rollback_at: _Optional[float] = ..., promote_at: _Optional[float] = ..., windows: _Optional[int] = ..., bad_windows: _Optional[int] = ..., canary: _Optional[_Union[RouterGroupFigures, _Mapping]] = ..., baseline: _Optional[_Union[RouterGroupFigures, _Mapping]] = ...) -> None: ...

class RouterProxyView(_message.Message):
    __slots__ = ("proxy_id", "region", "connected", "assigned_version", "applied_version", "error", "canary")
    PROXY_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_VERSION_FIELD_NUMBER: _ClassVar[int]
    APPLIED_VERSION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    proxy_id: str
    region: str
    connected: bool
    assigned_version: int
    applied_version: int
    error: str
    canary: bool
    def __init__(self, proxy_id: _Optional[str] = ..., region: _Optional[str] = ..., connected: _Optional[bool] = ..., assigned_version: _Optional[int] = ..., applied_version: _Optional[int] = ..., error: _Optional[str] = ..., canary: _Optional[bool] = ...) -> None: ...

class GetRouterResponse(_message.Message):
    __slots__ = ("default_version", "configs", "rollout", "proxies", "config")
    DEFAULT_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    PROXIES_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    default_version: int
    configs: _containers.RepeatedCompositeFieldContainer[RouterConfigView]
    rollout: RouterRolloutView
    proxies: _containers.RepeatedCompositeFieldContainer[RouterProxyView]
    config: RouterConfigView
    def __init__(self, default_version: _Optional[int] = ..., configs: _Optional[_Iterable[_Union[RouterConfigView, _Mapping]]] = ..., rollout: _Optional[_Union[RouterRolloutView, _Mapping]] = ..., proxies: _Optional[_Iterable[_Union[RouterProxyView, _Mapping]]] = ..., config: _Optional[_Union[RouterConfigView, _Mapping]] = ...) -> None: ...

class RouterDecideRequest(_message.Message):
    __slots__ = ("action", "reason")
    class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ACTION_UNSPECIFIED: _ClassVar[RouterDecideRequest.Action]
        ACTION_PROMOTE: _ClassVar[RouterDecideRequest.Action]
        ACTION_ROLLBACK: _ClassVar[RouterDecideRequest.Action]
    ACTION_UNSPECIFIED: RouterDecideRequest.Action
    ACTION_PROMOTE: RouterDecideRequest.Action
    ACTION_ROLLBACK: RouterDecideRequest.Action
    ACTION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    action: RouterDecideRequest.Action
    reason: str
    def __init__(self, action: _Optional[_Union[RouterDecideRequest.Action, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class RouterDecideResponse(_message.Message):
    __slots__ = ("rollout",)
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    rollout: RouterRolloutView
    def __init__(self, rollout: _Optional[_Union[RouterRolloutView, _Mapping]] = ...) -> None: ...

class GetEnginesRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class EngineParamView(_message.Message):
    __slots__ = ("name", "value", "stderr", "identifiable", "reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    IDENTIFIABLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: float
    stderr: float
    identifiable: bool
    reason: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[float] = ..., stderr: _Optional[float] = ..., identifiable: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class EngineFitView(_message.Message):
    __slots__ = ("model", "kind", "engine", "gpus", "version", "replica_ids", "samples", "window_seconds", "params", "relative_rms", "r2", "step_seconds", "kv_blocks_total", "kv_block_tokens", "max_running", "max_step_tokens", "unchunked", "sampled_replicas", "prefix_cache_blocks")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLICA_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    RELATIVE_RMS_FIELD_NUMBER: _ClassVar[int]
    R2_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_FIELD_NUMBER: _ClassVar[int]
    MAX_STEP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    UNCHUNKED_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    model: str
    kind: str
    engine: str
    gpus: int
    version: str
    replica_ids: _containers.RepeatedScalarFieldContainer[str]
    samples: int
    window_seconds: float
    params: _containers.RepeatedCompositeFieldContainer[EngineParamView]
    relative_rms: float
    r2: float
    step_seconds: float
    kv_blocks_total: int
    kv_block_tokens: int
    max_running: int
    max_step_tokens: int
    unchunked: bool
    sampled_replicas: int
    prefix_cache_blocks: int
    def __init__(self, model: _Optional[str] = ..., kind: _Optional[str] = ..., engine: _Optional[str] = ..., gpus: _Optional[int] = ..., version: _Optional[str] = ..., replica_ids: _Optional[_Iterable[str]] = ..., samples: _Optional[int] = ..., window_seconds: _Optional[float] = ..., params: _Optional[_Iterable[_Union[EngineParamView, _Mapping]]] = ..., relative_rms: _Optional[float] = ..., r2: _Optional[float] = ..., step_seconds: _Optional[float] = ..., kv_blocks_total: _Optional[int] = ..., kv_block_tokens: _Optional[int] = ..., max_running: _Optional[int] = ..., max_step_tokens: _Optional[int] = ..., unchunked: _Optional[bool] = ..., sampled_replicas: _Optional[int] = ..., prefix_cache_blocks: _Optional[int] = ...) -> None: ...

class GetEnginesResponse(_message.Message):
    __slots__ = ("engines", "sampled_at", "leading", "samples_dropped")
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_AT_FIELD_NUMBER: _ClassVar[int]
    LEADING_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    engines: _containers.RepeatedCompositeFieldContainer[EngineFitView]
    sampled_at: float
    leading: bool
    samples_dropped: int
    def __init__(self, engines: _Optional[_Iterable[_Union[EngineFitView, _Mapping]]] = ..., sampled_at: _Optional[float] = ..., leading: _Optional[bool] = ..., samples_dropped: _Optional[int] = ...) -> None: ...
