"""KServe v2 tensors of an LLM replica, as docs/CONTRACTS.md fixes them: parse requests, build responses.

Inputs: ``text_input`` (BYTES), ``max_tokens`` (INT32), optional ``stream``
(BOOL) and ``ignore_eos`` (BOOL: generate exactly ``max_tokens``, no natural
end; vLLM's and SGLang's name), each of shape ``[1, 1]`` or ``[1]``, given either as typed
``contents`` or, as tritonclient sends them, in ``raw_input_contents`` (one
entry per input, in order; BYTES elements are a 4-byte little-endian length
then the bytes). Output: ``text_output`` (BYTES, ``[1, 1]``) in
``raw_output_contents``. The sampling inputs of :data:`ferry.sampling.TENSORS`
(``temperature``, ``top_p``, ``top_k``, ``stop_words`` ``[1, n]``,
``random_seed``, ``presence_penalty``, ``frequency_penalty``) are declared
optional and parsed into :attr:`LlmRequest.sampling`. Every malformed input raises
:class:`ferry.errors.InvalidArgument` naming the tensor.

Generated text is whitespace words from a fixed vocabulary
(:func:`generated_text`), so deltas concatenate to the whole text and the
proxy's whitespace counts match the replica's token counts.

Cost: O(size of the request) to parse, O(text) to build.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from tritonclient.grpc import service_pb2

from ferry import sampling
from ferry.errors import InvalidArgument

INPUTS = {"text_input": "BYTES", "max_tokens": "INT32", "stream": "BOOL", "ignore_eos": "BOOL"}
OPTIONAL = ("stream", "ignore_eos")  # the inputs of INPUTS a request may leave out
SAMPLING_INPUTS = {tensor: datatype for tensor, datatype in sampling.TENSORS.values()}
DECLARED = {**INPUTS, **SAMPLING_INPUTS}  # every input the model declares (the sampling ones optional)
OUTPUT = "text_output"
SHAPES = ([1], [1, 1])
VOCABULARY = ("the", "ferry", "crosses", "a", "river", "of", "tokens", "and", "comes", "back")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LlmRequest:
    """The parsed inputs of one request; ``stream`` is None when the input is absent."""

    prompt: str
    max_tokens: int
    stream: bool | None = None
    ignore_eos: bool = False
    sampling: Mapping[str, sampling.SamplingValue] = dataclasses.field(default_factory=dict)


def parse_request(request: service_pb2.ModelInferRequest) -> LlmRequest:
    """The LLM inputs of ``request``; raises InvalidArgument naming the first bad tensor."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise InvalidArgument("raw_input_contents", f"{len(raw)} entries for {len(request.inputs)} inputs")
    values: dict[str, object] = {}
    given: dict[str, sampling.SamplingValue] = {}
    for i, tensor in enumerate(request.inputs):
        name = tensor.name
        if name in SAMPLING_INPUTS:
            if sampling.BY_TENSOR[name] in given:
                raise InvalidArgument(name, "input given twice")
            param, value = _sampling_value(tensor, raw[i] if raw else None)
            given[param] = value
            continue
        if name not in INPUTS:
            raise InvalidArgument(name or "inputs", f"unknown input tensor (expected {', '.join(DECLARED)})")
        if name in values:
            raise InvalidArgument(name, "input given twice")
        if tensor.datatype != INPUTS[name]:
            raise InvalidArgument(name, f"datatype must be {INPUTS[name]}, got {tensor.datatype or 'none'}")
        if list(tensor.shape) not in SHAPES:
            raise InvalidArgument(name, f"shape must be [1, 1] or [1], got {list(tensor.shape)}")
        values[name] = _value(name, tensor, raw[i] if raw else None)
    for out in request.outputs:
        if out.name != OUTPUT:
            raise InvalidArgument(out.name or "outputs", f"unknown output tensor (expected {OUTPUT})")
    if "text_input" not in values:
        raise InvalidArgument("text_input", "required input missing")
    if "max_tokens" not in values:
        raise InvalidArgument("max_tokens", "required input missing")
    prompt, max_tokens = values["text_input"], values["max_tokens"]
    assert isinstance(prompt, str) and isinstance(max_tokens, int)
    if not prompt.strip():
        raise InvalidArgument("text_input", "empty prompt")
    if max_tokens < 1:
        raise InvalidArgument("max_tokens", f"must be >= 1, got {max_tokens}")
    stream = values.get("stream")
    return LlmRequest(prompt=prompt, max_tokens=max_tokens, stream=bool(stream) if stream is not None else None,
                      ignore_eos=bool(values.get("ignore_eos", False)), sampling=given)


def _sampling_value(tensor: service_pb2.ModelInferRequest.InferInputTensor,
                    raw: bytes | None) -> tuple[str, sampling.SamplingValue]:
    """One sampling input (raw contents only, as the proxy and tritonclient send them)."""
    name = tensor.name
    if raw is None:
        raise InvalidArgument(name, "expected raw_input_contents")
    shape = list(tensor.shape)
    if len(shape) != 2 or shape[0] != 1 or not 1 <= shape[1] <= 16:
        raise InvalidArgument(name, f"shape must be [1, n] with n 1..16, got {shape}")
    contents: list[bytes] | bytes = _split_bytes(name, raw) if tensor.datatype == "BYTES" else raw
    try:
        return sampling.decode(name, tensor.datatype, contents)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgument(name, str(exc)) from None


def first_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """Where the first of ``stops`` begins in ``text``, and which (None when none occurs; empty ones never do)."""
    found = [(i, stop) for stop in stops if stop and (i := text.find(stop)) >= 0]
    return min(found) if found else None


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, int] | None:
    """``text`` before the first of ``stops`` and its word count (None when no stop string occurs).

    Words are the generated tokens, so the cut falls at a word boundary: the words wholly before the stop string.
    """
    first = first_stop(text, stops)
    if first is None:
        return None
    kept = text[:first[0]].split()
    return " ".join(kept), len(kept)


def _value(name: str, tensor: service_pb2.ModelInferRequest.InferInputTensor, raw: bytes | None) -> object:
    contents = tensor.contents
    if tensor.datatype == "BYTES":
        items = _split_bytes(name, raw) if raw is not None else list(contents.bytes_contents)
        if len(items) != 1:
            raise InvalidArgument(name, f"expected 1 element, got {len(items)}")
        try:
            return items[0].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidArgument(name, "not valid UTF-8") from exc
    if tensor.datatype == "INT32":
        if raw is not None:
            if len(raw) != 4:
                raise InvalidArgument(name, f"expected 4 raw bytes for one INT32, got {len(raw)}")
            return int.from_bytes(raw, "little", signed=True)
        if len(contents.int_contents) != 1:
            raise InvalidArgument(name, f"expected 1 element, got {len(contents.int_contents)}")
        return int(contents.int_contents[0])
    if raw is not None:  # BOOL
        if len(raw) != 1:
            raise InvalidArgument(name, f"expected 1 raw byte for one BOOL, got {len(raw)}")
        return raw != b"\x00"
    if len(contents.bool_contents) != 1:
        raise InvalidArgument(name, f"expected 1 element, got {len(contents.bool_contents)}")
    return bool(contents.bool_contents[0])


def _split_bytes(name: str, raw: bytes) -> list[bytes]:
    items: list[bytes] = []
    pos = 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise InvalidArgument(name, "truncated BYTES length prefix")
        size = int.from_bytes(raw[pos:pos + 4], "little")
        pos += 4
        if pos + size > len(raw):
            raise InvalidArgument(name, f"BYTES element of {size} bytes runs past the end")
        items.append(raw[pos:pos + size])
        pos += size
    return items


def encode_bytes(value: bytes) -> bytes:
    """One BYTES element in raw form: 4-byte little-endian length, then the bytes."""
    return len(value).to_bytes(4, "little") + value


def generated_text(start: int, count: int) -> str:
    """Words ``start`` to ``start + count - 1`` of a reply, each after a space except the very first."""
    return "".join(("" if i == 0 else " ") + VOCABULARY[i % len(VOCABULARY)] for i in range(start, start + count))


def text_response(*, model: str, version: str, request_id: str, text: str,
                  parameters: Mapping[str, bool | int | float | str],
                  extra: Sequence[tuple[str, str, tuple[int, ...], bytes]] = ()) -> service_pb2.ModelInferResponse:
    """A response with ``text_output`` = ``text``, the ``extra`` outputs (name, datatype, shape, raw contents:
    the log probabilities) and the given response parameters."""
    response = service_pb2.ModelInferResponse(model_name=model, model_version=version, id=request_id)
    out = response.outputs.add()
    out.name, out.datatype = OUTPUT, "BYTES"
    out.shape.extend([1, 1])
    response.raw_output_contents.append(encode_bytes(text.encode("utf-8")))
    for name, datatype, shape, raw in extra:
        more = response.outputs.add()
        more.name, more.datatype = name, datatype
        more.shape.extend(shape)
        response.raw_output_contents.append(raw)
    for key, value in parameters.items():
        if isinstance(value, bool):
            response.parameters[key].bool_param = value
        elif isinstance(value, int):
            response.parameters[key].int64_param = value
        elif isinstance(value, str):
            response.parameters[key].string_param = value
        else:
            response.parameters[key].double_param = value
    return response
