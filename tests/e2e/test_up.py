"""``ferry up``: the embedded default starts, is usable from its ready file, and stops cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from ferry.procs import Child
from tests.e2e.harness import wait_for


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of an exited parent is gone for our purposes
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except FileNotFoundError:
        return False


def test_ferry_up_runs_the_fleet_and_stops_on_sigint(tmp_path: Path) -> None:
    up = Child("up", ["up", "--replicas", "4", "--workdir", str(tmp_path / "fleet")], tmp_path).start()
    try:
        ready = up.wait_ready(90)
        assert set(ready) >= {"data_plane", "control_plane", "models", "api_keys", "envoy", "pickers"}
        assert ready["models"] == ["chat-large", "chat-small"]
        assert set(ready["api_keys"]) == {"enterprise-1", "paid-1", "free-1"}
        # control plane, proxy, two pickers, Envoy, 2 nodes
        assert len(ready["replicas"]) == 4 and set(ready["pids"]) == {
            "controlplane", "proxy", "picker-1", "picker-2", "envoy", "node-1", "node-2"}
        call = subprocess.run([sys.executable, "-m", "ferry", "call", "--ready-file", str(up.ready_path),
                               "--model", "chat-small", "--prompt", "hello", "--max-tokens", "3", "--json"],
                              capture_output=True, text=True, timeout=60)
        assert call.returncode == 0, call.stderr
        assert json.loads(call.stdout)["completion_tokens"] == 3
        # A chat without max_tokens through Envoy may run to the whole context: the replicas end it naturally.
        chat = {"model": "chat-small", "messages": [{"role": "user", "content": "tell me about the river"}]}
        request = urllib.request.Request(f"http://{ready['envoy']}/v1/chat/completions", json.dumps(chat).encode(),
                                         {"Authorization": f"Bearer {ready['api_keys']['enterprise-1']}",
                                          "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.loads(response.read())
        assert answer["choices"][0]["finish_reason"] == "stop", answer
        assert 8 <= answer["usage"]["completion_tokens"] <= 8 + 44 * 40, answer["usage"]  # ferry up: mean 48
        pids = list(ready["pids"].values())
        assert all(_alive(p) for p in pids)
        up.kill(signal.SIGINT)
        assert up.proc is not None and up.proc.wait(30) == 0
        wait_for(lambda: not any(_alive(p) for p in pids), 10, "every child of ferry up to exit")
    finally:
        up.stop()
