"""A real fleet of processes with a tokenizer file in its catalog: every process uses it, and it shows.

One control plane, one proxy and one node (``tools.process_fleet``) share a
config whose ``[[models]]`` entry names a tokenizer built in-process: the
proxy counts prompt tokens with it, the node's simulated replica caches
blocks of its tokens (the second identical prompt reports them cached),
``ferryctl models`` (ListModels) names it, and every component's /metrics
carries ``ferry_build_info`` and the proxy's token counters moved.
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import grpc
import pytest

from ferry.tokens import load_tokenizer
from ferry.v1 import admin_pb2, common_pb2, inference_pb2
from tests.test_tokens_hf import make_tokenizer
from tools.process_fleet import Fleet

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
PROMPT = "hello, world! " * 300  # 1,200 tokens of the test tokenizer, 600 words


def scrape(address: str) -> str:
    return urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()


def sample(text: str, metric: str) -> float:
    found = re.search(rf"^{metric}{{[^}}]*model=\"chat\"[^}}]*}} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_the_catalogs_tokenizer_is_used_by_every_process(tmp_path: Path) -> None:
    path = make_tokenizer(tmp_path / "tokenizer.json")
    name = load_tokenizer(path).name
    fleet = Fleet(tmp_path, {"node-a": ["chat:v1"]},
                  config={"models": [{"name": "chat", "min_gpus": 1, "tokenizer": str(path)},
                                     {"name": "empty-model", "min_gpus": 1}]})
    try:
        fleet.start()
        channel, admin = fleet.admin()
        with channel:
            models = {m.model: m.tokenizer for m in admin.ListModels(admin_pb2.ListModelsRequest(), timeout=5).models}
        assert models == {"chat": name, "empty-model": "whitespace"}
        with grpc.insecure_channel(fleet.data_plane) as ch:
            stub = fleet.inference(ch)
            ask = inference_pb2.InferRequest(model="chat", prompt=PROMPT, max_tokens=2,
                                             tier=common_pb2.TIER_INTERACTIVE)
            metadata = (("x-api-key", fleet.keys["ent"]),)
            first = stub.Infer(ask, metadata=metadata, timeout=20)
            second = stub.Infer(ask, metadata=metadata, timeout=20)
        assert first.prompt_tokens == second.prompt_tokens == 1200  # the model's tokens, not the 600 words
        assert second.cached_prompt_tokens >= 1024 and second.replica_id == first.replica_id
        for child in fleet.children:
            assert re.search(r"^ferry_build_info\{.*\} 1\.0$", scrape(child.ready["metrics"]), re.MULTILINE)
        proxy = scrape(fleet.proxies[0].ready["metrics"])
        assert sample(proxy, "ferry_proxy_prompt_tokens_total") == 2400
        assert sample(proxy, "ferry_proxy_cached_prompt_tokens_total") == second.cached_prompt_tokens
        assert sample(proxy, "ferry_proxy_generation_tokens_total") == first.completion_tokens * 2
    finally:
        fleet.stop()
