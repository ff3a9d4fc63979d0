"""Forwarding to a replica over KServe v2 gRPC with tritonclient's stubs (``GRPCInferenceServiceStub``).

Tensors follow docs/CONTRACTS.md: ``text_input`` (BYTES [1, 1]),
``max_tokens`` (INT32 [1, 1]), ``stream`` (BOOL [1, 1], streams only) in;
``text_output`` (BYTES [1, 1]) out. The proxy's request id is the KServe
request id; ``ferry_tier``, ``ferry_tenant``, ``ferry_plan`` go as request
parameters and the tier as Triton's ``priority`` (interactive 1, standard 2,
batch 3). The remaining deadline is the call's ``client_timeout`` (unary) or
``stream_timeout`` (stream). Cancelling the awaiting task cancels the call,
so a client that goes away frees the replica.

The ``ferry_*`` response parameters are read when present; a real Triton
sends none, and then the proxy falls back to its own measurements (service
time = wall time of the call, queue time 0) and whitespace token counts.

Failures raise :class:`ForwardFailed` (a :class:`ferry.errors.ReplicaFailed`
with a bounded ``kind`` for metric labels): before any output, unreachable,
UNAVAILABLE, INTERNAL, UNKNOWN, ABORTED, CANCELLED, NOT_FOUND and
RESOURCE_EXHAUSTED are retryable on another replica; INVALID_ARGUMENT and
the like are not; nothing is retryable once output started. A replica's
DEADLINE_EXCEEDED becomes :class:`ferry.errors.DeadlineExceeded`. A replica
with no KServe ``address`` (reached over OpenAI HTTP only) fails at once,
retryable, with kind ``no_kserve``: nothing is sent.

Requests are built as ``ModelInferRequest`` messages directly, field for
field what tritonclient's ``InferenceServerClient`` would send (a test holds
the two equal), and a stream is one ``write`` and a half-close on the call:
no numpy arrays, no request-iterator task. Response text is read from the
first element of ``text_output``'s raw bytes (a 4-byte little-endian length,
then the bytes) or of its typed ``bytes_contents``; another datatype goes
through tritonclient's ``InferResult`` as before.

A traced request's call carries ``traceparent`` (and ``tracestate``) as
metadata, naming the attempt's span (:mod:`dataplane.tracing`); an untraced
one carries none.

Cost per call: one request message, one gRPC call; per streamed response,
O(its size) with a handful of map lookups (no numpy, no per-response
result object).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import struct
from collections.abc import AsyncGenerator, Callable
from typing import Any

import grpc
from tritonclient.grpc import InferResult
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from dataplane.forward.clients import ClientPool
from dataplane.forward.failures import unreached
from dataplane.table.local import Replica
from ferry.errors import DeadlineExceeded, FerryError, ReplicaFailed
from ferry.sampling import Tensor
from ferry.tokens import count_tokens

RETRYABLE = frozenset(
    {"UNAVAILABLE", "INTERNAL", "UNKNOWN", "ABORTED", "CANCELLED", "NOT_FOUND", "RESOURCE_EXHAUSTED", "STREAM_ERROR"}
)
MAX_REASON_CHARS = 300
Metadata = tuple[tuple[str, str], ...]  # a call's metadata: the trace context (dataplane.tracing), when traced


class ForwardFailed(ReplicaFailed):
    """A replica failure with ``kind``: the lower-case gRPC code or ``stream_error`` / ``bad_response`` /
    ``no_kserve``."""

    def __init__(self, replica_id: str, kind: str, reason: str, *, output_started: bool, retryable: bool) -> None:
        super().__init__(replica_id, reason, output_started=output_started, retryable=retryable)
        self.kind = kind


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """What one forward sends; built once per request and reused across attempts."""

    request_id: str
    prompt: bytes
    prompt_tokens: int
    max_tokens: int
    tier: str
    priority: int
    tenant: str
    plan: str
    sampling: tuple[Tensor, ...] = ()  # the sampling parameters' input tensors (ferry.sampling)
    logprobs: int | None = None  # log probabilities asked, with this many alternatives per token (None: not asked)


@dataclasses.dataclass(slots=True)
class Outcome:
    """What a replica answered, with the proxy's fallbacks filled in."""

    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    queue_seconds: float = 0.0
    service_seconds: float = 0.0
    ttft_seconds: float = 0.0
    cached_reported: bool = False  # the replica sent ferry_cached_tokens
    completion_reported: bool = False  # the replica sent ferry_completion_tokens (else counted here, in words)
    finish_reason: str = ""  # the replica's ferry_finish_reason ("stop" or "length"), when it sent one
    logprobs: list[Logprob] = dataclasses.field(default_factory=list)  # when asked: each token's, in order


@dataclasses.dataclass(frozen=True, slots=True)
class Logprob:
    """One generated token's log probability, and the most likely tokens at its place (most likely first)."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Piece:
    """A streamed piece of text and its token count."""

    text: str
    tokens: int
    logprobs: tuple[Logprob, ...] = ()  # each token of ``text``'s, when asked


_LENGTH = struct.Struct("<I")  # the length prefix of each element of a BYTES tensor's raw contents
_INT32 = struct.Struct("<i")
_TRUE = b"\x01"


def request_message(call: Call, model: str, *, stream: bool) -> pb.ModelInferRequest:
    """The ``ModelInferRequest`` of ``call``: ``text_input`` BYTES [1, 1], ``max_tokens`` INT32 [1, 1] and, for
    a stream, ``stream`` BOOL [1, 1] as raw contents, then the sampling inputs the proxy encoded for the model
    (:mod:`ferry.sampling`); the request id; ``priority`` (when not 0) and the
    ``ferry_*`` parameters. Field for field what tritonclient's client builds from the same inputs."""
    request = pb.ModelInferRequest(model_name=model, id=call.request_id)
    request.inputs.add(name="text_input", datatype="BYTES", shape=(1, 1))
    request.inputs.add(name="max_tokens", datatype="INT32", shape=(1, 1))
    raw = [_LENGTH.pack(len(call.prompt)) + call.prompt, _INT32.pack(call.max_tokens)]
    if stream:
        request.inputs.add(name="stream", datatype="BOOL", shape=(1, 1))
        raw.append(_TRUE)
    for name, datatype, shape, contents in call.sampling:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        raw.append(contents)
    request.raw_input_contents.extend(raw)
    params = request.parameters
    if call.priority:
        params["priority"].uint64_param = call.priority
    params["ferry_tier"].string_param = call.tier
    params["ferry_tenant"].string_param = call.tenant
    params["ferry_plan"].string_param = call.plan
    return request


def _param(params: Any, name: str) -> Any:
    if name not in params:
        return None
    value = params[name]
    which = value.WhichOneof("parameter_choice")
    return getattr(value, which) if which else None


def _text(response: pb.ModelInferResponse, replica_id: str, started: bool, *, required: bool) -> str:
    """The first element of ``text_output`` as text. Absent: "" unless ``required``; empty: ForwardFailed."""
    for index, output in enumerate(response.outputs):
        if output.name != "text_output":
            continue
        if output.datatype != "BYTES":
            return _text_slow(response, replica_id, started)
        raw = response.raw_output_contents
        if index < len(raw):
            data: bytes = raw[index]
            if len(data) >= 4:
                (size,) = _LENGTH.unpack_from(data)
                return data[4:4 + size].decode(errors="replace")
        elif output.contents.bytes_contents:  # typed contents rather than raw
            first: bytes = output.contents.bytes_contents[0]
            return first.decode(errors="replace")
        required = True  # present but without an element: a bad response
        break
    if not required:
        return ""
    raise ForwardFailed(replica_id, "bad_response", "response has no text_output", output_started=started,
                        retryable=not started)


LOGPROB_OUTPUTS = ("output_log_probs", "output_tokens", "top_logprobs")  # docs/CONTRACTS.md, Log probabilities
MAX_TOP = 20  # alternatives kept per token


def _elements(raw: bytes) -> list[bytes]:
    """The elements of a BYTES tensor's raw contents (each length-prefixed)."""
    out: list[bytes] = []
    at = 0
    while at + 4 <= len(raw):
        (size,) = _LENGTH.unpack_from(raw, at)
        out.append(raw[at + 4:at + 4 + size])
        at += 4 + size
    return out


def _logprobs(response: pb.ModelInferResponse, keep: int = MAX_TOP) -> tuple[Logprob, ...]:
    """The log probabilities a response carries (none when it has no ``output_log_probs``): ``output_log_probs``
    FP32 one per token, ``output_tokens`` BYTES their texts, ``top_logprobs`` BYTES a JSON object per token
    (token -> log probability, most likely first; the first ``keep`` kept). A malformed part is left out, never
    an error: the text is what the client asked for first."""
    found: dict[str, bytes] = {}
    for index, output in enumerate(response.outputs):
        if output.name in LOGPROB_OUTPUTS and index < len(response.raw_output_contents):
            found[output.name] = response.raw_output_contents[index]
    raw = found.get("output_log_probs")
    if raw is None:
        return ()
    values = [v for (v,) in struct.iter_unpack("<f", raw[:len(raw) - len(raw) % 4])]
    tokens = [t.decode(errors="replace") for t in _elements(found.get("output_tokens", b""))]
    tops: list[tuple[tuple[str, float], ...]] = []
    for item in _elements(found.get("top_logprobs", b"")):
        try:
            data = json.loads(item)
        except ValueError:
            data = {}
        tops.append(tuple((str(k), float(v)) for k, v in list(data.items())[:min(keep, MAX_TOP)]
                          if isinstance(v, int | float)) if isinstance(data, dict) else ())
    return tuple(Logprob(tokens[i] if i < len(tokens) else "", value, tops[i] if i < len(tops) else ())
                 for i, value in enumerate(values))


def _text_slow(response: pb.ModelInferResponse, replica_id: str, started: bool) -> str:
    """``text_output`` of another datatype than BYTES, through tritonclient's InferResult."""
    array = InferResult(response).as_numpy("text_output")
    if array is None or array.size == 0:
        raise ForwardFailed(replica_id, "bad_response", "response has no text_output", output_started=started,
                            retryable=not started)
    item = array.reshape(-1)[0]
    return item.decode(errors="replace") if isinstance(item, bytes) else str(item)


def failure(replica_id: str, exc: BaseException, *, output_started: bool) -> FerryError:
    """The Ferry error for an exception of a replica call."""
    if isinstance(exc, grpc.aio.AioRpcError):
        code, message = exc.code().name, exc.details() or ""
    elif isinstance(exc, InferenceServerException):
        status = exc.status()
        code = status.rpartition(".")[2] if status else "STREAM_ERROR"
        message = exc.message() or ""
    else:
        code, message = "UNKNOWN", type(exc).__name__
    if code == "DEADLINE_EXCEEDED":
        return DeadlineExceeded(f"deadline exceeded waiting for replica {replica_id}")
    retryable = code in RETRYABLE and not output_started
    reason = f"{code}: {message}"[:MAX_REASON_CHARS]
    return ForwardFailed(replica_id, code.lower(), reason, output_started=output_started, retryable=retryable)


def _fill(outcome: Outcome, params: Any) -> bool:
    """Copy the ferry_* parameters into ``outcome``; returns whether service time was reported."""
    prompt = _param(params, "ferry_prompt_tokens")
    if prompt is not None:
        outcome.prompt_tokens = int(prompt)
    cached = _param(params, "ferry_cached_tokens")
    if cached is not None:
        outcome.cached_tokens = int(cached)
        outcome.cached_reported = True
    queue = _param(params, "ferry_queue_seconds")
    if queue is not None:
        outcome.queue_seconds = float(queue)
    service = _param(params, "ferry_service_seconds")
    if service is not None:
        outcome.service_seconds = float(service)
    finish = _param(params, "ferry_finish_reason")
    if finish in ("stop", "length"):
        outcome.finish_reason = finish
    return service is not None


_MAX_DECOUPLED = 4096
JOIN_PIECES = 64  # a stream's pieces kept apart before their texts are joined into one string


def _speaks_kserve(replica: Replica) -> None:
    """Raise a retryable ForwardFailed (kind ``no_kserve``) for a replica reached over OpenAI HTTP only."""
    if not replica.address:
        raise ForwardFailed(replica.replica_id, "no_kserve", f"replica {replica.replica_id} serves OpenAI HTTP only "
                            f"({replica.http_address or 'no address'})", output_started=False, retryable=True)


def _decoupled_refusal(exc: InferenceServerException | grpc.aio.AioRpcError) -> bool:
    """True when a replica refused a unary call because the model is decoupled (stream-only)."""
    if isinstance(exc, grpc.aio.AioRpcError):
        status, message = exc.code().name, exc.details() or ""
    else:
        status, message = str(exc.status() or ""), str(exc.message() or "")
    return "UNIMPLEMENTED" in status and "decoupled" in message


class Forwarder:
    """Sends calls to replicas through a :class:`ClientPool`; clock injected for the fallbacks."""

    def __init__(self, pool: ClientPool, *, clock: Callable[[], float]) -> None:
        self._pool = pool
        self._clock = clock
        # (address, model) of decoupled models: Triton answers them only over ModelStreamInfer, so a
        # unary call to them is served as a stream whose pieces are collected. Bounded; cleared when full.
        self._decoupled: set[tuple[str, str]] = set()

    def _failed(self, replica: Replica, exc: BaseException, *, output_started: bool) -> FerryError:
        """The error of a failed call; a refused connection also discards the address's client, so that the
        next call connects afresh (:meth:`ClientPool.discard`)."""
        error = failure(replica.replica_id, exc, output_started=output_started)
        if unreached(error):
            self._pool.discard(replica.address)
        return error

    async def infer(self, replica: Replica, call: Call, remaining: float, *,
                    metadata: Metadata | None = None) -> Outcome:
        """One unary ``ModelInfer`` (a collected stream for a decoupled model); raises ForwardFailed or
        DeadlineExceeded. ``metadata``: the call's (the trace context, :mod:`dataplane.tracing`)."""
        if remaining <= 0:
            raise DeadlineExceeded("deadline exceeded before forwarding")
        _speaks_kserve(replica)
        if (replica.address, replica.kserve_model) in self._decoupled:
            return await self._collect(replica, call, remaining, metadata)
        start = self._clock()
        request = request_message(call, replica.kserve_model, stream=False)
        async with self._pool.use(replica.address) as client:
            try:
                result: pb.ModelInferResponse | None = await client.stub.ModelInfer(request, timeout=remaining,
                                                                                    metadata=metadata)
            except (InferenceServerException, grpc.aio.AioRpcError) as exc:
                if not _decoupled_refusal(exc):
                    raise self._failed(replica, exc, output_started=False) from None
                result = None
        if result is None:
            if len(self._decoupled) >= _MAX_DECOUPLED:
                self._decoupled.clear()
            self._decoupled.add((replica.address, replica.kserve_model))
            return await self._collect(replica, call, remaining - (self._clock() - start), metadata)
        elapsed = self._clock() - start
        text = _text(result, replica.replica_id, started=False, required=True)
        params = result.parameters
        outcome = Outcome(text=text, prompt_tokens=call.prompt_tokens, ttft_seconds=elapsed)
        if not _fill(outcome, params):
            outcome.service_seconds = elapsed
        completion = _param(params, "ferry_completion_tokens")
        outcome.completion_tokens = int(completion) if completion is not None else count_tokens(text)
        outcome.completion_reported = completion is not None
        outcome.logprobs = list(_logprobs(result, call.logprobs)) if call.logprobs is not None else []
        return outcome

    async def _collect(self, replica: Replica, call: Call, remaining: float, metadata: Metadata | None) -> Outcome:
        """A unary call served over the stream (decoupled models): the pieces joined into one outcome."""
        outcome = Outcome()
        async for _piece in self.stream(replica, call, remaining, outcome, metadata=metadata):
            pass
        return outcome

    async def stream(
        self, replica: Replica, call: Call, remaining: float, outcome: Outcome, *,
        bind: Callable[[Callable[[], object] | None], None] | None = None, metadata: Metadata | None = None,
    ) -> AsyncGenerator[Piece, None]:
        """A decoupled ``ModelStreamInfer``: yields pieces as they come, fills ``outcome`` at the end.

        ``bind``, when given, receives the call's canceller once it starts and
        None once it ended (a preemption cancels the call through it: the
        next read raises ``asyncio.CancelledError``); ``metadata``, the call's
        (the trace context). Raises ForwardFailed
        (``output_started`` once a piece was yielded) or DeadlineExceeded.
        """
        if remaining <= 0:
            raise DeadlineExceeded("deadline exceeded before forwarding")
        _speaks_kserve(replica)
        start = self._clock()
        outcome.prompt_tokens = call.prompt_tokens
        # One request, then half-close: Triton ends the stream after the request's last
        # response, which also covers backends that send no final flag with data.
        request = request_message(call, replica.kserve_model, stream=True)
        started = reported_service = False
        texts: list[str] = []
        reported_tokens = 0
        async with self._pool.use(replica.address) as client:
            responses = client.stub.ModelStreamInfer(timeout=remaining, metadata=metadata)
            if bind is not None:
                bind(responses.cancel)
            try:
                try:
                    await responses.write(request)
                    await responses.done_writing()
                except asyncio.InvalidStateError:
                    pass  # the call already ended: its status is read below
                while True:
                    message = await responses.read()
                    if message is grpc.aio.EOF:
                        break
                    if message.error_message:
                        error = InferenceServerException(msg=message.error_message)
                        raise failure(replica.replica_id, error, output_started=started)
                    response = message.infer_response
                    params = response.parameters
                    reported_service = _fill(outcome, params) or reported_service
                    text = _text(response, replica.replica_id, started, required=False)
                    count = _param(params, "ferry_completion_tokens")
                    tokens = int(count) if count is not None else count_tokens(text)
                    reported_tokens += tokens if count is not None else 0
                    if text or tokens:
                        if not started:
                            outcome.ttft_seconds = self._clock() - start
                            started = True
                        texts.append(text)
                        if len(texts) >= JOIN_PIECES:  # the text as one string, not thousands of small ones
                            texts[:] = ["".join(texts)]
                        logprobs = _logprobs(response, call.logprobs) if call.logprobs is not None else ()
                        outcome.logprobs.extend(logprobs)
                        yield Piece(text, tokens, logprobs)
                    if _param(params, "triton_final_response"):
                        break
            except (InferenceServerException, grpc.aio.AioRpcError) as exc:
                raise self._failed(replica, exc, output_started=started) from None
            finally:
                if bind is not None:
                    bind(None)
                responses.cancel()  # no-op once the stream ended; frees the replica otherwise
        outcome.text = "".join(texts)
        outcome.completion_tokens = reported_tokens or count_tokens(outcome.text)
        outcome.completion_reported = bool(reported_tokens)
        if not reported_service:
            outcome.service_seconds = self._clock() - start

