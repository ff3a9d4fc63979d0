"""``ferry batch-runtime`` as a process: ready file, a call, clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as triton
from tritonclient.grpc import InferInput

from agent.batch.host import spec_from_args
from agent.batch.main import build_parser
from agent.batch.reference import transform

pytestmark = pytest.mark.timeout(30)
ROOT = Path(__file__).resolve().parents[2]


def test_flags_derive_max_wait_and_add_the_gang_model() -> None:
    args = build_parser().parse_args(["--gang-model", "big", "--gpus", "4", "--budget-ms", "1000"])
    small, big = spec_from_args(args, gpus=args.gpus).contracts()
    assert small.max_wait_s == pytest.approx(0.25) and small.gpus_per_batch == 1
    assert big.name == "big" and big.gpus_per_batch == 4


async def test_process_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    env = {**os.environ, "GRPC_VERBOSITY": "ERROR"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent.batch.main", "--ready-file", str(ready), "--max-wait-ms", "0", "--gpus", "2",
        "--insecure", stderr=asyncio.subprocess.PIPE, env=env, cwd=ROOT)
    try:
        assert proc.stderr is not None
        line = await asyncio.wait_for(proc.stderr.readline(), 20)  # logged after the ready file is written
        assert b"serving" in line, line
        info = json.loads(ready.read_text())
        assert info["models"] == ["batchstring"] and info["pid"] == proc.pid
        assert info["address"].startswith("127.0.0.1:") and info["metrics"].startswith("127.0.0.1:")
        client = triton.InferenceServerClient(info["address"])
        tensor = InferInput("text_input", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([b"abc"], dtype=object))
        result = await client.infer("batchstring", [tensor])
        assert result.as_numpy("text_output")[0][0] == transform("abc").encode()
        await client.close()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
