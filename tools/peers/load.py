"""One open-loop load generator for every router compared, so that each is measured the same way.

The plan: the trace slice's rows (:func:`tools.trace.load`), in order, each
due ``offset / speedup`` seconds after the start, with the prompt
:func:`ferry.tokens.prompt_from_blocks` builds from the row's block ids (the
same text for every router: rows that share leading block ids share leading
text) and ``max_tokens`` = the row's output length capped at ``max_output``.
Every request is streamed; TTFT is the time from sending to the first chunk
that carries text, end-to-end the time to the end of the stream.

Targets:

- :class:`GrpcTarget` (Ferry): ``ferry.v1.Inference/InferStream`` with an
  API key and a model, tier interactive, over 4 channels (as
  :mod:`tools.replay`); status = the gRPC code's name.
- :class:`HttpTarget` (the peer routers): streaming OpenAI
  ``POST /v1/completions`` (``"stream": true``, server-sent events), or
  SGLang ``POST /generate`` (``api="generate"``). The completions API is the
  default because it is the one both peer routers route with the same code
  path to any backend (vLLM servers have no ``/generate``), and both take the
  ``prompt`` string as the text their cache-aware trees match. The client is
  plain asyncio streams: HTTP/1.1 with keep-alive (a pool of idle
  connections; a reused connection that the server had closed before
  answering is retried once on a fresh one), chunked or sized bodies, SSE
  events split on blank lines. A stream is OK when it ends with
  ``data: [DONE]`` or an event with a ``finish_reason``; otherwise the
  status says what happened: ``HTTP <code>``, ``STREAM_ERROR`` (an
  ``error`` event), ``INCOMPLETE`` (the stream ended early), ``CONNECTION``,
  ``TIMEOUT``.

Bounds (:class:`Limits`): the plan's length (the caller's request count),
``concurrency`` requests in flight (a due request waits for a slot and its
lateness is recorded), a per-request ``timeout`` (the whole stream), and a
``time_limit`` after which nothing more is sent (rows due later are counted
as not sent). So a run lasts at most ``time_limit + timeout`` seconds.

Refusals are the statuses a router uses to shed load: HTTP 429 and 503,
gRPC ``RESOURCE_EXHAUSTED`` and ``UNAVAILABLE``.

Cost: the prompts and request bodies are built before the clock starts (O(total
prompt length)); during the run, O(1) work per request and per streamed event
(one small JSON decode).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol
from urllib.parse import urlsplit

import grpc

from ferry.tokens import prompt_from_blocks
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tools import trace as tracefile

REFUSALS = frozenset({"HTTP 429", "HTTP 503", "RESOURCE_EXHAUSTED", "UNAVAILABLE"})
HEADER_LIMIT = 64 * 1024
GRPC_CHANNELS = 4


@dataclasses.dataclass(frozen=True, slots=True)
class Planned:
    """One request of the plan: when it is due, its prompt and output cap."""

    index: int
    due_s: float            # seconds after the start of the run
    prompt: str
    max_tokens: int


@dataclasses.dataclass(slots=True)
class Outcome:
    """What happened to one request (times in seconds; ``ttft_s`` None when no text came)."""

    index: int
    sent_s: float = 0.0     # when it was sent, after the start
    late_s: float = 0.0     # sent minus due (waiting for a concurrency slot)
    ttft_s: float | None = None
    e2e_s: float = 0.0
    status: str = "NOT_SENT"
    detail: str = ""
    text_chunks: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """The bounds of a run; see the module docstring."""

    concurrency: int = 256
    timeout: float = 60.0
    time_limit: float = 300.0


def plan(rows: Sequence[tracefile.TraceRequest], *, speedup: float, max_output: int) -> list[Planned]:
    """The rows as requests due at ``offset / speedup`` from the first row, prompts built from their blocks."""
    if speedup <= 0:
        raise ValueError("speedup must be positive")
    start = rows[0].offset if rows else 0.0
    return [Planned(i, (r.offset - start) / speedup, prompt_from_blocks(list(r.hash_ids), r.input_tokens),
                    max(1, min(r.output_tokens, max_output))) for i, r in enumerate(rows)]


class Target(Protocol):
    """Something requests are streamed to."""

    name: str

    async def open(self, requests: Sequence[Planned]) -> None:
        """Prepare (connections, encoded bodies) before the clock starts."""

    async def send(self, request: Planned, outcome: Outcome, limit_s: float) -> None:
        """Stream one request; fill ``outcome`` (status, detail, ttft_s, text_chunks)."""

    async def close(self) -> None:
        """Release connections."""


# -- Ferry's gRPC API -------------------------------------------------------------------------------------------------

class GrpcTarget:
    """Ferry's ``InferStream``, tier interactive."""

    def __init__(self, address: str, *, api_key: str, model: str) -> None:
        self.name = f"grpc://{address}"
        self.address, self.model = address, model
        self.metadata = (("x-api-key", api_key),)
        self._channels: list[grpc.aio.Channel] = []
        self._stubs: list[Any] = []
        self._requests: dict[int, Any] = {}

    async def open(self, requests: Sequence[Planned]) -> None:
        options = [("grpc.max_send_message_length", 16 << 20), ("grpc.max_receive_message_length", 16 << 20)]
        self._channels = [grpc.aio.insecure_channel(self.address, options=options) for _ in range(GRPC_CHANNELS)]
        self._stubs = [inference_pb2_grpc.InferenceStub(c) for c in self._channels]
        self._requests = {r.index: inference_pb2.InferRequest(
            model=self.model, tier=common_pb2.TIER_INTERACTIVE, prompt=r.prompt, max_tokens=r.max_tokens,
            idempotency_key=f"bench-peers-{r.index}") for r in requests}

    async def send(self, request: Planned, outcome: Outcome, limit_s: float) -> None:
        stub = self._stubs[request.index % len(self._stubs)]
        sent = time.monotonic()
        try:
            async for chunk in stub.InferStream(self._requests[request.index], metadata=self.metadata,
                                                timeout=limit_s):
                if chunk.text:
                    outcome.text_chunks += 1
                    if outcome.ttft_s is None:
                        outcome.ttft_s = time.monotonic() - sent
            outcome.status = "OK"
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            outcome.status = "TIMEOUT" if code == grpc.StatusCode.DEADLINE_EXCEEDED else code.name
            outcome.detail = (exc.details() or "")[:200]

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels, self._stubs = [], []


# -- HTTP with server-sent events -------------------------------------------------------------------------------------

class HttpStatusError(Exception):
    """A response other than 200."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status, self.body = status, body


class _StaleConnection(Exception):
    """A reused connection was closed by the server before any byte of the response."""


@dataclasses.dataclass(slots=True)
class _Stream:
    """State of one SSE stream being read."""

    api: str
    sent: float
    outcome: Outcome
    buffer: bytes = b""
    done: bool = False
    error: str = ""

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while True:
            cut = _event_end(self.buffer)
            if cut is None:
                return
            end, sep = cut
            event, self.buffer = self.buffer[:end], self.buffer[end + sep:]
            self._event(event)

    def _event(self, raw: bytes) -> None:
        lines = [line[5:].lstrip() for line in raw.replace(b"\r\n", b"\n").split(b"\n") if line.startswith(b"data:")]
        if not lines:
            return
        payload = b"\n".join(lines)
        if payload.strip() == b"[DONE]":
            self.done = True
            return
        try:
            event = json.loads(payload)
        except ValueError:
            self.error = self.error or f"unparsable event {payload[:80]!r}"
            return
        if not isinstance(event, dict):
            return
        if "error" in event:
            self.error = self.error or str(event["error"])[:200]
            return
        text, finished = _event_text(self.api, event)
        if text:
            self.outcome.text_chunks += 1
            if self.outcome.ttft_s is None:
                self.outcome.ttft_s = time.monotonic() - self.sent
        if finished:
            self.done = True


def _event_end(buffer: bytes) -> tuple[int, int] | None:
    """Where the first complete SSE event ends in ``buffer``, and the separator's length."""
    found = [(i, n) for i, n in ((buffer.find(b"\n\n"), 2), (buffer.find(b"\r\n\r\n"), 4)) if i >= 0]
    return min(found) if found else None


def _event_text(api: str, event: dict[str, Any]) -> tuple[str, bool]:
    """The text an event carries and whether it says the request finished."""
    if api == "generate":
        meta = event.get("meta_info") or {}
        finish = meta.get("finish_reason") if isinstance(meta, dict) else None
        return str(event.get("text") or ""), bool(finish)
    choices = event.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return "", False
    return str(choices[0].get("text") or ""), bool(choices[0].get("finish_reason"))


class HttpTarget:
    """A router's HTTP API, streamed: OpenAI ``/v1/completions`` or SGLang ``/generate``."""

    def __init__(self, base_url: str, *, model: str = "chat", api: str = "completions",
                 headers: dict[str, str] | None = None, temperature: float | None = 0.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"expected http://host:port, got {base_url!r}")
        if api not in ("completions", "generate"):
            raise ValueError(f"api must be completions or generate, got {api!r}")
        self.name = base_url
        self.host, self.port, self.model, self.api = parts.hostname, parts.port, model, api
        self.temperature = temperature  # None: not sent (a router that refuses a parameter its replica lists not)
        self.path = "/v1/completions" if api == "completions" else "/generate"
        self.extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._bodies: dict[int, bytes] = {}

    def body(self, request: Planned) -> dict[str, Any]:
        """The JSON body of one request."""
        if self.api == "generate":
            sampling: dict[str, Any] = {"max_new_tokens": request.max_tokens}
            if self.temperature is not None:
                sampling["temperature"] = self.temperature
            return {"text": request.prompt, "stream": True, "sampling_params": sampling}
        body: dict[str, Any] = {"model": self.model, "prompt": request.prompt, "max_tokens": request.max_tokens,
                                "stream": True}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        return body

    async def open(self, requests: Sequence[Planned]) -> None:
        for r in requests:
            payload = json.dumps(self.body(r)).encode()
            head = (f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                    f"Content-Type: application/json\r\nAccept: text/event-stream\r\n{self.extra}"
                    f"Content-Length: {len(payload)}\r\n\r\n").encode()
            self._bodies[r.index] = head + payload

    async def send(self, request: Planned, outcome: Outcome, limit_s: float) -> None:
        sent = time.monotonic()
        try:
            async with asyncio.timeout(limit_s):
                try:
                    await self._exchange(request, outcome, sent, reuse=True)
                except _StaleConnection:
                    await self._exchange(request, outcome, sent, reuse=False)
        except TimeoutError:
            outcome.status, outcome.detail = "TIMEOUT", f"no end of stream after {limit_s:g} s"
        except HttpStatusError as exc:
            outcome.status, outcome.detail = f"HTTP {exc.status}", exc.body[:200]
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, _StaleConnection) as exc:
            outcome.status, outcome.detail = "CONNECTION", f"{type(exc).__name__}: {exc}"[:200]

    async def _connection(self, reuse: bool) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
        while reuse and self._idle:
            reader, writer = self._idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer, True
            writer.close()
        reader, writer = await asyncio.open_connection(self.host, self.port, limit=HEADER_LIMIT)
        return reader, writer, False

    async def _exchange(self, request: Planned, outcome: Outcome, sent: float, *, reuse: bool) -> None:
        reader, writer, reused = await self._connection(reuse)
        keep = False
        try:
            try:
                writer.write(self._bodies[request.index])
                await writer.drain()
                status_line = await reader.readline()
            except (ConnectionResetError, BrokenPipeError) as exc:
                if reused:
                    raise _StaleConnection() from exc
                raise
            if not status_line:
                if reused:
                    raise _StaleConnection()
                raise asyncio.IncompleteReadError(b"", None)
            keep = await self._response(reader, status_line, request, outcome, sent)
        finally:
            if keep:
                self._idle.append((reader, writer))
            else:
                writer.close()

    async def _response(self, reader: asyncio.StreamReader, status_line: bytes, request: Planned,
                        outcome: Outcome, sent: float) -> bool:
        """Read one response; fill the outcome; whether the connection may be reused."""
        parts = status_line.decode("latin-1").split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise ValueError(f"bad status line {status_line[:80]!r}")
        status = int(parts[1])
        headers = await _headers(reader)
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = int(headers["content-length"]) if "content-length" in headers else None
        keep = headers.get("connection", "").lower() != "close" and (chunked or length is not None)
        stream = _Stream(self.api, sent, outcome)
        if status != 200:
            body = await _read_body(reader, chunked, length, limit=4096)
            raise HttpStatusError(status, body.decode("utf-8", "replace").strip())
        if chunked:
            while True:
                size_line = await reader.readline()
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    await _trailers(reader)
                    break
                stream.feed(await reader.readexactly(size))
                await reader.readexactly(2)
        elif length is not None:
            stream.feed(await reader.readexactly(length))
        else:
            while chunk := await reader.read(65536):
                stream.feed(chunk)
        stream.feed(b"\n\n")  # a last event without its blank line
        if stream.error:
            outcome.status, outcome.detail = "STREAM_ERROR", stream.error
        elif not stream.done:
            outcome.status, outcome.detail = "INCOMPLETE", "the stream ended without [DONE] or a finish_reason"
        else:
            outcome.status = "OK"
        return keep

    async def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


async def _headers(reader: asyncio.StreamReader) -> dict[str, str]:
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            return headers
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()


async def _trailers(reader: asyncio.StreamReader) -> None:
    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
        pass


async def _read_body(reader: asyncio.StreamReader, chunked: bool, length: int | None, *, limit: int) -> bytes:
    """A non-streamed body (an error's), at most ``limit`` bytes kept."""
    if length is not None:
        return (await reader.readexactly(length))[:limit]
    out = b""
    if chunked:
        while size := int((await reader.readline()).split(b";")[0].strip() or b"0", 16):
            out += (await reader.readexactly(size))[:limit]
            await reader.readexactly(2)
        await _trailers(reader)
        return out[:limit]
    return (await reader.read(limit))


# -- the run ----------------------------------------------------------------------------------------------------------

async def run(target: Target, requests: Sequence[Planned], limits: Limits) -> tuple[list[Outcome], float]:
    """Send every request at its due time within ``limits``; the outcomes (plan order) and the elapsed seconds."""
    outcomes = [Outcome(r.index) for r in requests]
    await target.open(requests)
    slots = asyncio.Semaphore(limits.concurrency)
    tasks: list[asyncio.Task[None]] = []
    start = time.monotonic()

    async def one(request: Planned, outcome: Outcome) -> None:
        try:
            now = time.monotonic()
            outcome.sent_s, outcome.late_s = now - start, now - start - request.due_s
            try:
                await target.send(request, outcome, limits.timeout)
            except Exception as exc:  # a client bug must not end the run: it is counted, and its detail kept
                outcome.status, outcome.detail = "CLIENT_ERROR", f"{type(exc).__name__}: {exc}"[:200]
            outcome.e2e_s = time.monotonic() - now
        finally:
            slots.release()

    try:
        for request, outcome in zip(requests, outcomes, strict=True):
            if request.due_s > limits.time_limit:
                break
            await asyncio.sleep(max(0.0, start + request.due_s - time.monotonic()))
            await slots.acquire()
            if time.monotonic() - start > limits.time_limit:
                slots.release()
                break
            tasks.append(asyncio.create_task(one(request, outcome)))
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
        await target.close()
    return outcomes, time.monotonic() - start


def run_sync(target: Target, requests: Sequence[Planned], limits: Limits,
             beside: Callable[[], Coroutine[Any, Any, None]] | None = None) -> tuple[list[Outcome], float]:
    """:func:`run` in a fresh event loop; ``beside`` (a sampler, say) runs alongside and is cancelled at the end."""
    async def main() -> tuple[list[Outcome], float]:
        side = asyncio.create_task(beside()) if beside is not None else None
        try:
            return await run(target, requests, limits)
        finally:
            if side is not None:
                side.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await side

    return asyncio.run(main())
