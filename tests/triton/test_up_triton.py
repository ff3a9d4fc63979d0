"""``ferry up --triton``: an agent beside a real Triton server instead of simulated replicas."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ferry.procs import Child
from tools.triton.launch import TritonProcess

pytestmark = [pytest.mark.triton, pytest.mark.timeout(120)]


def test_ferry_up_adopts_a_real_triton(tmp_path: Path, triton_factory: Callable[[], TritonProcess]) -> None:
    server = triton_factory()
    up = Child("up", ["up", "--triton", f"{server.grpc},{server.metrics_url}", "--workdir", str(tmp_path / "f")],
               tmp_path).start()
    try:
        ready = up.wait_ready(90)
        call = subprocess.run([sys.executable, "-m", "ferry", "call", "--ready-file", str(up.ready_path),
                               "--model", "llm-unary", "--prompt", "hello ferry", "--max-tokens", "4", "--json"],
                              capture_output=True, text=True, timeout=60)
        assert call.returncode == 0, call.stderr
        reply = json.loads(call.stdout)
        assert reply["replica_id"] == "triton-1-llm-unary-1" and len(reply["text"].split()) == 4
        stream = subprocess.run([sys.executable, "-m", "ferry", "call", "--ready-file", str(up.ready_path),
                                 "--model", "llm", "--prompt", "hello ferry", "--max-tokens", "4", "--stream"],
                                capture_output=True, text=True, timeout=60)
        assert stream.returncode == 0 and len(stream.stdout.split()) == 4, stream
        # A unary call to the decoupled (stream-only) model is served over the stream and collected.
        unary = subprocess.run([sys.executable, "-m", "ferry", "call", "--ready-file", str(up.ready_path),
                                "--model", "llm", "--prompt", "hello ferry", "--max-tokens", "5", "--json"],
                               capture_output=True, text=True, timeout=60)
        assert unary.returncode == 0, unary.stderr
        assert json.loads(unary.stdout)["completion_tokens"] == 5
        # The client's deadline reaches the real server (10 ms a token: 500 tokens cannot fit in 0.5 s).
        for model, extra in (("llm-unary", []), ("llm", ["--stream"])):
            late = subprocess.run([sys.executable, "-m", "ferry", "call", "--ready-file", str(up.ready_path),
                                   "--model", model, "--prompt", "a long answer", "--max-tokens", "500",
                                   "--timeout", "0.5", *extra], capture_output=True, text=True, timeout=60)
            assert late.returncode == 1 and late.stderr.startswith("DEADLINE_EXCEEDED"), (model, late.stderr)
        assert ready["pids"].keys() == {"controlplane", "proxy", "picker-1", "picker-2", "envoy", "triton-1"}
        up.kill(signal.SIGINT)
        assert up.proc is not None and up.proc.wait(30) == 0
        assert server.alive(), "ferry up stops only what it started"
    finally:
        up.stop()
