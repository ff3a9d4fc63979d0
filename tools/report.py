"""Results of replayed requests and the report made of them.

Percentiles are nearest-rank. The prefix-cache hit ratio of a replica is the
prompt tokens it served from its prefix cache over all prompt tokens it got
(``cached_prompt_tokens / prompt_tokens`` from the responses).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from typing import Any


@dataclasses.dataclass
class Result:
    """What happened to one request."""

    index: int
    model: str
    tier: str
    stream: bool
    late_s: float = 0.0
    sent_s: float = 0.0           # when it was sent, seconds after the replay started
    status: str = "UNKNOWN"
    detail: str = ""
    latency_s: float = 0.0
    ttft_s: float | None = None
    replica: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    attempts: int = 0

    def fill(self, response: Any) -> None:
        """Copy the fields of an ``InferResponse``."""
        self.replica = response.replica_id
        self.prompt_tokens = response.prompt_tokens
        self.cached_tokens = response.cached_prompt_tokens
        self.completion_tokens = response.completion_tokens
        self.attempts = response.attempts
        if response.ttft_seconds:
            self.ttft_s = response.ttft_seconds


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile ``p`` (0–100) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def _ms(values: list[float]) -> dict[str, float]:
    return {f"p{p}_ms": round(percentile(values, p) * 1000, 1) for p in (50, 95, 99)}


def summarize(results: list[Result], elapsed: float) -> dict[str, Any]:
    """The report as a JSON-ready dict."""
    ok = [r for r in results if r.status == "OK"]
    per_replica: dict[str, dict[str, int]] = defaultdict(lambda: {"requests": 0, "prompt": 0, "cached": 0})
    for r in ok:
        row = per_replica[r.replica]
        row["requests"] += 1
        row["prompt"] += r.prompt_tokens
        row["cached"] += r.cached_tokens
    prompt = sum(r.prompt_tokens for r in ok)
    return {
        "requests": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "errors_by_status": dict(Counter(r.status for r in results if r.status != "OK")),
        "error_examples": sorted({f"{r.status}: {r.detail}" for r in results if r.status != "OK"})[:5],
        "elapsed_s": round(elapsed, 2),
        "throughput_rps": round(len(ok) / elapsed, 2) if elapsed > 0 else 0.0,
        "output_tokens_per_s": round(sum(r.completion_tokens for r in ok) / elapsed, 1) if elapsed > 0 else 0.0,
        "latency": _ms([r.latency_s for r in ok]),
        "ttft": _ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        "by_tier": {t: {"requests": sum(r.tier == t for r in results), **_ms([r.latency_s for r in ok if r.tier == t])}
                    for t in sorted({r.tier for r in results})},
        "retried": sum(r.attempts > 1 for r in ok),
        "max_late_s": round(max((r.late_s for r in results), default=0.0), 3),
        "prefix_hit_ratio": round(sum(r.cached_tokens for r in ok) / prompt, 4) if prompt else 0.0,
        "replicas": {rid: {"requests": v["requests"],
                           "hit_ratio": round(v["cached"] / v["prompt"], 4) if v["prompt"] else 0.0}
                     for rid, v in sorted(per_replica.items())},
    }


def print_report(report: dict[str, Any]) -> None:
    """Print the report for a person."""
    print(f"\nrequests {report['requests']}   ok {report['ok']}   errors {report['errors']}"
          f"   elapsed {report['elapsed_s']} s   throughput {report['throughput_rps']} req/s"
          f"   output {report['output_tokens_per_s']} tok/s   retried {report['retried']}")
    for status, n in sorted(report["errors_by_status"].items()):
        print(f"  {status}: {n}")
    for example in report["error_examples"]:
        print(f"  e.g. {example}")
    for name in ("latency", "ttft"):
        v = report[name]
        print(f"{name:<8} p50 {v['p50_ms']:>8.1f} ms   p95 {v['p95_ms']:>8.1f} ms   p99 {v['p99_ms']:>8.1f} ms")
    for tier, v in report["by_tier"].items():
        print(f"  {tier:<12} {v['requests']:>5} requests   latency p50 {v['p50_ms']:.1f} ms   p99 {v['p99_ms']:.1f} ms")
    print(f"prefix-cache hit ratio {report['prefix_hit_ratio']:.1%} of prompt tokens")
    print(f"{'replica':<16} {'requests':>8} {'hit ratio':>10}")
    for rid, v in report["replicas"].items():
        print(f"{rid:<16} {v['requests']:>8} {v['hit_ratio']:>10.1%}")
