"""The endpoint-picker protocol (v1 of the Gateway API Inference Extension's) over Envoy's ext_proc messages.

Pure translation, no I/O: what a forwarder (Envoy) tells the picker in a
``ProcessingRequest``, and the ``ProcessingResponse`` the picker answers.

Request side (forwarder -> picker):

- header values arrive in ``raw_value`` (bytes) with ``value`` empty; both are read
  (:func:`headers_of`), names in lower case;
- the subset hint: ``metadata_context.filter_metadata["envoy.lb.subset_hint"]
  ["x-gateway-destination-endpoint-subset"]``, a list of ``ip:port`` the
  picker must choose from (:func:`subset_hint`; absent: no restriction);
- the endpoint that served, reported with the response:
  ``metadata_context.filter_metadata["envoy.lb"]["x-gateway-destination-endpoint-served"]``
  (:func:`served_endpoint`).

Answer side (picker -> forwarder), :func:`destination`: the chosen endpoint
and its fallbacks as one ``ip:port,ip:port,…`` string, set alike in the
``x-gateway-destination-endpoint`` header and in dynamic metadata
``envoy.lb`` / ``x-gateway-destination-endpoint`` (the protocol requires the
two to agree), with ``clear_route_cache`` so a mutation sent after the body
still routes. A request that must not be forwarded gets an
:func:`immediate` response: 429 (shed) with ``Retry-After``, 503 (nothing
ready), or the status of a bad request, each with an OpenAI-shaped JSON body.
Every other message is let through unchanged (:func:`proceed`).

Header values set here go in ``raw_value`` as well: a mutation set through
``value`` alone gives no usable header.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.type.v3 import http_status_pb2

DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
SUBSET = "x-gateway-destination-endpoint-subset"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
ANSWER_NAMESPACE = "ferry.answer"  # dynamic metadata: headers the forwarder adds to a forwarded answer
# the answer headers a forwarder's route copies from ANSWER_NAMESPACE (the tenant's rate limits)
ANSWER_HEADERS = tuple(f"x-ratelimit-{what}-{unit}" for unit in ("requests", "tokens")
                       for what in ("limit", "remaining", "reset"))
MAX_SUBSET = 4096  # endpoints read from a subset hint; more are ignored (bounded, rule 4)
JSON = "application/json"


def headers_of(message: ext.HttpHeaders) -> dict[str, str]:
    """The headers of an ext_proc headers message, names in lower case, values from ``raw_value`` (or ``value``).

    A repeated name keeps its first value (the API key, the tier and the timeout are single-valued)."""
    out: dict[str, str] = {}
    for header in message.headers.headers:
        value = header.raw_value.decode("utf-8", errors="replace") if header.raw_value else header.value
        out.setdefault(header.key.lower(), value)
    return out


def _namespace(request: ext.ProcessingRequest, namespace: str) -> Any:
    """The ``google.protobuf.Struct`` of ``namespace`` in the request's metadata context, or None."""
    if not request.HasField("metadata_context"):
        return None
    entries = request.metadata_context.filter_metadata
    return entries.get(namespace)


def subset_hint(request: ext.ProcessingRequest) -> frozenset[str] | None:
    """The endpoints the forwarder allows (``ip:port``), or None when it sets no hint (any endpoint of the pool).

    An empty set is a hint too: nothing is eligible, and the protocol asks for a 503."""
    space = _namespace(request, SUBSET_NAMESPACE)
    if space is None or SUBSET not in space.fields:
        return None
    value = space.fields[SUBSET]
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        items = [v.string_value for v in value.list_value.values[:MAX_SUBSET]]
    elif kind == "string_value":  # tolerated: one comma-separated string
        items = value.string_value.split(",")[:MAX_SUBSET]
    else:
        items = []
    return frozenset(item.strip() for item in items if item.strip())


def served_endpoint(request: ext.ProcessingRequest) -> str:
    """The ``ip:port`` the forwarder says served the request ("" when it does not say)."""
    space = _namespace(request, LB_NAMESPACE)
    if space is None or SERVED not in space.fields:
        return ""
    return str(space.fields[SERVED].string_value)


def _header(name: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=name, raw_value=value.encode()),
                                      append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)


def destination(endpoints: Sequence[str], *, after_body: bool, headers: Mapping[str, str] | None = None,
                answer_headers: Mapping[str, str] | None = None) -> ext.ProcessingResponse:
    """Route to ``endpoints`` (the chosen one first, then the fallbacks): header and metadata alike.

    ``after_body``: the answer to the request body (else to the request headers, for a request without a
    body); ``headers``: more request headers to set (the request id); ``answer_headers``: headers for the
    forwarder to add to the replica's answer, passed as dynamic metadata in :data:`ANSWER_NAMESPACE` (the
    picker has left the stream by then; the forwarder's route adds each name it knows from there)."""
    joined = ",".join(endpoints)
    common = ext.CommonResponse(clear_route_cache=True)
    common.header_mutation.set_headers.append(_header(DESTINATION, joined))
    for name, value in (headers or {}).items():
        common.header_mutation.set_headers.append(_header(name, value))
    response = ext.ProcessingResponse()
    if after_body:
        response.request_body.response.CopyFrom(common)
    else:
        response.request_headers.response.CopyFrom(common)
    response.dynamic_metadata.update({LB_NAMESPACE: {DESTINATION: joined},
                                      **({ANSWER_NAMESPACE: dict(answer_headers)} if answer_headers else {})})
    return response


def immediate(status: int, body: Mapping[str, Any], *, retry_after: float | None = None,
              request_id: str = "", grpc_code: int | None = None,
              headers: Mapping[str, str] | None = None) -> ext.ProcessingResponse:
    """Answer the client at once with ``status`` and a JSON ``body``; ``Retry-After`` in whole seconds (>= 1);
    ``headers``: more answer headers (the tenant's rate limits).

    ``grpc_code``: the caller speaks gRPC (a KServe v2 client): the answer is a gRPC status with that code and
    the error's message as its details (HTTP 200, as gRPC has it), not a JSON body."""
    if grpc_code is not None:
        message = body.get("error", {}).get("message", "") if isinstance(body.get("error"), Mapping) else ""
        answer = ext.ImmediateResponse(status=http_status_pb2.HttpStatus(code=200),
                                       grpc_status=ext.GrpcStatus(status=grpc_code), details=str(message))
        answer.headers.set_headers.append(_header("content-type", "application/grpc"))
    else:
        answer = ext.ImmediateResponse(status=http_status_pb2.HttpStatus(code=status),
                                       body=json.dumps(body, separators=(",", ":")).encode())
        answer.headers.set_headers.append(_header("content-type", JSON))
    if retry_after is not None:
        answer.headers.set_headers.append(_header("retry-after", str(max(1, math.ceil(retry_after)))))
    if request_id:
        answer.headers.set_headers.append(_header("x-request-id", request_id))
    for name, value in (headers or {}).items():
        answer.headers.set_headers.append(_header(name, value))
    return ext.ProcessingResponse(immediate_response=answer)


def proceed(phase: str) -> ext.ProcessingResponse:
    """Let the message of ``phase`` (``request_headers``, ``response_headers``, ``request_body``, …) through."""
    response = ext.ProcessingResponse()
    getattr(response, phase).SetInParent()
    return response


def streamed_body(chunk: bytes, *, end: bool) -> ext.ProcessingResponse:
    """Hand a request body chunk back unchanged (full-duplex streamed mode: the processor returns every chunk)."""
    response = ext.ProcessingResponse()
    response.request_body.response.body_mutation.streamed_response.body = chunk
    response.request_body.response.body_mutation.streamed_response.end_of_stream = end
    return response


def wait_for(seconds: float) -> ext.ProcessingResponse:
    """Extend the forwarder's timeout for the message being processed to ``seconds`` (a request about to wait in
    a tier queue); the forwarder caps it at its ``max_message_timeout``."""
    response = ext.ProcessingResponse()
    response.override_message_timeout.FromNanoseconds(int(max(0.0, seconds) * 1e9))
    return response
