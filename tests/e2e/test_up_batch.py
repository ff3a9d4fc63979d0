"""``ferry up`` with no flags, and with ``--batch-gpus``: the fixed-batch runtime behind the proxy."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from ferry.procs import Child


def _call(ready: Path, model: str, prompt: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ferry", "call", "--ready-file", str(ready), "--model", model,
                           "--prompt", prompt, "--max-tokens", "4", "--json"],
                          capture_output=True, text=True, timeout=60)


def test_ferry_up_without_flags_runs_eight_replicas(tmp_path: Path) -> None:
    up = Child("up", ["up", "--workdir", str(tmp_path / "f")], tmp_path).start()
    try:
        ready = up.wait_ready(90)
        assert len(ready["replicas"]) == 8
        call = _call(up.ready_path, "chat-large", "hello")
        assert call.returncode == 0, call.stderr
        up.kill(signal.SIGINT)
        assert up.proc is not None and up.proc.wait(30) == 0
    finally:
        up.stop()


def test_ferry_up_with_the_batch_runtime(tmp_path: Path) -> None:
    up = Child("up", ["up", "--replicas", "0", "--batch-gpus", "2", "--workdir", str(tmp_path / "f")],
               tmp_path).start()
    try:
        ready = up.wait_ready(90)
        assert "batch-1" in ready["pids"]
        call = _call(up.ready_path, "batchstring", "ferry across the river")
        assert call.returncode == 0, call.stderr
        reply = json.loads(call.stdout)
        assert reply["replica_id"].startswith("batch-1-b") and reply["text"]
    finally:
        up.stop()
