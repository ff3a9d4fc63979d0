"""The one place the control plane turns an error into a gRPC status.

:func:`status_of` chooses the status of a :class:`ferry.errors.FerryError`:
the control plane's own errors (:mod:`controlplane.errors`:
FAILED_PRECONDITION, ABORTED, UNIMPLEMENTED) first, then
:func:`ferry.grpcutil.status_for` (INVALID_ARGUMENT naming the field,
NOT_FOUND, RESOURCE_EXHAUSTED, UNAVAILABLE, ...; INTERNAL for an unmapped
one). :func:`abort` ends a call with it and the error's message;
:func:`answer` runs a unary handler's body and :func:`serve` a streaming
handler's, aborting on a ``FerryError``. Every servicer, handler and the
admin-token interceptor of :mod:`controlplane.api` goes through these; no
other module of the control plane chooses a status.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc

from controlplane.errors import Aborted, FailedPrecondition, Unimplemented
from ferry.errors import FerryError
from ferry.grpcutil import status_for

R = TypeVar("R")

_STATUS: tuple[tuple[type[FerryError], grpc.StatusCode], ...] = (
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (Aborted, grpc.StatusCode.ABORTED),
    (Unimplemented, grpc.StatusCode.UNIMPLEMENTED),
)


def status_of(error: FerryError) -> grpc.StatusCode:
    """The gRPC status of ``error`` (module docstring)."""
    for cls, code in _STATUS:
        if isinstance(error, cls):
            return code
    return status_for(error)


async def abort(context: Any, error: FerryError) -> NoReturn:
    """End the call with the status of ``error`` and its message."""
    await context.abort(status_of(error), str(error))
    raise AssertionError("context.abort returned")  # it raises; this line is for the type checker


async def answer(context: Any, call: Callable[[], Awaitable[R] | R]) -> R:
    """Run a unary handler's body; a ``FerryError`` aborts the call (:func:`abort`)."""
    try:
        result = call()
        return await result if inspect.isawaitable(result) else result
    except FerryError as exc:
        await abort(context, exc)


async def serve(context: Any, body: Awaitable[None]) -> None:
    """Run a streaming handler's body; a ``FerryError`` aborts the call (:func:`abort`)."""
    try:
        await body
    except FerryError as exc:
        await abort(context, exc)
