"""The proxy's Prometheus metrics, in one object so that a test can give each proxy its own registry.

| name | type | labels |
| --- | --- | --- |
| ``ferry_proxy_requests_total`` | counter | model, tier, status (gRPC code name) |
| ``ferry_proxy_request_duration_seconds`` | histogram | model, tier |
| ``ferry_proxy_ttft_seconds`` | histogram | model, tier |
| ``ferry_proxy_tpot_seconds`` | histogram of the time per output token after the first (streams) | model, tier |
| ``ferry_proxy_prompt_tokens_total`` | counter of answered requests' prompt tokens | model, tier |
| ``ferry_proxy_generation_tokens_total`` | counter of tokens generated for answered requests | model, tier |
| ``ferry_proxy_cached_prompt_tokens_total`` | counter of prompt tokens served from the prefix cache | model, tier |
| ``ferry_proxy_picks_total`` | counter | model, branch (:class:`dataplane.pick.p2c.Branch`) |
| ``ferry_proxy_retries_total`` | counter | model, reason (failure kind) |
| ``ferry_proxy_retry_budget_exhausted_total`` | counter | model |
| ``ferry_proxy_spilled_total`` | counter | from, to (regions) |
| ``ferry_proxy_outlier_ejections_total`` | counter | model, reason (failures, latency) |
| ``ferry_proxy_stream_continuations_total`` | counter | model, outcome (continued, cut, preempted) |
| ``ferry_proxy_guardrail_seconds`` | histogram of each hook call (:mod:`dataplane.guard.hooks`) | hook, stage |
| ``ferry_proxy_guardrail_verdicts_total`` | counter | hook, stage, verdict (allow, deny, redact, failed_*) |
| ``ferry_proxy_inflight`` | gauge | |
| ``ferry_proxy_table_version`` | gauge | |
| ``ferry_proxy_table_age_seconds`` | gauge (read at scrape) | |
| ``ferry_proxy_table_rejections_total`` | counter | |
| ``ferry_proxy_telemetry_age_seconds`` | histogram of the picked replica's telemetry age | |
| ``ferry_proxy_pick_step_seconds`` | histogram of each decision step (:class:`PickSteps`) | step, branch |
| ``ferry_proxy_trace_spans_total`` | counter of trace spans (dataplane.tracing) | outcome (exported, dropped, failed) |

Token counts are the replica's when it reports them (``ferry_*_tokens``
response parameters, docs/CONTRACTS.md), else the proxy's own with the
model's tokenizer (:mod:`dataplane.intake.tokenwork`); a replica that reports
no cached tokens adds none. The time per output token is
``(duration - ttft) / (completion_tokens - 1)`` of a successful request
with more than one token and output before its end (a unary answer's first
token is its whole answer, so it has none).

The model label is a model the table names, or ``_unknown`` (requests that
fail before the model is resolved), so clients cannot grow the label set.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from ferry.metrics import LATENCY_BUCKETS, TPOT_BUCKETS, BoundedLabel, name, register_build_info

UNKNOWN = "_unknown"
STEP_BUCKETS = (5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 0.025)
AGE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)


class ProxyMetrics:
    """Every metric of one proxy, registered in ``registry`` (the default one when None)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = registry if registry is not None else REGISTRY
        self.registry = reg
        register_build_info(reg)  # ferry_build_info, also in a test's own registry
        self.requests = Counter(
            name("proxy_requests_total"), "Requests answered, by final gRPC status.",
            ["model", "tier", "status"], registry=reg,
        )
        self.ignored_fields = Counter(
            name("proxy_ignored_fields_total"), "Fields of OpenAI bodies that OpenAI does not define, left out "
            "(the first 64 names seen; the others as _other).", ["field"], registry=reg,
        )
        self.ignored_field = BoundedLabel(64)
        self.duration = Histogram(
            name("proxy_request_duration_seconds"), "Time from arrival to the last byte.",
            ["model", "tier"], buckets=LATENCY_BUCKETS, registry=reg,
        )
        self.ttft = Histogram(
            name("proxy_ttft_seconds"), "Time from arrival to the first output.",
            ["model", "tier"], buckets=LATENCY_BUCKETS, registry=reg,
        )
        self.tpot = Histogram(
            name("proxy_tpot_seconds"), "Time per output token after the first (inter-token latency), streams.",
            ["model", "tier"], buckets=TPOT_BUCKETS, registry=reg,
        )
        self.prompt_tokens = Counter(
            name("proxy_prompt_tokens_total"), "Prompt tokens of answered requests.", ["model", "tier"], registry=reg,
        )
        self.generation_tokens = Counter(
            name("proxy_generation_tokens_total"), "Tokens generated for answered requests.", ["model", "tier"],
            registry=reg,
        )
        self.cached_tokens = Counter(
            name("proxy_cached_prompt_tokens_total"), "Prompt tokens the replica served from its prefix cache.",
            ["model", "tier"], registry=reg,
        )
        self.picks = Counter(
            name("proxy_picks_total"), "Picks, by branch.", ["model", "branch"], registry=reg,
        )
        self.retries = Counter(
            name("proxy_retries_total"), "Attempts retried on another replica.", ["model", "reason"], registry=reg,
        )
        self.retry_budget_exhausted = Counter(
            name("proxy_retry_budget_exhausted_total"), "Retries or continuations refused by the retry budget.",
            ["model"], registry=reg,
        )
        self.spilled = Counter(
            name("proxy_spilled_total"), "Requests sent to another region's replica (dataplane.regions.choice).",
            ["from", "to"], registry=reg,
        )
        self.ejections = Counter(
            name("proxy_outlier_ejections_total"), "Replicas ejected by outlier detection.",
            ["model", "reason"], registry=reg,
        )
        self.continuations = Counter(
            name("proxy_stream_continuations_total"), "Streams cut mid-way, by what happened next.",
            ["model", "outcome"], registry=reg,
        )
        self.guard_seconds = Histogram(
            name("proxy_guardrail_seconds"), "Time of each guardrail hook call.", ["hook", "stage"],
            buckets=LATENCY_BUCKETS, registry=reg,
        )
        self.guard_verdicts = Counter(
            name("proxy_guardrail_verdicts_total"), "Guardrail hook verdicts.", ["hook", "stage", "verdict"],
            registry=reg,
        )
        self.inflight = Gauge(name("proxy_inflight"), "Requests in flight in this proxy.", registry=reg)
        self.table_version = Gauge(name("proxy_table_version"), "Version of the applied table.", registry=reg)
        self.table_age = Gauge(name("proxy_table_age_seconds"), "Seconds since a table was applied.", registry=reg)
        self.table_rejections = Counter(
            name("proxy_table_rejections_total"), "Snapshots rejected by validation.", registry=reg,
        )
        self.telemetry_age = Histogram(
            name("proxy_telemetry_age_seconds"), "Telemetry age of the picked replica at pick time.",
            buckets=AGE_BUCKETS, registry=reg,
        )
        self.trace_spans = Counter(
            name("proxy_trace_spans_total"), "Request spans by what became of them (dataplane.tracing).",
            ["outcome"], registry=reg,
        )

        self.pick_steps = PickSteps(Histogram(
            name("proxy_pick_step_seconds"), "Time of each step of the decision (dataplane.pick.decide), by the "
            "branch the decision took (region step: region or local).", ["step", "branch"],
            buckets=STEP_BUCKETS, registry=reg,
        ))

    def watch_table_age(self, age: Callable[[], float]) -> None:
        """Read the table age from ``age`` at every scrape."""
        self.table_age.set_function(age)

    def value(self, metric: str, **labels: str) -> float:
        """A sample's current value (0 when absent): for tests and diagnostics."""
        found = self.registry.get_sample_value(name(metric), labels)
        return float(found) if found is not None else 0.0


class PickSteps:
    """The decision's step times (:class:`dataplane.pick.plugin.Steps`): one histogram, its children cached.

    Labels are bounded: ``step`` is one of :data:`dataplane.pick.plugin.STEPS`, ``branch`` one of
    :class:`dataplane.pick.p2c.Branch` or ``local`` (the region step kept the request here).
    """

    def __init__(self, histogram: Histogram) -> None:
        self.histogram = histogram
        self._children: dict[tuple[str, str], Any] = {}

    def observe(self, step: str, branch: str, seconds: float) -> None:
        """One step of one decision took ``seconds``."""
        child = self._children.get((step, branch))
        if child is None:
            child = self._children[(step, branch)] = self.histogram.labels(step, branch)
        child.observe(seconds)
