"""Answer undecodable request bytes with INVALID_ARGUMENT instead of UNKNOWN.

``grpc.aio`` answers a request that its deserializer cannot parse with
UNKNOWN ("Unexpected DecodeError"). :class:`DecodeGuard`, a server
interceptor that :func:`ferry.grpcutil.start_server` installs on every server,
wraps each method's handler once (cached per method): its deserializer turns a
parse failure into a marker, and the handler aborts with INVALID_ARGUMENT
(``request: …``) when it meets one, for unary and streaming requests alike.
Cost per call: one dictionary lookup and one ``isinstance``.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc


class _Undecodable:
    """A request whose bytes did not decode: carries the reason to answer with INVALID_ARGUMENT."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


async def relay(result: Any) -> AsyncIterator[Any]:
    """What a wrapped streaming handler returned, relayed: an async generator's items, or a coroutine awaited.

    A servicer may stream by yielding or by writing on the context in a
    coroutine; an interceptor's wrapper serves both through this.
    """
    if inspect.isasyncgen(result):
        async for item in result:
            yield item
    else:
        await result


def _safe(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # any parse failure is the client's malformed message
            return _Undecodable(f"{type(exc).__name__}: {exc}")
    return parse


async def _refuse(context: grpc.aio.ServicerContext, method: str, bad: _Undecodable) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request: not a valid message for {method} ({bad.reason})")


async def _checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext, method: str) -> AsyncIterator[Any]:
    async for item in requests:
        if isinstance(item, _Undecodable):
            await _refuse(context, method, item)
        yield item


def _wrap(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    deser = _safe(handler.request_deserializer)
    ser = handler.response_serializer
    if handler.unary_unary:
        inner_uu: Callable[..., Awaitable[Any]] = handler.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, _Undecodable):
                await _refuse(context, method, request)
            return await inner_uu(request, context)
        return grpc.unary_unary_rpc_method_handler(unary_unary, request_deserializer=deser, response_serializer=ser)
    if handler.unary_stream:
        inner_us = handler.unary_stream

        async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, _Undecodable):
                await _refuse(context, method, request)
            async for item in relay(inner_us(request, context)):
                yield item
        return grpc.unary_stream_rpc_method_handler(unary_stream, request_deserializer=deser, response_serializer=ser)
    if handler.stream_unary:
        inner_su = handler.stream_unary

        async def stream_unary(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            return await inner_su(_checked(requests, context, method), context)
        return grpc.stream_unary_rpc_method_handler(stream_unary, request_deserializer=deser, response_serializer=ser)
    inner_ss = handler.stream_stream

    async def stream_stream(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for item in relay(inner_ss(_checked(requests, context, method), context)):
            yield item
    return grpc.stream_stream_rpc_method_handler(stream_stream, request_deserializer=deser, response_serializer=ser)


class DecodeGuard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Server interceptor: malformed request bytes get INVALID_ARGUMENT naming ``request``."""

    def __init__(self) -> None:
        self._cache: dict[str, grpc.RpcMethodHandler | None] = {}

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        method = details.method
        if method in self._cache:
            return self._cache[method]
        handler = await continuation(details)
        wrapped = handler if handler is None or handler.request_deserializer is None else _wrap(handler, method)
        self._cache[method] = wrapped
        return wrapped
