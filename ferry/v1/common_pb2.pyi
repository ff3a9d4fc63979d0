from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    TIER_INTERACTIVE: _ClassVar[Tier]
    TIER_STANDARD: _ClassVar[Tier]
    TIER_BATCH: _ClassVar[Tier]

class ReplicaState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLICA_STATE_UNSPECIFIED: _ClassVar[ReplicaState]
    REPLICA_STATE_WARMING: _ClassVar[ReplicaState]
    REPLICA_STATE_READY: _ClassVar[ReplicaState]
    REPLICA_STATE_DRAINING: _ClassVar[ReplicaState]
    REPLICA_STATE_DRAINED: _ClassVar[ReplicaState]
    REPLICA_STATE_DEAD: _ClassVar[ReplicaState]
TIER_UNSPECIFIED: Tier
TIER_INTERACTIVE: Tier
TIER_STANDARD: Tier
TIER_BATCH: Tier
REPLICA_STATE_UNSPECIFIED: ReplicaState
REPLICA_STATE_WARMING: ReplicaState
REPLICA_STATE_READY: ReplicaState
REPLICA_STATE_DRAINING: ReplicaState
REPLICA_STATE_DRAINED: ReplicaState
REPLICA_STATE_DEAD: ReplicaState

class ReplicaLoad(_message.Message):
    __slots__ = ("replica_id", "state", "queued", "running", "kv_blocks_free", "kv_blocks_total", "gpu_utilization", "requests_total", "prefix_hit_blocks", "prefix_lookup_blocks", "engine")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_FREE_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    GPU_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HIT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_LOOKUP_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    state: ReplicaState
    queued: int
    running: int
    kv_blocks_free: int
    kv_blocks_total: int
    gpu_utilization: float
    requests_total: int
    prefix_hit_blocks: int
    prefix_lookup_blocks: int
    engine: EngineSample
    def __init__(self, replica_id: _Optional[str] = ..., state: _Optional[_Union[ReplicaState, str]] = ..., queued: _Optional[int] = ..., running: _Optional[int] = ..., kv_blocks_free: _Optional[int] = ..., kv_blocks_total: _Optional[int] = ..., gpu_utilization: _Optional[float] = ..., requests_total: _Optional[int] = ..., prefix_hit_blocks: _Optional[int] = ..., prefix_lookup_blocks: _Optional[int] = ..., engine: _Optional[_Union[EngineSample, _Mapping]] = ...) -> None: ...

class EngineSample(_message.Message):
    __slots__ = ("replica_id", "prefill_steps", "prefill_tokens", "decode_steps", "decode_tokens", "step_seconds", "intervals", "kv_blocks_total", "kv_block_tokens", "max_running", "max_step_tokens", "unchunked", "prefix_cache_blocks")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    PREFILL_STEPS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DECODE_STEPS_FIELD_NUMBER: _ClassVar[int]
    DECODE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INTERVALS_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_FIELD_NUMBER: _ClassVar[int]
    MAX_STEP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    UNCHUNKED_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    prefill_steps: int
    prefill_tokens: int
    decode_steps: int
    decode_tokens: int
    step_seconds: float
    intervals: int
    kv_blocks_total: int
    kv_block_tokens: int
    max_running: int
    max_step_tokens: int
    unchunked: bool
    prefix_cache_blocks: int
    def __init__(self, replica_id: _Optional[str] = ..., prefill_steps: _Optional[int] = ..., prefill_tokens: _Optional[int] = ..., decode_steps: _Optional[int] = ..., decode_tokens: _Optional[int] = ..., step_seconds: _Optional[float] = ..., intervals: _Optional[int] = ..., kv_blocks_total: _Optional[int] = ..., kv_block_tokens: _Optional[int] = ..., max_running: _Optional[int] = ..., max_step_tokens: _Optional[int] = ..., unchunked: _Optional[bool] = ..., prefix_cache_blocks: _Optional[int] = ...) -> None: ...
