"""``ferryctl cache`` on a ``ferry up`` fleet: a duplicate-heavy slice turns the cache on, a chat slice does not.

Two deterministic slices (:mod:`tools.cache_rate`): a classifier's prompts,
drawn with Zipf weights from 30 (model chat-small), and the bundled Mooncake
excerpt's prompts, equal exactly where the trace's are (chat-large). The
proxy measures both, turns the cache on for chat-small only, reports both
on the table watch; ``ferryctl cache`` shows the rates and the cache's state,
and the proxy's metric says the same. Then two tenants send the same payload
to chat-small: the second tenant's request reaches a replica, never the
first tenant's cached answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from ferry.procs import Child
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tests.e2e.harness import wait_for
from tools import cache_rate
from tools import trace as tracefile
from tools.fetch_traces import BUNDLED

ENV = {k: v for k, v in os.environ.items() if k not in ("FERRY_ADMIN_TOKEN", "FERRY_CONTROL_PLANE")}
CONFIG = """[proxy]
cache_min_requests = 50
cache_enable_above = 0.05
cache_disable_below = 0.03
"""
REPORT = 5.0  # a proxy's report reaches ferryctl within this (one report a second)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("cache")
    (work / "cache.toml").write_text(CONFIG)
    child = Child("up", ["up", "--replicas", "4", "--models", "chat-small,chat-large", "--config",
                         str(work / "cache.toml"), "--workdir", str(work / "fleet")], work).start()
    try:
        ready = child.wait_ready(90)
        yield {**ready, "ready_file": str(child.ready_path)}
    finally:
        child.stop()


def ctl(up: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ferry_cli.ctl.main", "--ready-file", up["ready_file"], *args],
                          capture_output=True, text=True, timeout=60, env=ENV)


def rows(up: dict[str, Any], *args: str) -> dict[str, dict[str, Any]]:
    result = ctl(up, "cache", "--json", *args)
    assert result.returncode == 0, result.stderr
    return {row["model"] + ("/" + row["tenant"] if row["tenant"] != "*" else ""): row
            for row in json.loads(result.stdout)}


def metric(up: dict[str, Any], line: str) -> bool:
    with urllib.request.urlopen(f"http://{up['metrics']['proxy']}/metrics", timeout=5) as reply:
        return line in reply.read().decode()


def test_the_duplicate_heavy_slice_turns_the_cache_on_and_the_chat_slice_does_not(up: dict[str, Any]) -> None:
    key = up["api_keys"]["enterprise-1"]
    common: dict[str, Any] = {"concurrency": 16, "deadline": 30.0, "max_tokens": 8}
    classify = asyncio.run(cache_rate.send(up["data_plane"], key, "chat-small",
                                           cache_rate.classify_slice(300, 30, seed=1), **common))
    chat = asyncio.run(cache_rate.send(up["data_plane"], key, "chat-large",
                                       cache_rate.chat_slice(tracefile.load(BUNDLED)), **common))
    assert classify == {"OK": 300} and chat == {"OK": 346}

    def settled() -> dict[str, dict[str, Any]] | None:
        got = rows(up)
        done = got.get("chat-small", {}).get("deterministic", 0) == 300 and \
            got.get("chat-large", {}).get("deterministic", 0) == 346
        return got if done else None

    got = wait_for(settled, REPORT, "both slices in ferryctl cache")
    small, large = got["chat-small"], got["chat-large"]
    assert small["duplicate_share"] > 0.5 and small["cache"] == "on (1/1)"
    assert small["saved_gpu_s"] > 0 and small["hits_per_s"] > 0 and 0 < small["hits"] <= small["duplicates"]
    assert large["duplicates"] == 3 and large["duplicate_share"] == round(3 / 346, 4)  # the excerpt's 3 repeats
    assert large["cache"] == "off (0/1)" and large["hits_per_s"] == 0
    assert metric(up, 'ferry_proxy_cache_enabled{model="chat-small"} 1.0')
    assert metric(up, 'ferry_proxy_cache_enabled{model="chat-large"} 0.0')
    by_tenant = rows(up, "--by-tenant", "--model", "chat-small")
    assert set(by_tenant) == {"chat-small/enterprise-1"}
    human = ctl(up, "cache")
    assert human.returncode == 0 and human.stdout.split()[:3] == ["MODEL", "TENANT", "DETERMINISTIC_PER_S"]
    print(human.stdout)  # the figures of the closing note (pytest -s)


def test_a_tenant_never_reads_another_tenants_cached_answer(up: dict[str, Any]) -> None:
    wait_for(lambda: metric(up, 'ferry_proxy_cache_enabled{model="chat-small"} 1.0'), 60, "the cache on")
    request = inference_pb2.InferRequest(model="chat-small", prompt="is this ticket about billing?", max_tokens=6,
                                         temperature=0.0, tier=common_pb2.TIER_STANDARD)
    with grpc.insecure_channel(up["data_plane"]) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)

        def infer(tenant: str) -> Any:
            return stub.Infer(request, metadata=(("x-api-key", up["api_keys"][tenant]),), timeout=10)

        first, again = infer("enterprise-1"), infer("enterprise-1")
        assert first.replica_id and again.replica_id == "" and again.text == first.text  # a hit
        other = infer("paid-1")
        assert other.replica_id and other.attempts == 1  # from a replica, not enterprise-1's entry
        assert infer("paid-1").replica_id == ""  # its own entry now
        assert infer("free-1").replica_id  # and the third tenant's first one is its own again


def test_a_bad_filter_is_refused_naming_the_field(up: dict[str, Any]) -> None:
    result = ctl(up, "cache", "--model", "bad\tname")
    assert result.returncode == 1 and "model" in result.stderr
