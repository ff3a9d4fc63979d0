"""``ferry.v1.Inference`` servicer: translates between the wire and :class:`dataplane.router.Router`.

It holds no policy. Per call it takes the caller's ``x-request-id`` metadata
(1 to 64 characters of ``A-Z a-z 0-9 . _ : -``; anything else is
INVALID_ARGUMENT naming it) or makes one, sends it at once as
``x-request-id`` initial metadata (the replica gets it as the KServe
request id), lets the router run it, builds the
``InferResponse`` (or the stream's chunks, then a final chunk with the
summary), and on failure chooses the status with
:func:`ferry.grpcutil.status_for`: UNAUTHENTICATED, INVALID_ARGUMENT (the
message names the field), PERMISSION_DENIED (names the tier), NOT_FOUND
(model or version), UNAVAILABLE (no table, no ready replica, replica failed
after retries), DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED (with ``retry-after``
in seconds in the trailing metadata; UNAVAILABLE of a version still warming up
carries one too, :mod:`dataplane.admission.coldstart`). It counts every request in the
metrics and writes one JSON log line per failed request (ids, model, tier,
status, reason; never a key or a prompt).

**Slow readers.** A stream's chunks are written one at a time
(``context.write``), and the next piece is read from the replica only once
the previous chunk was written: a client that does not read fills its HTTP/2
window, the write waits, the proxy stops reading from the replica, and the
replica's window fills in turn (the replica channels do not grow their
windows, :func:`dataplane.forward.clients.default_factory`). So an unread
stream holds at most one piece here, plus the two flow-control windows. A
chunk not written within ``stream_unread_timeout_seconds`` (``[proxy]``,
default 30 s) ends the stream RESOURCE_EXHAUSTED (:class:`StreamUnread`,
``stream: not read for …``) and cancels it upstream, which frees the
replica's slot; the request leaves the proxy's in-flight count at once, and
the call ends when the client reads (it gets what was buffered, then the
status) or its deadline passes.

The caller's ``traceparent`` and ``tracestate`` metadata start the request's
trace when tracing is on (:mod:`dataplane.tracing`); the root span is named
after the RPC and ends in :meth:`InferenceServicer.count`.

Cost per request, beyond the router: one ``x-request-id`` match, one initial
metadata send, and the metric children of its (model, tier[, status])
looked up in a dict (label sets are bounded: models the table names, the
tiers, gRPC codes), not through ``labels()``; per streamed piece, one
``InferChunk``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc

from dataplane.admission.coldstart import WarmingUp
from dataplane.forward.kserve import Logprob
from dataplane.intake.idempotency import body_digest
from dataplane.metrics import ProxyMetrics
from dataplane.router import RequestState, Router
from dataplane.tracing import TRACEPARENT, TRACESTATE, header
from ferry.errors import DeadlineExceeded, FerryError, InvalidArgument, Overloaded
from ferry.grpcutil import status_for
from ferry.logs import event
from ferry.v1 import inference_pb2, inference_pb2_grpc

log = logging.getLogger("ferry.proxy")



REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


class StreamUnread(Overloaded):
    """A stream's client read nothing for ``seconds``: its stream is cancelled upstream (RESOURCE_EXHAUSTED)."""

    def __init__(self, seconds: float, retry_after: float) -> None:
        super().__init__(f"stream: not read for {seconds:g} s (stream_unread_timeout_seconds); cancelled, "
                         "its replica freed", retry_after)
        self.seconds = seconds


def caller_request_id(metadata: Sequence[tuple[str, str | bytes]]) -> tuple[str, InvalidArgument | None]:
    """The caller's ``x-request-id`` ("" when none) and the error when it is malformed (a fresh id is used)."""
    for key, value in metadata:
        if key == "x-request-id":
            text = value if isinstance(value, str) else ""
            if REQUEST_ID.fullmatch(text):
                return text, None
            return "", InvalidArgument("x-request-id", "must be 1 to 64 characters of A-Z a-z 0-9 . _ : -")
    return "", None


def finish_reason(state: RequestState) -> str:
    """Why generation ended: the replica's ``ferry_finish_reason`` when it sent one, else ``length`` when the output
    reached ``max_tokens`` and ``stop`` (end of text or a stop string) when it did not."""
    if state.outcome.finish_reason:
        return state.outcome.finish_reason
    asked = state.request.max_tokens if state.request is not None else 0
    return "length" if asked and state.outcome.completion_tokens >= asked else "stop"


def token_logprobs(found: Sequence[Logprob]) -> list[inference_pb2.TokenLogprob]:
    """The wire's ``TokenLogprob`` of each token's log probability."""
    return [inference_pb2.TokenLogprob(token=lp.token, logprob=lp.logprob,
                                       top=[inference_pb2.TopLogprob(token=t, logprob=v) for t, v in lp.top])
            for lp in found]


class InferenceServicer(inference_pb2_grpc.InferenceServicer):
    """The public Inference API of one proxy."""

    def __init__(self, router: Router, metrics: ProxyMetrics, *, region: str, clock: Callable[[], float],
                 unread_timeout: float = 30.0, retry_after: float = 1.0, strict_fields: bool = False) -> None:
        self._strict_fields = strict_fields  # [proxy] http_strict_fields: a field OpenAI does not define is a 400
        self._unread_timeout = unread_timeout  # a stream's chunk not written in this long ends it (StreamUnread)
        self._retry_after = retry_after
        self._router = router
        self._metrics = metrics
        self._region = region
        self._clock = clock
        # Metric children by label values: ``labels()`` validates and locks on every call.
        self._requests: dict[tuple[str, str, str], Any] = {}
        self._timings: dict[tuple[str, str], tuple[Any, ...]] = {}

    async def _start(self, context: grpc.aio.ServicerContext, metadata: Sequence[tuple[str, str | bytes]],
                     rpc: str) -> tuple[RequestState, InvalidArgument | None]:
        given, refused = caller_request_id(metadata)
        state = RequestState(request_id=given or uuid.uuid4().hex, started=self._clock())
        tracer = self._router.tracer
        if tracer is not None:  # the caller's trace context, when tracing is on (dataplane.tracing)
            state.trace = tracer.begin(rpc, header(metadata, TRACEPARENT), header(metadata, TRACESTATE))
        await context.send_initial_metadata((("x-request-id", state.request_id),))
        return state, refused

    @contextlib.asynccontextmanager
    async def _guard(self, state: RequestState, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        """What both RPCs do around the router: a FerryError's status (``_fail`` aborts), a cancel
        counted, INTERNAL for a bug (and keep serving), and the in-flight slot always given back."""
        try:
            yield
        except FerryError as error:
            self._router.end(state)  # before the status, which waits behind what an unread stream holds
            await self._fail(state, error, context)
        except asyncio.CancelledError:
            self.count(state, "CANCELLED")
            raise
        except Exception as exc:  # a bug: answer INTERNAL, keep serving
            await self._crash(state, exc, context)
        finally:
            self._router.end(state)

    async def Infer(
        self, request: inference_pb2.InferRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.InferResponse:
        """One request, one answer."""
        metadata = context.invocation_metadata() or ()
        state, refused = await self._start(context, metadata, "ferry.v1.Inference/Infer")
        async with self._guard(state, context):
            if refused is not None:
                raise refused
            await self._router.encode(state, metadata, request)  # a large prompt's tokens, off the loop
            self._router.begin(state, metadata, request, context.time_remaining())
            if request.idempotency_key and state.tenant is not None:  # join, replay or run (intake.idempotency)
                response = await self._router.idempotency.run(state.tenant.name, request.idempotency_key,
                                                              body_digest(request), lambda: self._answer(state))
            else:
                response = await self._answer(state)
        state.outcome.ttft_seconds = self._clock() - state.started  # the whole answer is the first token
        self.succeed(state)
        return response

    async def _answer(self, state: RequestState) -> inference_pb2.InferResponse:
        await self._router.infer(state)
        state.outcome.ttft_seconds = self._clock() - state.started
        return self.summary(state, state.outcome.text)

    async def InferStream(self, request: inference_pb2.InferRequest, context: grpc.aio.ServicerContext) -> None:
        """One request, the text as chunks as they come, then a final chunk with the summary; each chunk written
        before the next piece is read (see Slow readers in the module docstring)."""
        metadata = context.invocation_metadata() or ()
        state, refused = await self._start(context, metadata, "ferry.v1.Inference/InferStream")
        state.streamed = True
        first: float | None = None
        async with self._guard(state, context):
            if refused is not None:
                raise refused
            await self._router.encode(state, metadata, request)  # a large prompt's tokens, off the loop
            self._router.begin(state, metadata, request, context.time_remaining())
            async with contextlib.aclosing(self._router.stream(state)) as pieces:
                async for piece in pieces:
                    if first is None:
                        first = self._clock() - state.started
                    await self._write(context, inference_pb2.InferChunk(text=piece.text, tokens=piece.tokens,
                                                                        logprobs=token_logprobs(piece.logprobs)))
            state.outcome.ttft_seconds = first if first is not None else self._clock() - state.started
            await self._write(context, inference_pb2.InferChunk(final=True, summary=self.summary(state, "")))
            self.succeed(state, streamed=first is not None)

    async def _write(self, context: grpc.aio.ServicerContext, chunk: inference_pb2.InferChunk) -> None:
        """Write one chunk; raises StreamUnread when the client has not taken it in ``stream_unread_timeout``."""
        try:
            async with asyncio.timeout(self._unread_timeout):  # no task per chunk, as wait_for would make
                await context.write(chunk)
        except TimeoutError:
            raise StreamUnread(self._unread_timeout, self._retry_after) from None

    def summary(self, state: RequestState, text: str) -> inference_pb2.InferResponse:
        """The ``InferResponse`` of a finished request (shared with the HTTP front door): a unary one (``text``
        given) with the tokens' log probabilities when asked; a stream's (``text`` "") without, each chunk
        carried its own."""
        outcome = state.outcome
        proxy_wait = max(state.forwarded_at - state.started, 0.0)
        return inference_pb2.InferResponse(
            logprobs=token_logprobs(outcome.logprobs) if text else (),
            text=text,
            prompt_tokens=outcome.prompt_tokens,
            completion_tokens=outcome.completion_tokens,
            replica_id=state.replica_id,
            region=state.region or self._region,
            queue_seconds=proxy_wait + outcome.queue_seconds,
            service_seconds=outcome.service_seconds,
            request_id=state.request_id,
            attempts=state.attempts,
            model_version=state.version,
            cached_prompt_tokens=outcome.cached_tokens,
            ttft_seconds=outcome.ttft_seconds,
            finish_reason=finish_reason(state),
        )

    def _timing(self, model: str, tier: str) -> tuple[Any, ...]:
        """The metric children of ``model`` and ``tier``: duration, ttft, tpot, prompt, generation, cached tokens."""
        found = self._timings.get((model, tier))
        if found is None:
            m = self._metrics
            found = self._timings[(model, tier)] = tuple(
                metric.labels(model, tier) for metric in (m.duration, m.ttft, m.tpot, m.prompt_tokens,
                                                          m.generation_tokens, m.cached_tokens))
        return found

    def count(self, state: RequestState, status: str) -> float:
        """Count one finished request under its gRPC status name (both fronts and the picker); returns its
        duration. Its trace, if any, ends here (:meth:`dataplane.router.Router.finish_trace`)."""
        elapsed = self._clock() - state.started
        key = (state.model_label, state.tier_label, status)
        counter = self._requests.get(key)
        if counter is None:
            counter = self._requests[key] = self._metrics.requests.labels(*key)
        counter.inc()
        self._timing(state.model_label, state.tier_label)[0].observe(elapsed)
        self._router.usage.record(state.model_label, state.tier_label, status, elapsed,  # the watch's report
                                  spilled=state.spilled is not None,
                                  guard_seconds=state.guard.seconds if state.guard is not None else 0.0)
        self._router.recorder.record(state, status, elapsed)  # the traffic recorder (dataplane.record)
        if state.trace is not None:  # every request is counted once, whatever its front door: its trace ends here
            self._router.finish_trace(state, status)
        return elapsed

    def ignored(self, fields: Sequence[str]) -> None:
        """Fields of an OpenAI body that OpenAI does not define (both HTTP paths): each counted in
        ``ferry_proxy_ignored_fields_total{field}`` (the first 64 names, then ``_other``), or, with
        ``http_strict_fields``, the first refused (InvalidArgument naming it, ``unknown_parameter``)."""
        if fields and self._strict_fields:
            raise InvalidArgument(fields[0][:64], "not a field of OpenAI's API (the proxy's http_strict_fields)",
                                  "unknown_parameter")
        for field in fields:
            self._metrics.ignored_fields.labels(self._metrics.ignored_field(field[:64])).inc()

    def succeed(self, state: RequestState, *, streamed: bool = False) -> None:
        """Count a request that succeeded (both fronts): its time to first token, its tokens, and for a stream
        the time per output token after the first."""
        elapsed = self.count(state, "OK")
        outcome = state.outcome
        _, ttft, tpot, prompt, generation, cached = self._timing(state.model_label, state.tier_label)
        ttft.observe(outcome.ttft_seconds)
        self._router.usage.first_token(state.model_label, state.tier_label, outcome.ttft_seconds)  # router guard
        prompt.inc(outcome.prompt_tokens)
        generation.inc(outcome.completion_tokens)
        cached.inc(outcome.cached_tokens)
        if streamed and outcome.completion_tokens > 1 and elapsed > outcome.ttft_seconds:  # the tokens after the first
            tpot.observe((elapsed - outcome.ttft_seconds) / (outcome.completion_tokens - 1))

    async def _crash(self, state: RequestState, exc: Exception, context: grpc.aio.ServicerContext) -> None:
        self.count(state, "INTERNAL")
        log.exception(json.dumps({"event": "request_crashed", "request_id": state.request_id}))
        message = f"internal error ({type(exc).__name__}); request {state.request_id}"
        await context.abort(grpc.StatusCode.INTERNAL, message)

    def failed(self, state: RequestState, error: FerryError, status: str) -> None:
        """Count a failed request under ``status`` and write its one log line (both fronts)."""
        elapsed = self.count(state, status)
        tenant = state.tenant.name if state.tenant else ""
        event(log, "request_failed", logging.WARNING, request_id=state.request_id, tenant=tenant,
              model=state.model_label, tier=state.tier_label, status=status, error=type(error).__name__,
              reason=str(error), attempts=state.attempts, replica_id=state.replica_id,
              duration_seconds=round(elapsed, 6))

    async def _fail(self, state: RequestState, error: FerryError, context: grpc.aio.ServicerContext) -> None:
        code = status_for(error)
        if isinstance(error, DeadlineExceeded) and context.cancelled():
            code = grpc.StatusCode.CANCELLED
        self.failed(state, error, code.name)
        trailing: tuple[tuple[str, str], ...] = ()
        if isinstance(error, Overloaded | WarmingUp):
            trailing = (("retry-after", f"{error.retry_after:g}"),)
        await context.abort(code, str(error), trailing_metadata=trailing)
