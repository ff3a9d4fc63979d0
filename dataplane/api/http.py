"""The OpenAI-compatible HTTP front door: aiohttp on the proxy's event loop, into the same :class:`Router` as gRPC.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``,
``GET /v1/models``, ``GET /v1/models/{id}``, and ``GET /health`` (no key asked: 200 with
``{"status": "SERVING"}`` while the proxy's gRPC health says so, else 503
with ``NOT_SERVING``: a load balancer that speaks only HTTP sees the drain too). A connection accepted beyond
``http_max_connections`` gets a 503 with ``Retry-After`` at once and is closed.
Per request, in this order: the in-flight bound (``http_max_streams``: 429
with ``Retry-After``), authentication
(``Authorization: Bearer KEY`` or ``x-api-key``; 401), the body read up to
``http_max_body_bytes`` (413 naming ``body``; parsed as JSON whatever its
``Content-Type``, as ``curl -d`` sends a form type), the pure translation
(:mod:`dataplane.api.openai`, 400 naming the field), the chat template
(:mod:`dataplane.api.chat`), then exactly what the gRPC servicer does:
:meth:`Router.begin` (validation, tier, table, admission), the idempotency
join for a unary request with an ``Idempotency-Key``, :meth:`Router.infer` or
:meth:`Router.stream` (retries, continuation), :meth:`Router.end`; metrics and
the failure log line through the servicer's :meth:`count`/:meth:`failed`, so
both fronts are counted alike (status label: the gRPC code name).

Headers in: ``x-ferry-tier`` (``interactive``/``standard``/``batch``;
absent: ``standard`` when the tenant's plan allows it, else its first tier),
``Idempotency-Key``, ``x-request-id`` (else one is made),
``x-ferry-timeout`` (seconds; else the proxy's default deadline),
``traceparent`` and ``tracestate`` (W3C; read only when tracing is on,
:mod:`dataplane.tracing`: the root span is named ``POST /v1/...``). Out:
``x-request-id`` on every answer, ``Retry-After`` (whole seconds, rounded up)
on 429 and on a 503 of a version still warming up, and OpenAI's
``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` for each per-tenant
limit the tenant has (:meth:`TenantLimits.headers`).

Streams (``"stream": true``) are server-sent events: the first event is
sent only once the first piece arrived (so an error before any output is a
plain JSON error with its status), then one event per piece, a last chunk
with ``finish_reason``, with ``stream_options.include_usage`` one more chunk
with empty ``choices`` and the ``usage`` (as OpenAI does; none otherwise), and
``data: [DONE]``. A failure after
output is one ``data: {"error": …}`` event, then the stream ends (no
``[DONE]``). Each write waits for the socket to drain below aiohttp's
high-water mark, so a slow reader holds back the replica's stream instead of
filling memory, and one that takes longer than ``http_write_timeout_seconds``
to take a chunk is cut off. A client that disconnects cancels its handler
(``handler_cancellation``), which cancels the replica call.

Stopping (:meth:`HttpFront.stop`, the proxy's drain): the listener closes,
a request arriving on a connection still open is a 503 (``shutting_down``,
``Retry-After``, ``Connection: close``), and those in flight get the grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from dataplane.api import openai
from dataplane.api.auth import Authenticator
from dataplane.api.chat import ChatTemplates
from dataplane.api.idempotency import body_digest
from dataplane.api.service import REQUEST_ID, InferenceServicer
from dataplane.config import HttpSettings
from dataplane.router import RequestState, Router
from dataplane.table.local import TableHolder
from dataplane.tracing import TRACEPARENT, TRACESTATE
from ferry.errors import FerryError
from ferry.grpcutil import status_for
from ferry.v1 import inference_pb2

log = logging.getLogger("ferry.proxy")

JSON = "application/json"
DONE = b"data: [DONE]\n\n"
REQUEST_ID_KEY = web.RequestKey("request_id", str)


def _retry_header(seconds: float | None) -> dict[str, str]:
    return {} if seconds is None else {"Retry-After": str(max(1, math.ceil(seconds)))}


def _dumps(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


class HttpFront:
    """One proxy's HTTP API; see the module docstring."""

    def __init__(self, router: Router, servicer: InferenceServicer, authenticator: Authenticator,
                 holder: TableHolder, templates: ChatTemplates, settings: HttpSettings, *,
                 default_deadline: float, clock: Callable[[], float],
                 serving: Callable[[], bool] = lambda: True) -> None:
        self._serving = serving  # the proxy's readiness (ferry.readiness), for GET /health
        self._router = router
        self._servicer = servicer
        self._auth = authenticator
        self._holder = holder
        self._templates = templates
        self._settings = settings
        self._deadline = default_deadline
        self._clock = clock
        self._inflight = 0
        self._closing = False  # stop() began: a new request is refused
        self._idle = asyncio.Event()  # set while no request is in flight
        self._idle.set()
        self._runner: web.AppRunner | None = None
        self._server: web.Server | None = None
        self._listener: asyncio.Server | None = None
        self.port = 0

    def app(self) -> web.Application:
        """The aiohttp application (routes and the body bound)."""
        app = web.Application(client_max_size=self._settings.http_max_body_bytes,
                              middlewares=[self._bounds])
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model:.+}", self._models)
        app.router.add_get("/health", self._health)
        return app

    async def _health(self, request: web.Request) -> web.StreamResponse:
        serving = self._serving() and not self._closing
        return web.Response(status=200 if serving else 503, content_type=JSON,
                            body=_dumps({"status": "SERVING" if serving else "NOT_SERVING"}),
                            headers={"x-request-id": request[REQUEST_ID_KEY]})

    async def start(self, listen: str, ssl_context: ssl.SSLContext | None = None) -> int:
        """Serve on ``listen`` (``host:port``, port 0: any free one), over TLS with ``ssl_context``; returns the port.

        The listener's protocol factory holds the connection bound: a connection accepted while
        ``http_max_connections`` are open gets a 503 with ``Retry-After: 1`` at once and is closed.
        """
        s = self._settings
        self._runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None, shutdown_timeout=1.0,
                                     keepalive_timeout=s.http_keepalive_seconds, max_line_size=s.http_max_line_bytes,
                                     max_field_size=s.http_max_header_bytes, max_headers=s.http_max_headers)
        await self._runner.setup()
        server = self._server = self._runner.server
        assert server is not None

        def protocol() -> asyncio.BaseProtocol:
            if len(server.connections) >= s.http_max_connections:
                return _Refused(s.http_max_connections)
            return server()

        host, _, port = listen.rpartition(":")
        self._listener = await asyncio.get_running_loop().create_server(
            protocol, host, int(port), backlog=min(s.http_max_connections, 4096), reuse_address=True,
            reuse_port=True,  # several proxies of one host may share the port, as their gRPC servers do
            ssl=ssl_context)
        self.port = int(self._listener.sockets[0].getsockname()[1])
        return self.port

    async def stop(self, grace: float = 1.0) -> None:
        """Take no new request, let those in flight finish within ``grace`` seconds, close the connections.

        The listener closes at once; a request that still arrives on an open connection gets a 503 with
        ``Retry-After: 1`` and ``Connection: close``; once nothing is in flight, or ``grace`` passed, aiohttp
        closes every connection (cancelling what still runs).
        """
        self._closing = True
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self._idle.wait()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _bounds(self, request: web.Request,
                      handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        """In-flight requests bounded; a request id on every answer; aiohttp's refusals in OpenAI's shape."""
        given = request.headers.get("x-request-id", "")
        request_id = given if REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
        request[REQUEST_ID_KEY] = request_id
        if request.path == "/health" and request.method == "GET":  # cheap, and never refused by the bounds
            response: web.StreamResponse = await handler(request)
            return response
        if self._closing:
            return self._error(request_id, 503, openai.error_body(
                "the proxy is shutting down; retry on another", "server_error", code="shutting_down"),
                {"Retry-After": "1", "Connection": "close"})
        if self._inflight >= self._settings.http_max_streams:
            return self._error(request_id, 429, openai.error_body(
                f"too many requests in flight over HTTP (limit {self._settings.http_max_streams})",
                "rate_limit_error", code="rate_limit_exceeded"), {"Retry-After": "1"})
        if given and not REQUEST_ID.fullmatch(given):
            return self._error(request_id, 400, openai.error_body(
                "x-request-id: must be 1 to 64 characters of A-Z a-z 0-9 . _ : -", "invalid_request_error",
                param="x-request-id", code="invalid_value"))
        self._inflight += 1
        self._idle.clear()
        try:
            result: web.StreamResponse = await handler(request)
            return result
        except web.HTTPException as exc:  # aiohttp's own refusals (405, 404 route, 413) in OpenAI's shape
            status = exc.status
            param = "body" if status == 413 else None
            reason = (f"body: larger than {self._settings.http_max_body_bytes} bytes" if status == 413
                      else f"{request.method} {request.path[:128]}: {exc.reason}")
            return self._error(request_id, status, openai.error_body(
                reason, "invalid_request_error", param=param, code="body_too_large" if status == 413 else None))
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._idle.set()

    def _error(self, request_id: str, status: int, body: dict[str, Any],
               headers: dict[str, str] | None = None) -> web.Response:
        return web.Response(status=status, body=_dumps(body), content_type=JSON,
                            headers={"x-request-id": request_id, **(headers or {})})

    async def _models(self, request: web.Request) -> web.StreamResponse:
        request_id = request[REQUEST_ID_KEY]
        try:
            self._auth.authenticate(openai.key_metadata(request.headers))
            table = self._holder.table
            answer = openai.models_answer(request.raw_path, table.models if table is not None else (),
                                          int(time.time()))
        except FerryError as error:
            status, body, retry = openai.error_of(error)
            return self._error(request_id, status, body, _retry_header(retry))
        return web.Response(body=_dumps(answer), content_type=JSON, headers={"x-request-id": request_id})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _parse(self, request: web.Request, chat: bool) -> tuple[openai.Parsed, inference_pb2.InferRequest,
                                                                       list[tuple[str, str]], float]:
        """Authenticate, read and translate the body; raises FerryError (or aiohttp's 413)."""
        metadata = openai.key_metadata(request.headers)
        tenant = self._auth.authenticate(metadata)  # 401 before anything about the body
        body = await request.read()
        parsed = openai.parse_chat(body) if chat else openai.parse_completion(body)
        prompt = self._templates.render(parsed.model, parsed.messages) if chat else parsed.prompt
        idempotency_key = request.headers.get("idempotency-key", "")
        message = openai.to_request(parsed, prompt, tier=openai.tier_of(request.headers, tenant),
                                    idempotency_key=idempotency_key)
        return parsed, message, metadata, openai.timeout_of(request.headers, self._deadline)

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        """One completion, unary or streamed, through the router; see the module docstring."""
        request_id: str = request[REQUEST_ID_KEY]
        state = RequestState(request_id=request_id, started=self._clock())
        tracer = self._router.tracer
        if tracer is not None:  # the caller's trace context, when tracing is on (dataplane.tracing)
            state.trace = tracer.begin(f"{request.method} {request.path}", request.headers.get(TRACEPARENT, ""),
                                       request.headers.get(TRACESTATE, ""))
        headers = {"x-request-id": request_id}
        created = int(time.time())
        try:
            parsed, message, metadata, timeout = await self._parse(request, chat)
            await self._router.encode(state, metadata, message)  # a large prompt's tokens, off the loop
            self._router.begin(state, metadata, message, timeout)
            headers.update(self._limits(state))
            if parsed.stream:
                return await self._stream(request, state, parsed, chat, created, headers)
            if message.idempotency_key and state.tenant is not None:
                summary = await self._router.idempotency.run(state.tenant.name, message.idempotency_key,
                                                             body_digest(message), lambda: self._answer(state))
            else:
                summary = await self._answer(state)
            self._servicer.succeed(state)
            body = openai.chat(summary, parsed.model, created) if chat else openai.completion(
                summary, parsed.model, created)
            return web.Response(body=_dumps(body), content_type=JSON, headers=headers)
        except FerryError as error:
            status, body, retry = openai.error_of(error)
            self._servicer.failed(state, error, status_for(error).name)
            return self._error(request_id, status, body, {**_retry_header(retry), **self._limits(state)})
        except asyncio.CancelledError:
            self._servicer.count(state, "CANCELLED")
            raise
        finally:
            self._router.end(state)

    def _limits(self, state: RequestState) -> dict[str, str]:
        """The tenant's ``x-ratelimit-*`` headers (:meth:`TenantLimits.headers`); none before it is known."""
        return {} if state.tenant is None else self._router.tenant_limits.headers(state.tenant, self._clock())

    async def _answer(self, state: RequestState) -> inference_pb2.InferResponse:
        await self._router.infer(state)
        state.outcome.ttft_seconds = self._clock() - state.started
        return self._servicer.summary(state, state.outcome.text)

    async def _write(self, response: web.StreamResponse, data: bytes) -> None:
        """Write one event; waits for the socket to drain, at most ``http_write_timeout_seconds``."""
        async with asyncio.timeout(self._settings.http_write_timeout_seconds):  # no task per event
            await response.write(data)

    async def _stream(self, request: web.Request, state: RequestState, parsed: openai.Parsed, chat: bool,
                      created: int, headers: dict[str, str]) -> web.StreamResponse:
        """Server-sent events: opened on the first piece; a last chunk, the usage chunk if asked, ``[DONE]``."""
        rid = state.request_id
        response: web.StreamResponse | None = None
        first: float | None = None

        def chunk(text: str | None, summary: inference_pb2.InferResponse | None = None) -> bytes:
            body = (openai.chat_chunk(rid, parsed.model, created, text, summary=summary) if chat
                    else openai.completion_chunk(rid, parsed.model, created, text or "", summary=summary))
            return b"data: " + _dumps(body) + b"\n\n"

        async def opened() -> web.StreamResponse:
            out = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream",
                                              "Cache-Control": "no-cache"})
            await out.prepare(request)
            if chat:
                await self._write(out, chunk(None))
            return out

        pieces: AsyncIterator[Any]
        try:
            async with contextlib.aclosing(self._router.stream(state)) as pieces:
                async for piece in pieces:
                    if response is None:
                        first = self._clock() - state.started
                        response = await opened()
                    await self._write(response, chunk(piece.text))
        except FerryError as error:  # after output (continuation failed): one error event, then the end
            if response is None:
                raise
            self._servicer.failed(state, error, status_for(error).name)
            with contextlib.suppress(ConnectionError, asyncio.TimeoutError):
                await self._write(response, b"data: " + _dumps(openai.error_of(error)[1]) + b"\n\n")
            return response
        except (TimeoutError, ConnectionError):
            self._servicer.count(state, "CANCELLED")  # the reader went away or stalled: the replica call is closed
            if response is None:
                raise
            return response
        if response is None:
            response = await opened()
        state.outcome.ttft_seconds = first if first is not None else self._clock() - state.started
        self._servicer.succeed(state, streamed=first is not None)
        summary = self._servicer.summary(state, "")
        with contextlib.suppress(ConnectionError, asyncio.TimeoutError):
            await self._write(response, chunk("", summary))
            if parsed.include_usage:
                usage = openai.usage_chunk(rid, parsed.model, created, summary, chat=chat)
                await self._write(response, b"data: " + _dumps(usage) + b"\n\n")
            await self._write(response, DONE)
        return response



class _Refused(asyncio.Protocol):
    """A connection over the bound: one 503 in OpenAI's error shape, then closed."""

    def __init__(self, limit: int) -> None:
        self._body = _dumps(openai.error_body(f"too many connections (limit {limit})", "server_error",
                                              code="too_many_connections"))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: {JSON}\r\nContent-Length: {len(self._body)}"
                f"\r\nRetry-After: 1\r\nx-request-id: {uuid.uuid4().hex}\r\nConnection: close\r\n\r\n")
        transport.write(head.encode() + self._body)
        transport.close()
