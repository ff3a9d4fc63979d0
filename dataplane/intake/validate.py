"""Validation of public requests: every field of ``InferRequest`` against :class:`ferry.config.Limits`.

Pure functions, no I/O. Checks, in field order, each raising
:class:`ferry.errors.InvalidArgument` naming the field:

- ``model``: required, at most ``max_model_bytes`` UTF-8 bytes, no control characters;
- ``version``: at most ``max_version_bytes``, no control characters;
- ``tier``: a known ``Tier`` value (``TIER_UNSPECIFIED`` means standard);
- ``prompt``: required, at most ``max_prompt_bytes``;
- ``max_tokens``: 1 .. ``max_tokens``, or 0: not given, as many as the model's context leaves
  (at most ``max_tokens`` and the model's ``max_output_tokens``), set by :meth:`Router.begin` once the pool is known;
- ``prefix_key``: at most ``max_prefix_key_bytes``;
- ``idempotency_key``: at most ``max_idempotency_key_bytes``;
- sampling (each optional): ``temperature`` 0..2, ``top_p`` (0, 1], ``top_k``,
  ``stop`` at most 4 strings of 1..64 bytes, ``seed``, ``presence_penalty``
  and ``frequency_penalty`` -2..2 (:mod:`ferry.sampling`).

:func:`check_sampling` then refuses (InvalidArgument naming it) a sampling
parameter the resolved version's replicas do not all declare, and encodes the
others as the replica's input tensors.

Then :func:`check_tier` raises :class:`ferry.errors.PermissionDenied` naming
the tier when the tenant's plan does not allow it, and :func:`resolve`
raises :class:`ferry.errors.NotFound` for a model (``"model"``) or version
(``"version"``) that the table does not name.

Without an explicit ``prefix_key``, the chained hashes of the prompt's first
``prefix_blocks`` blocks (:func:`dataplane.pick.prefix.leading_hashes`) are taken
from the same split, for the pick's prefix keys; with ``tail_blocks`` (a request
the traffic recorder keeps) the blocks after them, up to ``tail_blocks`` in all,
get cheaper sketch hashes (:func:`ferry.tokens.sketch_hashes`) for the record. Tokens are the model's
``tokenizer`` (:class:`ferry.tokens.Tokenizer`; whitespace words by
default); a prompt already encoded off the event loop comes as ``encoded``
(:mod:`dataplane.intake.tokenwork`).

Cost: one UTF-8 encoding of the prompt (kept for forwarding) and one
whitespace split to count its tokens (or the model's tokenizer, unless
``encoded`` is given); hashing of at most ``prefix_blocks``
blocks of it (16 x 512 tokens by default), whatever the prompt's size; the
other fields are short.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Collection

from dataplane.pick.prefix import DEPTHS
from dataplane.table.local import Pool, Table
from ferry import sampling
from ferry.config import Limits, TenantConfig
from ferry.errors import InvalidArgument, PermissionDenied
from ferry.tokens import WHITESPACE, Encoded, Tokenizer
from ferry.v1 import common_pb2, inference_pb2

TIER_NAMES = {
    common_pb2.TIER_UNSPECIFIED: "standard",
    common_pb2.TIER_INTERACTIVE: "interactive",
    common_pb2.TIER_STANDARD: "standard",
    common_pb2.TIER_BATCH: "batch",
}
# Triton request priority: lower is more urgent, 0 means the model's default.
TIER_PRIORITY = {"interactive": 1, "standard": 2, "batch": 3}


@dataclasses.dataclass(frozen=True, slots=True)
class ValidRequest:
    """A request that passed validation, with the derived values the path needs."""

    model: str
    version: str
    tier: str
    prompt: bytes
    prompt_tokens: int
    max_tokens: int
    prefix_key: str
    idempotency_key: str
    prefix_hashes: tuple[int, ...] = ()  # chained hashes of the leading blocks (none with a prefix_key): the
    # decision reads its depths' of them; a request the recorder keeps has every block's (dataplane.record)
    sampling: tuple[tuple[str, sampling.SamplingValue], ...] = ()  # the sampling parameters given, in field order


def _bounded(value: str, field: str, limit: int, *, required: bool = False) -> bytes:
    if required and not value:
        raise InvalidArgument(field, "required")
    if len(value) > limit:  # every character is at least one byte
        raise InvalidArgument(field, f"longer than {limit} bytes")
    encoded = value.encode()
    if len(encoded) > limit:
        raise InvalidArgument(field, f"longer than {limit} bytes")
    return encoded


def _no_control(value: str, field: str) -> None:
    if not value.isprintable():
        raise InvalidArgument(field, "must not contain control characters")


def validate_request(request: inference_pb2.InferRequest, limits: Limits,
                     prefix_blocks: int = DEPTHS[-1], *, tokenizer: Tokenizer = WHITESPACE,
                     encoded: Encoded | None = None, tail_blocks: int = 0) -> ValidRequest:
    """Check every field of ``request``; raises InvalidArgument naming the first bad one."""
    _bounded(request.model, "model", limits.max_model_bytes, required=True)
    _no_control(request.model, "model")
    if request.model.strip() != request.model:
        raise InvalidArgument("model", "must not start or end with whitespace")
    _bounded(request.version, "version", limits.max_version_bytes)
    _no_control(request.version, "version")
    tier = TIER_NAMES.get(request.tier)
    if tier is None:
        known = "TIER_INTERACTIVE, TIER_STANDARD, TIER_BATCH"
        raise InvalidArgument("tier", f"unknown tier value {request.tier} (use {known})")
    prompt = _bounded(request.prompt, "prompt", limits.max_prompt_bytes, required=True)
    if request.max_tokens < 0:
        raise InvalidArgument("max_tokens", f"0 (up to the model's context) or 1 to {limits.max_tokens}")
    if request.max_tokens > limits.max_tokens:
        raise InvalidArgument("max_tokens", f"over the limit of {limits.max_tokens}")
    _bounded(request.prefix_key, "prefix_key", limits.max_prefix_key_bytes)
    _bounded(request.idempotency_key, "idempotency_key", limits.max_idempotency_key_bytes)
    given = _sampling(request)
    if encoded is None:
        encoded = tokenizer.encode(request.prompt, blocks=0 if request.prefix_key else prefix_blocks,
                                   tail=0 if request.prefix_key else tail_blocks)
    return ValidRequest(
        model=request.model,
        version=request.version,
        tier=tier,
        prompt=prompt,
        prompt_tokens=encoded.count,
        max_tokens=request.max_tokens,
        prefix_key=request.prefix_key,
        idempotency_key=request.idempotency_key,
        prefix_hashes=() if request.prefix_key else encoded.hashes,
        sampling=given,
    )


MAX_STOP, MAX_STOP_BYTES = 4, 64
_RANGES = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0), "presence_penalty": (-2.0, 2.0),
           "frequency_penalty": (-2.0, 2.0)}


def _sampling(request: inference_pb2.InferRequest) -> tuple[tuple[str, sampling.SamplingValue], ...]:
    """The sampling parameters set on ``request``, checked; raises InvalidArgument naming the first bad one."""
    out: list[tuple[str, sampling.SamplingValue]] = []
    for name in sampling.PARAMETERS:
        if name == "stop":
            stops = tuple(request.stop)
            if not stops:
                continue
            if len(stops) > MAX_STOP:
                raise InvalidArgument("stop", f"at most {MAX_STOP} strings")
            for i, text in enumerate(stops):
                if not text or len(text.encode()) > MAX_STOP_BYTES:
                    raise InvalidArgument(f"stop[{i}]", f"must be 1 to {MAX_STOP_BYTES} bytes")
            out.append(("stop", stops))
            continue
        if not request.HasField(name):
            continue
        if name == "guided_json":
            out.append((name, (_guide(request.guided_json),)))
            continue
        if name == "top_logprobs":
            if not 0 <= request.top_logprobs <= MAX_TOP_LOGPROBS:
                raise InvalidArgument("top_logprobs", f"must be between 0 and {MAX_TOP_LOGPROBS}")
            if not request.logprobs:
                raise InvalidArgument("top_logprobs", "needs logprobs")
            if request.top_logprobs:
                out.append((name, request.top_logprobs))
            continue
        if name == "logprobs":
            if request.logprobs:
                out.append((name, True))
            continue
        value = getattr(request, name)
        if name in _RANGES:
            low, high = _RANGES[name]
            if not math.isfinite(value) or not low <= value <= high or (name == "top_p" and value == 0):
                raise InvalidArgument(name, f"must be between {low:g} and {high:g}" + (
                    " and above 0" if name == "top_p" else ""))
            value = round(value, 6)  # the wire's float32 back to the decimal the caller wrote (0.7, not 0.69999…)
        out.append((name, value))
    return tuple(out)


MAX_GUIDE_BYTES = 64 * 1024
MAX_TOP_LOGPROBS = 20


def _guide(text: str) -> str:
    """A ``guided_json`` schema: a JSON object of at most :data:`MAX_GUIDE_BYTES`."""
    if len(text.encode()) > MAX_GUIDE_BYTES:
        raise InvalidArgument("guided_json", f"longer than {MAX_GUIDE_BYTES} bytes")
    try:
        schema = json.loads(text)
    except (ValueError, RecursionError):
        raise InvalidArgument("guided_json", "not valid JSON") from None
    if not isinstance(schema, dict):
        raise InvalidArgument("guided_json", "must be a JSON Schema object", "invalid_type")
    return text


def check_sampling(valid: ValidRequest, inputs: Collection[str], model: str,
                   version: str) -> tuple[sampling.Tensor, ...]:
    """The input tensors of the request's sampling parameters for a version whose replicas declare ``inputs``.

    Raises InvalidArgument naming the first parameter the model does not accept (never dropped silently).
    """
    if not valid.sampling:
        return ()
    ok = sampling.accepted(inputs)
    for name, _ in valid.sampling:
        if name not in ok:
            raise InvalidArgument(name, f"model {model!r} version {version!r} does not accept it "
                                        f"(accepted: {', '.join(sorted(ok)) or 'none'})", "unsupported_parameter")
    return sampling.encode(dict(valid.sampling), inputs)


def check_tier(tier: str, tenant: TenantConfig) -> None:
    """Raise PermissionDenied naming the tier when the tenant's plan does not allow it."""
    if tier not in tenant.tiers:
        allowed = ", ".join(tenant.tiers) or "none"
        raise PermissionDenied(f"tier {tier!r} is not allowed for plan {tenant.plan!r} (allowed: {allowed})")


def resolve(table: Table, request: ValidRequest, u: float = 0.0) -> tuple[str, Pool]:
    """The version served and its pool (``u`` draws a canary split); raises NotFound("model"|"version", …)."""
    return table.candidates(request.model, request.version, u)
