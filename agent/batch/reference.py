"""The reference fixed-batch backend, its contract checks, and loading a backend by name.

``batchstring(inputs) -> outputs``: 1 to 100 strings in, exactly one string
out per input in the same order, about 100 ms per batch whatever its size
(it sleeps: call it in a thread), one batch at a time per GPU (the runtime's
job). Each output is :func:`transform` of its input: ``"ferry:"`` + the input
reversed and upper-cased, so a test can check that every answer belongs to
its own request.

:func:`load_function` resolves ``module:function`` (the runtime's
``--function`` flag); the function may be synchronous (run in a thread) or a
coroutine function (awaited).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from ferry.errors import ConfigError, InvalidArgument

MAX_BATCH = 100
BATCH_S = 0.1
PREFIX = "ferry:"
DEFAULT_FUNCTION = "agent.batch.reference:batchstring"


def transform(text: str) -> str:
    """The reference answer to one input."""
    return PREFIX + text[::-1].upper()


def check_inputs(inputs: Sequence[object], max_batch: int = MAX_BATCH) -> None:
    """Raise InvalidArgument unless ``inputs`` is 1 to ``max_batch`` strings."""
    if not 1 <= len(inputs) <= max_batch:
        raise InvalidArgument("inputs", f"a batch holds 1 to {max_batch} inputs, got {len(inputs)}")
    if not all(isinstance(s, str) for s in inputs):
        raise InvalidArgument("inputs", "every input must be a string")


def check_outputs(inputs: Sequence[object], outputs: object) -> list[str]:
    """The outputs as a list; raises ValueError unless there is exactly one string per input."""
    if not isinstance(outputs, list | tuple) or len(outputs) != len(inputs):
        got = len(outputs) if isinstance(outputs, list | tuple) else type(outputs).__name__
        raise ValueError(f"batch contract: {len(inputs)} inputs need {len(inputs)} outputs, got {got}")
    if not all(isinstance(s, str) for s in outputs):
        raise ValueError("batch contract: every output must be a string")
    return list(outputs)


def batchstring(inputs: list[str]) -> list[str]:
    """The reference backend: check the contract, take about 100 ms, answer each input."""
    check_inputs(inputs)
    time.sleep(BATCH_S)
    return [transform(s) for s in inputs]


def load_function(spec: str) -> Callable[[list[str]], Any]:
    """Import ``module:function``; raises ConfigError naming what is wrong."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError("function", f"{spec!r}: expected module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError("function", f"{spec!r}: cannot import {module_name}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError("function", f"{spec!r}: {module_name} has no callable {attr!r}")
    return fn  # type: ignore[no-any-return]
