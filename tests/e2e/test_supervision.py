"""Supervision in ``ferry up``: killed children come back on their address, two proxies share one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from ferry.procs import Child
from tests.e2e.harness import wait_for
from tests.e2e.test_up import _alive


def _call(ready: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ferry", "call", "--ready-file", str(ready), "--model", "chat-small",
                           "--prompt", "hello", "--max-tokens", "3", "--json"],
                          capture_output=True, text=True, timeout=60)


def _events(log: Path, name: str) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("{") and f'"{name}"' in line:
            record = json.loads(line)
            if record.get("event") == name:
                out.append(record)
    return out


def test_killed_proxy_and_node_are_restarted_behind_the_same_address(tmp_path: Path) -> None:
    up = Child("up", ["up", "--replicas", "2", "--proxies", "2", "--workdir", str(tmp_path / "fleet")],
               tmp_path).start()
    try:
        ready = up.wait_ready(90)
        assert set(ready["proxies"]) == {"proxy-1", "proxy-2"} and set(ready["proxies"]) <= set(ready["pids"])
        assert ready["restarts"] == {"controlplane": 0, "node-1": 0, "proxy-1": 0, "proxy-2": 0,
                                     "picker-1": 0, "picker-2": 0, "envoy": 0}  # the Envoy path supervised too
        address = ready["data_plane"]
        old = ready["pids"]["proxy-1"]
        os.kill(old, signal.SIGKILL)
        after = wait_for(lambda: (r := up.check_ready()) and r["pids"]["proxy-1"] != old and r, 30,
                         "a new proxy-1 pid in the ready file")
        assert after["restarts"]["proxy-1"] == 1 and after["data_plane"] == address
        assert not _alive(old) and _alive(after["pids"]["proxy-1"])
        exited = wait_for(lambda: _events(up.log_path, "child_exited"), 10, "the child_exited event")
        assert exited[0]["component"] == "proxy-1" and exited[0]["signal"] == "SIGKILL"
        call = _call(up.ready_path)
        assert call.returncode == 0, call.stderr
        status = subprocess.run([sys.executable, "-m", "ferry_cli.ctl.main", "--ready-file", str(up.ready_path),
                                 "status", "--json"], capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        rows = {r["component"]: r for r in json.loads(status.stdout)["supervision"]}
        assert rows["proxy-1"] == {"component": "proxy-1", "pid": after["pids"]["proxy-1"], "restarts": 1,
                                   "given_up": False}
        node = after["pids"]["node-1"]
        os.kill(node, signal.SIGKILL)
        wait_for(lambda: (r := up.check_ready()) and r["pids"]["node-1"] != node, 30, "a new node-1 pid")
        wait_for(lambda: _call(up.ready_path).returncode == 0, 30, "a request served after the node's restart")
        pids = list((up.check_ready() or {})["pids"].values())
        up.kill(signal.SIGINT)
        assert up.proc is not None and up.proc.wait(30) == 0
        wait_for(lambda: not any(_alive(p) for p in pids), 10, "every child of ferry up to exit")
    finally:
        up.stop()
