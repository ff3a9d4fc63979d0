"""The HTTP face of a simulated replica: SGLang's native API and OpenAI completions and chat on the gRPC face's engine.

:class:`HttpFace` serves one :class:`agent.replica.runner.EngineRunner` (the very
runner behind the replica's KServe v2 gRPC face) over HTTP/1.1 on asyncio
streams, so that HTTP routers can be measured in front of the same replicas
Ferry routes to over gRPC. Both faces admit a prompt with
:func:`submit_prompt` (whitespace tokens, chained block hashes of the
engine's block size) and write the answer :mod:`agent.replica.model` gives
(words, JSON, a tool call), so a request's text, token counts, cached
tokens and the engine's prefix-cache counters are the same whichever face it
came through.

Routes (``model`` is the replica's model name):

- ``GET /health``, ``GET /health_generate``: 200 ``{}``; 503 while the model loads.
- ``GET /get_load``: SGLang's list with one entry per data-parallel rank (one
  rank here): ``dp_rank`` 0, ``num_reqs`` (running + queued),
  ``num_running_reqs``, ``num_waiting_reqs``, ``num_tokens`` (tokens of the
  KV blocks in use).
- ``GET /server_info`` and ``/get_server_info``, ``GET /model_info`` and
  ``/get_model_info``, ``GET /v1/models``: the model name, its limits and
  ``is_generation``; never a ``model_path`` or ``tokenizer_path``, from
  which a router would try to load (or download) a tokenizer.
- ``POST /generate`` (SGLang): ``{"text": str, "sampling_params":
  {"max_new_tokens": int = 128, "stop": str | [str], "ignore_eos": bool},
  "stream": bool = false, "rid": str}``; answers ``{"text", "meta_info":
  {"id", "prompt_tokens", "completion_tokens", "cached_tokens",
  "finish_reason": {"type": "length", "length": n} | {"type": "stop",
  "matched": the stop string, or EOS_TOKEN_ID at a natural end}}}``.
  Streamed: one server-sent event per engine delta with the whole text so
  far (SGLang's default, not incremental), ``finish_reason`` null and no
  ``cached_tokens`` until the last event, then ``data: [DONE]``.
- ``POST /v1/completions`` (OpenAI): ``{"model": str, "prompt": str | [str],
  "max_tokens": int, "stop": str | [str], "ignore_eos": bool, "stream":
  bool = false, "stream_options": {"include_usage": bool}, "n": int = 1,
  "response_format"}``; answers a ``text_completion`` with ``usage``
  (``prompt_tokens_details.cached_tokens``). Streamed: one chunk per engine
  delta with the new text, the last with ``finish_reason``, then,
  when ``include_usage``, a chunk with empty ``choices`` and the usage, then
  ``data: [DONE]``. ``model``, when given, must be the replica's.
- ``POST /v1/chat/completions`` (OpenAI chat): ``{"model": str, "messages":
  [{"role", "content": str | [{"type": "text", "text": str}]}],
  "max_completion_tokens" | "max_tokens": int, "stop", "ignore_eos",
  "stream": bool = false, "stream_options": {"include_usage": bool}, "n":
  int = 1, "tools", "tool_choice", "response_format"}``; the prompt is the
  messages' text contents joined by newlines (no chat template). Answers a
  ``chat.completion`` whose ``message`` is ``{"role": "assistant",
  "content"}``, or a tool call (:mod:`agent.replica.choices`), with
  ``usage``. Streamed: ``chat.completion.chunk`` events, the first with
  ``delta`` ``{"role": "assistant", "content": ""}``, then one per engine
  delta with the new ``content`` (or a tool call's parts), then one with an
  empty ``delta`` and the ``finish_reason``; with ``include_usage`` every
  chunk carries ``"usage": null`` and one more chunk with empty ``choices``
  carries the usage (OpenAI's semantics); then ``data: [DONE]``.
- OpenAI's ``n`` (1 to ``MAX_CHOICES``): as many engine requests of the
  prompt (the later ones find it cached), the same answer each; choices
  ``index`` 0..n-1; streamed, every choice's first delta, then choice 0's
  chunks to its end, then choice 1's (its tokens so far in one chunk) ...;
  ``usage`` counts the prompt once and the completion tokens of every
  choice. ``tools`` / ``tool_choice`` and ``response_format``
  (``json_object``, ``json_schema``) are the model's
  (:mod:`agent.replica.model`): malformed ones are refused naming the field.
- ``POST /v1/completions/render`` (vLLM's renderer, which vllm-router's
  cache_aware policy calls on every worker before it routes a completion):
  the completion request -> ``[{"request_id", "model", "token_ids",
  "sampling_params": {"max_tokens"}}]``. ``POST /tokenize`` (its fallback):
  ``{"prompt": str}`` or ``{"text": str}`` -> ``{"count", "max_model_len",
  "tokens"}``. A token id is the CRC-32 of a whitespace word (31 bits): the
  same in every process and equal for equal words. The ids of recent prompts
  are cached (LRU, 32 Mi characters, shared by the faces of a process), so a
  prompt rendered on every replica of the process is hashed once.

Where an answer ends is :func:`agent.replica.answer.answer_limit`, as on
the KServe face: its natural end (``[replica] answer_tokens``; none with
``ignore_eos``), the first ``stop`` string (at most ``MAX_STOPS`` of at most
``MAX_STOP_CHARS`` characters) or the budget; ``finish_reason`` "stop" for
the first two, "length" for the budget. The OpenAI budget, when the body
gives none, is the context left after the prompt (vLLM's default: the
answer ends naturally or at the context). Other request fields (sampling
parameters, ``temperature`` ...) are ignored, but ``echo`` true is refused.

Errors are JSON ``{"error": {"message", "type", "param", "code"}}`` whose
``param`` names the field at fault: 400 malformed JSON or field, 404 unknown
path or model, 405 method, 408 body too slow, 411 a chunked request body
(``Content-Length`` is required), 413 body over ``max_body_bytes``, 429 engine queue full
(with ``Retry-After``), 431 head over ``MAX_HEAD_BYTES``, 503 model loading
or ``max_connections`` open.

Connections: keep-alive (HTTP/1.1's default; HTTP/1.0 and ``Connection:
close`` close after the response), one request at a time. The next request's
head must arrive within ``idle_seconds`` of the last response (longer than
the 90 s idle pools of common clients, so the server is not the side that
closes a pooled connection), its body within ``BODY_TIMEOUT_SECONDS``. While
a generation runs the connection is watched: a client that closes it (a
half-close counts) cancels its request in the engine, which frees the KV
blocks. The first byte of a pipelined next request ends the watch and is
kept for the next parse.

Defaults: ``max_body_bytes`` 8 MiB (a 130 k-word prompt), ``max_connections``
1024, ``idle_seconds`` 300.

Cost: O(head + body) to parse a request, O(prompt) to admit or render one.
A streamed ``/generate`` sends the whole text so far in each event, O(n²)
bytes over n events (as SGLang does); the OpenAI stream sends O(n). Memory
per connection is bounded by the head, the body and one event; the render
cache by its budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from agent.replica import choices, logprobs
from agent.replica import model as simulated
from agent.replica.answer import answer_limit
from agent.replica.engine import Finished
from agent.replica.model import Script
from agent.replica.runner import EngineRunner, Ticket
from ferry.errors import FerryError, InvalidArgument, NotFound, Overloaded, Unavailable
from ferry.tokens import tokenize

MAX_HEAD_BYTES = 32 * 1024
MAX_HEADERS = 100
BODY_TIMEOUT_SECONDS = 30.0
LINGER_SECONDS = 1.0  # after closing its side, the server discards what the client still sends this long ...
LINGER_BYTES = 1024 * 1024  # ... or up to this much, so the close does not reset the connection before it is read
GENERATE_DEFAULT_TOKENS = 128  # SGLang's default max_new_tokens
MAX_STOPS = 16  # stop strings per request (as many as the KServe face's stop_words tensor takes)
MAX_STOP_CHARS = 256
MAX_CHOICES = 16  # n, the choices of one OpenAI request
MAX_COMPLETION_LOGPROBS = 5  # /v1/completions logprobs: alternatives per token, as OpenAI bounds it
EOS_TOKEN_ID = 2  # what SGLang's finish_reason names as matched at a natural end (Llama's </s>)

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
            411: "Length Required", 413: "Content Too Large", 429: "Too Many Requests",
            431: "Request Header Fields Too Large", 503: "Service Unavailable"}
_T = TypeVar("_T")


def submit_prompt(runner: EngineRunner, prompt: str, max_tokens: int | None, *, stops: Sequence[str] = (),
                  ignore_eos: bool = False, prompt_field: str = "prompt",
                  script: tuple[str, ...] | None = None) -> tuple[Ticket, int]:
    """Queue ``prompt`` in the engine (both faces do it this way); returns the ticket and the prompt's tokens.

    Tokens are the runner's tokenizer (a model's ``tokenizer.json``, else
    whitespace words), cut into KV blocks of ``kv_block_tokens`` and hashed
    as the proxy does (:meth:`ferry.tokens.Tokenizer.encode`), so a proxy
    block of 512 tokens is whole engine blocks whenever the engine's block
    size divides 512, and with the default (512) the very same hashes.
    ``max_tokens`` None is the context left after the prompt (vLLM's
    default; InvalidArgument naming ``prompt_field`` when none is left).
    Where the answer ends (``ticket.answer``) is :func:`agent.replica.answer.answer_limit`
    of the prompt, the budget, ``stops``, ``ignore_eos`` and the answer's
    ``script`` (:mod:`agent.replica.model`; None: words), with the engine's
    ``answer_tokens`` settings.
    """
    params = runner.engine.params
    encoded = runner.tokenizer.encode(prompt, block_tokens=params.kv_block_tokens)
    if max_tokens is None:
        max_tokens = params.max_context_tokens - encoded.count
        if max_tokens < 1:
            raise InvalidArgument(prompt_field, f"prompt of {encoded.count} tokens leaves no room for an answer "
                                                f"in the context of {params.max_context_tokens} tokens")
    answer = answer_limit(prompt, max_tokens, stops, params=params, ignore_eos=ignore_eos, script=script)
    return runner.submit(encoded.count, max_tokens, encoded.hashes, answer), encoded.count


def token_ids(prompt: str) -> list[int]:
    """Stable token ids of ``prompt``: the CRC-32 of each whitespace word, 31 bits (equal words, equal ids)."""
    return [zlib.crc32(word.encode("utf-8")) & 0x7FFFFFFF for word in tokenize(prompt)]


class _RenderCache:
    """Recent prompts' token ids as JSON text (with their count), least recently used out past ``budget`` characters.

    A router that renders each prompt on every worker would otherwise hash it once per replica of this process.
    """

    def __init__(self, budget: int = 32 * 1024 * 1024) -> None:
        self.budget, self._size = budget, 0
        self._items: OrderedDict[str, tuple[int, str]] = OrderedDict()

    def get(self, prompt: str) -> tuple[int, str]:
        hit = self._items.get(prompt)
        if hit is not None:
            self._items.move_to_end(prompt)
            return hit
        ids = token_ids(prompt)
        entry = (len(ids), json.dumps(ids, separators=(",", ":")))
        cost = len(prompt) + len(entry[1])
        if cost <= self.budget:
            self._items[prompt], self._size = entry, self._size + cost
            while self._size > self.budget:
                old, (_, text) = self._items.popitem(last=False)
                self._size -= len(old) + len(text)
        return entry


_RENDERED = _RenderCache()


class HttpReject(Exception):
    """A request refused with an HTTP status; ``param`` names the field at fault."""

    def __init__(self, status: int, param: str, message: str, *, close: bool = False,
                 headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(f"{param}: {message}")
        self.status, self.param, self.message, self.close, self.headers = status, param, message, close, headers


class ClientGone(Exception):
    """The client closed the connection while its request ran."""


@dataclasses.dataclass(frozen=True)
class _Request:
    """One parsed HTTP request: method, path, body, and whether the connection stays open."""

    method: str
    path: str
    body: bytes
    keep_alive: bool


class _Conn:
    """One client connection: reads requests, writes sized or streamed responses, watches for the client leaving."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.pushback = b""  # the first byte of a pipelined request, read by the watch
        self.closed = False  # the client closed its side
        self.chunked = True  # HTTP/1.1: streamed bodies are chunked
        self._watch: asyncio.Future[bytes] | None = None

    async def read_request(self, idle_seconds: float, max_body: int) -> _Request | None:
        """The next request; None when the client closed or stayed idle too long."""
        try:
            head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), idle_seconds)
        except asyncio.IncompleteReadError as exc:
            self.closed = True
            if exc.partial.strip() or self.pushback:
                raise HttpReject(400, "request", "connection closed inside the request head", close=True) from None
            return None
        except asyncio.LimitOverrunError:
            raise HttpReject(431, "headers", f"request head over {MAX_HEAD_BYTES} bytes", close=True) from None
        except TimeoutError:
            return None
        lines = (self.pushback + head).decode("latin-1").split("\r\n")
        self.pushback = b""
        parts = lines[0].split(" ")
        if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0") or not parts[1].startswith("/"):
            raise HttpReject(400, "request line", f"expected 'METHOD /path HTTP/1.1', got {lines[0][:80]!r}",
                             close=True)
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise HttpReject(400, "headers", f"malformed header line {line[:80]!r}", close=True)
            headers[name.lower()] = value.strip()
        if len(headers) > MAX_HEADERS:
            raise HttpReject(431, "headers", f"more than {MAX_HEADERS} header fields", close=True)
        self.chunked = version == "HTTP/1.1"
        keep_alive = self.chunked and headers.get("connection", "").lower() != "close"
        if "transfer-encoding" in headers:
            raise HttpReject(411, "Transfer-Encoding", "request bodies must be sent with a Content-Length",
                             close=True)
        raw = headers.get("content-length", "0")
        if not (raw.isascii() and raw.isdigit()):
            raise HttpReject(400, "Content-Length", f"not a byte count: {raw[:40]!r}", close=True)
        if int(raw) > max_body:
            raise HttpReject(413, "Content-Length", f"body of {raw} bytes over the limit of {max_body}", close=True)
        if int(raw) and headers.get("expect", "").lower() == "100-continue":
            self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        try:
            body = await asyncio.wait_for(self.reader.readexactly(int(raw)), BODY_TIMEOUT_SECONDS)
        except TimeoutError:
            raise HttpReject(408, "body", f"not received within {BODY_TIMEOUT_SECONDS:g} s", close=True) from None
        except asyncio.IncompleteReadError:
            self.closed = True
            return None
        return _Request(method, target.split("?", 1)[0], body, keep_alive)

    def _head(self, status: int, content_type: str, keep_alive: bool, extra: tuple[tuple[str, str], ...]) -> str:
        lines = [f"HTTP/1.1 {status} {_REASONS[status]}", f"Content-Type: {content_type}",
                 f"Connection: {'keep-alive' if keep_alive else 'close'}", *(f"{k}: {v}" for k, v in extra)]
        return "\r\n".join(lines) + "\r\n"

    async def send_json(self, status: int, payload: object, *, keep_alive: bool,
                        headers: tuple[tuple[str, str], ...] = ()) -> None:
        await self.send_raw(status, json.dumps(payload, separators=(",", ":")).encode("utf-8"),
                            keep_alive=keep_alive, headers=headers)

    async def send_raw(self, status: int, body: bytes, *, keep_alive: bool,
                       headers: tuple[tuple[str, str], ...] = ()) -> None:
        """A JSON response whose body is already encoded."""
        head = self._head(status, "application/json", keep_alive, headers) + f"Content-Length: {len(body)}\r\n\r\n"
        self.writer.write(head.encode("latin-1") + body)
        await self.writer.drain()

    def start_events(self, keep_alive: bool) -> None:
        """The head of a server-sent event stream (chunked on HTTP/1.1; HTTP/1.0 ends it by closing)."""
        extra = (("Cache-Control", "no-cache"),) + ((("Transfer-Encoding", "chunked"),) if self.chunked else ())
        self.writer.write((self._head(200, "text/event-stream", keep_alive, extra) + "\r\n").encode("latin-1"))

    async def event(self, payload: bytes) -> None:
        """One ``data:`` event, flushed."""
        data = b"data: " + payload + b"\n\n"
        self.writer.write(b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data)
        await self.writer.drain()

    async def end_events(self) -> None:
        """``data: [DONE]``, then the end of the chunked body."""
        await self.event(b"[DONE]")
        if self.chunked:
            self.writer.write(b"0\r\n\r\n")
            await self.writer.drain()

    async def linger(self) -> None:
        """Close the server's side, then discard what the client still sends (bounded in bytes and time)."""
        if self.closed or self.writer.is_closing():
            return
        with contextlib.suppress(TimeoutError, ConnectionError, OSError, RuntimeError):
            self.writer.write_eof()
            async with asyncio.timeout(LINGER_SECONDS):
                left = LINGER_BYTES
                while left > 0 and (data := await self.reader.read(min(64 * 1024, left))):
                    left -= len(data)

    def watch(self) -> None:
        """Start watching for the client closing the connection."""
        self._watch = asyncio.ensure_future(self.reader.read(1))

    async def wait(self, awaitable: Awaitable[_T]) -> _T:
        """Await ``awaitable``; raises ClientGone if the client closes the connection first."""
        task = asyncio.ensure_future(awaitable)
        while self._watch is not None:
            try:
                await asyncio.wait((task, self._watch), return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                task.cancel()
                raise
            if task.done():
                return task.result()
            self._settle()
            if self.closed:
                task.cancel()
                raise ClientGone
        return await task

    async def unwatch(self) -> None:
        """Stop watching (a byte it read is kept for the next request)."""
        if self._watch is not None and not self._watch.done():
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        self._settle()

    def _settle(self) -> None:
        watch, self._watch = self._watch, None
        if watch is None or not watch.done() or watch.cancelled():
            return
        data = b"" if watch.exception() is not None else watch.result()
        if data:
            self.pushback = data
        else:
            self.closed = True


def _json_body(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InvalidArgument("body", f"not UTF-8 (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise InvalidArgument("body", f"not JSON: {exc.msg} at character {exc.pos}") from None
    if not isinstance(value, dict):
        raise InvalidArgument("body", f"must be a JSON object, got {type(value).__name__}")
    return value


def _typed(obj: Mapping[str, Any], name: str, kind: type[_T], default: _T, where: str = "") -> _T:
    """Field ``name`` of ``obj`` (absent or null: ``default``), of JSON type ``kind``; a bool is not an int."""
    value = obj.get(name)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = {int: "an integer", bool: "a boolean", str: "a string", dict: "an object"}
        raise InvalidArgument(where + name, f"must be {names.get(kind, kind.__name__)}, "
                                            f"got {type(value).__name__} {json.dumps(value)[:40]}")
    return value


def _prompt(value: object, field: str) -> str:
    if isinstance(value, list):
        if len(value) != 1:
            raise InvalidArgument(field, f"a list of {len(value)} prompts: one prompt per request is served")
        value = value[0]
    if not isinstance(value, str):
        raise InvalidArgument(field, "required: one prompt string")
    if not value.strip():
        raise InvalidArgument(field, "empty prompt")
    return value


class HttpFace:
    """HTTP/1.1 server of one replica's engine; see the module docstring for the routes."""

    def __init__(self, *, model: str, runner: EngineRunner, loaded: Callable[[], bool] = lambda: True,
                 max_body_bytes: int = 8 * 1024 * 1024, max_connections: int = 1024,
                 idle_seconds: float = 300.0) -> None:
        self.model, self.runner, self._loaded = model, runner, loaded
        self.max_body_bytes, self.max_connections, self.idle_seconds = max_body_bytes, max_connections, idle_seconds
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._get: dict[str, Callable[[], object]] = {
            "/health": self._health, "/health_generate": self._health, "/get_load": self._load,
            "/server_info": self._server_info, "/get_server_info": self._server_info,
            "/model_info": self._model_info, "/get_model_info": self._model_info, "/v1/models": self._models,
        }
        self._post: dict[str, Callable[[_Conn, _Request], Awaitable[None]]] = {
            "/generate": self._generate, "/v1/completions": self._completions, "/v1/chat/completions": self._chat,
            "/v1/completions/render": self._render, "/tokenize": self._tokenize,
        }

    async def start(self, host: str, port: int = 0) -> int:
        """Listen on ``host:port`` (0: the system picks); returns the bound port."""
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD_BYTES)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        """Stop listening and end every connection (their requests are cancelled in the engine)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    # -- connections ----------------------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        conn = _Conn(reader, writer)
        try:
            if len(self._tasks) > self.max_connections:
                await self._send_error(conn, HttpReject(503, "connection", f"{self.max_connections} connections "
                                                        "already open", close=True), keep_alive=False)
            else:
                await self._converse(conn)
            await conn.linger()
        except (ClientGone, ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass  # stop() ends connections; a cancelled handler task would be logged as an error by asyncio
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _converse(self, conn: _Conn) -> None:
        """Serve requests on ``conn`` until either side ends the conversation."""
        while not conn.closed:
            keep = False
            try:
                request = await conn.read_request(self.idle_seconds, self.max_body_bytes)
                if request is None:
                    return
                keep = request.keep_alive
                await self._dispatch(conn, request)
            except HttpReject as exc:
                keep = keep and not exc.close
                await self._send_error(conn, exc, keep_alive=keep)
            if not keep:
                return

    async def _send_error(self, conn: _Conn, exc: HttpReject, *, keep_alive: bool) -> None:
        kind = "invalid_request_error" if exc.status < 500 else "server_error"
        payload = {"error": {"message": str(exc), "type": kind, "param": exc.param, "code": exc.status}}
        await conn.send_json(exc.status, payload, keep_alive=keep_alive, headers=exc.headers)

    async def _dispatch(self, conn: _Conn, request: _Request) -> None:
        get, post = self._get.get(request.path), self._post.get(request.path)
        if get is None and post is None:
            raise HttpReject(404, "path", f"no route {request.path}; routes: {', '.join([*self._get, *self._post])}")
        if get is not None and request.method == "GET":
            if request.path.startswith("/health") and not self._loaded():
                raise HttpReject(503, "model", f"model {self.model} is loading")
            await conn.send_json(200, get(), keep_alive=request.keep_alive)
        elif post is not None and request.method == "POST":
            try:
                await post(conn, request)
            except FerryError as exc:
                raise _rejection(exc) from None
        else:
            allowed = "GET" if get is not None else "POST"
            raise HttpReject(405, "method", f"{request.method} {request.path}: only {allowed}",
                             headers=(("Allow", allowed),))

    # -- metadata -------------------------------------------------------------------------------------------------

    def _health(self) -> object:
        return {}

    def _load(self) -> object:
        load = self.runner.engine.load()
        used = (load.kv_blocks_total - load.kv_blocks_free) * load.kv_block_tokens
        return [{"dp_rank": 0, "num_reqs": load.running + load.queued, "num_running_reqs": load.running,
                 "num_waiting_reqs": load.queued, "num_tokens": used}]

    def _server_info(self) -> object:
        p = self.runner.engine.params
        return {"served_model_name": self.model, "model_id": self.model, "dp_size": 1, "tp_size": 1,
                "max_running_requests": p.max_running, "max_total_num_tokens": p.kv_blocks_total * p.kv_block_tokens,
                "context_length": p.max_context_tokens, "page_size": p.kv_block_tokens, "version": "ferry-simulated"}

    def _model_info(self) -> object:
        return {"served_model_name": self.model, "is_generation": True, "model_type": "ferry_simulated_llm"}

    def _models(self) -> object:
        entry = {"id": self.model, "object": "model", "created": 0, "owned_by": "ferry", "root": self.model,
                 "max_model_len": self.runner.engine.params.max_context_tokens}
        return {"object": "list", "data": [entry]}

    # -- tokens ---------------------------------------------------------------------------------------------------

    async def _render(self, conn: _Conn, request: _Request) -> None:
        body = _json_body(request.body)
        model = _typed(body, "model", str, self.model)
        if model != self.model:
            raise NotFound("model", model)
        count, ids = _RENDERED.get(_prompt(body.get("prompt"), "prompt"))
        max_tokens = _typed(body, "max_tokens", int, max(self.runner.engine.params.max_context_tokens - count, 1))
        rendered = json.dumps({"request_id": f"cmpl-{uuid.uuid4().hex}", "model": self.model,
                               "sampling_params": {"max_tokens": max_tokens}}, separators=(",", ":"))
        payload = f'[{rendered[:-1]},"token_ids":{ids}}}]'
        await conn.send_raw(200, payload.encode("utf-8"), keep_alive=request.keep_alive)

    async def _tokenize(self, conn: _Conn, request: _Request) -> None:
        body = _json_body(request.body)
        field = "prompt" if body.get("prompt") is not None or body.get("text") is None else "text"
        count, ids = _RENDERED.get(_prompt(body.get(field), field))
        payload = f'{{"count":{count},"max_model_len":{self.runner.engine.params.max_context_tokens},"tokens":{ids}}}'
        await conn.send_raw(200, payload.encode("utf-8"), keep_alive=request.keep_alive)

    # -- generation -----------------------------------------------------------------------------------------------

    def _admit(self, prompt: str, budget: Budget, prompt_field: str, script: Script | None = None,
               n: int = 1) -> tuple[list[Ticket], int]:
        """Queue ``n`` answers to ``prompt`` (an engine request each; the later ones find the prompt cached) and
        return their tickets and the prompt's tokens; none stays queued when one is refused."""
        if not self._loaded():
            raise Unavailable(f"model {self.model} is loading")
        tickets: list[Ticket] = []
        prompt_tokens = 0
        try:
            for _ in range(n):
                ticket, prompt_tokens = submit_prompt(
                    self.runner, prompt, budget.max_tokens, stops=budget.stops, ignore_eos=budget.ignore_eos,
                    prompt_field=prompt_field, script=script.tokens if script is not None else None)
                tickets.append(ticket)
        except BaseException as exc:
            for ticket in tickets:
                self.runner.cancel(ticket)
            if isinstance(exc, InvalidArgument) and exc.field == "max_tokens":
                raise InvalidArgument(budget.field, exc.reason) from None
            raise
        return tickets, prompt_tokens

    async def _follow(self, conn: _Conn, tickets: Sequence[Ticket],
                      on_delta: Callable[[int, int, Finished | None], Awaitable[None]] | None = None
                      ) -> list[Finished]:
        """Wait for ``tickets`` to finish, one after the other, calling ``on_delta(choice, tokens, finished)`` per
        delta (a later ticket's tokens wait in it, and come in one delta); cancels them if the client leaves."""
        conn.watch()
        done: list[Finished] = []
        try:
            for i, ticket in enumerate(tickets):
                finished: Finished | None = None
                while finished is None:
                    count, finished = await conn.wait(ticket.next())
                    if on_delta is not None:
                        await on_delta(i, count, finished)
                done.append(finished)
            return done
        finally:
            await conn.unwatch()
            for ticket in tickets:
                if ticket.finished is None:
                    self.runner.cancel(ticket)

    async def _generate(self, conn: _Conn, request: _Request) -> None:
        body = _json_body(request.body)
        if body.get("text") is None and body.get("input_ids") is not None:
            raise InvalidArgument("text", "required (input_ids are not served: prompts are whitespace words)")
        prompt = _prompt(body.get("text"), "text")
        sampling = _typed(body, "sampling_params", dict, {})
        budget = _budget(sampling, ("max_new_tokens",), GENERATE_DEFAULT_TOKENS, "sampling_params.")
        stream = _typed(body, "stream", bool, False)
        rid = _typed(body, "rid", str, "") or uuid.uuid4().hex
        (ticket,), prompt_tokens = self._admit(prompt, budget, "text")

        def meta(finished: Finished | None) -> dict[str, Any]:
            info: dict[str, Any] = {"id": rid, "finish_reason": None, "prompt_tokens": prompt_tokens,
                                    "completion_tokens": ticket.emitted}
            if finished is not None:
                info.update(finish_reason=_sglang_finish(ticket), cached_tokens=finished.cached_tokens,
                            e2e_latency=finished.queue_seconds + finished.service_seconds)
            return info

        if not stream:
            (f,) = await self._follow(conn, [ticket])
            await conn.send_json(200, {"text": ticket.answer.text(0, ticket.emitted), "meta_info": meta(f)},
                                 keep_alive=request.keep_alive)
            return

        async def delta(_: int, count: int, finished: Finished | None) -> None:
            text = ticket.answer.text(0, ticket.emitted)
            await conn.event(json.dumps({"text": text, "meta_info": meta(finished)}).encode())

        conn.start_events(request.keep_alive)
        await self._follow(conn, [ticket], delta)
        await conn.end_events()

    async def _completions(self, conn: _Conn, request: _Request) -> None:
        body = _json_body(request.body)
        model = _typed(body, "model", str, self.model)
        if model != self.model:
            raise NotFound("model", model)
        prompt = _prompt(body.get("prompt"), "prompt")
        budget = _budget(body, ("max_tokens",))
        if _typed(body, "echo", bool, False):
            raise InvalidArgument("echo", "the prompt is not echoed")
        stream = _typed(body, "stream", bool, False)
        usage_too = _typed(_typed(body, "stream_options", dict, {}), "include_usage", bool, False, "stream_options.")
        top = _typed(body, "logprobs", int, -1)  # log probabilities with this many alternatives (absent: none)
        if top > MAX_COMPLETION_LOGPROBS:
            raise InvalidArgument("logprobs", f"must be 0 to {MAX_COMPLETION_LOGPROBS}, got {top}")
        tickets, prompt_tokens = self._admit(prompt, budget, "prompt", simulated.response_script(body), _n(body))
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": self.model}
        sent = [0] * len(tickets)
        offsets = [0] * len(tickets)

        def choice(i: int, count: int, finished: Finished | None) -> dict[str, Any]:
            """Choice ``i``'s next ``count`` tokens (its whole answer, for a unary one)."""
            answer = tickets[i].answer
            text = answer.text(sent[i], count)
            found = (logprobs.completion(answer.tokens(sent[i], count), sent[i], top, offsets[i])
                     if top >= 0 and count else None)
            sent[i], offsets[i] = sent[i] + count, offsets[i] + len(text)
            return {"index": i, "text": text, "logprobs": found,
                    "finish_reason": answer.reason if finished else None}

        if not stream:
            done = await self._follow(conn, tickets)
            answer = {**head, "choices": [choice(i, t.emitted, f)
                                          for i, (t, f) in enumerate(zip(tickets, done, strict=True))],
                      "usage": _usage(prompt_tokens, tickets, done)}
            await conn.send_json(200, answer, keep_alive=request.keep_alive)
            return

        async def delta(i: int, count: int, finished: Finished | None) -> None:
            await conn.event(json.dumps({**head, "choices": [choice(i, count, finished)]}).encode())

        conn.start_events(request.keep_alive)
        done = await self._follow(conn, tickets, delta)
        if usage_too:
            usage = _usage(prompt_tokens, tickets, done)
            await conn.event(json.dumps({**head, "choices": [], "usage": usage}).encode())
        await conn.end_events()

    async def _chat(self, conn: _Conn, request: _Request) -> None:
        body = _json_body(request.body)
        model = _typed(body, "model", str, self.model)
        if model != self.model:
            raise NotFound("model", model)
        prompt = _chat_prompt(body.get("messages"))
        budget = _budget(body, ("max_completion_tokens", "max_tokens"))
        stream = _typed(body, "stream", bool, False)
        usage_too = _typed(_typed(body, "stream_options", dict, {}), "include_usage", bool, False, "stream_options.")
        script = simulated.chat_script(body)
        asked = _typed(body, "logprobs", bool, False)
        top = _typed(body, "top_logprobs", int, 0)
        if not 0 <= top <= logprobs.MAX_TOP or (top and not asked):
            raise InvalidArgument("top_logprobs", f"0 to {logprobs.MAX_TOP}, with logprobs: true")
        tickets, prompt_tokens = self._admit(prompt, budget, "messages", script, _n(body))

        def chat_logprobs(i: int, start: int, count: int) -> dict[str, Any] | None:
            """Choice ``i``'s tokens ``start``.. ``start + count - 1``, when log probabilities are asked."""
            return logprobs.chat(tickets[i].answer.tokens(start, count), start, top) if asked and count else None

        head: dict[str, Any] = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()),
                                "model": self.model}

        if not stream:
            done = await self._follow(conn, tickets)
            answers = [choices.message(script, t.answer, t.emitted) for t in tickets]
            answer = {**head, "object": "chat.completion",
                      "choices": [{"index": i, "message": message, "finish_reason": finish,
                                   "logprobs": chat_logprobs(i, 0, tickets[i].emitted)}
                                  for i, (message, finish) in enumerate(answers)],
                      "usage": _usage(prompt_tokens, tickets, done)}
            await conn.send_json(200, answer, keep_alive=request.keep_alive)
            return
        chunk_head = {**head, "object": "chat.completion.chunk"}
        tail: dict[str, Any] = {"usage": None} if usage_too else {}  # OpenAI: null in every chunk but the last
        streams = [choices.Deltas(script, t.answer) for t in tickets]

        sent = [0] * len(tickets)

        async def chunk(i: int, delta: dict[str, Any], finish: str | None, found: dict[str, Any] | None = None) -> None:
            choice = {"index": i, "delta": delta, "logprobs": found, "finish_reason": finish}
            await conn.event(json.dumps({**chunk_head, "choices": [choice], **tail}).encode())

        async def on_delta(i: int, count: int, finished: Finished | None) -> None:
            delta = streams[i].feed(count) if count else None
            if delta is not None:
                await chunk(i, delta, None, chat_logprobs(i, sent[i], count))
            sent[i] += count
            if finished is not None:
                await chunk(i, {}, streams[i].finish_reason)

        conn.start_events(request.keep_alive)
        for i, deltas in enumerate(streams):
            await chunk(i, deltas.first(), None)
        done = await self._follow(conn, tickets, on_delta)
        if usage_too:
            await conn.event(json.dumps({**chunk_head, "choices": [],
                                         "usage": _usage(prompt_tokens, tickets, done)}).encode())
        await conn.end_events()


@dataclasses.dataclass(frozen=True)
class Budget:
    """How long a request's answer may run: ``max_tokens`` (None: the context left after the prompt), the field
    that gave it, stop strings and ``ignore_eos`` (no natural end)."""

    max_tokens: int | None
    field: str
    stops: tuple[str, ...] = ()
    ignore_eos: bool = False


def _budget(obj: Mapping[str, Any], fields: tuple[str, ...], default: int | None = None, where: str = "") -> Budget:
    """The budget of a request body (or SGLang's ``sampling_params``): the first of ``fields`` given (absent:
    ``default``), ``stop`` (a string or a list of at most :data:`MAX_STOPS` strings of at most
    :data:`MAX_STOP_CHARS` characters) and ``ignore_eos``; raises InvalidArgument naming the field."""
    field = next((f for f in fields if obj.get(f) is not None), fields[-1])
    max_tokens = default if obj.get(field) is None else _typed(obj, field, int, 0, where)
    if max_tokens is not None and max_tokens < 1:
        raise InvalidArgument(where + field, f"must be >= 1, got {max_tokens}")
    stop = obj.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise InvalidArgument(where + "stop", "must be a string or a list of strings")
    if len(stops) > MAX_STOPS:
        raise InvalidArgument(where + "stop", f"at most {MAX_STOPS} strings, got {len(stops)}")
    for i, text in enumerate(stops):
        if len(text) > MAX_STOP_CHARS:
            raise InvalidArgument(f"{where}stop[{i}]", f"at most {MAX_STOP_CHARS} characters, got {len(text)}")
    return Budget(max_tokens, where + field, tuple(stops), _typed(obj, "ignore_eos", bool, False, where))


def _usage(prompt_tokens: int, tickets: Sequence[Ticket], done: Sequence[Finished]) -> dict[str, Any]:
    """OpenAI's ``usage`` of finished requests (the choices of one): the prompt once, every answer's tokens, and
    the first's cached tokens."""
    return choices.usage(prompt_tokens, sum(t.emitted for t in tickets), done[0].cached_tokens)


def _n(body: Mapping[str, Any]) -> int:
    """How many choices a body asks for: ``n``, 1 to :data:`MAX_CHOICES`."""
    n = _typed(body, "n", int, 1)
    if not 1 <= n <= MAX_CHOICES:
        raise InvalidArgument("n", f"must be 1 to {MAX_CHOICES}, got {n}")
    return n


def _sglang_finish(ticket: Ticket) -> dict[str, Any]:
    """SGLang's ``finish_reason``: ``length`` with the length, or ``stop`` with what matched (the stop string, or
    the end-of-sequence token's id)."""
    if ticket.answer.reason == "length":
        return {"type": "length", "length": ticket.emitted}
    return {"type": "stop", "matched": ticket.answer.matched if ticket.answer.matched is not None else EOS_TOKEN_ID}


def _chat_prompt(messages: object) -> str:
    """The prompt of a chat request: the messages' text contents joined by newlines."""
    if not isinstance(messages, list) or not messages:
        raise InvalidArgument("messages", "required: a non-empty list of messages")
    texts: list[str] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidArgument(f"messages[{i}]", "must be an object")
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise InvalidArgument(f"messages[{i}].content[{j}]", "only text parts are served")
                texts.append(part["text"])
        elif content is not None:
            raise InvalidArgument(f"messages[{i}].content", "must be a string or a list of text parts")
    return _prompt("\n".join(t for t in texts if t), "messages")


def _rejection(exc: FerryError) -> HttpReject:
    """The HTTP status of an error raised while admitting a request."""
    if isinstance(exc, InvalidArgument):
        return HttpReject(400, exc.field, exc.reason)
    if isinstance(exc, NotFound):
        return HttpReject(404, exc.kind, str(exc))
    if isinstance(exc, Overloaded):
        return HttpReject(429, "engine", str(exc), headers=(("Retry-After", str(max(1, round(exc.retry_after)))),))
    if isinstance(exc, Unavailable):
        return HttpReject(503, "model", str(exc))
    return HttpReject(400, "request", str(exc))
