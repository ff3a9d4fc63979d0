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

Bodies are typed by :mod:`dataplane.api.schema` (pydantic, strict). A field
OpenAI defines that no model of the fleet serves through the proxy
(:data:`NOT_SERVED`: log probabilities, tools, structured output, …) is a 400
naming the field and the model (``unsupported_parameter``); a field OpenAI
does not define is returned in :attr:`Parsed.ignored` for the front door to
count or refuse. ``n`` and a list of prompts fan out (:attr:`Parsed.choices`
requests, at most :data:`MAX_CHOICES`); ``echo`` is served by the front door.
"""

from __future__ import annotations

import dataclasses
import json
import math
import urllib.parse
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError

from dataplane.admission.coldstart import WarmingUp
from dataplane.api import schema
from dataplane.api import tools as tooling
from dataplane.guard.hooks import Refused
from ferry import errors
from ferry.config import TenantConfig
from ferry.v1 import common_pb2, inference_pb2

TIERS = {"interactive": common_pb2.TIER_INTERACTIVE, "standard": common_pb2.TIER_STANDARD,
         "batch": common_pb2.TIER_BATCH}
MAX_STOP_BYTES = 64
MAX_CHOICES = 16  # requests one body fans out to (n x prompts): each takes a slot of the fleet
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)
# fields OpenAI defines that no replica of this fleet serves through the proxy yet: a 400 naming the field and the
# model when given (a value other than the "off" one), never silently dropped
NOT_SERVED = {"logit_bias": "logit bias", "suffix": "a suffix (fill in the middle)", "best_of": "best_of",
              "functions": "functions (deprecated: use tools)", "function_call": "functions (deprecated: use tools)",
              "audio": "audio output"}
OFF: dict[str, Any] = {"best_of": (None, 1),
                       "tool_choice": (None, "none"), "function_call": (None, "none"),
                       "logit_bias": (None, {}), "tools": (None, []), "functions": (None, [])}
JSON_OBJECT = '{"type": "object"}'  # the schema of response_format json_object


@dataclasses.dataclass(frozen=True, slots=True)
class Parsed:
    """A checked body: the model, its prompts (or chat messages), the sampling values given, and stream options.

    ``max_tokens`` None: not given, so up to the model's context (:meth:`dataplane.router.Router.begin`).
    ``prompts``: each prompt of a completion body, text or token ids (a list fans out, one request each);
    ``n``: choices per prompt (each one request, with the same prefix, so they share a replica's cache);
    ``ignored``: fields OpenAI does not define, left out (counted by the front door, or refused when strict).
    """

    model: str
    max_tokens: int | None
    stream: bool = False
    include_usage: bool = False
    prompts: tuple[str | tuple[int, ...], ...] = ()
    messages: tuple[Mapping[str, Any], ...] = ()
    sampling: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    n: int = 1
    echo: bool = False
    ignored: tuple[str, ...] = ()
    tools: tuple[Mapping[str, Any], ...] = ()  # chat: the tools offered (dataplane.api.tools)
    tool_choice: str | Mapping[str, Any] | None = None

    @property
    def prompt(self) -> str:
        """The first prompt, as text ("" when it is token ids or a chat)."""
        first = self.prompts[0] if self.prompts else ""
        return first if isinstance(first, str) else ""

    @property
    def logprobs(self) -> bool:
        """Whether the tokens' log probabilities are asked."""
        return bool(self.sampling.get("logprobs"))

    @property
    def choices(self) -> int:
        """Requests this body fans out to: ``n`` per prompt (a chat has one)."""
        return self.n * max(1, len(self.prompts))


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "none"})


def _path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as the field's name (``messages[1].content``), union branch tags left out."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _TYPE_TAGS or "[" in part or "-" in part or part[:1].isupper():
            continue
        else:
            out += f".{part}" if out else part
    return out or "body"


def _invalid(exc: ValidationError) -> errors.InvalidArgument:
    """The first error of a validation, naming its field, with OpenAI's code (``invalid_type``/``invalid_value``)."""
    found = exc.errors(include_url=False, include_context=False, include_input=False)
    first = found[0]
    at = _path(tuple(first["loc"]))
    for other in found:  # a union: the branch whose type matched says more than the ones whose type did not
        if _path(tuple(other["loc"])) == at and not str(other["type"]).endswith("_type"):
            first = other
            break
    kind = str(first["type"])
    if kind == "json_invalid":
        return errors.InvalidArgument("body", f"not valid JSON: {first['msg'].removeprefix('Invalid JSON: ')}")
    path = _path(tuple(first["loc"]))
    if path == "body":
        return errors.InvalidArgument("body", "must be a JSON object", "invalid_type")
    if kind == "missing":
        return errors.InvalidArgument(path, "required")
    message = str(first["msg"])
    code = "invalid_type" if kind.endswith("_type") or kind.startswith("union_tag") else "invalid_value"
    return errors.InvalidArgument(path, message[:1].lower() + message[1:], code)


def _read(adapter: TypeAdapter[Any], body: bytes) -> Any:
    try:
        return adapter.validate_json(body)
    except ValidationError as exc:
        raise _invalid(exc) from None


def _refuse_unserved(data: schema.Sampling, model: str) -> None:
    """A field OpenAI defines that the proxy cannot serve for ``model``: 400 naming it and the model.

    Only the fields the body set are looked at (``model_fields_set``: a few names, not every field declared)."""
    given = data.model_fields_set
    for field in sorted(given & NOT_SERVED.keys()):
        value = getattr(data, field)
        if value is None or value in OFF.get(field, (None,)):
            continue
        raise errors.InvalidArgument(field, f"model {model!r} does not serve {NOT_SERVED[field]} through this API",
                                     "unsupported_parameter")
    if "modalities" in given:
        modalities = getattr(data, "modalities", None)
        if modalities and set(modalities) != {"text"}:
            raise errors.InvalidArgument("modalities", f"model {model!r} answers text only", "unsupported_parameter")


def _sampling(data: schema.Sampling) -> dict[str, Any]:
    """The sampling fields given (absent or null ones left out), past the schema's ranges."""
    out: dict[str, Any] = {field: float(value) for field in ("temperature", "top_p", "presence_penalty",
                                                             "frequency_penalty")
                           if (value := getattr(data, field)) is not None}
    if out.get("top_p") == 0.0:
        raise errors.InvalidArgument("top_p", "must be greater than 0")
    if data.top_k is not None:
        out["top_k"] = max(0, data.top_k)  # -1 (vLLM's "no limit") is the wire's 0
    if data.seed is not None:
        if not SEED_RANGE[0] <= data.seed <= SEED_RANGE[1]:
            raise errors.InvalidArgument("seed", f"must be between {SEED_RANGE[0]} and {SEED_RANGE[1]}")
        out["seed"] = data.seed % (1 << 64)
    if isinstance(data, schema.ChatRequest):  # read by type: pydantic's attribute fallback is slow
        out.update(_chat_sampling(data))
    elif isinstance(data, schema.CompletionRequest) and data.logprobs is not None:
        out["logprobs"] = True  # completions: the number of alternatives (0: the chosen token's only)
        if data.logprobs:
            out["top_logprobs"] = data.logprobs
    if data.stop is not None:
        items = [data.stop] if isinstance(data.stop, str) else data.stop
        for i, text in enumerate(items):
            if not text or len(text.encode()) > MAX_STOP_BYTES:
                raise errors.InvalidArgument(f"stop[{i}]" if isinstance(data.stop, list) else "stop",
                                             f"must be 1 to {MAX_STOP_BYTES} bytes")
        if items:
            out["stop"] = tuple(items)
    return out


def _chat_sampling(data: schema.ChatRequest) -> dict[str, Any]:
    """A chat's structured output (``guided_json``) and log probabilities (a flag, and ``top_logprobs``)."""
    out: dict[str, Any] = {}
    response_format = data.response_format
    if response_format is not None and response_format.type != "text":  # structured output: the model's guide
        spec = response_format.json_schema
        if response_format.type == "json_schema" and (spec is None or spec.schema_ is None):
            raise errors.InvalidArgument("response_format.json_schema.schema", "required with type json_schema")
        out["guided_json"] = (JSON_OBJECT if response_format.type == "json_object" or spec is None
                              else json.dumps(spec.schema_, separators=(",", ":")))
    if data.top_logprobs and not data.logprobs:
        raise errors.InvalidArgument("top_logprobs", "needs logprobs: true")
    if data.logprobs:
        out["logprobs"] = True
        if data.top_logprobs:
            out["top_logprobs"] = data.top_logprobs
    return out


def _common(data: schema.Sampling, max_tokens: int | None, prompts: int) -> dict[str, Any]:
    n = data.n or 1
    if n * max(1, prompts) > MAX_CHOICES:
        raise errors.InvalidArgument("n" if prompts <= 1 else "prompt",
                                     f"{n} choices of {max(1, prompts)} prompts: at most {MAX_CHOICES} in all")
    options = data.stream_options
    return {"model": data.model, "max_tokens": max_tokens, "stream": bool(data.stream),
            "include_usage": bool(options is not None and options.include_usage), "n": n,
            "sampling": _sampling(data), "ignored": tuple(schema.extras(data))}


def parse_completion(body: bytes) -> Parsed:
    """A ``/v1/completions`` body: ``prompt`` a string, a list of them, token ids, or lists of token ids.

    Raises InvalidArgument naming the field (typed by :data:`dataplane.api.schema.COMPLETION`)."""
    data: schema.CompletionRequest = _read(schema.COMPLETION, body)
    _refuse_unserved(data, data.model)
    prompt = data.prompt
    prompts: tuple[str | tuple[int, ...], ...] = ()
    if isinstance(prompt, str):
        prompts = (prompt,)
    elif prompt and isinstance(prompt[0], int):
        prompts = (tuple(item for item in prompt if isinstance(item, int)),)
    else:
        prompts = tuple(item if isinstance(item, str) else tuple(item) for item in prompt
                        if isinstance(item, str | list))
    if not prompts:
        raise errors.InvalidArgument("prompt", "must not be an empty list")
    if data.echo and data.logprobs is not None:
        raise errors.InvalidArgument("echo", f"with logprobs: model {data.model!r} does not return the prompt's "
                                             "log probabilities", "unsupported_parameter")
    return Parsed(prompts=prompts, echo=bool(data.echo), **_common(data, data.max_tokens, len(prompts)))


def _content(value: str | list[Any] | None, field: str, model: str) -> str:
    if value is None or isinstance(value, str):
        return value or ""
    texts: list[str] = []
    for i, part in enumerate(value):
        if not isinstance(part, schema.TextPart):
            raise errors.InvalidArgument(f"{field}[{i}]", f"model {model!r} takes text only, not {part.type}",
                                         "unsupported_parameter")
        texts.append(part.text)
    return "".join(texts)


def parse_chat(body: bytes) -> Parsed:
    """A ``/v1/chat/completions`` body (typed by :data:`dataplane.api.schema.CHAT`); raises InvalidArgument naming
    the field. Each message goes to the chat template with its role and text content (and its ``name``,
    ``tool_calls`` and ``tool_call_id`` when given, which templates may read)."""
    data: schema.ChatRequest = _read(schema.CHAT, body)
    _refuse_unserved(data, data.model)
    out: list[Mapping[str, Any]] = []
    for i, message in enumerate(data.messages):
        rendered: dict[str, Any] = {"role": message.role,
                                    "content": _content(message.content, f"messages[{i}].content", data.model)}
        for key in ("name", "tool_call_id"):
            if (value := getattr(message, key)) is not None:
                rendered[key] = value
        if message.tool_calls:
            rendered["tool_calls"] = [call.model_dump() for call in message.tool_calls]
        out.append(rendered)
    max_tokens = data.max_completion_tokens if data.max_completion_tokens is not None else data.max_tokens
    choice = data.tool_choice.model_dump() if isinstance(data.tool_choice, schema.Body) else data.tool_choice
    return Parsed(messages=tuple(out), tools=tuple(tool.model_dump(by_alias=True, exclude_none=True)
                                                   for tool in data.tools or ()),
                  tool_choice=choice, **_common(data, max_tokens, 0))


def to_request(parsed: Parsed, prompt: str, *, tier: str, idempotency_key: str) -> inference_pb2.InferRequest:
    """The ``InferRequest`` both fronts validate and route; ``tier`` "" means the tenant's default (standard)."""
    if tier and tier not in TIERS:
        raise errors.InvalidArgument("x-ferry-tier", f"unknown tier {tier[:32]!r} (use {', '.join(TIERS)})")
    max_tokens = 0 if parsed.max_tokens is None else min(parsed.max_tokens, (1 << 31) - 1)  # 0: up to the context
    request = inference_pb2.InferRequest(model=parsed.model, prompt=prompt, max_tokens=max_tokens,
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


def usage(summaries: Sequence[inference_pb2.InferResponse], n: int = 1) -> dict[str, Any]:
    """OpenAI's ``usage`` object of one or more answers, with the cached prompt tokens under
    ``prompt_tokens_details``; ``n`` answers in a row share one prompt, counted once (as OpenAI counts ``n``)."""
    prompts = summaries[::max(1, n)]
    prompt = sum(s.prompt_tokens for s in prompts)
    completion = sum(s.completion_tokens for s in summaries)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(s.cached_prompt_tokens for s in prompts)}}


Logprobs = Sequence[tuple[str, float, Sequence[tuple[str, float]]]]  # (token, log probability, alternatives)


def logprobs_of(items: Sequence[Any]) -> list[tuple[str, float, list[tuple[str, float]]]]:
    """Log probabilities as ``(token, logprob, alternatives)``, from the wire's ``TokenLogprob`` or the
    forwarder's ``Logprob``."""
    return [(i.token, i.logprob, [(t.token, t.logprob) if hasattr(t, "token") else (t[0], t[1]) for t in i.top])
            for i in items]


def chat_logprobs(items: Logprobs) -> dict[str, Any]:
    """A chat choice's ``logprobs``: ``content``, one entry per token with its bytes and ``top_logprobs``."""
    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": round(logprob, 6), "bytes": list(token.encode())}

    return {"content": [{**entry(token, logprob), "top_logprobs": [entry(t, v) for t, v in top]}
                        for token, logprob, top in items], "refusal": None}


def completion_logprobs(items: Logprobs, offset: int = 0) -> dict[str, Any]:
    """A completion choice's ``logprobs``: ``tokens``, ``token_logprobs``, ``top_logprobs`` (a token -> logprob
    object each) and ``text_offset`` (each token's offset in the text, from ``offset``)."""
    offsets, at = [], offset
    for token, _, _ in items:
        offsets.append(at)
        at += len(token)
    return {"tokens": [token for token, _, _ in items], "token_logprobs": [round(lp, 6) for _, lp, _ in items],
            "top_logprobs": [{t: round(v, 6) for t, v in top} for _, _, top in items], "text_offset": offsets}


def _id(prefix: str, summary: inference_pb2.InferResponse, request_id: str) -> str:
    return f"{prefix}-{summary.request_id or request_id}"


def completion(summaries: Sequence[inference_pb2.InferResponse], model: str, created: int, *, n: int = 1,
               echo: Sequence[str] = (), logprobs: bool = False) -> dict[str, Any]:
    """The ``text_completion`` object of a unary answer: one choice per summary (``echo``: each prompt first)."""
    return {"id": _id("cmpl", summaries[0], ""), "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": i, "text": (echo[i] if echo else "") + s.text,
                         "logprobs": completion_logprobs(logprobs_of(s.logprobs)) if logprobs else None,
                         "finish_reason": s.finish_reason or "stop"} for i, s in enumerate(summaries)],
            "usage": usage(summaries, n)}


def chat(summaries: Sequence[inference_pb2.InferResponse], model: str, created: int, *,
         n: int = 1, tools: bool = False, logprobs: bool = False) -> dict[str, Any]:
    """The ``chat.completion`` object of a unary answer: one choice per summary; with ``tools`` offered, the calls
    in each answer parsed out (:func:`dataplane.api.tools.parse`) into ``message.tool_calls``."""
    choices = []
    for i, s in enumerate(summaries):
        message: dict[str, Any] = {"role": "assistant", "content": s.text}
        finish = s.finish_reason or "stop"
        if tools:
            content, calls = tooling.parse(s.text)
            if calls:
                message = {"role": "assistant", "content": content, "tool_calls": [c.openai() for c in calls]}
                finish = "tool_calls"
        choices.append({"index": i, "message": message, "finish_reason": finish,
                        "logprobs": chat_logprobs(logprobs_of(s.logprobs)) if logprobs else None})
    return {"id": _id("chatcmpl", summaries[0], ""), "object": "chat.completion", "created": created,
            "model": model, "choices": choices, "usage": usage(summaries, n)}


def completion_chunk(request_id: str, model: str, created: int, text: str, *,
                     summary: inference_pb2.InferResponse | None = None, index: int = 0,
                     logprobs: Logprobs | None = None, offset: int = 0) -> dict[str, Any]:
    """One ``text_completion`` stream chunk of choice ``index``; its last one (``summary`` given) has the finish
    reason."""
    choice: dict[str, Any] = {"index": index, "text": text,
                              "logprobs": completion_logprobs(logprobs, offset) if logprobs is not None else None,
                              "finish_reason": (summary.finish_reason or "stop") if summary is not None else None}
    return {"id": f"cmpl-{request_id}", "object": "text_completion", "created": created, "model": model,
            "choices": [choice]}


def chat_chunk(request_id: str, model: str, created: int, text: str | None, *,
               summary: inference_pb2.InferResponse | None = None, index: int = 0,
               calls: Sequence[tuple[int, tooling.Call]] = (), finish: str = "",
               logprobs: Logprobs | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk`` of choice ``index``: ``text`` None is the first (the role); ``calls``
    (``(index among the choice's calls, call)``) a delta of tool calls; ``summary`` marks the last (``finish``:
    its reason, else the summary's)."""
    delta: dict[str, Any] = {"role": "assistant", "content": ""} if text is None else (
        {"content": text} if summary is None else {})
    if calls:
        delta = {"tool_calls": [call.openai(k) for k, call in calls]}
    choice = {"index": index, "delta": delta, "logprobs": chat_logprobs(logprobs) if logprobs is not None else None,
              "finish_reason": (finish or summary.finish_reason or "stop") if summary is not None else None}
    return {"id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk", "created": created,
            "model": model, "choices": [choice]}


def usage_chunk(request_id: str, model: str, created: int, summaries: Sequence[inference_pb2.InferResponse], *,
                chat: bool, n: int = 1) -> dict[str, Any]:
    """The chunk ``stream_options.include_usage`` asks for, after the last: empty ``choices`` and the ``usage``
    (as OpenAI sends it; without ``include_usage`` a stream carries no usage at all)."""
    prefix, kind = ("chatcmpl", "chat.completion.chunk") if chat else ("cmpl", "text_completion")
    return {"id": f"{prefix}-{request_id}", "object": kind, "created": created, "model": model, "choices": [],
            "usage": usage(summaries, n)}


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


HTTP_FIELDS = {"guided_json": "response_format"}  # the InferRequest field an HTTP body sets through another


def error_of(error: errors.FerryError) -> tuple[int, dict[str, Any], float | None]:
    """The status, body and retry-after (seconds, or None) of a Ferry error."""
    status, kind, code = http_status(error)
    param = HTTP_FIELDS.get(error.field, error.field) if isinstance(error, errors.InvalidArgument) else (
        error.kind if isinstance(error, errors.NotFound) else None)
    retry = getattr(error, "retry_after", None) if isinstance(error, errors.Overloaded | WarmingUp) else None
    return status, error_body(str(error), kind, param=param, code=code), retry
