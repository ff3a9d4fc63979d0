"""gRPC plumbing shared by every server and client of Ferry.

- :func:`start_server` binds a ``grpc.aio`` server (port 0 allowed: the bound
  port is returned), registers the given services with gRPC health checking
  (:class:`ferry.readiness.Readiness`: SERVING, or what the caller's own
  readiness says) and server reflection, and starts it.
- :func:`status_for` maps a :class:`ferry.errors.FerryError` to a gRPC status
  code; servicers call it at the boundary and nowhere else is a status chosen.
- :func:`split_address` parses ``host:port``.
- :class:`StreamWriter` writes on a client stream without outliving it.

Every server gets :class:`ferry.decodeguard.DecodeGuard` first among its
interceptors, so malformed request bytes are answered INVALID_ARGUMENT.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ferry import errors
from ferry.decodeguard import DecodeGuard
from ferry.readiness import Readiness

R = TypeVar("R")

DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, Any]]:
    """Options for servers and channels: message size limits and keepalive that notices dead peers."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


DEFAULT_MAX_STREAMS_PER_CONNECTION = 4096


def server_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                   max_streams: int = DEFAULT_MAX_STREAMS_PER_CONNECTION) -> list[tuple[str, Any]]:
    """Server options: the channel options, at most ``max_streams`` concurrent streams (calls) per
    connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS), and permission for client keepalive pings.

    A client that opens more streams than the limit before the server's settings reach it gets
    them refused (RST_STREAM, UNAVAILABLE to the caller), and gRPC clients share one connection
    among channels to the same target; so the limit sits well above what one proxy sends to one
    replica (its in-flight cap), and admission, not this, is what bounds work."""
    return [
        *channel_options(max_message_bytes),
        ("grpc.max_concurrent_streams", max_streams),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ]


M = TypeVar("M")


def take_within(queue: collections.deque[M], *, max_rows: int, max_bytes: int) -> list[M]:
    """The oldest messages of ``queue``, popped, while they fit ``max_rows`` and ``max_bytes`` of serialized
    size (each message's ``ByteSize()`` and 6 bytes of field tag and length; at least one, when any waits): so
    that repeated rows put on one message stay under the channels' message limit whatever their size."""
    out: list[M] = []
    size = 0
    while queue and len(out) < max_rows:
        n = queue[0].ByteSize() + 6  # type: ignore[attr-defined]
        if out and size + n > max_bytes:
            break
        out.append(queue.popleft())
        size += n
    return out


def chunks_within(rows: Sequence[M], *, max_rows: int, max_bytes: int) -> list[list[M]]:
    """``rows`` in order, cut into lists that each fit :func:`take_within`'s bounds."""
    queue = collections.deque(rows)
    out = []
    while queue:
        out.append(take_within(queue, max_rows=max_rows, max_bytes=max_bytes))
    return out


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` to its parts; raises ValueError naming the address."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"address {address!r}: expected host:port")
    return host, int(port)


class StreamWriter:
    """The writes of one client stream (``grpc.aio`` stream-stream call), none of which outlives the call.

    grpcio's asyncio ``write`` can stay pending for ever after its call has ended: with 625 agent streams
    registering against busy control planes, 1 to 10 of the 250 to 300 streams the server ended in a run
    (UNAVAILABLE, the store late) left the client's next telemetry write pending with the call's status
    already read, so that agent never reconnected. Each :meth:`write` therefore races the message against the call's end
    (one done callback per call, not one per write) and against ``until`` (the caller's reader or stop
    event), and cancels the write when one of those comes first.
    """

    def __init__(self, call: Any, *until: asyncio.Future[Any]) -> None:
        self._call = call
        self._until = until
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.abandoned = 0  # writes cancelled because the call or ``until`` ended first
        call.add_done_callback(self._end)

    def _end(self, _call: Any) -> None:
        if not self.ended.done():
            self.ended.set_result(None)

    async def write(self, message: Any) -> bool:
        """Write ``message``; False (nothing raised) when the call ended or ``until`` finished first.

        The call's own errors (``AioRpcError``, ``UsageError``, ``InvalidStateError``) propagate as
        ``call.write`` raises them.
        """
        if self.ended.done() or self._call.done() or any(f.done() for f in self._until):
            return False
        writing = asyncio.ensure_future(self._call.write(message))
        try:
            await asyncio.wait({writing, self.ended, *self._until}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not writing.done():
                writing.cancel()
                await asyncio.wait({writing})
                if not writing.cancelled():
                    writing.exception()  # retrieved: the call's end is what the caller learns about
        if writing.cancelled():
            self.abandoned += 1
            return False
        writing.result()
        return True


async def start_server(
    services: Sequence[tuple[Callable[[Any, grpc.aio.Server], None], Any, str]],
    listen: str,
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    credentials: grpc.ServerCredentials | None = None,
    max_streams: int = DEFAULT_MAX_STREAMS_PER_CONNECTION,
    readiness: Readiness | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Start a server for ``services`` (each ``(add_fn, servicer, full_service_name)``) on ``listen``.

    Adds gRPC health checking (every service and the server as a whole report
    one status: ``readiness``'s, which its owner sets; without one, SERVING)
    and reflection. With ``credentials`` (see :mod:`ferry.tls`) the
    port is TLS, otherwise plain text. Returns the server and the port it bound.
    """
    guard = DecodeGuard()  # undecodable request bytes: INVALID_ARGUMENT, not UNKNOWN
    server = grpc.aio.server(options=server_options(max_message_bytes, max_streams),
                             interceptors=[guard, *interceptors])
    names = []
    for add, servicer, name in services:
        add(servicer, server)
        names.append(name)
    health_servicer = readiness if readiness is not None else Readiness()
    health_servicer.add_names(names)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((*names, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    port = server.add_secure_port(listen, credentials) if credentials else server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"could not bind {listen}")
    await server.start()
    return server, port


_STATUS: list[tuple[type[errors.FerryError], grpc.StatusCode]] = [
    (errors.ConfigError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (errors.NoReplica, grpc.StatusCode.UNAVAILABLE),
    (errors.Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.ReplicaFailed, grpc.StatusCode.UNAVAILABLE),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
]


def status_for(error: errors.FerryError) -> grpc.StatusCode:
    """The gRPC status code for a Ferry error (INTERNAL for an unmapped one)."""
    for cls, code in _STATUS:
        if isinstance(error, cls):
            return code
    return grpc.StatusCode.INTERNAL


async def answer(context: Any, call: Callable[[], Awaitable[R] | R]) -> R:
    """Run a unary handler's body; a FerryError aborts the call with :func:`status_for` and its message."""
    try:
        result = call()
        return await result if inspect.isawaitable(result) else result
    except errors.FerryError as exc:
        await context.abort(status_for(exc), str(exc))
        raise  # abort raises; this line is for the type checker
