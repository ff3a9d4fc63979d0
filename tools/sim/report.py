"""Figures of simulated runs: the row of ``bench-results/simulate-<trace>.json``.

:func:`summarize` takes the runs of one policy at one load, one per seed,
and pools their requests: percentiles are over every request of every run,
so that a tail of 1 % rests on hundreds of requests rather than one run's
hundred. Per-run ratios (load, utilisation) are averaged over the runs.

- ``ttft_p50_ms``, ``ttft_p99_ms``, ``e2e_p50_ms``, ``e2e_p99_ms``: nearest-rank
  percentiles (:func:`tools.report.percentile`) over every request; a
  rejected request counts as infinitely slow (a policy cannot improve its
  tail by getting requests refused; a percentile that falls on one is null),
  and ``rejected`` says how many.
- ``hit_ratio``: prompt tokens served from the replicas' prefix caches over
  all prompt tokens (as :mod:`tools.report` computes it from responses).
- ``max_mean_load``: the busiest replica's load over the mean, where a
  replica's load is its queued + running requests averaged over the
  telemetry samples: what the bound of bounded-load hashing limits.
  ``max_mean_requests`` is the same for requests routed.
- ``utilisation``: engine busy time over replicas x makespan.
- ``branches``: share of requests per branch label of the policy.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from tools.report import percentile
from tools.sim.fleet import RunResult


def _ms(values: list[float], p: float) -> float | None:
    value = percentile(values, p)
    return round(value * 1000, 1) if math.isfinite(value) else None  # None (JSON null): past the refusals


def _ratio(values: list[float]) -> float:
    mean = sum(values) / len(values) if values else 0.0
    return round(max(values) / mean, 3) if mean > 0 else 1.0


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarize(results: Sequence[RunResult]) -> dict[str, Any]:
    """The figures of the runs (one per seed) of one policy at one load; see the module docstring."""
    served = [s for r in results for s in r.served]
    ttft = [math.inf if s.rejected or math.isnan(s.ttft) else s.ttft for s in served]
    e2e = [math.inf if s.rejected or math.isnan(s.e2e) else s.e2e for s in served]
    prompt = sum(q.prompt_tokens for r in results for q in r.requests)
    cached = sum(s.cached_tokens for s in served)
    branches = Counter(s.branch for s in served)
    n = len(served) or 1
    per_run_requests = [_ratio([float(Counter(s.replica for s in r.served).get(i, 0)) for i in range(len(r.loads))])
                        for r in results]
    utilisation = [sum(load.busy_seconds for load in r.loads) / (len(r.loads) * r.makespan)
                   for r in results if r.makespan > 0]
    return {
        "requests": len(served),
        "runs": len(results),
        "rejected": sum(s.rejected for s in served),
        "ttft_p50_ms": _ms(ttft, 50),
        "ttft_p99_ms": _ms(ttft, 99),
        "e2e_p50_ms": _ms(e2e, 50),
        "e2e_p99_ms": _ms(e2e, 99),
        "hit_ratio": round(cached / prompt, 4) if prompt else 0.0,
        "max_mean_load": round(_mean([_ratio(list(r.mean_outstanding)) for r in results]), 3),
        "max_mean_requests": round(_mean(per_run_requests), 3),
        "utilisation": round(_mean(utilisation), 4),
        "makespan_s": round(_mean([r.makespan for r in results]), 1),
        "branches": {b: round(c / n, 4) for b, c in sorted(branches.items())},
    }
