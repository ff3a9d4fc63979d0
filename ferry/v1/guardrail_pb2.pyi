from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GuardStage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GUARD_STAGE_UNSPECIFIED: _ClassVar[GuardStage]
    GUARD_STAGE_PROMPT: _ClassVar[GuardStage]
    GUARD_STAGE_OUTPUT: _ClassVar[GuardStage]

class GuardAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GUARD_ACTION_UNSPECIFIED: _ClassVar[GuardAction]
    GUARD_ACTION_ALLOW: _ClassVar[GuardAction]
    GUARD_ACTION_DENY: _ClassVar[GuardAction]
    GUARD_ACTION_REDACT: _ClassVar[GuardAction]
GUARD_STAGE_UNSPECIFIED: GuardStage
GUARD_STAGE_PROMPT: GuardStage
GUARD_STAGE_OUTPUT: GuardStage
GUARD_ACTION_UNSPECIFIED: GuardAction
GUARD_ACTION_ALLOW: GuardAction
GUARD_ACTION_DENY: GuardAction
GUARD_ACTION_REDACT: GuardAction

class CheckRequest(_message.Message):
    __slots__ = ("stage", "model", "tier", "tenant", "request_id", "text", "context", "final")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    stage: GuardStage
    model: str
    tier: str
    tenant: str
    request_id: str
    text: str
    context: str
    final: bool
    def __init__(self, stage: _Optional[_Union[GuardStage, str]] = ..., model: _Optional[str] = ..., tier: _Optional[str] = ..., tenant: _Optional[str] = ..., request_id: _Optional[str] = ..., text: _Optional[str] = ..., context: _Optional[str] = ..., final: _Optional[bool] = ...) -> None: ...

class CheckResponse(_message.Message):
    __slots__ = ("action", "reason", "text")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    action: GuardAction
    reason: str
    text: str
    def __init__(self, action: _Optional[_Union[GuardAction, str]] = ..., reason: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...
