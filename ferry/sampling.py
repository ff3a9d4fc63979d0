"""Sampling parameters on the replica wire: which a model accepts, and their KServe v2 input tensors.

Pure, shared by the proxy (encodes, and refuses a parameter the model does not
accept) and Ferry's simulated replica (declares and decodes). A model accepts
a parameter when its metadata declares the matching input (the agent sends the
declared input names with each replica's registration; the table carries
them to the proxies). Two conventions, docs/CONTRACTS.md:

- **one tensor per parameter** (TensorRT-LLM ensembles, Ferry's replica), each
  of shape ``[1, n]``: :data:`TENSORS` maps the parameter to its input name
  and datatype (``stop`` is ``stop_words``, ``seed`` is ``random_seed``);
- **one JSON input** ``sampling_parameters`` (BYTES ``[1]``; Triton's vLLM
  backend): every parameter is accepted, sent under vLLM's ``SamplingParams``
  names (the same as Ferry's).

When a model declares both, the tensors are used for the parameters they
cover, JSON for the rest.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Collection, Mapping, Sequence

SamplingValue = float | int | tuple[str, ...]
Tensor = tuple[str, str, tuple[int, ...], bytes]  # (input name, datatype, shape, raw contents)

PARAMETERS = ("temperature", "top_p", "top_k", "stop", "seed", "presence_penalty", "frequency_penalty",
              "guided_json", "logprobs", "top_logprobs")
TENSORS: Mapping[str, tuple[str, str]] = {
    "temperature": ("temperature", "FP32"),
    "top_p": ("top_p", "FP32"),
    "top_k": ("top_k", "INT32"),
    "stop": ("stop_words", "BYTES"),
    "seed": ("random_seed", "UINT64"),
    "presence_penalty": ("presence_penalty", "FP32"),
    "frequency_penalty": ("frequency_penalty", "FP32"),
    "guided_json": ("guided_json", "BYTES"),  # a JSON Schema the answer matches (structured output)
    "logprobs": ("return_log_probs", "BOOL"),  # each token's log probability back (TensorRT-LLM's name)
    "top_logprobs": ("top_logprobs", "INT32"),  # and as many of the most likely tokens at each place
}
# not carried by the sampling_parameters JSON (vLLM has no guided_json, and its logprobs is another shape)
TENSOR_ONLY = frozenset({"guided_json", "logprobs", "top_logprobs"})
BY_TENSOR = {tensor: name for name, (tensor, _) in TENSORS.items()}
JSON_INPUT = "sampling_parameters"
MAX_INPUTS = 64  # input names kept per replica (a model declares a handful)
MAX_INPUT_CHARS = 64

_PACK = {"FP32": struct.Struct("<f"), "INT32": struct.Struct("<i"), "UINT64": struct.Struct("<Q"),
         "BOOL": struct.Struct("<?")}


def accepted(inputs: Collection[str]) -> frozenset[str]:
    """The sampling parameters a model with these declared inputs accepts."""
    declared = frozenset(name for name, (tensor, _) in TENSORS.items() if tensor in inputs)
    if JSON_INPUT in inputs:
        return declared | (frozenset(PARAMETERS) - TENSOR_ONLY)
    return declared


def bounded(inputs: Sequence[str]) -> tuple[str, ...]:
    """A registration's input names, bounded: at most :data:`MAX_INPUTS`, each at most :data:`MAX_INPUT_CHARS`."""
    return tuple(name for name in inputs[:MAX_INPUTS] if 0 < len(name) <= MAX_INPUT_CHARS)


def _bytes(items: Sequence[bytes]) -> bytes:
    return b"".join(len(item).to_bytes(4, "little") + item for item in items)


def encode(values: Mapping[str, SamplingValue], inputs: Collection[str]) -> tuple[Tensor, ...]:
    """The input tensors carrying ``values`` for a model declaring ``inputs`` (each value already accepted)."""
    out: list[Tensor] = []
    rest: dict[str, object] = {}
    for name, value in values.items():
        tensor, datatype = TENSORS[name]
        if tensor not in inputs:
            rest[name] = list(value) if isinstance(value, tuple) else value
        elif isinstance(value, tuple):
            out.append((tensor, datatype, (1, len(value)), _bytes([s.encode() for s in value])))
        else:
            number = float(value) if datatype == "FP32" else (bool(value) if datatype == "BOOL" else int(value))
            out.append((tensor, datatype, (1, 1), _PACK[datatype].pack(number)))
    if rest:
        out.append((JSON_INPUT, "BYTES", (1,), _bytes([json.dumps(rest, sort_keys=True).encode()])))
    return tuple(out)


def decode(tensor: str, datatype: str, items: Sequence[bytes] | bytes) -> tuple[str, SamplingValue]:
    """A replica's view of one sampling tensor: (parameter, value); raises ValueError on a malformed one."""
    name = BY_TENSOR.get(tensor)
    if name is None:
        raise ValueError(f"{tensor}: not a sampling input")
    expected = TENSORS[name][1]
    if datatype != expected:
        raise ValueError(f"{tensor}: datatype must be {expected}, got {datatype}")
    if datatype == "BYTES":
        assert not isinstance(items, bytes)
        return name, tuple(item.decode() for item in items)
    assert isinstance(items, bytes)
    pack = _PACK[datatype]
    if len(items) != pack.size:
        raise ValueError(f"{tensor}: expected one {datatype} ({pack.size} bytes), got {len(items)}")
    return name, pack.unpack(items)[0]
