"""The recorded TensorRT-LLM metrics sample (tests/fixtures/trtllm_metrics.txt) parses and holds together.

The sample follows the TensorRT-LLM Triton backend's metric families (see
docs/triton.md); the agent's metrics adapter is tested against it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.triton, pytest.mark.timeout(10)]

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "trtllm_metrics.txt"


def families() -> dict[str, tuple[str, dict[tuple[tuple[str, str], ...], float]]]:
    """{family: (type, {sorted labels (less model and version): value})} of the model ``tensorrt_llm``."""
    out: dict[str, tuple[str, dict[tuple[tuple[str, str], ...], float]]] = {}
    for family in text_string_to_metric_families(FIXTURE.read_text()):
        samples = out.setdefault(family.name, (family.type, {}))[1]
        for s in family.samples:
            if s.labels.get("model", "tensorrt_llm") == "tensorrt_llm":
                labels = {k: v for k, v in s.labels.items() if k not in ("model", "version")}
                samples[(("sample", s.name), *sorted(labels.items()))] = s.value
    return out


def value(fams: dict, family: str, **labels: str) -> float:
    type_, samples = fams[family]
    name = family + ("_total" if type_ == "counter" else "")
    return samples[(("sample", name), *sorted(labels.items()))]


def test_every_family_of_the_backend_and_of_triton_is_there() -> None:
    fams = families()
    expected = {
        "nv_trt_llm_request_metrics": "gauge",
        "nv_trt_llm_runtime_memory_metrics": "gauge",
        "nv_trt_llm_kv_cache_block_metrics": "gauge",
        "nv_trt_llm_disaggregated_serving_metrics": "counter",
        "nv_trt_llm_inflight_batcher_metrics": "gauge",
        "nv_trt_llm_general_metrics": "gauge",
        "nv_llm_input_token_len": "histogram",
        "nv_llm_output_token_len": "histogram",
        "nv_inference_request_success": "counter",
        "nv_inference_count": "counter",
        "nv_inference_queue_duration_us": "counter",
        "nv_inference_pending_request_count": "gauge",
        "nv_gpu_utilization": "gauge",
    }
    assert {name: fams[name][0] for name in expected} == expected
    request_types = {dict(k[1:])["request_type"] for k in fams["nv_trt_llm_request_metrics"][1]}
    assert request_types == {"active", "max", "scheduled", "context", "waiting"}
    block_types = {dict(k[1:])["kv_cache_block_type"] for k in fams["nv_trt_llm_kv_cache_block_metrics"][1]}
    assert block_types == {"max", "free", "used", "tokens_per", "reused", "fraction"}


def test_the_values_hold_together() -> None:
    fams = families()
    kv = "nv_trt_llm_kv_cache_block_metrics"
    blocks_max = value(fams, kv, kv_cache_block_type="max")
    blocks_free = value(fams, kv, kv_cache_block_type="free")
    blocks_used = value(fams, kv, kv_cache_block_type="used")
    assert blocks_free + blocks_used == blocks_max
    assert value(fams, kv, kv_cache_block_type="fraction") == pytest.approx(blocks_used / blocks_max, abs=0.005)
    req = "nv_trt_llm_request_metrics"
    assert value(fams, req, request_type="active") <= value(fams, req, request_type="max")
    ifb = "nv_trt_llm_inflight_batcher_metrics"
    assert value(fams, req, request_type="scheduled") == value(fams, req, request_type="context") + value(
        fams, ifb, inflight_batcher_specific_metric="generation_requests"
    )
    assert value(fams, "nv_inference_request_success") == 5210
    assert 0 < value(fams, "nv_gpu_utilization", gpu_uuid="GPU-5f0f3a52-0c51-7a7e-9f2b-7c1c2f9a4d10") <= 1
