"""The OpenAI API's request and answer bodies as typed models (pydantic v2), and the OpenAPI document built from them.

One declaration of each body: the HTTP front door and the endpoint picker
validate requests with :data:`COMPLETION` and :data:`CHAT`
(:func:`pydantic.TypeAdapter.validate_json` in strict mode: a string is not a
number, ``1`` is not ``true``), and :func:`openapi` serves the same models as
the ``GET /openapi.json`` document, so a client can be generated from it and a
schema-based fuzzer can run against it.

Why pydantic: it is what the OpenAI-compatible servers of this field declare
their APIs with, it is already installed beside the official client, and its
validator is compiled (Rust): measured by ``python -m tools.bench.validation``
(bench-results/validation.json), the parse of a chat body costs about the
same as the hand-written checks it replaces (the figures are in the closing
notes and docs/api.md).

What is declared: every field OpenAI defines for ``/v1/completions`` and
``/v1/chat/completions`` (plus ``top_k``, the extension the engines of this
field share), with its type and OpenAI's range. A body may carry fields
OpenAI does not define (``extra="allow"``): they are returned by
:func:`extras` so the front door can count them
(``ferry_proxy_ignored_fields_total{field}``) or refuse them
(``[proxy] http_strict_fields``). Which declared fields a model can serve is
not a question of the schema: :mod:`dataplane.api.openai` answers it, and
refuses a field the model cannot serve with a 400 naming the field and the
model (never "unknown field" for a field OpenAI defines).

Answers (:class:`Completion`, :class:`ChatCompletion`, their chunks,
:class:`Model`, :class:`ModelList`, :class:`ErrorBody`) are declared for the
document only: the front door builds them as plain dicts on the hot path.
"""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic.json_schema import models_json_schema

Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
Tokens = Annotated[int, Field(ge=1)]
Stop = str | Annotated[list[str], Field(max_length=4)] | None
MAX_MESSAGES = 1024
MAX_PROMPTS = 128  # prompts in one /v1/completions body (each is one request to the fleet)
MAX_N = 16  # choices of one request (each is one request to the fleet)


class Body(BaseModel):
    """A request body: strict types; fields OpenAI does not define are kept aside (:func:`extras`)."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)


class StreamOptions(Body):
    """Options of a streamed answer: ``include_usage`` adds a last chunk with the usage."""

    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None  # vLLM's: accepted, usage stays on the final chunk


class Sampling(Body):
    """The fields both endpoints share."""

    model: str = Field(min_length=1)
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: dict[str, float] | None = None
    max_tokens: Tokens | None = None
    n: Annotated[int, Field(ge=1, le=128)] | None = None
    seed: int | None = None
    stop: Stop = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Probability | None = None
    user: str | None = None
    top_k: Annotated[int, Field(ge=-1, le=1 << 20)] | None = None  # vLLM's extension; -1 (or 0): no limit


class CompletionRequest(Sampling):
    """``POST /v1/completions``."""

    prompt: str | list[str] | list[int] | list[list[int]]
    best_of: Annotated[int, Field(ge=1)] | None = None
    echo: bool | None = None
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    suffix: str | None = None


class TextPart(Body):
    """A text part of a message's content."""

    type: Literal["text"]
    text: str


class ImageUrl(Body):
    """An image, by URL or data URL."""

    url: str
    detail: str | None = None


class ImagePart(Body):
    """An image part of a message's content."""

    type: Literal["image_url"]
    image_url: ImageUrl


class AudioData(Body):
    """Audio, base64-encoded, with its format."""

    data: str
    format: str


class AudioPart(Body):
    """An audio part of a message's content."""

    type: Literal["input_audio"]
    input_audio: AudioData


class FileData(Body):
    """A file, inline or by id."""

    file_data: str | None = None
    file_id: str | None = None
    filename: str | None = None


class FilePart(Body):
    """A file part of a message's content."""

    type: Literal["file"]
    file: FileData


class RefusalPart(Body):
    """A refusal part of an assistant message's content."""

    type: Literal["refusal"]
    refusal: str


Part = Annotated[TextPart | ImagePart | AudioPart | FilePart | RefusalPart, Field(discriminator="type")]


class FunctionCall(Body):
    """A function the model called: its name and its arguments as a JSON string."""

    name: str
    arguments: str


class ToolCall(Body):
    """A tool call of an earlier assistant message."""

    id: str
    type: Literal["function"]
    function: FunctionCall


class Message(Body):
    """One chat message: ``system``, ``developer``, ``user``, ``assistant`` (with ``tool_calls``), ``tool``."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[Part] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None


class FunctionSpec(Body):
    """A function the model may call: name, description and JSON Schema of its parameters."""

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Body):
    """A tool the model may call."""

    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(Body):
    """A function named by the caller."""

    name: str


class NamedTool(Body):
    """The tool the model must call."""

    type: Literal["function"]
    function: NamedFunction


class JsonSchemaSpec(Body):
    """The JSON Schema an answer must match (``response_format`` ``json_schema``)."""

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Body):
    """The form of the answer: ``text``, ``json_object`` or ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class ChatRequest(Sampling):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Tokens | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedTool | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    functions: list[FunctionSpec] | None = None  # deprecated in OpenAI's API, still defined
    function_call: Literal["none", "auto"] | NamedFunction | None = None
    # defined by OpenAI, no effect on what a model of this fleet answers
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    modalities: list[str] | None = None
    prediction: dict[str, Any] | None = None
    audio: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


COMPLETION: TypeAdapter[CompletionRequest] = TypeAdapter(CompletionRequest)
CHAT: TypeAdapter[ChatRequest] = TypeAdapter(ChatRequest)


def extras(body: BaseModel) -> list[str]:
    """The fields of ``body`` (and its nested bodies' top level) that OpenAI does not define, sorted."""
    return sorted(body.model_extra or {})


# -- answers, declared for the document ---------------------------------------------------------------------------


class Answer(BaseModel):
    """An answer body; fields beyond those declared may be present."""

    model_config = ConfigDict(extra="allow")


class PromptTokensDetails(Answer):
    """Details of the prompt's tokens: those read from a replica's prefix cache."""

    cached_tokens: int


class Usage(Answer):
    """Tokens of the request: prompt, completion, both."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class Logprobs(Answer):
    """Log probabilities of the answer's tokens."""

    tokens: list[str] | None = None
    token_logprobs: list[float | None] | None = None
    top_logprobs: list[dict[str, float] | None] | None = None
    text_offset: list[int] | None = None
    content: list[dict[str, Any]] | None = None


Finish = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]


class CompletionChoice(Answer):
    """One choice of a text completion."""

    index: int
    text: str
    logprobs: Logprobs | None = None
    finish_reason: Finish | None = None


class Completion(Answer):
    """A text completion (``POST /v1/completions``)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AnswerToolCall(Answer):
    """A tool call the model made."""

    index: int | None = None
    id: str | None = None
    type: Literal["function"] | None = None
    function: dict[str, Any] | None = None


class AnswerMessage(Answer):
    """The assistant's message of a chat choice."""

    role: Literal["assistant"]
    content: str | None = None
    tool_calls: list[AnswerToolCall] | None = None
    refusal: str | None = None


class ChatChoice(Answer):
    """One choice of a chat completion."""

    index: int
    message: AnswerMessage
    logprobs: Logprobs | None = None
    finish_reason: Finish | None = None


class ChatCompletion(Answer):
    """A chat completion (``POST /v1/chat/completions``)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class Delta(Answer):
    """What a streamed chunk adds to a choice."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[AnswerToolCall] | None = None


class ChunkChoice(Answer):
    """One choice's part of a streamed chunk."""

    index: int
    delta: Delta
    logprobs: Logprobs | None = None
    finish_reason: Finish | None = None


class ChatCompletionChunk(Answer):
    """One ``data:`` event of a streamed chat (the last, with ``include_usage``: ``choices`` empty, ``usage``)."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class Model(Answer):
    """A model the fleet serves."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(Answer):
    """The models the fleet serves."""

    object: Literal["list"]
    data: list[Model]


class Error(Answer):
    """What went wrong: ``param`` names the field at fault, ``code`` says how (OpenAI's codes)."""

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(Answer):
    """OpenAI's error shape: every 4xx and 5xx of the API."""

    error: Error


class Health(Answer):
    """Whether the proxy serves."""

    status: Literal["SERVING", "NOT_SERVING"]


# -- the document -------------------------------------------------------------------------------------------------

REF = "#/components/schemas/{model}"
OPENAPI_PATH = "/openapi.json"
ERRORS = {"400": "a field is malformed or cannot be served by the model (``param`` names it)",
          "401": "missing or unknown API key", "403": "tier not allowed, or a guardrail refused",
          "404": "unknown model", "413": "body too large", "429": "over a limit (``Retry-After``)",
          "503": "no ready replica, warming up, or shutting down", "504": "deadline passed"}


def _json(ref: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": ref}}}


def _errors(refs: dict[str, str]) -> dict[str, Any]:
    return {code: {"description": text, "content": _json(refs["ErrorBody"])} for code, text in ERRORS.items()}


@functools.cache
def openapi(version: str = "1") -> dict[str, Any]:
    """The OpenAPI 3.1 document of the HTTP API (requests, answers, errors, the bearer key), from the models
    above; made once per process (callers do not change it)."""
    models: list[tuple[type[BaseModel], Literal["validation", "serialization"]]] = [
        (CompletionRequest, "validation"), (ChatRequest, "validation"), (Completion, "validation"),
        (ChatCompletion, "validation"), (ChatCompletionChunk, "validation"), (Model, "validation"),
        (ModelList, "validation"), (ErrorBody, "validation"), (Health, "validation")]
    keys, definitions = models_json_schema(models, ref_template=REF)
    refs = {model.__name__: keys[(model, mode)]["$ref"] for model, mode in models}
    stream = {"text/event-stream": {"schema": {"type": "string", "description": (
        "server-sent events: `data: {chunk}` per piece, then `data: [DONE]`")}}}

    def completion(request: str, answer: str, summary: str) -> dict[str, Any]:
        return {"post": {
            "summary": summary, "security": [{"bearer": []}, {"apiKey": []}],
            "parameters": [
                {"name": "x-ferry-tier", "in": "header", "required": False,
                 "schema": {"type": "string", "enum": ["interactive", "standard", "batch"]}},
                {"name": "x-ferry-timeout", "in": "header", "required": False,
                 "schema": {"type": "string", "description": "seconds, above 0"}}],
            "requestBody": {"required": True, "content": _json(refs[request])},
            "responses": {"200": {"description": "the answer (with `stream`: server-sent events)",
                                  "content": {**_json(refs[answer]), **stream}}, **_errors(refs)}}}

    return {
        "openapi": "3.1.0",
        "info": {"title": "Ferry: OpenAI-compatible model API", "version": version},
        "paths": {
            "/v1/completions": completion("CompletionRequest", "Completion", "A text completion"),
            "/v1/chat/completions": completion("ChatRequest", "ChatCompletion", "A chat completion"),
            "/v1/models": {"get": {"summary": "The models served", "security": [{"bearer": []}, {"apiKey": []}],
                                   "responses": {"200": {"description": "the list",
                                                         "content": _json(refs["ModelList"])}, **_errors(refs)}}},
            "/v1/models/{model}": {"get": {
                "summary": "One model", "security": [{"bearer": []}, {"apiKey": []}],
                "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "the model", "content": _json(refs["Model"])},
                              **_errors(refs)}}},
            "/health": {"get": {"summary": "Readiness (no key)", "responses": {
                "200": {"description": "serving", "content": _json(refs["Health"])},
                "503": {"description": "not serving", "content": _json(refs["Health"])}}}},
        },
        "components": {
            "schemas": definitions.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}},
        },
    }


@functools.cache
def openapi_bytes() -> bytes:
    """:func:`openapi` as JSON, made once per process."""
    return json.dumps(openapi(), separators=(",", ":")).encode()
