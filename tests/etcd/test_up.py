"""``ferry up --store etcd --control-planes 2``: the demo on a real etcd that it starts and removes itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ferry.process import read_ready_file
from tests.etcd.harness import wait_for


def _healthy(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{endpoint}/health", timeout=1) as response:
            return bool(json.loads(response.read()).get("health") == "true")
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _ctl(*args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from ferry_cli.ctl.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)


def test_ferry_up_with_etcd_and_two_control_planes(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen([sys.executable, "-m", "ferry", "up", "--store", "etcd", "--control-planes", "2",
                             "--replicas", "4", "--ready-file", str(ready)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        info = wait_for(lambda: proc.poll() is None and read_ready_file(ready), 60, "ferry up to be ready")
        assert len(info["control_planes"]) == 2 and info["control_plane"] == info["control_planes"][0]
        assert _healthy(info["etcd"])
        etcd_pid = info["pids"]["etcd"]  # a child like the others, with its pid in the ready file
        assert _alive(etcd_pid) and set(info["pids"]) == {"etcd", "controlplane-1", "controlplane-2", "proxy",
                                                          "picker-1", "picker-2", "envoy", "node-1", "node-2"}
        status = _ctl("--ready-file", str(ready), "status", "--json")
        assert status.returncode == 0, status.stderr
        data = json.loads(status.stdout)
        assert data["leader"] is not None and data["store"] == {**data["store"], "backend": "etcd", "healthy": True}
        assert sorted(p["role"] for p in data["control_planes"]) == ["follower", "leader"]
        assert all(p["reachable"] for p in data["control_planes"])
        assert data["regions"][0]["replicas"] == 4 and data["members"] == 2
        assert sorted((p["proxy_id"], p["synced"]) for p in data["proxies"]) == [
            ("envoy", True), ("picker-1", True), ("picker-2", True), ("proxy-1", True)]
        human = _ctl("--ready-file", str(ready), "status")
        assert human.returncode == 0 and "leader: controlplane-" in human.stdout and "PROXY_ID" in human.stdout
        key = info["api_keys"]["enterprise-1"]
        call = subprocess.run([sys.executable, "-m", "ferry", "call", "--data-plane", info["data_plane"],
                               "--api-key", key, "--model", "chat-small", "--prompt", "hi there", "--max-tokens", "3"],
                              capture_output=True, text=True, timeout=60)
        assert call.returncode == 0, call.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 5
        while _healthy(info["etcd"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _healthy(info["etcd"]), "ferry up must stop the etcd it started"
        assert not _alive(etcd_pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "2 control planes" in (proc.stdout.read() if proc.stdout else "")


def test_ferry_up_refuses_two_control_planes_on_the_embedded_store(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "ferry", "up", "--control-planes", "2", "--workdir",
                             str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "--store etcd" in result.stderr
