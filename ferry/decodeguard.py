"""Answer undecodable request bytes with INVALID_ARGUMENT instead of UNKNOWN.

``grpc.aio`` answers a request that its deserializer cannot parse with
UNKNOWN ("Unexpected DecodeError"). :class:`DecodeGuard`, a server
interceptor that :func:`ferry.grpcutil.start_server` installs on every server,
wraps each method's handler once (cached per method): its deserializer turns a
parse failure into a marker, and the handler aborts with INVALID_ARGUMENT
when it meets one, for unary and streaming requests alike. The message names
what is at fault: ``request body: not a valid ferry.v1.InferRequest: field 4
(prompt): not valid UTF-8``. :func:`fault` finds the field by walking the
protobuf wire format against the message's descriptor (tags, wire types,
lengths, UTF-8 of strings, nested messages to :data:`MAX_DEPTH` levels);
when the walk finds nothing, the parser's own reason is given.
Cost per call: one dictionary lookup and one ``isinstance``; a refused
message is walked once, O(its size).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor

MAX_DEPTH = 8  # nested messages :func:`fault` descends into
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_SCALAR_WIRE = {
    FieldDescriptor.TYPE_DOUBLE: _I64, FieldDescriptor.TYPE_FIXED64: _I64, FieldDescriptor.TYPE_SFIXED64: _I64,
    FieldDescriptor.TYPE_FLOAT: _I32, FieldDescriptor.TYPE_FIXED32: _I32, FieldDescriptor.TYPE_SFIXED32: _I32,
    FieldDescriptor.TYPE_STRING: _LEN, FieldDescriptor.TYPE_BYTES: _LEN, FieldDescriptor.TYPE_MESSAGE: _LEN,
}


def _varint(data: bytes, at: int) -> tuple[int, int] | None:
    """The varint at ``at`` and the offset after it; None when truncated or longer than 10 bytes."""
    value, shift = 0, 0
    for i in range(at, min(len(data), at + 10)):
        value |= (data[i] & 0x7F) << shift
        if not data[i] & 0x80:
            return value, i + 1
        shift += 7
    return None


def _repeated(field: FieldDescriptor) -> bool:
    is_repeated = getattr(field, "is_repeated", None)
    if isinstance(is_repeated, bool):
        return is_repeated
    return bool(field.label == FieldDescriptor.LABEL_REPEATED)


def fault(descriptor: Descriptor, data: bytes, depth: int = 0) -> str | None:
    """Where ``data`` stops being a valid ``descriptor`` message on the wire, e.g. ``field 4 (prompt): …``.

    Walks tag by tag: a bad tag or wire type, a truncated value, a string that is not UTF-8, and (to :data:`MAX_DEPTH`)
    the same inside nested messages, whose path is dotted. None when the
    walk finds no fault (the parser's reason stands then).
    """
    at, end = 0, len(data)
    while at < end:
        start, tag = at, _varint(data, at)
        if tag is None:
            return f"byte {start}: truncated field tag"
        key, at = tag
        number, wire = key >> 3, key & 7
        field = descriptor.fields_by_number.get(number)
        name = f"field {number} ({field.name})" if field is not None else f"field {number}"
        if number == 0:
            return f"byte {start}: field number 0"
        if field is not None:
            expected = _SCALAR_WIRE.get(field.type, _VARINT)
            packable = _repeated(field) and expected != _LEN
            if wire != expected and not (packable and wire == _LEN):
                field = None  # parsers keep a mismatched wire type as an unknown field: only its framing counts
        if wire == _VARINT:
            value = _varint(data, at)
            if value is None:
                return f"{name}: truncated varint"
            at = value[1]
        elif wire in (_I64, _I32):
            at += 8 if wire == _I64 else 4
            if at > end:
                return f"{name}: truncated fixed-width value"
        elif wire == _LEN:
            size = _varint(data, at)
            if size is None:
                return f"{name}: truncated length"
            length, at = size
            if at + length > end:
                return f"{name}: length {length} runs past the end ({end - at} byte(s) left)"
            chunk, at = data[at:at + length], at + length
            if field is not None and field.type == FieldDescriptor.TYPE_STRING:
                try:
                    chunk.decode("utf-8")
                except UnicodeDecodeError:
                    return f"{name}: not valid UTF-8"
            elif field is not None and field.type == FieldDescriptor.TYPE_MESSAGE and depth < MAX_DEPTH:
                inner = fault(field.message_type, chunk, depth + 1)
                if inner is not None:
                    return f"{name} > {inner}"
        else:
            return f"{name}: unsupported wire type {wire}"
    return None


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


def reason(deserializer: Callable[[bytes], Any], data: bytes, exc: Exception) -> str:
    """The refusal of ``data`` that ``deserializer`` could not parse: the message type, and the field at fault."""
    descriptor = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    if not isinstance(descriptor, Descriptor):
        return f"request body: not a valid message ({type(exc).__name__}: {exc})"
    where = fault(descriptor, bytes(data)) or f"{type(exc).__name__}: {exc}"
    return f"request body: not a valid {descriptor.full_name}: {where}"


def _safe(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # any parse failure is the client's malformed message
            return _Undecodable(reason(deserializer, data, exc))
    return parse


async def _refuse(context: grpc.aio.ServicerContext, method: str, bad: _Undecodable) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{bad.reason} (method {method})")


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
    """Server interceptor: malformed request bytes get INVALID_ARGUMENT naming the message type and field."""

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
