"""``ferryctl board`` against a real ``ferry up`` (unsupervised, 4 replicas on 2 nodes, one proxy).

Traffic runs through the proxy while the board samples the fleet; the SVG
must name every component (control plane and the leader mark, the store,
the proxy, the tier queues, every node and replica) and every flow, each
with a measured rate. Then a node is killed for good: the next frames of
``--watch --count 2`` show it dead.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ferry.procs import Child
from ferry.v1 import inference_pb2, inference_pb2_grpc
from tests.e2e.harness import wait_for

pytestmark = pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot is not installed (make graphviz)")
ENV = {k: v for k, v in os.environ.items() if k not in ("FERRY_ADMIN_TOKEN", "FERRY_CONTROL_PLANE")}
FLOWS = ("requests (gRPC, HTTP)", "tokens streamed back", "admit", "KServe v2 gRPC", "Fleet.Connect: telemetry",
         "Tables.Watch: table pushes", "leases, intent, watches", "Admin API")


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("board")  # unsupervised: the node killed below stays dead
    child = Child("up", ["up", "--replicas", "4", "--no-supervise", "--workdir", str(work / "fleet")], work).start()
    try:
        ready = child.wait_ready(90)
        yield {**ready, "ready_file": str(child.ready_path), "work": work}
    finally:
        child.stop()


def board(up: dict[str, Any], out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ferry_cli.ctl.main", "--ready-file", up["ready_file"], "board",
                           "--out", str(out), *flags], capture_output=True, text=True, timeout=120, env=ENV)


def svg_text(out: Path) -> str:
    return html.unescape((out / "board.svg").read_text())


class Load:
    """Unary requests through the proxy on a thread until stopped."""

    def __init__(self, up: dict[str, Any]) -> None:
        self.up, self.stop, self.answered = up, threading.Event(), 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        key = (("x-api-key", next(iter(self.up["api_keys"].values()))),)
        with grpc.insecure_channel(self.up["data_plane"]) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            while not self.stop.is_set():
                request = inference_pb2.InferRequest(model=self.up["models"][-1], prompt="a b c d", max_tokens=4)
                stub.Infer(request, metadata=key, timeout=10)
                self.answered += 1

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(15)


def test_the_board_names_every_component_and_flow_with_its_rate(up: dict[str, Any], tmp_path: Path) -> None:
    with Load(up) as load:
        wait_for(lambda: load.answered > 0, 30, "the first answered request")
        result = board(up, tmp_path, "--window", "2", "--json")
    assert result.returncode == 0, result.stderr
    frame = json.loads(result.stdout)
    assert sorted(Path(f).name for f in frame["files"]) == ["board.dot", "board.png", "board.svg"]
    assert (tmp_path / "board.png").read_bytes()[:4] == b"\x89PNG"
    svg = svg_text(tmp_path)
    assert "control plane controlplane" in svg and "LEADER" in svg
    assert "store: memory" in svg and "healthy" in svg
    assert "proxy proxy-1" in svg and "tier queues" in svg and "services" in svg and "ferryctl" in svg
    for tier in ("interactive", "standard", "batch"):
        assert f"{tier}: " in svg
    nodes = {r["replica_id"].rsplit("-r", 1)[0] for r in up["replicas"]}
    for name in nodes:
        assert f"node {name}" in svg
    for replica in up["replicas"]:
        assert f"{replica['replica_id']} {replica['model']}:{replica['version']}" in svg
    for wire in FLOWS:
        assert wire in svg, wire
    rates = re.findall(r"([0-9][0-9.,]*|\?) (req|tok|msg|push|rev|call)/s", svg)
    units = {unit for value, unit in rates if value != "?"}
    assert units >= {"req", "tok", "msg", "push", "rev", "call"}, rates  # every kind measured, from the ready file
    snap = frame["snapshot"]
    relay = next(p for p in snap["proxies"] if p["kind"] == "proxy")  # the load goes through the relay here
    assert relay["requests_per_s"] > 0 and relay["tokens_per_s"] > 0
    assert {p["kind"] for p in snap["proxies"]} == {"proxy", "picker", "envoy"}
    assert sum(n["requests_per_s"] for n in snap["nodes"]) > 0
    assert all(n["telemetry_per_s"] > 0 for n in snap["nodes"])
    assert "DEAD" not in svg and "DISCONNECTED" not in svg


def test_a_killed_node_is_drawn_dead_while_watching(up: dict[str, Any], tmp_path: Path) -> None:
    victim = "node-1"
    os.kill(up["pids"][victim], signal.SIGKILL)
    result = board(up, tmp_path, "--watch", "--interval", "1", "--count", "2", "--window", "1", "--json")
    assert result.returncode == 0, result.stderr
    frames = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(frames) == 2

    def drawn_dead() -> bool:
        result = board(up, tmp_path, "--window", "1", "--json")
        return result.returncode == 0 and not next(n for n in json.loads(result.stdout)["snapshot"]["nodes"]
                                                   if n["name"] == victim)["live"]

    wait_for(drawn_dead, 30, f"{victim} drawn dead")
    lines = {line.split(" [label=")[0].strip(): line for line in (tmp_path / "board.dot").read_text().splitlines()
             if " [label=" in line and " -> " not in line}
    dead, alive = lines[f'"node:{victim}"'], lines['"node:node-2"']
    assert "DEAD" in dead and "dashed" in dead and "<B>dead</B>" in dead
    assert "agent connected" in alive and "dashed" not in alive and "<B>ready</B>" in alive
    svg = svg_text(tmp_path)
    assert f"node {victim}" in svg and "DEAD" in svg and f"{victim}-r0" in svg


def test_human_output_names_the_files(up: dict[str, Any], tmp_path: Path) -> None:
    result = board(up, tmp_path, "--window", "0.5")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"board: {tmp_path / 'board.svg'}, {tmp_path / 'board.png'} (")
    assert "proxies" in result.stdout and "flows)" in result.stdout


def test_bad_flags_and_a_missing_dot_are_refused(up: dict[str, Any], tmp_path: Path) -> None:
    result = board(up, tmp_path, "--interval", "0")
    assert result.returncode == 2 and "--interval" in result.stderr
    env = {**ENV, "PATH": str(tmp_path)}
    missing = subprocess.run([sys.executable, "-m", "ferry_cli.ctl.main", "--ready-file", up["ready_file"], "board",
                              "--out", str(tmp_path)], capture_output=True, text=True, timeout=60, env=env)
    assert missing.returncode == 2 and "graphviz" in missing.stderr
    assert not (tmp_path / "board.svg").exists()
