"""What the response cache costs the proxy per request: the request path's calls, timed in process.

``python -m tools.bench.cache`` times :class:`dataplane.cache.path.CachePath`
as :class:`dataplane.router.Router` calls it, on one core, for prompts of
``--prompt-bytes`` (default 1 KiB and 16 KiB):

- *not deterministic*: ``lookup`` and ``store`` of a request without
  temperature 0 or a seed (what every other request pays);
- *measured, cache off*: a deterministic request, all distinct payloads
  (the meter's hash set filling up to its cap);
- *hit*: ``lookup`` of a payload kept in the cache (cache on);
- *miss and keep*: ``lookup`` then ``store`` of a new payload, cache on.

Each case runs ``--requests`` times (default 20,000), ``--repeats`` times
(default 5); the figure is the lowest of the repeats' means, in microseconds
a request (the machine is shared: the lowest is the least disturbed). Prints
a table with the load average and writes ``bench-results/cache.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry

from dataplane.cache.path import CachePath
from dataplane.cache.settings import CacheSettings
from dataplane.forward.kserve import Outcome
from dataplane.intake.validate import ValidRequest
from dataplane.router import RequestState
from ferry.config import TenantConfig

TENANT = TenantConfig(name="bench", api_key_sha256="0" * 64)


def state(prompt: bytes, *, deterministic: bool) -> RequestState:
    """A request as the router holds it after ``begin`` and a forward."""
    sampling = (("temperature", 0.0),) if deterministic else (("temperature", 0.7),)
    valid = ValidRequest(model="m", version="", tier="standard", prompt=prompt, prompt_tokens=len(prompt) // 5,
                         max_tokens=16, prefix_key="", idempotency_key="", sampling=sampling)
    s = RequestState(request_id="r", started=0.0, model_label="m", tier_label="standard", tenant=TENANT,
                     request=valid, version="v1")
    s.outcome = Outcome(text="an answer of a few words " * 4, prompt_tokens=valid.prompt_tokens,
                        completion_tokens=16, service_seconds=0.05)
    return s


def timed(requests: int, body: Callable[[int], object]) -> float:
    """Mean microseconds of ``body(i)`` over ``requests`` calls."""
    start = time.perf_counter()
    for i in range(requests):
        body(i)
    return (time.perf_counter() - start) / requests * 1e6


def run(prompt_bytes: int, requests: int) -> dict[str, float]:
    """The four cases (module docstring) for prompts of ``prompt_bytes``."""
    clock = [0.0]
    settings = CacheSettings(cache_min_requests=0, cache_enable_above=0.0, cache_disable_below=0.0)
    base = b"x" * (prompt_bytes - 8)
    prompts = [base + i.to_bytes(8, "little") for i in range(requests)]
    out: dict[str, float] = {}

    path = CachePath(CacheSettings(cache_mode="off"), clock=lambda: clock[0], registry=CollectorRegistry())
    plain = [state(p, deterministic=False) for p in prompts[:64]]
    measured = [state(p, deterministic=True) for p in prompts]

    def both(states: list[RequestState], i: int) -> None:
        s = states[i % len(states)]
        path.lookup(s)
        path.store(s)

    out["not deterministic"] = timed(requests, lambda i: both(plain, i))
    out["measured, cache off"] = timed(requests, lambda i: both(measured, i))

    path = CachePath(settings, clock=lambda: clock[0], registry=CollectorRegistry())
    hot = state(prompts[0], deterministic=True)
    for _ in range(3):  # a repeat turns the cache on, the third keeps the answer
        path.store(hot)
    assert path.enabled("m") and path.lookup(hot) is not None
    out["hit"] = timed(requests, lambda i: path.lookup(hot))
    fresh = [state(p + b"!", deterministic=True) for p in prompts]
    out["miss and keep"] = timed(requests, lambda i: both(fresh, i))
    return out


def main(argv: list[str] | None = None) -> int:
    """Run every prompt size, print the table, write the JSON."""
    p = argparse.ArgumentParser(prog="bench.cache", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--prompt-bytes", type=int, nargs="+", default=[1024, 16384])
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="bench-results/cache.json")
    args = p.parse_args(argv)
    results: dict[str, dict[str, float]] = {}
    for size in args.prompt_bytes:
        runs = [run(size, args.requests) for _ in range(args.repeats)]
        results[str(size)] = {case: min(r[case] for r in runs) for case in runs[0]}
    cases = list(next(iter(results.values())))
    print(f"{'case':<22}" + "".join(f"{size + ' B':>14}" for size in results) + "   (µs a request)")
    for case in cases:
        print(f"{case:<22}" + "".join(f"{results[size][case]:>14.2f}" for size in results))
    load = os.getloadavg()[0]
    print(f"load average {load:.2f} on {os.cpu_count()} cores")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"requests": args.requests, "repeats": args.repeats, "load": load,
                                          "microseconds": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
