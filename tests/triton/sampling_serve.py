"""Ferry's Triton test server plus ``llm-sampling``: a model declaring TensorRT-LLM's sampling inputs.

Runs under the Triton environment's interpreter, with ``tools/triton/serve.py``'s
command line. ``llm-sampling`` (unary, not decoupled, no batching) takes
``text_input`` and ``max_tokens`` and the optional ``temperature`` (FP32),
``top_k`` (INT32), ``random_seed`` (UINT64) and ``stop_words`` (BYTES
``[1, n]``), and answers in ``text_output`` the JSON of the sampling inputs it
received, so a test can see what reached the model.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.triton import serve

SAMPLING_MODEL = "llm-sampling"
_bind = serve.bind_models


def bind_models(triton: Any, args: Any) -> None:
    """Serve's models, then ``llm-sampling``."""
    import numpy as np
    from pytriton.model_config import ModelConfig, Tensor  # type: ignore[import-not-found]

    _bind(triton, args)

    def received(request: Any) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for name in ("temperature", "top_k", "random_seed"):
            if name in request:
                value = request[name].reshape(-1)[0].item()
                seen[name] = round(value, 4) if isinstance(value, float) else value
        if "stop_words" in request:
            seen["stop_words"] = [serve._text(v) for v in request["stop_words"].reshape(-1)]
        return seen

    def infer(requests: list[Any]) -> list[dict[str, Any]]:
        return [{"text_output": np.array([[json.dumps(received(r), sort_keys=True).encode()]], dtype=np.object_)}
                for r in requests]

    triton.bind(
        model_name=SAMPLING_MODEL,
        infer_func=infer,
        inputs=[Tensor(name="text_input", dtype=bytes, shape=(-1, 1)),
                Tensor(name="max_tokens", dtype=np.int32, shape=(-1, 1)),
                Tensor(name="temperature", dtype=np.float32, shape=(-1, 1), optional=True),
                Tensor(name="top_k", dtype=np.int32, shape=(-1, 1), optional=True),
                Tensor(name="random_seed", dtype=np.uint64, shape=(-1, 1), optional=True),
                Tensor(name="stop_words", dtype=bytes, shape=(-1, -1), optional=True)],
        outputs=[Tensor(name="text_output", dtype=bytes, shape=(-1, 1))],
        config=ModelConfig(batching=False),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``serve.main`` with ``llm-sampling`` bound and awaited too."""
    serve.bind_models = bind_models
    serve.MODELS = (*serve.MODELS, SAMPLING_MODEL)
    return serve.main(argv)


if __name__ == "__main__":
    sys.exit(main())
