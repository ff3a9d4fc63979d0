"""``ferryctl scale`` against a fleet started by ``ferry up``, with a standby node (``ferry node --standby``).

The standby node registers with no replica: it shows in ``ferryctl nodes``,
in the scaling plan's warm pool and in ``ferry_scaling_standby_nodes``, never
in the table. Traffic to one model gives it an arrival rate in the plan.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ferry.procs import Child
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tests.e2e.harness import wait_for

ENV = {k: v for k, v in os.environ.items() if k not in ("FERRY_ADMIN_TOKEN", "FERRY_CONTROL_PLANE")}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("scale")
    child = Child("up", ["up", "--replicas", "2", "--workdir", str(work / "fleet")], work).start()
    spare: Child | None = None
    try:
        ready = child.wait_ready(90)
        token = (work / "fleet" / "join-token").read_text().strip()
        spare = Child("spare", ["node", "--standby", "--node", "spare-1", "--region", ready["region"],
                                "--control-plane", ready["control_plane"], "--insecure"], work,
                      env={"FERRY_JOIN_TOKEN": token}).start()
        spare.wait_ready(60)
        yield {**ready, "ready_file": str(child.ready_path)}
    finally:
        if spare is not None:
            spare.stop()
        child.stop()


def ctl(up: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ferry_cli.ctl.main", "--ready-file", up["ready_file"], *args],
                          capture_output=True, text=True, timeout=60, env=ENV)


def data(up: dict[str, Any], *args: str) -> Any:
    result = ctl(up, *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_standby_refuses_weights(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "ferry", "node", "--standby", "--replica", "chat-small",
                             "--control-plane", "127.0.0.1:1", "--insecure"], capture_output=True, text=True,
                            timeout=60, env=ENV)
    assert result.returncode == 2 and "--standby" in result.stderr and "--replica" in result.stderr


def test_scale_shows_the_plan_and_the_warm_pool(up: dict[str, Any]) -> None:
    stop = threading.Event()

    def load() -> None:
        request = inference_pb2.InferRequest(model="chat-small", prompt="a b c", max_tokens=2,
                                             tier=common_pb2.TIER_INTERACTIVE)
        with grpc.insecure_channel(up["data_plane"]) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            while not stop.is_set():
                stub.Infer(request, metadata=(("x-api-key", up["api_keys"]["paid-1"]),), timeout=10)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    try:
        def planned() -> Any:
            plan = data(up, "scale")
            rows = {r["model"]: r for r in plan["models"]}
            small = rows.get("chat-small")
            busy = small is not None and small["rate_per_s"] > 0
            pool = {r["region"]: r for r in plan["regions"]}.get(up["region"])
            return plan if busy and pool and pool["standby"] == 1 else None

        plan = wait_for(planned, 60, "a plan with chat-small's traffic and the standby node", interval=0.5)
        human = ctl(up, "scale")
    finally:
        stop.set()
        thread.join(15)
    assert plan["leading"] and plan["sampled_at"] > 0
    rows = {r["model"]: r for r in plan["models"]}
    assert set(rows) == {"chat-large", "chat-small"}
    for row in rows.values():
        assert row["current"] == row["ready"] == 1 and row["region"] == up["region"]
        assert row["desired"] >= max(1, row["needed_now"], row["needed_for_ramp"])  # the floor is 1
        assert row["promote"] == max(0, min(1, row["desired"] - row["current"]))
    [pool] = plan["regions"]
    assert pool["startup_s"] > 0 and pool["replacement_s"] > 0 and pool["standby_to_keep"] >= 1
    assert human.returncode == 0 and "NEEDED_FOR_RAMP" in human.stdout and "STANDBY_TO_KEEP" in human.stdout
    elsewhere = data(up, "scale", "--region", "elsewhere")
    assert (elsewhere["models"], elsewhere["regions"], elsewhere["leading"]) == ([], [], True)
    bad = ctl(up, "scale", "--region", "x" * 200)
    assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr and "region" in bad.stderr

    # the standby node is a node of the fleet, never a replica of a table
    nodes = {n["node"]: n for n in data(up, "nodes")}
    assert (nodes["spare-1"]["replicas"], nodes["spare-1"]["live"]) == (0, True)
    assert all(r["node"] != "spare-1" for r in data(up, "replicas"))
    assert data(up, "table")["regions"][0]["replicas"] == 2

    metrics = next(v for k, v in up["metrics"].items() if k.startswith("controlplane"))
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert f'ferry_scaling_standby_nodes{{kind="current",region="{up["region"]}"}} 1.0' in text
    assert 'ferry_scaling_replicas{kind="desired",model="chat-small"' in text
