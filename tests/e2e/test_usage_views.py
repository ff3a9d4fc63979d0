"""``ferryctl top``, ``tiers`` and ``spill`` against fleets started by ``ferry up``, in both output modes.

The proxies report their usage on the table watch every second; the control
plane merges it (controlplane.tables.usage). One region with bounded traffic for
top and tiers; three regions (round trips configured by ``ferry up``) for
the spill pairs, and one region has none.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ferry.procs import Child
from ferry.v1 import admin_pb2, common_pb2, inference_pb2, inference_pb2_grpc
from ferry_cli.ctl import flow as ctlflow
from tests.e2e.harness import wait_for

ENV = {k: v for k, v in os.environ.items() if k not in ("FERRY_ADMIN_TOKEN", "FERRY_CONTROL_PLANE")}
MAX_REQUESTS = 3000  # the traffic thread stops after this many, or when told


def start_up(work: Path, *args: str) -> tuple[Child, dict[str, Any]]:
    child = Child("up", ["up", *args, "--workdir", str(work / "fleet")], work).start()
    try:
        ready = child.wait_ready(90)
    except BaseException:
        child.stop()
        raise
    return child, {**ready, "ready_file": str(child.ready_path)}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    child, ready = start_up(tmp_path_factory.mktemp("usage"), "--replicas", "2")
    try:
        yield ready
    finally:
        child.stop()


def ctl(up: dict[str, Any], *args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "ferry_cli.ctl.main", "--ready-file", up["ready_file"], *args],
                            capture_output=True, text=True, timeout=60, env=ENV)
    assert result.returncode == 0, result.stderr
    return result.stdout


class Traffic:
    """Standard-tier requests for chat-small in a thread, one at a time, until stopped (bounded)."""

    def __init__(self, up: dict[str, Any]) -> None:
        self.up = up
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        request = inference_pb2.InferRequest(model="chat-small", prompt="a b c", max_tokens=2,
                                             tier=common_pb2.TIER_STANDARD)
        metadata = (("x-api-key", self.up["api_keys"]["paid-1"]),)
        with grpc.insecure_channel(self.up["data_plane"]) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            while not self.stop.is_set() and self.sent < MAX_REQUESTS:
                stub.Infer(request, metadata=metadata, timeout=10)
                self.sent += 1

    def __enter__(self) -> Traffic:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(15)


def test_top_shows_rate_and_p99_from_the_proxies(up: dict[str, Any]) -> None:
    with Traffic(up) as traffic:
        wait_for(lambda: traffic.sent > 0, 10, "the first request of the traffic")
        frames = [json.loads(line) for line in ctl(up, "top", "--iterations", "3", "--json").splitlines()]
        tiered = [json.loads(line) for line in ctl(up, "top", "--iterations", "1", "--json", "--by-tier")
                  .splitlines()]
        human = ctl(up, "top", "--iterations", "1", "--by-tier")
    assert traffic.sent > 0 and len(frames) == 3
    rows = [{r["model"]: r for r in f["rows"]} for f in frames]
    assert all(set(r) == {"chat-large", "chat-small"} for r in rows)
    small = [r["chat-small"] for r in rows]
    assert max(r["rate_per_s"] for r in small) > 0
    assert any(r["p99_ms"] is not None and r["p99_ms"] > 0 for r in small)
    assert all(r["shed"] == 0 and r["errors"] == 0 for r in small)
    assert all(r["chat-large"]["rate_per_s"] == 0 and r["chat-large"]["p99_ms"] is None for r in rows)
    assert {"queue", "queue_replicas", "queue_proxies", "running", "kv_util", "gpu_util", "ready",
            "replica_rate_per_s"} <= set(small[0])
    [frame] = tiered
    by_tier = {(r["model"], r["tier"]): r for r in frame["rows"]}
    assert ("chat-small", "all") in by_tier and by_tier[("chat-small", "standard")]["rate_per_s"] > 0
    assert "TIER" in human and "standard" in human and "P99_MS" in human and "n/a" not in human


def test_tiers_shows_quotas_and_the_rates(up: dict[str, Any]) -> None:
    def reported() -> list[dict[str, Any]] | None:  # a usage report with this traffic reached the control plane
        rows = json.loads(ctl(up, "tiers", "--json"))
        standard = [t for t in rows if t["tier"] == "standard" and t["rate_per_s"] > 0]
        return rows if standard else None

    with Traffic(up):
        tiers = wait_for(reported, 10, "a usage report with the standard-tier traffic", interval=0.2)
        human = ctl(up, "tiers")
    by_tier = {(t["region"], t["tier"]): t for t in tiers}
    assert set(by_tier) >= {("local", "interactive"), ("local", "standard"), ("local", "batch")}
    standard = by_tier[("local", "standard")]
    assert standard["quota"] > 0 and standard["reserved_share"] > 0
    assert standard["rate_per_s"] > 0 and standard["p99_ms"] is not None and standard["shed"] == 0
    assert "RESERVED_SHARE" in human and "standard" in human
    assert json.loads(ctl(up, "tiers", "--region", "elsewhere", "--json")) == []


def test_spill_on_one_region_has_no_pairs(up: dict[str, Any]) -> None:
    assert json.loads(ctl(up, "spill", "--json")) == []
    assert "no region pairs" in ctl(up, "spill")


def test_spill_lists_every_pair_of_three_regions(tmp_path: Path) -> None:
    child, ready = start_up(tmp_path, "--regions", "3", "--replicas", "3")
    try:
        pairs = json.loads(ctl(ready, "spill", "--json"))
        human = ctl(ready, "spill", "--region", "a")
        only_b = json.loads(ctl(ready, "spill", "--region", "b", "--json"))
    finally:
        child.stop()
    got = {(p["source"], p["target"]): p for p in pairs}
    assert set(got) == {(s, t) for s in "abc" for t in "abc" if s != t}
    assert (got[("a", "b")]["rtt_ms"], got[("a", "c")]["rtt_ms"], got[("b", "c")]["rtt_ms"]) == (40.0, 200.0, 180.0)
    assert all(0 <= p["weight"] <= 1 and p["spilled_per_s"] >= 0 for p in pairs)
    assert {p["source"] for p in only_b} == {"b"} and len(only_b) == 2
    assert "RTT_MS" in human and "SPILLED_PER_S" in human


class FakeAdmin:
    """An Admin stub answering GetStatus with a role; GetStatus fails when ``down``."""

    def __init__(self, role: str, leader_address: str = "", down: bool = False) -> None:
        self.role, self.leader_address, self.down = role, leader_address, down

    def GetStatus(self, request: Any, timeout: float) -> Any:
        if self.down:
            raise grpc.RpcError()
        return admin_pb2.GetStatusResponse(role=self.role, leader_address=self.leader_address)


@pytest.mark.parametrize(("role", "leader_down", "asks"), [
    ("single", False, "here"), ("leader", False, "here"), ("follower", False, "leader"), ("follower", True, "here"),
])
def test_views_are_asked_of_the_leader(role: str, leader_down: bool, asks: str) -> None:
    here = FakeAdmin(role, "127.0.0.1:9" if role == "follower" else "")
    leader_stub = FakeAdmin("leader", down=leader_down)
    opened: list[str] = []

    @contextlib.contextmanager
    def connect(address: str) -> Iterator[FakeAdmin]:
        opened.append(address)
        yield leader_stub

    with ctlflow.leader(here, connect, 1.0) as target:
        assert target is (leader_stub if asks == "leader" else here)
    assert opened == (["127.0.0.1:9"] if role == "follower" else [])
