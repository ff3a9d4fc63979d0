"""The reference guardrail hook (``python -m tools.guardrail``) in front of a real ``ferry up`` fleet.

A prompt hook denies one keyword for every tier; an output hook redacts a
word of the simulated replicas' text in batch answers, 8 tokens at a time.
Over gRPC and over HTTP with the official ``openai`` client: a denied prompt
is PERMISSION_DENIED (HTTP 403) with the hook's reason, an allowed one is
answered, a batch answer comes back redacted, and the proxy's metrics count
each verdict.
"""

from __future__ import annotations

import secrets
import urllib.request
from pathlib import Path

import grpc
import openai
import pytest
from tomli_w import dumps

from ferry.config import hash_api_key
from ferry.procs import Child, stop_all
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tools.process_fleet import FAST_REPLICA

pytestmark = pytest.mark.timeout(180)


def test_reference_hook_in_ferry_up(tmp_path: Path) -> None:
    key = "fk_" + secrets.token_hex(8)
    hook = Child("guardrail", ["--deny", "forbidden", "--redact", "ferry"], tmp_path, module="tools.guardrail")
    children = [hook.start()]
    try:
        address = hook.wait_ready(30)["address"]
        config = {
            "tenants": [{"name": "ent", "api_key_sha256": hash_api_key(key), "plan": "enterprise"}],
            "models": [{"name": "chat", "min_gpus": 1}],
            "guardrails": [
                {"name": "keywords", "address": address, "stage": "prompt", "timeout_ms": 2000.0},
                {"name": "answers", "address": address, "stage": "output", "tiers": ["batch"], "every_tokens": 8,
                 "timeout_ms": 2000.0},
            ],
            "replica": dict(FAST_REPLICA),
        }
        (tmp_path / "user.toml").write_text(dumps(config))
        up = Child("up", ["up", "--replicas", "2", "--models", "chat", "--config", str(tmp_path / "user.toml"),
                          "--workdir", str(tmp_path / "fleet")], tmp_path)
        children.append(up.start())
        ready = up.wait_ready(90)
        metadata = (("x-api-key", key),)
        with grpc.insecure_channel(ready["data_plane"]) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            with pytest.raises(grpc.RpcError) as info:
                stub.Infer(inference_pb2.InferRequest(model="chat", prompt="something forbidden", max_tokens=4),
                           metadata=metadata, timeout=20)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert info.value.details() == "guardrail 'keywords' refused the prompt: matched deny rule 1"
            fine = stub.Infer(inference_pb2.InferRequest(model="chat", prompt="something fine", max_tokens=12),
                              metadata=metadata, timeout=20)
            assert fine.completion_tokens == 12 and "ferry" in fine.text  # standard: no output hook
            batch = stub.Infer(inference_pb2.InferRequest(model="chat", prompt="something fine", max_tokens=12,
                                                          tier=common_pb2.TIER_BATCH), metadata=metadata, timeout=20)
            assert "ferry" not in batch.text and "[redacted]" in batch.text
            chunks = list(stub.InferStream(inference_pb2.InferRequest(
                model="chat", prompt="something fine", max_tokens=20, tier=common_pb2.TIER_BATCH),
                metadata=metadata, timeout=20))
            streamed = "".join(c.text for c in chunks)
            assert "ferry" not in streamed and "[redacted]" in streamed
            assert chunks[-1].final and chunks[-1].summary.completion_tokens == 20
        client = openai.OpenAI(base_url=f"http://{ready['http']}/v1", api_key=key, max_retries=0, timeout=30)
        with pytest.raises(openai.PermissionDeniedError) as denied:
            client.completions.create(model="chat", prompt="a forbidden request", max_tokens=4)
        assert denied.value.status_code == 403
        assert "guardrail 'keywords' refused the prompt" in str(denied.value)
        assert denied.value.code == "guardrail_denied"
        proxy = next(iter(ready["proxies"]))
        metrics = urllib.request.urlopen(f"http://{ready['metrics'][proxy]}/metrics", timeout=5).read()
        text = metrics.decode()
        assert 'ferry_proxy_guardrail_verdicts_total{hook="keywords",stage="prompt",verdict="deny"} 2.0' in text
        assert 'ferry_proxy_guardrail_verdicts_total{hook="answers",stage="output",verdict="redact"}' in text
    finally:
        stop_all(children)
