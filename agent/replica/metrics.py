"""The Prometheus text of one simulated replica, under Triton's, TensorRT-LLM's, vLLM's and SGLang's metric names.

So that the agent reads a simulated replica and a real Triton server the same
way, the names and label sets are those of Triton (``model``, ``version``)
and of its TensorRT-LLM backend (``request_type``, ``kv_cache_block_type``);
and so that the agent's OpenAI-HTTP adapter (:mod:`agent.openai`) reads it as
it reads a vLLM or SGLang server, the same values are also exported under
their names (label ``model_name``):

- ``nv_inference_request_success``, ``nv_inference_request_failure{reason}``
  (``REJECTED``, ``CANCELED``), ``nv_inference_count``,
  ``nv_inference_exec_count`` (engine steps), ``nv_inference_request_duration_us``,
  ``nv_inference_queue_duration_us``, ``nv_inference_compute_infer_duration_us``
  (counters), ``nv_inference_pending_request_count`` (gauge: the queue);
- ``nv_trt_llm_request_metrics{request_type=active|max|scheduled|context|waiting}``;
- ``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max|free|used|tokens_per|fraction}``;
- ``nv_gpu_utilization{gpu_uuid}``: the share of the last second in steps;
- ferry's own counters ``ferry_replica_prefix_hit_blocks_total`` and
  ``ferry_replica_prefix_lookup_blocks_total``;
- the engine's step counters, what the step-time model is linear in, as the
  agent reads them (:mod:`agent.stepcounters`; docs/engine.md, "Counters", names the real engines'
  equivalents): ``ferry_replica_prefill_steps_total``,
  ``ferry_replica_prefill_tokens_total`` (uncached tokens prefilled),
  ``ferry_replica_decode_steps_total``, ``ferry_replica_decode_tokens_total``
  (requests decoding, summed over steps), ``ferry_replica_step_seconds_total``
  (the wall time of the steps, :mod:`agent.replica.runner`), and the gauge
  ``ferry_replica_max_step_tokens`` (the chunked-prefill budget, 0: none),
  ``ferry_replica_prefix_cache_blocks`` (the prefix cache's size in blocks);
- vLLM's ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` (used blocks / blocks, 0..1),
  ``vllm:cache_config_info{block_size, num_gpu_blocks}`` (1) and
  ``vllm:request_success_total{finished_reason="length"}``;
- SGLang's ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
  ``sglang:token_usage`` (the same fraction) and ``sglang:num_requests_total``.

Cost: O(1) per render (about fifty lines).
"""

from __future__ import annotations

from agent.replica.engine import EngineLoad
from agent.replica.runner import RunnerStats

_HELP = {
    "nv_inference_request_success": ("counter", "Number of successful inference requests, all batch sizes"),
    "nv_inference_request_failure": ("counter", "Number of failed inference requests, all batch sizes"),
    "nv_inference_count": ("counter", "Number of inferences performed (does not include cached requests)"),
    "nv_inference_exec_count": ("counter", "Number of model executions performed (engine steps)"),
    "nv_inference_request_duration_us": ("counter", "Cumulative inference request duration in microseconds"),
    "nv_inference_queue_duration_us": ("counter", "Cumulative inference queuing duration in microseconds"),
    "nv_inference_compute_infer_duration_us": ("counter", "Cumulative compute inference duration in microseconds"),
    "nv_inference_pending_request_count": ("gauge", "Instantaneous number of pending requests awaiting execution"),
    "nv_trt_llm_request_metrics": ("gauge", "TRT LLM request metrics"),
    "nv_trt_llm_kv_cache_block_metrics": ("gauge", "TRT LLM KV cache block metrics"),
    "nv_gpu_utilization": ("gauge", "GPU utilization rate [0.0 - 1.0)"),
    "ferry_replica_prefix_hit_blocks_total": ("counter", "Prompt blocks served from the prefix cache"),
    "ferry_replica_prefix_lookup_blocks_total": ("counter", "Prompt blocks looked up in the prefix cache"),
    "ferry_replica_prefill_steps_total": ("counter", "Engine steps that prefilled prompt tokens"),
    "ferry_replica_prefill_tokens_total": ("counter", "Uncached prompt tokens prefilled"),
    "ferry_replica_decode_steps_total": ("counter", "Engine steps that decoded"),
    "ferry_replica_decode_tokens_total": ("counter", "Requests decoding, summed over engine steps"),
    "ferry_replica_step_seconds_total": ("counter", "Wall time of the engine's steps in seconds"),
    "ferry_replica_max_step_tokens": ("gauge", "Prompt tokens one engine step prefills at most (0: no limit)"),
    "ferry_replica_prefix_cache_blocks": ("gauge", "Blocks the prefix cache holds at most"),
    "vllm:num_requests_running": ("gauge", "Number of requests in model execution batches."),
    "vllm:num_requests_waiting": ("gauge", "Number of requests waiting to be processed."),
    "vllm:kv_cache_usage_perc": ("gauge", "KV-cache usage. 1 means 100 percent usage."),
    "vllm:cache_config_info": ("gauge", "Information of the LLMEngine CacheConfig"),
    "vllm:request_success_total": ("counter", "Count of successfully processed requests."),
    "sglang:num_running_reqs": ("gauge", "The number of running requests."),
    "sglang:num_queue_reqs": ("gauge", "The number of requests in the waiting queue."),
    "sglang:token_usage": ("gauge", "The token usage."),
    "sglang:num_requests_total": ("counter", "Number of requests processed."),
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(*, model: str, version: str, load: EngineLoad, stats: RunnerStats, utilization: float,
           gpu_uuid: str) -> str:
    """The exposition text of one replica."""
    base = {"model": model, "version": version}
    us = 1e6
    rows: list[tuple[str, dict[str, str], float]] = [
        ("nv_inference_request_success", base, stats.success),
        ("nv_inference_request_failure", {**base, "reason": "REJECTED"}, stats.rejected),
        ("nv_inference_request_failure", {**base, "reason": "CANCELED"}, stats.cancelled),
        ("nv_inference_count", base, stats.success),
        ("nv_inference_exec_count", base, load.steps),
        ("nv_inference_request_duration_us", base, round((stats.queue_seconds + stats.compute_seconds) * us)),
        ("nv_inference_queue_duration_us", base, round(stats.queue_seconds * us)),
        ("nv_inference_compute_infer_duration_us", base, round(stats.compute_seconds * us)),
        ("nv_inference_pending_request_count", base, load.queued),
    ]
    requests = {"active": load.running, "max": load.max_running, "scheduled": load.running,
                "context": load.context, "waiting": load.queued}
    rows += [("nv_trt_llm_request_metrics", {**base, "request_type": k}, v) for k, v in requests.items()]
    used = load.kv_blocks_total - load.kv_blocks_free
    blocks = {"max": load.kv_blocks_total, "free": load.kv_blocks_free, "used": used,
              "tokens_per": load.kv_block_tokens, "fraction": used / load.kv_blocks_total}
    rows += [("nv_trt_llm_kv_cache_block_metrics", {**base, "kv_cache_block_type": k}, v) for k, v in blocks.items()]
    rows += [
        ("nv_gpu_utilization", {"gpu_uuid": gpu_uuid}, utilization),
        ("ferry_replica_prefix_hit_blocks_total", base, load.prefix_hit_blocks),
        ("ferry_replica_prefix_lookup_blocks_total", base, load.prefix_lookup_blocks),
        ("ferry_replica_prefill_steps_total", base, load.prefill_steps),
        ("ferry_replica_prefill_tokens_total", base, load.prefill_tokens),
        ("ferry_replica_decode_steps_total", base, load.decode_steps),
        ("ferry_replica_decode_tokens_total", base, load.decode_tokens),
        ("ferry_replica_step_seconds_total", base, round(stats.step_seconds, 6)),
        ("ferry_replica_max_step_tokens", base, load.max_step_tokens),
        ("ferry_replica_prefix_cache_blocks", base, load.prefix_cache_blocks),
    ]
    engine = {"model_name": model}
    usage = used / load.kv_blocks_total
    cache = {**engine, "block_size": str(load.kv_block_tokens), "num_gpu_blocks": str(load.kv_blocks_total)}
    rows += [
        ("vllm:num_requests_running", engine, load.running),
        ("vllm:num_requests_waiting", engine, load.queued),
        ("vllm:kv_cache_usage_perc", engine, usage),
        ("vllm:cache_config_info", cache, 1),
        ("vllm:request_success_total", {**engine, "finished_reason": "length"}, stats.success),
        ("sglang:num_running_reqs", engine, load.running),
        ("sglang:num_queue_reqs", engine, load.queued),
        ("sglang:token_usage", engine, usage),
        ("sglang:num_requests_total", engine, stats.success),
    ]
    lines: list[str] = []
    seen: set[str] = set()
    for name, labels, value in rows:
        if name not in seen:
            seen.add(name)
            kind, text = _HELP[name]
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
        lines.append(f"{name}{{{label_text}}} {value}")
    return "\n".join(lines) + "\n"
