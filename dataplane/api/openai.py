"""OpenAI-compatible request and response translation: JSON bodies to ``InferRequest``, summaries to JSON.

Pure functions, no I/O. :func:`parse_completion` and :func:`parse_chat` read
a ``/v1/completions`` or ``/v1/chat/completions`` body (already bounded in
size by the HTTP edge) and raise :class:`ferry.errors.InvalidArgument` naming
the field at fault (``messages[1].content``, ``temperature``, ``body``: not
UTF-8 or not a JSON object). :func:`to_request` turns the parsed body, the
tier and the idempotency key into the same ``ferry.v1.InferRequest`` the gRPC
API takes, so both fronts share validation and the whole request path.
:func:`completion`, :func:`chat`, :func:`completion_chunk`,
:func:`chat_chunk` build the answers from the router's ``InferResponse``
summary; :func:`error_body` and :func:`http_status` give OpenAI's error shape
and the HTTP status of a :class:`ferry.errors.FerryError`.

Fields accepted and not used (``user``, ``n`` = 1, ``logprobs`` absent,
``stream_options``) are listed in :data:`IGNORED`; any other unknown field is
a 400 naming it, so a parameter is never silently dropped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import urllib.parse
from collections.abc import Collection, Mapping
from typing import Any

from dataplane.admission.coldstart import WarmingUp
from dataplane.guard.hooks import Refused
from ferry import errors
from ferry.config import TenantConfig
from ferry.v1 import common_pb2, inference_pb2

TIERS = {"interactive": common_pb2.TIER_INTERACTIVE, "standard": common_pb2.TIER_STANDARD,
         "batch": common_pb2.TIER_BATCH}
SAMPLING = ("temperature", "top_p", "top_k", "stop", "seed", "presence_penalty", "frequency_penalty")
COMMON = frozenset({"model", "max_tokens", "stream", "stream_options", "user", "n", *SAMPLING})
IGNORED = frozenset({"user", "stream_options", "n"})
COMPLETION_FIELDS = COMMON | {"prompt", "echo", "logprobs", "suffix", "best_of"}
CHAT_FIELDS = COMMON | {"messages", "max_completion_tokens", "logprobs"}
ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
MAX_MESSAGES = 1024
MAX_STOP = 4
MAX_STOP_BYTES = 64
DEFAULT_MAX_TOKENS = 16


@dataclasses.dataclass(frozen=True, slots=True)
class Parsed:
    """A checked body: the model, its prompt (or chat messages), the sampling values given, and stream options."""

    model: str
    max_tokens: int
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: one more chunk, empty choices, with the usage
    prompt: str = ""
    messages: tuple[Mapping[str, str], ...] = ()
    sampling: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def _object(body: bytes) -> dict[str, Any]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise errors.InvalidArgument("body", f"not UTF-8 (byte {exc.start})") from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        reason = f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}" if isinstance(
            exc, json.JSONDecodeError) else "not valid JSON: nested too deeply"
        raise errors.InvalidArgument("body", reason) from None
    if not isinstance(data, dict):
        raise errors.InvalidArgument("body", "must be a JSON object")
    return data


def _number(data: Mapping[str, Any], field: str, low: float, high: float) -> float | None:
    value = data.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise errors.InvalidArgument(field, "must be a number", "invalid_type")
    if not low <= value <= high:
        raise errors.InvalidArgument(field, f"must be between {low:g} and {high:g}")
    return float(value)


def _integer(data: Mapping[str, Any], field: str, low: int, high: int) -> int | None:
    value = data.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.InvalidArgument(field, "must be an integer", "invalid_type")
    if not low <= value <= high:
        raise errors.InvalidArgument(field, f"must be between {low} and {high}")
    return value


def _sampling(data: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling fields given (absent or null ones left out), each checked against its range."""
    out: dict[str, Any] = {}
    for field, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0),
                             ("presence_penalty", -2.0, 2.0), ("frequency_penalty", -2.0, 2.0)):
        value = _number(data, field, low, high)
        if value is not None:
            out[field] = value
    if out.get("top_p") == 0.0:
        raise errors.InvalidArgument("top_p", "must be greater than 0")
    top_k = _integer(data, "top_k", 0, 1 << 20)
    if top_k is not None:
        out["top_k"] = top_k
    seed = _integer(data, "seed", -(1 << 63), (1 << 64) - 1)
    if seed is not None:
        out["seed"] = seed % (1 << 64)
    stop = data.get("stop")
    if stop is not None:
        items = [stop] if isinstance(stop, str) else stop
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            raise errors.InvalidArgument("stop", "must be a string or a list of strings", "invalid_type")
        if len(items) > MAX_STOP:
            raise errors.InvalidArgument("stop", f"at most {MAX_STOP} strings")
        for i, s in enumerate(items):
            if not s or len(s.encode()) > MAX_STOP_BYTES:
                raise errors.InvalidArgument(f"stop[{i}]", f"must be 1 to {MAX_STOP_BYTES} bytes")
        if items:
            out["stop"] = tuple(items)
    return out


def _common(data: Mapping[str, Any], known: frozenset[str], max_tokens_field: str = "max_tokens") -> dict[str, Any]:
    for field in data:
        if field not in known:
            raise errors.InvalidArgument(str(field)[:64], "unknown field", "unknown_parameter")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise errors.InvalidArgument("model", "required, a string", "invalid_value" if not model else "invalid_type")
    max_tokens = _integer(data, max_tokens_field, 1, 1 << 31)
    if max_tokens is None and max_tokens_field != "max_tokens":
        max_tokens = _integer(data, "max_tokens", 1, 1 << 31)
    stream = data.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise errors.InvalidArgument("stream", "must be a boolean", "invalid_type")
    n = data.get("n")
    if n is not None and n != 1:
        raise errors.InvalidArgument("n", "only 1 is supported")
    options = data.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise errors.InvalidArgument("stream_options", "must be an object", "invalid_type")
        flag = options.get("include_usage", False)
        if not isinstance(flag, bool):
            raise errors.InvalidArgument("stream_options.include_usage", "must be a boolean", "invalid_type")
        include_usage = flag
    user = data.get("user")
    if user is not None and not isinstance(user, str):
        raise errors.InvalidArgument("user", "must be a string", "invalid_type")
    return {"model": model, "max_tokens": max_tokens or DEFAULT_MAX_TOKENS, "stream": bool(stream),
            "include_usage": include_usage, "sampling": _sampling(data)}


def _absent(data: Mapping[str, Any], *fields: str) -> None:
    """Fields Ferry does not implement: absent, null, false (or ``best_of`` 1) only."""
    for field in fields:
        value = data.get(field)
        if value is not None and value is not False and not (field == "best_of" and value == 1):
            raise errors.InvalidArgument(field, "not supported")


def parse_completion(body: bytes) -> Parsed:
    """A ``/v1/completions`` body: ``prompt`` one string (or a list of one); raises InvalidArgument naming the field."""
    data = _object(body)
    common = _common(data, COMPLETION_FIELDS)
    _absent(data, "echo", "logprobs", "best_of")
    if data.get("suffix") is not None:
        raise errors.InvalidArgument("suffix", "not supported")
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise errors.InvalidArgument("prompt", "required, a string (or a list of one string)",
                                     "invalid_value" if prompt is None else "invalid_type")
    return Parsed(prompt=prompt, **common)


def _content(value: Any, field: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: text only
        texts: list[str] = []
        for i, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise errors.InvalidArgument(f"{field}[{i}]", "only parts of type 'text' with a string 'text'")
            texts.append(part["text"])
        return "".join(texts)
    raise errors.InvalidArgument(field, "must be a string or a list of text parts", "invalid_type")


def parse_chat(body: bytes) -> Parsed:
    """A ``/v1/chat/completions`` body: ``messages`` of role and content; raises InvalidArgument naming the field."""
    data = _object(body)
    common = _common(data, CHAT_FIELDS, "max_completion_tokens")
    _absent(data, "logprobs")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise errors.InvalidArgument("messages", "required, a non-empty list",
                                     "invalid_value" if messages in (None, []) else "invalid_type")
    if len(messages) > MAX_MESSAGES:
        raise errors.InvalidArgument("messages", f"at most {MAX_MESSAGES} messages")
    out: list[Mapping[str, str]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise errors.InvalidArgument(f"messages[{i}]", "must be an object", "invalid_type")
        role = message.get("role")
        if role not in ROLES:
            raise errors.InvalidArgument(f"messages[{i}].role", f"must be one of {', '.join(sorted(ROLES))}")
        out.append({"role": role, "content": _content(message.get("content"), f"messages[{i}].content")})
    return Parsed(messages=tuple(out), **common)


def to_request(parsed: Parsed, prompt: str, *, tier: str, idempotency_key: str) -> inference_pb2.InferRequest:
    """The ``InferRequest`` both fronts validate and route; ``tier`` "" means the tenant's default (standard)."""
    if tier and tier not in TIERS:
        raise errors.InvalidArgument("x-ferry-tier", f"unknown tier {tier[:32]!r} (use {', '.join(TIERS)})")
    request = inference_pb2.InferRequest(model=parsed.model, prompt=prompt, max_tokens=min(parsed.max_tokens, 1 << 31),
                                         tier=TIERS.get(tier, common_pb2.TIER_UNSPECIFIED),
                                         idempotency_key=idempotency_key)
    for field, value in parsed.sampling.items():
        if field == "stop":
            request.stop.extend(value)
        else:
            setattr(request, field, value)
    return request


KEY_HEADERS = ("authorization", "x-api-key")  # where an HTTP caller's API key travels


def key_metadata(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """The headers the router's authentication reads (``authorization``, ``x-api-key``), as gRPC-style metadata.

    ``headers``: lower-case names, or a case-insensitive mapping (both HTTP edges use this)."""
    return [(name, value) for name in KEY_HEADERS if (value := headers.get(name)) is not None]


def tier_of(headers: Mapping[str, str], tenant: TenantConfig) -> str:
    """The tier asked in ``x-ferry-tier``, else the tenant's default (``standard`` when allowed)."""
    asked = headers.get("x-ferry-tier", "").strip().lower()
    if asked:
        return asked
    return "standard" if "standard" in tenant.tiers or not tenant.tiers else tenant.tiers[0]


def timeout_of(headers: Mapping[str, str], default: float) -> float:
    """The request's deadline in seconds: ``x-ferry-timeout`` (above 0, at most ``default``), else ``default``."""
    raw = headers.get("x-ferry-timeout")
    if raw is None:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= default:
        raise errors.InvalidArgument("x-ferry-timeout", f"must be seconds, above 0 and at most {default:g}")
    return seconds


def usage(summary: inference_pb2.InferResponse) -> dict[str, Any]:
    """OpenAI's ``usage`` object, with the cached prompt tokens under ``prompt_tokens_details``."""
    return {"prompt_tokens": summary.prompt_tokens, "completion_tokens": summary.completion_tokens,
            "total_tokens": summary.prompt_tokens + summary.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": summary.cached_prompt_tokens}}


def _id(prefix: str, summary: inference_pb2.InferResponse, request_id: str) -> str:
    return f"{prefix}-{summary.request_id or request_id}"


def completion(summary: inference_pb2.InferResponse, model: str, created: int) -> dict[str, Any]:
    """The ``text_completion`` object of a unary answer."""
    return {"id": _id("cmpl", summary, ""), "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": summary.text, "logprobs": None,
                         "finish_reason": summary.finish_reason or "stop"}],
            "usage": usage(summary)}


def chat(summary: inference_pb2.InferResponse, model: str, created: int) -> dict[str, Any]:
    """The ``chat.completion`` object of a unary answer."""
    return {"id": _id("chatcmpl", summary, ""), "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": summary.text},
                         "logprobs": None, "finish_reason": summary.finish_reason or "stop"}],
            "usage": usage(summary)}


def completion_chunk(request_id: str, model: str, created: int, text: str, *,
                     summary: inference_pb2.InferResponse | None = None) -> dict[str, Any]:
    """One ``text_completion`` stream chunk; the last one (``summary`` given) has the finish reason."""
    choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None,
                              "finish_reason": (summary.finish_reason or "stop") if summary is not None else None}
    return {"id": f"cmpl-{request_id}", "object": "text_completion", "created": created, "model": model,
            "choices": [choice]}


def chat_chunk(request_id: str, model: str, created: int, text: str | None, *,
               summary: inference_pb2.InferResponse | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk``: ``text`` None is the first (the role); ``summary`` marks the last."""
    delta: dict[str, Any] = {"role": "assistant", "content": ""} if text is None else (
        {"content": text} if summary is None else {})
    choice = {"index": 0, "delta": delta, "logprobs": None,
              "finish_reason": (summary.finish_reason or "stop") if summary is not None else None}
    return {"id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk", "created": created,
            "model": model, "choices": [choice]}


def usage_chunk(request_id: str, model: str, created: int, summary: inference_pb2.InferResponse, *,
                chat: bool) -> dict[str, Any]:
    """The chunk ``stream_options.include_usage`` asks for, after the last: empty ``choices`` and the ``usage``
    (as OpenAI sends it; without ``include_usage`` a stream carries no usage at all)."""
    prefix, kind = ("chatcmpl", "chat.completion.chunk") if chat else ("cmpl", "text_completion")
    return {"id": f"{prefix}-{request_id}", "object": kind, "created": created, "model": model, "choices": [],
            "usage": usage(summary)}


def model_object(name: str, created: int) -> dict[str, Any]:
    """One ``model`` object, as ``GET /v1/models/{id}`` answers it and ``/v1/models`` lists it."""
    return {"id": name, "object": "model", "created": created, "owned_by": "ferry"}


def models(names: list[str], created: int) -> dict[str, Any]:
    """The ``/v1/models`` list."""
    return {"object": "list", "data": [model_object(name, created) for name in names]}


MODELS_PATH = "/v1/models"


def models_answer(path: str, names: Collection[str], created: int) -> dict[str, Any]:
    """``GET /v1/models`` (the list) or ``GET /v1/models/{id}`` (one, percent-decoded; ids may hold ``/``) of the
    models the table routes; raises NotFound ``model`` (404 ``model_not_found``) for an id it does not."""
    route = path.split("?", 1)[0]
    if route in (MODELS_PATH, MODELS_PATH + "/"):
        return models(sorted(names), created)
    name = urllib.parse.unquote(route.removeprefix(MODELS_PATH + "/"))
    if name not in names:
        raise errors.NotFound("model", name[:128])
    return model_object(name, created)


def http_status(error: errors.FerryError) -> tuple[int, str, str]:
    """The HTTP status, OpenAI error ``type`` and ``code`` of a Ferry error (500 for an unmapped one)."""
    if isinstance(error, errors.InvalidArgument):
        return 400, "invalid_request_error", error.code
    if isinstance(error, errors.Unauthenticated):
        return 401, "authentication_error", "invalid_api_key"
    if isinstance(error, Refused):
        return 403, "permission_error", "guardrail_denied"
    if isinstance(error, errors.PermissionDenied):
        return 403, "permission_error", "tier_not_allowed"
    if isinstance(error, errors.NotFound):
        return 404, "invalid_request_error", "model_not_found" if error.kind in ("model", "version") else "not_found"
    if isinstance(error, errors.Overloaded):
        return 429, "rate_limit_error", "rate_limit_exceeded"
    if isinstance(error, errors.DeadlineExceeded):
        return 504, "timeout_error", "deadline_exceeded"
    if isinstance(error, WarmingUp):
        return 503, "server_error", "model_warming_up"
    if isinstance(error, errors.NoReplica | errors.ReplicaFailed | errors.Unavailable):
        return 503, "server_error", "unavailable"
    return 500, "server_error", "internal_error"


def error_body(message: str, kind: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_of(error: errors.FerryError) -> tuple[int, dict[str, Any], float | None]:
    """The status, body and retry-after (seconds, or None) of a Ferry error."""
    status, kind, code = http_status(error)
    param = error.field if isinstance(error, errors.InvalidArgument) else (
        error.kind if isinstance(error, errors.NotFound) else None)
    retry = getattr(error, "retry_after", None) if isinstance(error, errors.Overloaded | WarmingUp) else None
    return status, error_body(str(error), kind, param=param, code=code), retry
