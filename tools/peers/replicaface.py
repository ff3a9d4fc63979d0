"""The HTTP face of a simulated replica: SGLang's native API and OpenAI completions and chat on the gRPC face's engine.

Test and benchmark scaffolding, not part of the agent: :class:`HttpFace` serves
one :class:`agent.replica.runner.EngineRunner` (the very runner behind the
replica's KServe v2 gRPC face) over HTTP/1.1 with ``aiohttp.web``, so that HTTP
routers (the peers of :mod:`tools.peers`) can be measured in front of the same
replicas Ferry routes to over gRPC. It is a
:class:`agent.replica.server.FaceFactory`: ``SimulatedReplica(..., face=HttpFace)``
starts it, as :func:`tools.peers.replicas.start_replicas` and ``ferry node``
(which the ``ferry`` command gives this face) do. Both faces admit a prompt with
:meth:`agent.replica.runner.EngineRunner.submit_prompt` (the model's tokens,
chained block hashes of the engine's block size) and write the answer
:mod:`agent.replica.model` gives (words, JSON, a tool call), so a request's
text, token counts, cached tokens and the engine's prefix-cache counters are
the same whichever face it came through.

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
(``Content-Length`` is required), 413 body over ``max_body_bytes``, 429 engine
queue full (with ``Retry-After``), 503 model loading or ``max_connections``
open. A request head aiohttp cannot parse (a bad request line or header, a
line over ``MAX_HEAD_BYTES``) gets aiohttp's own 400 and the connection is closed.

Connections (aiohttp's): keep-alive (HTTP/1.1's default, said in a
``Connection: keep-alive`` header; HTTP/1.0 and ``Connection: close`` close
after the response), pipelined requests answered in order. A connection may
stay idle ``idle_seconds`` between requests (longer than the 90 s idle pools
of common clients, so the server is not the side that closes a pooled
connection); a body must arrive within ``BODY_TIMEOUT_SECONDS``. A client
that closes its connection while its request runs cancels the request's
handler (aiohttp's ``handler_cancellation``), which cancels its requests in
the engine and frees their KV blocks. :meth:`HttpFace.stop` ends every
connection at once.

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
import dataclasses
import json
import time
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from aiohttp import web

from agent.replica import choices, logprobs
from agent.replica import model as simulated
from agent.replica.engine import Finished
from agent.replica.model import Script
from agent.replica.runner import EngineRunner, Ticket
from ferry.errors import FerryError, InvalidArgument, NotFound, Overloaded, Unavailable
from ferry.tokens import tokenize

MAX_HEAD_BYTES = 32 * 1024  # a request line or a header line longer than this is refused (aiohttp's 400)
MAX_HEADERS = 100
BODY_TIMEOUT_SECONDS = 30.0
LINGER_SECONDS = 1.0  # after a refusal that closes, the request body still coming is read and dropped this long
STOP_SECONDS = 0.0  # stop() gives the requests that run this long before it cancels them (none: at once)
GENERATE_DEFAULT_TOKENS = 128  # SGLang's default max_new_tokens
MAX_STOPS = 16  # stop strings per request (as many as the KServe face's stop_words tensor takes)
MAX_STOP_CHARS = 256
MAX_CHOICES = 16  # n, the choices of one OpenAI request
MAX_COMPLETION_LOGPROBS = 5  # /v1/completions logprobs: alternatives per token, as OpenAI bounds it
EOS_TOKEN_ID = 2  # what SGLang's finish_reason names as matched at a natural end (Llama's </s>)

_T = TypeVar("_T")
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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


def _json_response(status: int, body: bytes, headers: tuple[tuple[str, str], ...] = ()) -> web.Response:
    """A JSON response whose body is already encoded."""
    return web.Response(status=status, body=body, headers={"Content-Type": "application/json", **dict(headers)})


def _send_json(payload: object, status: int = 200) -> web.Response:
    return _json_response(status, json.dumps(payload, separators=(",", ":")).encode("utf-8"))


class _Events:
    """A server-sent event stream: one ``data:`` event per write (one chunk on HTTP/1.1), then ``data: [DONE]``."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                               "Cache-Control": "no-cache"})

    async def start(self) -> None:
        await self.response.prepare(self.request)

    async def event(self, payload: bytes) -> None:
        """One ``data:`` event, flushed."""
        await self.response.write(b"data: " + payload + b"\n\n")

    async def end(self) -> web.StreamResponse:
        """``data: [DONE]``, then the end of the body."""
        await self.event(b"[DONE]")
        await self.response.write_eof()
        return self.response


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
    """HTTP/1.1 server (``aiohttp.web``) of one replica's engine; see the module docstring for the routes."""

    def __init__(self, *, model: str, runner: EngineRunner, loaded: Callable[[], bool] = lambda: True,
                 max_body_bytes: int = 8 * 1024 * 1024, max_connections: int = 1024,
                 idle_seconds: float = 300.0) -> None:
        self.model, self.runner, self._loaded = model, runner, loaded
        self.max_body_bytes, self.max_connections, self.idle_seconds = max_body_bytes, max_connections, idle_seconds
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._get: dict[str, Callable[[], object]] = {
            "/health": self._health, "/health_generate": self._health, "/get_load": self._load,
            "/server_info": self._server_info, "/get_server_info": self._server_info,
            "/model_info": self._model_info, "/get_model_info": self._model_info, "/v1/models": self._models,
        }
        self._post: dict[str, Callable[[web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]] = {
            "/generate": self._generate, "/v1/completions": self._completions, "/v1/chat/completions": self._chat,
            "/v1/completions/render": self._render, "/tokenize": self._tokenize,
        }

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_bytes, middlewares=[self._refusals])
        for path, read in self._get.items():
            app.router.add_get(path, self._getter(path, read), allow_head=False)
        for path, post in self._post.items():
            app.router.add_post(path, self._poster(post))
        app.on_response_prepare.append(_say_keep_alive)
        return app

    async def start(self, host: str, port: int = 0) -> int:
        """Listen on ``host:port`` (0: the system picks); returns the bound port."""
        self._runner = web.AppRunner(
            self._app(), access_log=None, handler_cancellation=True, shutdown_timeout=STOP_SECONDS,
            keepalive_timeout=self.idle_seconds, max_line_size=MAX_HEAD_BYTES, max_field_size=MAX_HEAD_BYTES,
            max_headers=MAX_HEADERS, lingering_time=LINGER_SECONDS)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        self.port = int(self._runner.addresses[0][1])
        return self.port

    async def stop(self) -> None:
        """Stop listening and end every connection (their requests are cancelled in the engine)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- requests -------------------------------------------------------------------------------------------------

    @web.middleware
    async def _refusals(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        """Every refusal as the JSON error of the module docstring: the face's own, aiohttp's 404 and 405, and the
        connections over ``max_connections``."""
        try:
            server = self._runner.server if self._runner is not None else None
            if server is not None and len(server.connections) > self.max_connections:
                raise HttpReject(503, "connection", f"{self.max_connections} connections already open", close=True)
            return await handler(request)
        except HttpReject as exc:
            return _error(request, exc)
        except web.HTTPNotFound:
            routes = ", ".join([*self._get, *self._post])
            return _error(request, HttpReject(404, "path", f"no route {request.path}; routes: {routes}"))
        except web.HTTPMethodNotAllowed as exc:
            allowed = ", ".join(sorted(exc.allowed_methods))
            return _error(request, HttpReject(405, "method", f"{request.method} {request.path}: only {allowed}",
                                              headers=(("Allow", allowed),)))

    def _getter(self, path: str, read: Callable[[], object]) -> _Handler:
        async def handle(_: web.Request) -> web.StreamResponse:
            if path.startswith("/health") and not self._loaded():
                raise HttpReject(503, "model", f"model {self.model} is loading")
            return _send_json(read())

        return handle

    def _poster(self, post: Callable[[web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]) -> _Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            if "Transfer-Encoding" in request.headers:
                raise HttpReject(411, "Transfer-Encoding", "request bodies must be sent with a Content-Length",
                                 close=True)
            size = request.content_length or 0
            if size > self.max_body_bytes:
                raise HttpReject(413, "Content-Length", f"body of {size} bytes over the limit of "
                                                        f"{self.max_body_bytes}", close=True)
            try:
                async with asyncio.timeout(BODY_TIMEOUT_SECONDS):
                    raw = await request.read()
            except TimeoutError:
                raise HttpReject(408, "body", f"not received within {BODY_TIMEOUT_SECONDS:g} s",
                                 close=True) from None
            try:
                return await post(request, _json_body(raw))
            except FerryError as exc:
                raise _rejection(exc) from None

        return handle

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

    async def _render(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        model = _typed(body, "model", str, self.model)
        if model != self.model:
            raise NotFound("model", model)
        count, ids = _RENDERED.get(_prompt(body.get("prompt"), "prompt"))
        max_tokens = _typed(body, "max_tokens", int, max(self.runner.engine.params.max_context_tokens - count, 1))
        rendered = json.dumps({"request_id": f"cmpl-{uuid.uuid4().hex}", "model": self.model,
                               "sampling_params": {"max_tokens": max_tokens}}, separators=(",", ":"))
        payload = f'[{rendered[:-1]},"token_ids":{ids}}}]'
        return _json_response(200, payload.encode("utf-8"))

    async def _tokenize(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        field = "prompt" if body.get("prompt") is not None or body.get("text") is None else "text"
        count, ids = _RENDERED.get(_prompt(body.get(field), field))
        payload = f'{{"count":{count},"max_model_len":{self.runner.engine.params.max_context_tokens},"tokens":{ids}}}'
        return _json_response(200, payload.encode("utf-8"))

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
                ticket, prompt_tokens = self.runner.submit_prompt(
                    prompt, budget.max_tokens, stops=budget.stops, ignore_eos=budget.ignore_eos,
                    prompt_field=prompt_field, script=script.tokens if script is not None else None)
                tickets.append(ticket)
        except BaseException as exc:
            for ticket in tickets:
                self.runner.cancel(ticket)
            if isinstance(exc, InvalidArgument) and exc.field == "max_tokens":
                raise InvalidArgument(budget.field, exc.reason) from None
            raise
        return tickets, prompt_tokens

    async def _follow(self, tickets: Sequence[Ticket],
                      on_delta: Callable[[int, int, Finished | None], Awaitable[None]] | None = None
                      ) -> list[Finished]:
        """Wait for ``tickets`` to finish, one after the other, calling ``on_delta(choice, tokens, finished)`` per
        delta (a later ticket's tokens wait in it, and come in one delta); cancels them if the client leaves (the
        handler is cancelled) or a write fails."""
        done: list[Finished] = []
        try:
            for i, ticket in enumerate(tickets):
                finished: Finished | None = None
                while finished is None:
                    count, finished = await ticket.next()
                    if on_delta is not None:
                        await on_delta(i, count, finished)
                done.append(finished)
            return done
        finally:
            for ticket in tickets:
                if ticket.finished is None:
                    self.runner.cancel(ticket)

    async def _generate(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
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
            (f,) = await self._follow([ticket])
            return _send_json({"text": ticket.answer.text(0, ticket.emitted), "meta_info": meta(f)})

        async def delta(_: int, count: int, finished: Finished | None) -> None:
            text = ticket.answer.text(0, ticket.emitted)
            await events.event(json.dumps({"text": text, "meta_info": meta(finished)}).encode())

        events = _Events(request)
        await events.start()
        await self._follow([ticket], delta)
        return await events.end()

    async def _completions(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
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
            done = await self._follow(tickets)
            return _send_json({**head, "choices": [choice(i, t.emitted, f)
                                                   for i, (t, f) in enumerate(zip(tickets, done, strict=True))],
                               "usage": _usage(prompt_tokens, tickets, done)})

        async def delta(i: int, count: int, finished: Finished | None) -> None:
            await events.event(json.dumps({**head, "choices": [choice(i, count, finished)]}).encode())

        events = _Events(request)
        await events.start()
        done = await self._follow(tickets, delta)
        if usage_too:
            usage = _usage(prompt_tokens, tickets, done)
            await events.event(json.dumps({**head, "choices": [], "usage": usage}).encode())
        return await events.end()

    async def _chat(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
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
            done = await self._follow(tickets)
            answers = [choices.message(script, t.answer, t.emitted) for t in tickets]
            return _send_json({**head, "object": "chat.completion",
                               "choices": [{"index": i, "message": message, "finish_reason": finish,
                                            "logprobs": chat_logprobs(i, 0, tickets[i].emitted)}
                                           for i, (message, finish) in enumerate(answers)],
                               "usage": _usage(prompt_tokens, tickets, done)})
        chunk_head = {**head, "object": "chat.completion.chunk"}
        tail: dict[str, Any] = {"usage": None} if usage_too else {}  # OpenAI: null in every chunk but the last
        streams = [choices.Deltas(script, t.answer) for t in tickets]

        sent = [0] * len(tickets)

        async def chunk(i: int, delta: dict[str, Any], finish: str | None, found: dict[str, Any] | None = None) -> None:
            choice = {"index": i, "delta": delta, "logprobs": found, "finish_reason": finish}
            await events.event(json.dumps({**chunk_head, "choices": [choice], **tail}).encode())

        async def on_delta(i: int, count: int, finished: Finished | None) -> None:
            delta = streams[i].feed(count) if count else None
            if delta is not None:
                await chunk(i, delta, None, chat_logprobs(i, sent[i], count))
            sent[i] += count
            if finished is not None:
                await chunk(i, {}, streams[i].finish_reason)

        events = _Events(request)
        await events.start()
        for i, deltas in enumerate(streams):
            await chunk(i, deltas.first(), None)
        done = await self._follow(tickets, on_delta)
        if usage_too:
            await events.event(json.dumps({**chunk_head, "choices": [],
                                           "usage": _usage(prompt_tokens, tickets, done)}).encode())
        return await events.end()


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


def _error(request: web.Request, exc: HttpReject) -> web.Response:
    """The JSON error of a refusal; the connection closes after it when ``exc.close``."""
    kind = "invalid_request_error" if exc.status < 500 else "server_error"
    payload = {"error": {"message": str(exc), "type": kind, "param": exc.param, "code": exc.status}}
    response = _json_response(exc.status, json.dumps(payload, separators=(",", ":")).encode("utf-8"), exc.headers)
    if exc.close:
        response.force_close()
    return response


async def _say_keep_alive(request: web.Request, response: web.StreamResponse) -> None:
    """Name keep-alive in the head (aiohttp leaves HTTP/1.1's default unsaid), as a pooled client reads it."""
    if request.keep_alive and response.keep_alive is not False and request.version >= (1, 1):
        response.headers.setdefault("Connection", "keep-alive")
