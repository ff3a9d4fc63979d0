"""The simulated model's log probabilities: deterministic, from each token's text and place in the answer.

Pure. A token's log probability is -0.01 - (BLAKE2b(place, text) mod 4000) / 1000, in (-4.01, -0.01]; its
alternatives, when ``top`` are asked (at most :data:`MAX_TOP`), are the token itself first, then words of
the vocabulary, each 0.5 less likely than the one before (most likely first, as OpenAI lists them). Both
faces answer the same numbers for the same answer: the KServe face as the three outputs of
docs/CONTRACTS.md (:func:`outputs`: ``output_log_probs``, ``output_tokens``, ``top_logprobs``), the OpenAI
face in OpenAI's shapes (:func:`chat`, :func:`completion`).

Cost: one 8-byte BLAKE2b per token, O(top) per token for the alternatives.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from typing import Any

from agent.replica.tensors import VOCABULARY, encode_bytes

MAX_TOP = 20


def logprob(token: str, place: int) -> float:
    """The log probability of ``token`` at ``place`` (0-based) of the answer."""
    digest = hashlib.blake2b(f"{place}\0{token}".encode(), digest_size=8).digest()
    return -0.01 - (int.from_bytes(digest, "little") % 4000) / 1000


def alternatives(token: str, place: int, top: int) -> list[tuple[str, float]]:
    """The ``top`` most likely tokens at ``place``: ``token`` first, then vocabulary words, less likely each."""
    first = logprob(token, place)
    others = [w for w in VOCABULARY if w != token.strip()][:max(0, min(top, MAX_TOP) - 1)]
    return ([(token, first)] + [(" " + w, first - 0.5 * (j + 1)) for j, w in enumerate(others)])[:min(top, MAX_TOP)]


def outputs(tokens: Sequence[str], start: int, top: int) -> list[tuple[str, str, tuple[int, ...], bytes]]:
    """The KServe outputs of ``tokens`` (places ``start``..): ``(name, datatype, shape, raw contents)`` each."""
    shape = (1, len(tokens))
    values = b"".join(struct.pack("<f", logprob(t, start + i)) for i, t in enumerate(tokens))
    texts = b"".join(encode_bytes(t.encode()) for t in tokens)
    tops = b"".join(encode_bytes(json.dumps(dict(alternatives(t, start + i, top))).encode())
                    for i, t in enumerate(tokens))
    return [("output_log_probs", "FP32", shape, values), ("output_tokens", "BYTES", shape, texts),
            ("top_logprobs", "BYTES", shape, tops)]


def chat(tokens: Sequence[str], start: int, top: int) -> dict[str, Any]:
    """A chat choice's ``logprobs`` (OpenAI's shape) for ``tokens`` at places ``start``.."""
    def entry(token: str, value: float) -> dict[str, Any]:
        return {"token": token, "logprob": round(value, 6), "bytes": list(token.encode())}

    return {"content": [{**entry(t, logprob(t, start + i)),
                         "top_logprobs": [entry(a, v) for a, v in alternatives(t, start + i, top)]}
                        for i, t in enumerate(tokens)], "refusal": None}


def completion(tokens: Sequence[str], start: int, top: int, offset: int = 0) -> dict[str, Any]:
    """A completion choice's ``logprobs`` (OpenAI's shape): tokens, their log probabilities, ``top`` alternatives
    each, and each token's offset in the text (from ``offset``)."""
    offsets, at = [], offset
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {"tokens": list(tokens), "token_logprobs": [round(logprob(t, start + i), 6) for i, t in enumerate(tokens)],
            "top_logprobs": [{a: round(v, 6) for a, v in alternatives(t, start + i, top)}
                             for i, t in enumerate(tokens)], "text_offset": offsets}
