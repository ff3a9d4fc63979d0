"""What reading an OpenAI body costs the proxy per request: :func:`dataplane.api.openai.parse_completion` and
:func:`~dataplane.api.openai.parse_chat`, the bytes of a body to the checked request, on three bodies.

Bodies: a completion (a 40-word prompt, five sampling fields), a chat of two messages with streaming options,
and a chat of 20 messages with every sampling field. Each is parsed ``--requests`` times (20,000) after a
warm-up of 1,000; each parse is timed alone with ``time.perf_counter_ns``, and the p50, p99 and mean (µs)
are printed and written to ``bench-results/validation.json`` (``--out``). The module imports only the
parser, so the same file measures any revision of it (``PYTHONPATH=<an older tree>``), which is how the
figure before the typed schema was taken.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dataplane.api import openai

ROOT = Path(__file__).resolve().parents[2]
WORDS = " ".join(f"word{i}" for i in range(40))
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "seed": 7, "stop": ["\n\n", "END"], "presence_penalty": 0.1,
            "frequency_penalty": 0.2}
BODIES: dict[str, tuple[Callable[[bytes], Any], dict[str, Any]]] = {
    "completion": (openai.parse_completion, {"model": "chat", "prompt": WORDS, "max_tokens": 64,
                                             **{k: SAMPLING[k] for k in ("temperature", "top_p", "seed", "stop")},
                                             "user": "u-1"}),
    "chat-2": (openai.parse_chat, {"model": "chat", "max_tokens": 64, "stream": True,
                                   "stream_options": {"include_usage": True},
                                   "messages": [{"role": "system", "content": "Be brief."},
                                                {"role": "user", "content": WORDS}]}),
    "chat-20": (openai.parse_chat, {"model": "chat", "max_completion_tokens": 256, **SAMPLING,
                                    "messages": [{"role": ("user", "assistant")[i % 2], "content": WORDS}
                                                 for i in range(20)]}),
}


def measure(parse: Callable[[bytes], Any], body: bytes, requests: int) -> dict[str, float]:
    """p50, p99 and mean of ``requests`` timed parses of ``body`` (µs), after a warm-up."""
    for _ in range(1000):
        parse(body)
    times: list[int] = []
    clock = time.perf_counter_ns
    for _ in range(requests):
        start = clock()
        parse(body)
        times.append(clock() - start)
    times.sort()
    return {"p50_us": round(times[len(times) // 2] / 1e3, 2), "p99_us": round(times[int(len(times) * 0.99)] / 1e3, 2),
            "mean_us": round(sum(times) / len(times) / 1e3, 2), "body_bytes": len(body)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_validation", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--out", default=str(ROOT / "bench-results" / "validation.json"))
    args = p.parse_args(argv)
    results = {name: measure(parse, json.dumps(body).encode(), args.requests)
               for name, (parse, body) in BODIES.items()}
    for name, figures in results.items():
        print(f"{name:<11} {figures['body_bytes']:>6} B  p50 {figures['p50_us']:>7.2f} µs  "
              f"p99 {figures['p99_us']:>7.2f} µs  mean {figures['mean_us']:>7.2f} µs")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": "python -m tools.bench.validation", "requests": args.requests,
                               "parser": openai.__file__, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
