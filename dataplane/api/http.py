"""The OpenAI-compatible HTTP front door: aiohttp on the proxy's event loop, into the same :class:`Router` as gRPC.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``,
``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /openapi.json`` (the
API's OpenAPI document, :mod:`dataplane.api.schema`; no key asked), and ``GET /health`` (no key asked: 200 with
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
import dataclasses
import json
import logging
import math
import ssl
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from typing import Any

from aiohttp import web

from dataplane.api import openai, schema
from dataplane.api import tools as tooling
from dataplane.api.chat import ChatTemplates
from dataplane.api.service import REQUEST_ID, InferenceServicer
from dataplane.config import HttpSettings
from dataplane.forward.kserve import Logprob, Piece
from dataplane.intake.auth import Authenticator
from dataplane.intake.idempotency import body_digest
from dataplane.router import RequestState, Router
from dataplane.table.local import TableHolder
from dataplane.tracing import TRACEPARENT, TRACESTATE
from ferry.errors import FerryError, InvalidArgument
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
        app.router.add_get(schema.OPENAPI_PATH, self._openapi)
        return app

    async def _openapi(self, request: web.Request) -> web.StreamResponse:
        """The API's OpenAPI document (:func:`dataplane.api.schema.openapi`), no key asked."""
        return web.Response(body=schema.openapi_bytes(), content_type=JSON,
                            headers={"x-request-id": request[REQUEST_ID_KEY]})

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

    async def _parse(self, request: web.Request, chat: bool) -> tuple[
            openai.Parsed, list[inference_pb2.InferRequest], list[str], list[tuple[str, str]], float]:
        """Authenticate, read and translate the body; raises FerryError (or aiohttp's 413).

        Returns the parsed body, one ``InferRequest`` per choice (``n`` per prompt, in OpenAI's order of choice
        indexes), each choice's prompt text, the key's metadata and the deadline."""
        metadata = openai.key_metadata(request.headers)
        tenant = self._auth.authenticate(metadata)  # 401 before anything about the body
        body = await request.read()
        parsed = openai.parse_chat(body) if chat else openai.parse_completion(body)
        self._servicer.ignored(parsed.ignored)
        if chat:
            offered = tooling.offered(parsed.tools, parsed.tool_choice, model=parsed.model,
                                      parser=self._templates.tool_parser(parsed.model))
            texts = [self._templates.render(parsed.model, parsed.messages, offered)]
            if offered:  # the answers' calls are parsed out (dataplane.api.tools)
                parsed = dataclasses.replace(parsed, tools=tuple(offered))
            else:
                parsed = dataclasses.replace(parsed, tools=())
        else:
            texts = [self._text(parsed.model, prompt, len(parsed.prompts) > 1, i)
                     for i, prompt in enumerate(parsed.prompts)]
        tier = openai.tier_of(request.headers, tenant)
        key = request.headers.get("idempotency-key", "")
        if key and parsed.choices > 1:
            raise InvalidArgument("idempotency-key", "taken for one choice only (n = 1, one prompt)")
        prompts = [text for text in texts for _ in range(parsed.n)]
        messages = [openai.to_request(parsed, text, tier=tier, idempotency_key=key) for text in prompts]
        return parsed, messages, prompts, metadata, openai.timeout_of(request.headers, self._deadline)

    def _text(self, model: str, prompt: str | tuple[int, ...], listed: bool, i: int) -> str:
        """A prompt's text: itself, or its token ids decoded by the model's tokenizer."""
        if isinstance(prompt, str):
            return prompt
        field = f"prompt[{i}]" if listed else "prompt"
        try:
            text = self._router.tokens.tokenizer(model).decode(list(prompt))
        except ValueError as exc:
            raise InvalidArgument(field, f"token ids that model {model!r}'s tokenizer does not know: {exc}") from None
        if text is None:
            raise InvalidArgument(field, f"token ids: model {model!r} has no tokenizer file to read them "
                                         "([[models]] tokenizer)", "unsupported_parameter")
        return text

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        """One completion, unary or streamed, through the router (each choice a request); see the module docstring."""
        request_id: str = request[REQUEST_ID_KEY]
        state = RequestState(request_id=request_id, started=self._clock())
        states = [state]
        tracer = self._router.tracer
        if tracer is not None:  # the caller's trace context, when tracing is on (dataplane.tracing)
            state.trace = tracer.begin(f"{request.method} {request.path}", request.headers.get(TRACEPARENT, ""),
                                       request.headers.get(TRACESTATE, ""))
        headers = {"x-request-id": request_id}
        created = int(time.time())
        try:
            parsed, messages, prompts, metadata, timeout = await self._parse(request, chat)
            states += [RequestState(request_id=f"{request_id}-{i}", started=state.started)
                       for i in range(1, len(messages))]
            for one, message in zip(states, messages, strict=True):
                one.streamed = parsed.stream  # the traffic recorder's (dataplane.record)
                await self._router.encode(one, metadata, message)  # a large prompt's tokens, off the loop
                self._router.begin(one, metadata, message, timeout)
            headers.update(self._router.rate_limit_headers(state))
            echo = prompts if parsed.echo else []
            if parsed.stream:
                return await self._stream(request, states, parsed, chat, created, headers, echo)
            if messages[0].idempotency_key and state.tenant is not None:
                summaries = [await self._router.idempotency.run(state.tenant.name, messages[0].idempotency_key,
                                                                body_digest(messages[0]),
                                                                lambda: self._answer(state))]
            else:
                summaries = await _all(self._answer(one) for one in states)
            for one in states:
                self._servicer.succeed(one)
            body = openai.chat(summaries, parsed.model, created, n=parsed.n, tools=bool(parsed.tools),
                               logprobs=parsed.logprobs) if chat else openai.completion(
                summaries, parsed.model, created, n=parsed.n, echo=echo, logprobs=parsed.logprobs)
            return web.Response(body=_dumps(body), content_type=JSON, headers=headers)
        except FerryError as error:
            status, body, retry = openai.error_of(error)
            for one in states:
                self._servicer.failed(one, error, status_for(error).name)
            return self._error(request_id, status, body,
                               {**_retry_header(retry), **self._router.rate_limit_headers(state)})
        except asyncio.CancelledError:
            for one in states:
                self._servicer.count(one, "CANCELLED")
            raise
        finally:
            for one in states:
                self._router.end(one)


    async def _answer(self, state: RequestState) -> inference_pb2.InferResponse:
        await self._router.infer(state)
        state.outcome.ttft_seconds = self._clock() - state.started
        return self._servicer.summary(state, state.outcome.text)

    async def _write(self, response: web.StreamResponse, data: bytes) -> None:
        """Write one event; waits for the socket to drain, at most ``http_write_timeout_seconds``."""
        async with asyncio.timeout(self._settings.http_write_timeout_seconds):  # no task per event
            await response.write(data)

    async def _stream(self, request: web.Request, states: list[RequestState], parsed: openai.Parsed, chat: bool,
                      created: int, headers: dict[str, str], echo: list[str]) -> web.StreamResponse:
        """Server-sent events: opened on the first piece of any choice (chat: each choice's role first; ``echo``:
        each prompt); each piece as it comes, tagged with its choice's index; a choice's last chunk when it ends;
        then the usage chunk if asked, and ``[DONE]``. Several choices are read by one task each through a
        bounded queue, so a slow reader holds them all back."""
        rid = states[0].request_id
        response: web.StreamResponse | None = None
        firsts: list[float | None] = [None] * len(states)
        summaries: list[inference_pb2.InferResponse | None] = [None] * len(states)

        calls = [tooling.Stream() for _ in states] if chat and parsed.tools else []  # offered: parse the calls

        offsets = [0] * len(states)  # each choice's text so far (completions' logprobs text_offset)

        def chunk(index: int, text: str | None, summary: inference_pb2.InferResponse | None = None,
                  found: Sequence[tuple[int, tooling.Call]] = (), logprobs: Sequence[Logprob] = ()) -> bytes:
            finish = "tool_calls" if calls and summary is not None and calls[index].calls else ""
            asked = openai.logprobs_of(logprobs) if parsed.logprobs and text and summary is None else None
            if chat:
                body = openai.chat_chunk(rid, parsed.model, created, text, summary=summary, index=index, calls=found,
                                         finish=finish, logprobs=asked)
            else:
                body = openai.completion_chunk(rid, parsed.model, created, text or "", summary=summary,
                                               index=index, logprobs=asked, offset=offsets[index])
                offsets[index] += len(text or "")
            return b"data: " + _dumps(body) + b"\n\n"

        async def piece(index: int, text: str, logprobs: Sequence[Logprob] = ()) -> None:
            """One piece of choice ``index``: as it is, or through its tool-call parser."""
            assert response is not None
            if not calls:
                await self._write(response, chunk(index, text, logprobs=logprobs))
                return
            released, found = calls[index].feed(text)
            if released:
                await self._write(response, chunk(index, released, logprobs=logprobs))
            if found:
                first = calls[index].calls - len(found)
                await self._write(response, chunk(index, "", found=list(enumerate(found, first))))

        async def opened() -> web.StreamResponse:
            out = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream",
                                              "Cache-Control": "no-cache"})
            await out.prepare(request)
            for index in range(len(states)):
                if chat:
                    await self._write(out, chunk(index, None))
                elif echo:
                    await self._write(out, chunk(index, echo[index]))
            return out

        async def ended(index: int) -> None:
            if calls and (rest := calls[index].end()):  # an unclosed call: text after all
                assert response is not None
                await self._write(response, chunk(index, rest))
            state = states[index]
            state.outcome.ttft_seconds = firsts[index] or self._clock() - state.started
            self._servicer.succeed(state, streamed=firsts[index] is not None)
            summary = summaries[index] = self._servicer.summary(state, "")
            assert response is not None
            await self._write(response, chunk(index, "", summary))

        try:
            async with contextlib.aclosing(_pieces(self._router, states)) as pieces:
                async for index, item in pieces:
                    if response is None:
                        response = await opened()
                    if item is None:
                        await ended(index)
                        continue
                    if firsts[index] is None:
                        firsts[index] = self._clock() - states[index].started
                    await piece(index, item.text, item.logprobs)
        except _ChoiceFailed as failure:  # after output (continuation failed): one error event, then the end
            if response is None:
                raise failure.error from None
            self._servicer.failed(states[failure.index], failure.error, status_for(failure.error).name)
            with contextlib.suppress(ConnectionError, asyncio.TimeoutError):
                await self._write(response, b"data: " + _dumps(openai.error_of(failure.error)[1]) + b"\n\n")
            return response
        except (TimeoutError, ConnectionError):
            for state, summary in zip(states, summaries, strict=True):
                if summary is None:  # the reader went away or stalled: the replica calls are closed
                    self._servicer.count(state, "CANCELLED")
            if response is None:
                raise
            return response
        assert response is not None  # every choice's end opened it
        with contextlib.suppress(ConnectionError, asyncio.TimeoutError):
            if parsed.include_usage:
                done = [s for s in summaries if s is not None]
                usage = openai.usage_chunk(rid, parsed.model, created, done, chat=chat, n=parsed.n)
                await self._write(response, b"data: " + _dumps(usage) + b"\n\n")
            await self._write(response, DONE)
        return response


class _ChoiceFailed(Exception):
    """Choice ``index`` of a streamed answer failed with ``error``."""

    def __init__(self, index: int, error: FerryError) -> None:
        super().__init__(str(error))
        self.index, self.error = index, error


CHOICE_QUEUE = 64  # pieces of several streamed choices waiting for the writer; beyond, their readers wait


async def _pieces(router: Router, states: list[RequestState]) -> AsyncGenerator[tuple[int, Piece | None], None]:
    """The pieces of every choice's stream as ``(index, piece)``, ``(index, None)`` when that choice ends; raises
    :class:`_ChoiceFailed`. One choice is read in place (no task, no queue: the common case); several by one
    task each into a queue of :data:`CHOICE_QUEUE`, cancelled when the caller stops."""
    if len(states) == 1:
        try:
            async with contextlib.aclosing(router.stream(states[0])) as pieces:
                async for piece in pieces:
                    yield 0, piece
        except FerryError as error:
            raise _ChoiceFailed(0, error) from None
        yield 0, None
        return
    queue: asyncio.Queue[tuple[int, Piece | FerryError | None]] = asyncio.Queue(CHOICE_QUEUE)

    async def pump(index: int, state: RequestState) -> None:
        try:
            async with contextlib.aclosing(router.stream(state)) as pieces:
                async for piece in pieces:
                    await queue.put((index, piece))
        except FerryError as error:
            await queue.put((index, error))
            return
        await queue.put((index, None))

    tasks = [asyncio.create_task(pump(i, state)) for i, state in enumerate(states)]
    try:
        for _ in range(len(states)):
            while True:
                index, item = await queue.get()
                if isinstance(item, FerryError):
                    raise _ChoiceFailed(index, item)
                yield index, item
                if item is None:
                    break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _all(answers: Iterable[Awaitable[inference_pb2.InferResponse]]) -> list[inference_pb2.InferResponse]:
    """Every answer, in order; the first failure cancels the others and is raised."""
    tasks = [asyncio.ensure_future(answer) for answer in answers]
    if len(tasks) == 1:
        return [await tasks[0]]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()


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
