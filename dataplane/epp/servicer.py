"""The endpoint picker's ext_proc servicer: Envoy asks, per request, where to send it; the bytes never come here.

One ``ExternalProcessor.Process`` stream per HTTP request, which Envoy opens
when the request arrives and ends once it has the decision. The servicer
translates (rule 2); the request path is the proxy's own
(:class:`dataplane.router.Router`): the same authentication, validation,
tenant limits, tier queues (a queued request waits here, within its
deadline), decision and records as the Python relay's: ``Router.hand_off``,
``served`` and ``handed_back`` drive the same attempt loop
(:class:`dataplane.attempt.AttemptLoop`) as the relay and the simulator.

Per request:

0. ``GET /v1/models`` (the table's models, for an authenticated caller) and
   ``GET /health`` (the picker's readiness) are answered here at once.
1. ``request_headers``: the method, path, API key, tier, timeout and request
   id; the subset hint (:func:`dataplane.epp.protocol.subset_hint`). With a
   body to come, let through (BUFFERED) or held (FULL_DUPLEX_STREAMED, where
   the headers' answer must carry the route and so waits for the body).
2. ``request_body`` (the whole body, or chunks up to ``end_of_stream``,
   bounded by ``picker_max_body_bytes``): read (:mod:`dataplane.epp.bodies`),
   :meth:`Router.begin`, then :meth:`Router.hand_off`; the answer names the
   chosen replica and its fallbacks (:func:`dataplane.epp.protocol.destination`),
   on the wire's address of each (``http_address`` for OpenAI HTTP,
   ``address`` for KServe v2 gRPC), and sets ``x-request-id`` and the
   remaining deadline (``x-envoy-upstream-rq-timeout-ms``: Envoy cuts the
   request there) and, when the request is traced (:mod:`dataplane.tracing`:
   the caller's ``traceparent`` read from the headers), ``traceparent``
   naming the picker's ``forward`` span; replicas without an address for the wire, or outside the
   subset hint, are excluded from the decision. Refusals are immediate
   responses in OpenAI's error shape: 429 with ``Retry-After`` when shed,
   503 when nothing is ready, the front door's status for a bad request.
3. The end: Envoy's report of it (:mod:`dataplane.epp.ends`; the replica's
   end, or the client's) names who served (:meth:`Router.served` moves the
   attempt when a fallback did), then :meth:`Router.handed_back` (in-flight
   load, outlier feed), :meth:`Router.end` (slots) and the request counted.
   A stream answered with a 2xx counts its ``max_tokens`` as its completion
   tokens (the engine's own count is not seen on this path), and no prefill
   sample is taken (an event stream's headers come before its first token).
   With ``picker_end = "stream"`` (a forwarder that sends no reports and
   keeps the processor stream open to the response) the stream's end ends
   the request instead, and ``response_headers``, when sent, give the status
   and the endpoint that served (:func:`dataplane.epp.protocol.served_endpoint`).

Envoy's ``message_timeout`` (1 s in the rendered bootstrap) would cut a
request waiting in a tier queue: a decision not made within
``EXTEND_AFTER`` (50 ms) sends ``override_message_timeout`` first, for the
request's remaining deadline or ``picker_max_wait_seconds`` (29 s, under
the forwarder's ``max_message_timeout``), whichever is shorter; a request
still queued then is refused with a 429. Only requests that really wait
cost the extra message.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from prometheus_client import CollectorRegistry

from dataplane.api import openai, schema
from dataplane.api.chat import ChatTemplates
from dataplane.api.service import REQUEST_ID, InferenceServicer
from dataplane.config import PickerSettings
from dataplane.epp import bodies, protocol
from dataplane.epp.ends import Ended, Ends
from dataplane.intake.auth import Authenticator
from dataplane.router import Handoff, RequestState, Router
from dataplane.tracing import TRACEPARENT, TRACESTATE
from ferry.errors import DeadlineExceeded, FerryError, NoReplica, Overloaded
from ferry.grpcutil import status_for

log = logging.getLogger("ferry.picker")

SERVICE_NAME = "envoy.service.ext_proc.v3.ExternalProcessor"
LIVENESS = "liveness"
READINESS = "readiness"
FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
UNROUTED_GRPC = {404: grpc.StatusCode.UNIMPLEMENTED, 405: grpc.StatusCode.UNIMPLEMENTED,
                 413: grpc.StatusCode.RESOURCE_EXHAUSTED}  # a request not routed, to a gRPC caller
WIRE_NAMES = {bodies.OPENAI: "OpenAI HTTP", bodies.KSERVE: "KServe v2 gRPC under its public model name"}
EXTEND_AFTER = 0.05  # seconds a decision may take before the forwarder's message timeout is extended (1 s in
# the rendered bootstrap): only requests that really wait in a queue cost the extra message


class Flow:
    """One request's state on its ext_proc stream."""

    def __init__(self, request_id: str, started: float) -> None:
        self.state = RequestState(request_id=request_id, started=started)
        self.headers: dict[str, str] = {}
        self.subset: frozenset[str] | None = None
        self.body = bytearray()
        self.duplex = False
        self.wire = ""
        self.stream = False
        self.handoff: Handoff | None = None
        self.endpoints: dict[str, str] = {}  # address -> replica id, of the handoff's order
        self.status = 0  # the answer's HTTP status, once its headers came back
        self.begun = False


class PickerServicer(ext_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """Answers Envoy's ext_proc streams; see the module docstring."""

    def __init__(self, router: Router, requests: InferenceServicer, authenticator: Authenticator,
                 templates: ChatTemplates, settings: PickerSettings, *, default_deadline: float,
                 clock: Callable[[], float], registry: CollectorRegistry, max_pending: int = 65_536,
                 serving: Callable[[], bool] = lambda: True) -> None:
        self._serving = serving  # the picker's readiness, for GET /health
        self._router = router
        self._requests = requests  # counts and logs requests as both front doors do
        self._auth = authenticator
        self._templates = templates
        self._settings = settings
        self._deadline = default_deadline
        self._clock = clock
        self.streams = 0  # ext_proc streams open
        # the requests handed off, until the forwarder reports their end (dataplane.epp.ends)
        self.ends: Ends[Flow] = Ends(self._ended, registry=registry, clock=clock, max_pending=max_pending)

    async def Process(self, requests: AsyncIterator[ext.ProcessingRequest],
                      context: Any) -> AsyncIterator[ext.ProcessingResponse]:
        flow = Flow(uuid.uuid4().hex, self._clock())
        self.streams += 1
        try:
            async for message in requests:
                async for response in self._answer(flow, message):
                    yield response
                    if response.HasField("immediate_response"):
                        return  # answered for the forwarder: nothing more comes on this stream
                if flow.handoff is not None and self._settings.picker_end == "report":
                    return  # decided: the stream ends here, so a picker that dies now cuts no request
        finally:
            self.streams -= 1
            if flow.handoff is None and flow.begun:  # refused, or the stream ended before a decision
                self._router.end(flow.state)
            elif (flow.handoff is not None and self._settings.picker_end == "stream"
                  and self.ends.pending.pop(flow.state.request_id, None) is not None):
                self._ended(flow, Ended(flow.status, "", "stream"))

    def _answer(self, flow: Flow, message: ext.ProcessingRequest) -> AsyncIterator[ext.ProcessingResponse]:
        kind = message.WhichOneof("request")
        if kind == "request_headers":
            return self._on_headers(flow, message)
        if kind == "request_body":
            return self._on_body(flow, message.request_body)
        if kind == "response_headers":
            return _one(self._on_response(flow, message))
        # trailers or a response body, when a forwarder is configured to send them
        return _one(protocol.proceed(kind)) if kind else _none()

    async def _on_headers(self, flow: Flow, message: ext.ProcessingRequest) -> AsyncIterator[ext.ProcessingResponse]:
        headers = flow.headers = protocol.headers_of(message.request_headers)
        given = headers.get("x-request-id", "")
        if REQUEST_ID.fullmatch(given):
            flow.state.request_id = given
        flow.subset = protocol.subset_hint(message)
        tracer = self._router.tracer
        if tracer is not None:  # the caller's trace context, when tracing is on (dataplane.tracing)
            flow.state.trace = tracer.begin("pick", headers.get(TRACEPARENT, ""), headers.get(TRACESTATE, ""))
        if message.HasField("protocol_config"):
            flow.duplex = message.protocol_config.request_body_mode == FULL_DUPLEX
        try:  # a route the picker does not serve is refused before its body is waited for (a gRPC stream that
            bodies.wire_of(headers.get(":method", ""), headers.get(":path", ""))  # stays open, say)
        except bodies.Unrouted as unrouted:
            yield self._refuse(flow, unrouted)
            return
        if message.request_headers.end_of_stream:  # no body: decided on the headers alone
            async for response in self._route(flow, after_body=False):
                yield response
        elif not flow.duplex:
            yield protocol.proceed("request_headers")

    async def _on_body(self, flow: Flow, body: ext.HttpBody) -> AsyncIterator[ext.ProcessingResponse]:
        if len(flow.body) + len(body.body) > self._settings.picker_max_body_bytes:
            yield self._refuse(flow, bodies.Unrouted(
                413, f"body: larger than {self._settings.picker_max_body_bytes} bytes", "body_too_large"))
            return
        flow.body += body.body
        if not body.end_of_stream:
            return
        async for response in self._route(flow, after_body=not flow.duplex):
            yield response
            if flow.duplex and flow.handoff is not None and response.HasField("request_headers"):
                yield protocol.streamed_body(bytes(flow.body), end=True)  # the body goes on, unchanged

    async def _route(self, flow: Flow, *, after_body: bool) -> AsyncIterator[ext.ProcessingResponse]:
        """Read, admit, decide: the destination answer, or an immediate refusal. A request that may wait (tier
        queue, warming version) first extends the forwarder's message timeout to its deadline."""
        state, headers = flow.state, flow.headers
        try:
            flow.wire = bodies.wire_of(headers.get(":method", ""), headers.get(":path", ""))
            if flow.wire == bodies.OPENAPI:
                yield protocol.immediate(200, schema.openapi(), request_id=state.request_id)
                return
            if flow.wire == bodies.HEALTH:
                serving = self._serving()
                yield protocol.immediate(200 if serving else 503, {"status": "SERVING" if serving else "NOT_SERVING"},
                                         request_id=state.request_id)
                return
            metadata = openai.key_metadata(headers)
            tenant = self._auth.authenticate(metadata)
            if flow.wire == bodies.MODELS:
                table = self._router.table
                answer = openai.models_answer(headers.get(":path", ""), table.models if table is not None else (),
                                              int(time.time()))
                yield protocol.immediate(200, answer, request_id=state.request_id)
                return
            body = bytes(flow.body)
            routed = (bodies.openai_request(headers.get(":path", ""), body, headers, tenant, self._templates)
                      if flow.wire == bodies.OPENAI else bodies.kserve_request(body, headers))
            flow.stream = flow.state.streamed = routed.stream
            self._requests.ignored(routed.ignored)
            await self._router.encode(state, metadata, routed.request)  # a large prompt's tokens, off the loop
            flow.begun = True
            state.untouched = True  # the replica reads the body itself, sampling parameters included
            self._router.begin(state, metadata, routed.request, openai.timeout_of(headers, self._deadline))
            self._exclude(flow)
            remaining = max(0.0, state.deadline - self._clock())
            wait = min(remaining, self._settings.picker_max_wait_seconds)  # what the forwarder lets it wait
            deciding = asyncio.ensure_future(self._router.hand_off(state, fallbacks=self._settings.picker_fallbacks))
            try:
                await asyncio.wait((deciding,), timeout=min(EXTEND_AFTER, wait))
                if not deciding.done():  # it waits (tier queue, warming version): the forwarder must wait too
                    yield protocol.wait_for(wait + EXTEND_AFTER)
                async with asyncio.timeout(wait):
                    handoff = flow.handoff = await deciding
            finally:
                deciding.cancel()
        except FerryError as error:
            yield self._refuse(flow, error)
            return
        except TimeoutError:
            yield self._refuse(flow, DeadlineExceeded("deadline passed while queued in the picker") if wait >= remaining
                               else Overloaded(f"queued {wait:g} s in the picker, its longest wait "
                                               "(picker_max_wait_seconds)", retry_after=1.0))
            return
        endpoints = [self._address(flow, replica) for replica in handoff.replicas]
        flow.endpoints = {address: replica.replica_id for address, replica in zip(endpoints, handoff.replicas,
                                                                                 strict=True)}
        if not self.ends.expect(state.request_id, flow, state.deadline):  # no room to wait for its end: at once
            self._ended(flow, Ended(0, "", "overflow"))
        remaining_ms = max(1, int((state.deadline - self._clock()) * 1000))
        yield protocol.destination(endpoints, after_body=after_body, headers={
            "x-request-id": state.request_id,
            "x-envoy-upstream-rq-timeout-ms": str(remaining_ms),  # the forwarder holds the request's deadline
            # traced: the replica's parent is the attempt's span (the caller's traceparent replaced)
            **(dict(state.trace.headers()) if state.trace is not None else {})},
            answer_headers=self._router.rate_limit_headers(state))


    def _address(self, flow: Flow, replica: Any) -> str:
        return str(replica.http_address if flow.wire == bodies.OPENAI else replica.address)

    def _exclude(self, flow: Flow) -> None:
        """Replicas without an endpoint for the request's wire, or outside the subset hint, are not decided on."""
        state = flow.state
        assert state.routing is not None
        model = state.model_label
        excluded = set()
        for replica in state.routing.pool.replicas:
            address = self._address(flow, replica)
            if (not address or (flow.subset is not None and address not in flow.subset)
                    or (flow.wire == bodies.KSERVE and replica.kserve_model != model)):
                excluded.add(replica.replica_id)
        state.exclude = frozenset(excluded)
        replicas = state.routing.pool.replicas
        if replicas and len(excluded) == len(replicas):
            why = ("none of its ready replicas is in the gateway's subset hint" if flow.subset is not None
                   else f"none of its ready replicas serves {WIRE_NAMES[flow.wire]} (use the proxy's own front door)")
            raise NoReplica(model, why)
        spilled = state.spilled.replica if state.spilled is not None else None
        if spilled is not None and (not self._address(flow, spilled) or flow.subset is not None):
            state.spilled = None  # the region step chose a replica this request cannot reach: decide at home

    def _refuse(self, flow: Flow, error: FerryError) -> ext.ProcessingResponse:
        """An immediate answer: OpenAI's error shape, or a gRPC status to a gRPC caller; counted and logged as the
        front doors do (``unknown`` model and tier when refused before they were known)."""
        state = flow.state
        if isinstance(error, bodies.Unrouted):
            code, body, retry = error.status, openai.error_body(str(error), "invalid_request_error",
                                                                code=error.code), None
            grpc_code = UNROUTED_GRPC.get(error.status, grpc.StatusCode.INVALID_ARGUMENT)
        else:
            code, body, retry = openai.error_of(error)
            grpc_code = status_for(error)
        self._requests.failed(state, error, grpc_code.name)
        speaks_grpc = flow.headers.get("content-type", "").startswith("application/grpc")
        return protocol.immediate(code, body, retry_after=retry, request_id=state.request_id,
                                  grpc_code=grpc_code.value[0] if speaks_grpc else None,
                                  headers=None if speaks_grpc else self._router.rate_limit_headers(state))

    def _on_response(self, flow: Flow, message: ext.ProcessingRequest) -> ext.ProcessingResponse:
        headers = protocol.headers_of(message.response_headers)
        status = headers.get(":status", "0")
        flow.status = int(status) if status.isdigit() else 0
        handoff = flow.handoff
        if handoff is not None:
            served = protocol.served_endpoint(message)
            replica_id = flow.endpoints.get(served, "")
            if replica_id:
                self._router.served(flow.state, handoff, replica_id)
        return protocol.proceed("response_headers")

    def _ended(self, flow: Flow, ended: Ended) -> None:
        """The request is over (:class:`dataplane.epp.ends.Ended`): who served, records, slots, counts."""
        state, handoff = flow.state, flow.handoff
        assert handoff is not None
        replica_id = flow.endpoints.get(ended.served, "")
        if replica_id:
            self._router.served(state, handoff, replica_id)
        ok = 200 <= ended.status < 300
        completion = state.call.max_tokens if ok and state.call is not None else 0
        state.outcome.prompt_tokens = state.call.prompt_tokens if state.call is not None else 0
        self._router.handed_back(state, handoff, ok=ok, completion_tokens=completion, failed=ended.status >= 500)
        if ok:
            self._requests.succeed(state, streamed=flow.stream)
        else:  # no answer (the client left, or no report came) or the replica's refusal
            self._requests.count(state, "CANCELLED" if not ended.status else
                                 "UNAVAILABLE" if ended.status >= 500 else "FAILED_PRECONDITION")
        self._router.end(state)


async def _one(response: ext.ProcessingResponse) -> AsyncIterator[ext.ProcessingResponse]:
    yield response


async def _none() -> AsyncIterator[ext.ProcessingResponse]:
    return
    yield
