"""Helpers of the agent tests: tensors for tritonclient, fast engine parameters, bounded waits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np
from tritonclient.grpc import InferInput

from agent.replica.answer import natural_length
from agent.replica.engine import EngineParams

FAST = EngineParams(
    max_running=8, max_queue=16, kv_block_tokens=16, kv_blocks_total=256, prefix_cache_blocks=256,
    prefill_base_seconds=0.001, prefill_seconds_per_token=1e-6, decode_base_seconds=0.004,
    decode_seconds_per_request=0.0001, max_context_tokens=2048,
)


def llm_inputs(prompt: str, max_tokens: int, stream: bool | None = None,
               ignore_eos: bool | None = None) -> list[InferInput]:
    text = InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[prompt.encode()]], dtype=object))
    limit = InferInput("max_tokens", [1, 1], "INT32")
    limit.set_data_from_numpy(np.array([[max_tokens]], dtype=np.int32))
    inputs = [text, limit]
    if stream is not None:
        flag = InferInput("stream", [1, 1], "BOOL")
        flag.set_data_from_numpy(np.array([[stream]], dtype=bool))
        inputs.append(flag)
    if ignore_eos is not None:
        flag = InferInput("ignore_eos", [1, 1], "BOOL")
        flag.set_data_from_numpy(np.array([[ignore_eos]], dtype=bool))
        inputs.append(flag)
    return inputs


def with_natural(params: EngineParams, low: int, high: int, tag: str = "prompt") -> tuple[str, int]:
    """A prompt whose natural answer length under ``params`` is in [low, high], and that length."""
    for i in range(10_000):
        prompt = f"{tag} number {i}: tell me about the river"
        n = natural_length(prompt, params.answer_tokens, params.answer_min_tokens)
        if low <= n <= high:
            return prompt, n
    raise AssertionError(f"no prompt with a natural length in [{low}, {high}]")


def text_of(result) -> str:
    return result.as_numpy("text_output").reshape(-1)[0].decode()


def params_of(result) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, p in result.get_response().parameters.items():
        out[key] = getattr(p, p.WhichOneof("parameter_choice"))
    return out


async def until(predicate: Callable[[], bool], within: float = 3.0) -> None:
    """Wait for a condition the code under test reaches on its own (not for readiness: servers signal that)."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)
