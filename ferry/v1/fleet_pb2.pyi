from ferry.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AgentMessage(_message.Message):
    __slots__ = ("register", "telemetry", "result")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    register: Register
    telemetry: Telemetry
    result: CommandResult
    def __init__(self, register: _Optional[_Union[Register, _Mapping]] = ..., telemetry: _Optional[_Union[Telemetry, _Mapping]] = ..., result: _Optional[_Union[CommandResult, _Mapping]] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("node", "region", "gpus", "replicas", "agent_version", "join_token", "standby")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    JOIN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STANDBY_FIELD_NUMBER: _ClassVar[int]
    node: str
    region: str
    gpus: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaInfo]
    agent_version: str
    join_token: str
    standby: bool
    def __init__(self, node: _Optional[str] = ..., region: _Optional[str] = ..., gpus: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaInfo, _Mapping]]] = ..., agent_version: _Optional[str] = ..., join_token: _Optional[str] = ..., standby: _Optional[bool] = ...) -> None: ...

class ReplicaInfo(_message.Message):
    __slots__ = ("replica_id", "model", "version", "address", "kserve_model", "gpus", "max_concurrency", "kv_block_tokens", "max_context_tokens", "state", "inputs", "http_address", "engine")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    KSERVE_MODEL_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    HTTP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    model: str
    version: str
    address: str
    kserve_model: str
    gpus: int
    max_concurrency: int
    kv_block_tokens: int
    max_context_tokens: int
    state: _common_pb2.ReplicaState
    inputs: _containers.RepeatedScalarFieldContainer[str]
    http_address: str
    engine: str
    def __init__(self, replica_id: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., address: _Optional[str] = ..., kserve_model: _Optional[str] = ..., gpus: _Optional[int] = ..., max_concurrency: _Optional[int] = ..., kv_block_tokens: _Optional[int] = ..., max_context_tokens: _Optional[int] = ..., state: _Optional[_Union[_common_pb2.ReplicaState, str]] = ..., inputs: _Optional[_Iterable[str]] = ..., http_address: _Optional[str] = ..., engine: _Optional[str] = ...) -> None: ...

class Telemetry(_message.Message):
    __slots__ = ("seq", "replicas", "changed", "removed")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    seq: int
    replicas: _containers.RepeatedCompositeFieldContainer[_common_pb2.ReplicaLoad]
    changed: _containers.RepeatedCompositeFieldContainer[ReplicaInfo]
    removed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, seq: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[_common_pb2.ReplicaLoad, _Mapping]]] = ..., changed: _Optional[_Iterable[_Union[ReplicaInfo, _Mapping]]] = ..., removed: _Optional[_Iterable[str]] = ...) -> None: ...

class CommandResult(_message.Message):
    __slots__ = ("command_id", "ok", "message")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    ok: bool
    message: str
    def __init__(self, command_id: _Optional[str] = ..., ok: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class ControlMessage(_message.Message):
    __slots__ = ("registered", "command")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    registered: Registered
    command: Command
    def __init__(self, registered: _Optional[_Union[Registered, _Mapping]] = ..., command: _Optional[_Union[Command, _Mapping]] = ...) -> None: ...

class Registered(_message.Message):
    __slots__ = ("control_plane_id", "telemetry_interval_seconds", "grace_seconds")
    CONTROL_PLANE_ID_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    control_plane_id: str
    telemetry_interval_seconds: float
    grace_seconds: float
    def __init__(self, control_plane_id: _Optional[str] = ..., telemetry_interval_seconds: _Optional[float] = ..., grace_seconds: _Optional[float] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("command_id", "kind", "replica_id")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[Command.Kind]
        KIND_DRAIN: _ClassVar[Command.Kind]
        KIND_UNDRAIN: _ClassVar[Command.Kind]
    KIND_UNSPECIFIED: Command.Kind
    KIND_DRAIN: Command.Kind
    KIND_UNDRAIN: Command.Kind
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    kind: Command.Kind
    replica_id: str
    def __init__(self, command_id: _Optional[str] = ..., kind: _Optional[_Union[Command.Kind, str]] = ..., replica_id: _Optional[str] = ...) -> None: ...
