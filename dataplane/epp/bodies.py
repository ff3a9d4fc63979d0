"""What the picker reads of a buffered request to route it: the wire, then an ``InferRequest``.

Pure functions, no I/O. The forwarder carries the body on untouched; the
picker reads it only to know the model, the prompt (for its prefix keys and
token count), ``max_tokens``, the tier and the idempotency key, and builds
the very ``ferry.v1.InferRequest`` the proxy's own front doors build, so the
same validation and admission apply (:meth:`dataplane.router.Router.begin`).

Two wires (:func:`wire_of`):

- ``openai``: ``POST /v1/completions`` and ``/v1/chat/completions`` with a
  JSON body (:mod:`dataplane.api.openai`: the same parser, fields and errors
  as the proxy's HTTP front door; a chat rendered by the model's template
  for its token count and prefix keys); the replica's ``http_address``.
- ``kserve``: gRPC ``inference.GRPCInferenceService/ModelInfer`` with one
  length-prefixed ``ModelInferRequest`` (a ``tritonclient`` caller pointed
  at Ferry unchanged): the model name, the ``text_input`` BYTES tensor
  (Triton's raw layout: a 4-byte little-endian length, then the bytes) and
  ``max_tokens`` INT32, the tier from the ``ferry_tier`` parameter or the
  ``x-ferry-tier`` header; the replica's KServe ``address``.

``GET /v1/models`` and ``GET /health`` are answered by the picker itself
(the table's models; its readiness). Anything else is :class:`Unrouted`
with the HTTP status to answer.
Cost: O(body) to parse once.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Mapping

from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from dataplane.api import openai, schema, tools
from dataplane.api.chat import ChatTemplates
from ferry import errors
from ferry.config import TenantConfig
from ferry.v1 import common_pb2, inference_pb2

OPENAI = "openai"
KSERVE = "kserve"
MODELS = "models"  # GET /v1/models and /v1/models/{id}: answered by the picker from its table
HEALTH = "health"  # GET /health: the picker's readiness
OPENAPI = "openapi"  # GET /openapi.json: the API's document (dataplane.api.schema), no key asked
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
_FRAME = struct.Struct(">BI")  # gRPC's message prefix: compressed flag, length (big-endian)
_LENGTH = struct.Struct("<I")  # a BYTES element's length prefix in raw contents
_INT32 = struct.Struct("<i")


class Unrouted(errors.FerryError):
    """A request the picker does not route: ``status`` is the HTTP status to answer, ``code`` OpenAI's code."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


@dataclasses.dataclass(frozen=True, slots=True)
class Routed:
    """A request read: its wire, the ``InferRequest`` to admit, whether the answer streams."""

    wire: str
    request: inference_pb2.InferRequest
    stream: bool
    ignored: tuple[str, ...] = ()  # body fields OpenAI does not define (counted, or refused when strict)


def wire_of(method: str, path: str) -> str:
    """The wire of a request from its method and path (query string ignored); raises :class:`Unrouted`."""
    route = path.split("?", 1)[0]
    if method == "GET" and route == schema.OPENAPI_PATH:
        return OPENAPI
    if method == "GET" and (route == "/health" or route == openai.MODELS_PATH
                            or route.startswith(openai.MODELS_PATH + "/")):
        return HEALTH if route == "/health" else MODELS
    if route in (COMPLETIONS, CHAT):
        if method != "POST":
            raise Unrouted(405, f"{method} {route}: use POST", "method_not_allowed")
        return OPENAI
    if route == MODEL_INFER:
        return KSERVE
    raise Unrouted(404, f"{method} {route[:128]}: no such route (the picker routes {COMPLETIONS}, {CHAT} and "
                        f"{MODEL_INFER})", "not_found")


def openai_request(path: str, body: bytes, headers: Mapping[str, str], tenant: TenantConfig,
                   templates: ChatTemplates) -> Routed:
    """A completion or chat body as the HTTP front door reads it; raises InvalidArgument naming the field."""
    chat = path.split("?", 1)[0] == CHAT
    parsed = openai.parse_chat(body) if chat else openai.parse_completion(body)
    if chat:  # the replica renders its own prompt; this one routes it (tools: refused if the model takes none)
        offered = tools.offered(parsed.tools, parsed.tool_choice, model=parsed.model,
                                parser=templates.tool_parser(parsed.model))
        prompt = templates.render(parsed.model, parsed.messages, offered)
    else:  # the first prompt routes the request (the replica answers every one); token ids, as words
        first = parsed.prompts[0]
        prompt = first if isinstance(first, str) else " ".join(map(str, first))
    request = openai.to_request(parsed, prompt, tier=openai.tier_of(headers, tenant),
                                idempotency_key=headers.get("idempotency-key", ""))
    return Routed(OPENAI, request, parsed.stream, parsed.ignored)


def _element(raw: bytes, field: str) -> bytes:
    if len(raw) < _LENGTH.size:
        raise errors.InvalidArgument(field, "a BYTES tensor needs a 4-byte length prefix")
    (length,) = _LENGTH.unpack_from(raw)
    if length > len(raw) - _LENGTH.size:
        raise errors.InvalidArgument(field, f"element length {length} exceeds the {len(raw)} bytes given")
    return raw[_LENGTH.size:_LENGTH.size + length]


def kserve_request(body: bytes, headers: Mapping[str, str]) -> Routed:
    """One framed ``ModelInferRequest`` to an ``InferRequest``; raises InvalidArgument naming the field."""
    if len(body) < _FRAME.size:
        raise errors.InvalidArgument("body", "a gRPC message needs its 5-byte prefix")
    compressed, length = _FRAME.unpack_from(body)
    if compressed:
        raise errors.InvalidArgument("body", "compressed gRPC messages are not read; send it uncompressed")
    if length != len(body) - _FRAME.size:
        raise errors.InvalidArgument("body", f"one ModelInferRequest expected ({length} bytes announced, "
                                             f"{len(body) - _FRAME.size} given)")
    message = pb.ModelInferRequest()
    try:
        message.ParseFromString(body[_FRAME.size:])
    except DecodeError as exc:
        raise errors.InvalidArgument("body", f"not a ModelInferRequest: {exc}") from None
    prompt, max_tokens = b"", 0
    for index, tensor in enumerate(message.inputs):
        field = f"inputs[{index}]"
        raw = message.raw_input_contents[index] if index < len(message.raw_input_contents) else None
        if tensor.name == "text_input":
            if raw is not None:
                prompt = _element(raw, field)
            elif tensor.contents.bytes_contents:
                prompt = tensor.contents.bytes_contents[0]
        elif tensor.name == "max_tokens":
            if raw is not None and len(raw) >= _INT32.size:
                (max_tokens,) = _INT32.unpack_from(raw)
            elif tensor.contents.int_contents:
                max_tokens = tensor.contents.int_contents[0]
    if not prompt:
        raise errors.InvalidArgument("inputs.text_input", "a BYTES text_input tensor is required")
    try:
        text = prompt.decode("utf-8")
    except UnicodeDecodeError:
        raise errors.InvalidArgument("inputs.text_input", "must be UTF-8") from None
    params = message.parameters
    tier = params["ferry_tier"].string_param if "ferry_tier" in params else headers.get("x-ferry-tier", "")
    tier = tier.strip().lower()
    if tier and tier not in openai.TIERS:
        raise errors.InvalidArgument("parameters.ferry_tier", f"unknown tier {tier[:32]!r}")
    request = inference_pb2.InferRequest(model=message.model_name, version=message.model_version, prompt=text,
                                         max_tokens=max(0, max_tokens),
                                         tier=openai.TIERS.get(tier, common_pb2.TIER_UNSPECIFIED),
                                         idempotency_key=headers.get("idempotency-key", ""))
    return Routed(KSERVE, request, stream=False)
