"""One root error type with subclasses that carry typed fields.

Policies and engines raise these; the gRPC status is chosen only at the
boundary, in the servicers, from :func:`ferry.grpcutil.status_for`.
"""

from __future__ import annotations


class FerryError(Exception):
    """Root of every error Ferry raises on purpose."""


class ConfigError(FerryError):
    """A configuration value is missing, unknown or out of range."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"config {key}: {reason}")
        self.key = key
        self.reason = reason


class InvalidArgument(FerryError):
    """A request field is missing, malformed or over its limit.

    ``code`` says which, in OpenAI's words: ``invalid_value`` (absent, or out of its range), ``invalid_type``
    (not the JSON type the field takes), ``context_length_exceeded`` (the prompt, or prompt + max tokens,
    larger than the model's context), ``unknown_parameter``.
    """

    def __init__(self, field: str, reason: str, code: str = "invalid_value") -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
        self.code = code


class Unauthenticated(FerryError):
    """No credential, or one that names no tenant."""


class PermissionDenied(FerryError):
    """The tenant may not do this (for example use this tier)."""


class NotFound(FerryError):
    """A named thing (model, replica, version) does not exist."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f"{kind} {name!r} not found")
        self.kind = kind
        self.name = name


class AlreadyExists(FerryError):
    """A claim (replica id, node name, address) that another live holder already has."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class NoReplica(FerryError):
    """The model exists but no replica can take the request now."""

    def __init__(self, model: str, reason: str) -> None:
        super().__init__(f"no replica for model {model!r}: {reason}")
        self.model = model
        self.reason = reason


class Overloaded(FerryError):
    """Admission refused: retry after ``retry_after`` seconds."""

    def __init__(self, what: str, retry_after: float) -> None:
        super().__init__(f"{what}; retry after {retry_after:.3f} s")
        self.what = what
        self.retry_after = retry_after


class DeadlineExceeded(FerryError):
    """The request's deadline passed before it was answered."""


class ReplicaFailed(FerryError):
    """A replica failed a request; ``output_started`` tells whether any output reached the client."""

    def __init__(self, replica_id: str, reason: str, *, output_started: bool, retryable: bool) -> None:
        super().__init__(f"replica {replica_id}: {reason}")
        self.replica_id = replica_id
        self.reason = reason
        self.output_started = output_started
        self.retryable = retryable


class Unavailable(FerryError):
    """A dependency (store, control plane) cannot be reached now."""
