from ferry.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
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
    __slots__ = ("replica_id", "node", "region", "model", "version", "address", "state", "drain_requested", "load", "telemetry_age_seconds", "in_table")
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
    def __init__(self, replica_id: _Optional[str] = ..., node: _Optional[str] = ..., region: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., address: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.ReplicaState, str]] = ..., drain_requested: _Optional[bool] = ..., load: _Optional[_Union[_common_pb2.ReplicaLoad, _Mapping]] = ..., telemetry_age_seconds: _Optional[float] = ..., in_table: _Optional[bool] = ...) -> None: ...

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
