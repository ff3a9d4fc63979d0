"""``ferry node`` as a real process: ready file, registration, clean stop on SIGTERM; flag errors."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest
import tritonclient.grpc.aio as triton

from agent.main import main, parse_replica
from ferry.process import read_ready_file
from tests.agent.helpers import llm_inputs, until
from tests.agent.test_agent import FakeFleet, start_fleet


async def test_node_process_serves_registers_and_stops_on_sigterm(tmp_path):
    fake = FakeFleet()
    server, port = await start_fleet(fake)
    ready = tmp_path / "ready.json"
    config = tmp_path / "ferry.toml"
    config.write_text("[replica]\nmax_running = 4\ndecode_base_seconds = 0.002\n[agent]\nprobe_timeout_seconds = 0.5\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; from agent.main import main; sys.exit(main())",
        "--control-plane", f"127.0.0.1:{port}", "--node", "node-7", "--region", "eu",
        "--replica", "chat", "--replica", "code:v2", "--gpus", "8", "--config", str(config),
        "--ready-file", str(ready), "--insecure", env={**os.environ, "GRPC_VERBOSITY": "ERROR"},
        stderr=asyncio.subprocess.DEVNULL)
    try:
        _, register = await fake.next("register", within=20)
        assert (register.node, register.region) == ("node-7", "eu")
        assert [(r.replica_id, r.model, r.version, r.gpus, r.max_concurrency) for r in register.replicas] == [
            ("node-7-r0", "chat", "v1", 4, 4), ("node-7-r1", "code", "v2", 4, 4)]
        await until(lambda: read_ready_file(ready) is not None, within=10)
        info = read_ready_file(ready)
        assert info is not None and info["node"] == "node-7" and info["pid"] == proc.pid
        assert [r["replica_id"] for r in info["replicas"]] == ["node-7-r0", "node-7-r1"]
        assert info["replicas"][0]["address"] == register.replicas[0].address
        async with triton.InferenceServerClient(info["replicas"][1]["address"]) as client:
            result = await client.infer("code", llm_inputs("hi", 2), model_version="v2")
            assert len(result.as_numpy("text_output").reshape(-1)[0].split()) == 2
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await server.stop(None)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--control-plane", "nohost"],
        ["--control-plane", "127.0.0.1:1", "--replica", ":v1"],
        ["--control-plane", "127.0.0.1:1", "--gpus", "0"],
        ["--control-plane", "127.0.0.1:1", "--config", "/nonexistent/ferry.toml"],
    ],
    ids=["no-control-plane", "bad-address", "bad-replica", "no-gpus", "missing-config"],
)
def test_bad_flags_exit_2(argv, monkeypatch, capsys):
    monkeypatch.delenv("FERRY_CONTROL_PLANE", raising=False)
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("ferry node:")


@pytest.mark.parametrize(("text", "expected"), [("m", ("m", "v1")), ("m:v3", ("m", "v3")), ("m:", ("m", "v1"))])
def test_parse_replica(text, expected):
    assert parse_replica(text) == expected
