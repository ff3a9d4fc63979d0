"""Settings from a config file, and ``ferry controlplane`` as a real process on loopback."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controlplane.config import ControlPlaneSettings
from controlplane.main import main
from ferry.config import load_file, parse
from ferry.errors import ConfigError
from ferry.process import read_ready_file
from ferry.v1 import admin_pb2, admin_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]


def test_settings_defaults_follow_the_contracts() -> None:
    s = parse({}).section(ControlPlaneSettings, "controlplane")
    assert (s.tick_seconds, s.grace_seconds, s.telemetry_interval_seconds) == (0.5, 3.0, 0.5)


BAD = [
    ("unknown-key", {"tick": 1}, "controlplane.tick"),
    ("wrong-type", {"max_watchers": "many"}, "controlplane.max_watchers"),
    ("zero-grace", {"grace_seconds": 0}, "controlplane.grace_seconds"),
    ("debounce-over-tick", {"debounce_seconds": 1.0}, "controlplane.debounce_seconds"),
    ("negative-queue", {"command_queue_size": -1}, "controlplane.command_queue_size"),
    ("empty-id", {"id": ""}, "controlplane.id"),
]


@pytest.mark.parametrize(("section", "key"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_settings_name_their_key(section: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse({"controlplane": section}).section(ControlPlaneSettings, "controlplane")
    assert err.value.key.startswith(key)


def test_a_bad_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ferry.toml"
    path.write_text("[controlplane]\ngrace_seconds = -1\n")
    assert main(["--config", str(path)]) == 2
    assert "controlplane.grace_seconds" in capsys.readouterr().err
    assert load_file(None).models == ()


def test_the_process_serves_writes_its_ready_file_and_stops_on_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "ferry.toml"
    config.write_text('[[models]]\nname = "chat"\n\n[controlplane]\ntick_seconds = 0.2\n')
    ready = tmp_path / "ready.json"
    argv = ["--ready-file", str(ready), "--config", str(config), "--id", "cp-7", "--insecure"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane.main", *argv], cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, env={"GRPC_VERBOSITY": "ERROR", "PATH": "/usr/bin", "FERRY_ADMIN_TOKEN": "t0k"},
    )
    try:
        deadline = time.monotonic() + 20
        info = None
        while info is None:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "no ready file"
            info = read_ready_file(ready)
            time.sleep(0.05)
        assert info["id"] == "cp-7" and info["pid"] == proc.pid
        assert info["grpc"].startswith("127.0.0.1:") and info["metrics"].startswith("127.0.0.1:")
        with grpc.insecure_channel(info["grpc"]) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "ferry.v1.Fleet", "ferry.v1.Tables", "ferry.v1.Admin"):
                answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                assert answer.status == health_pb2.HealthCheckResponse.SERVING
            admin = admin_pb2_grpc.AdminStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                admin.ListReplicas(admin_pb2.ListReplicasRequest(), timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            token = (("authorization", "Bearer t0k"),)
            assert admin.ListReplicas(admin_pb2.ListReplicasRequest(), timeout=5, metadata=token).replicas == []
        with urllib.request.urlopen(f"http://{info['metrics']}/metrics", timeout=5) as response:
            assert "ferry_controlplane_members" in response.read().decode()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


STORES = [
    ("unknown-scheme", "bogus://x", 2, "--store"),
    ("etcd-without-port", "etcd://localhost", 2, "--store"),
    ("etcd-unreachable", "etcd://127.0.0.1:1", 1, "etcd at 127.0.0.1:1"),
]


@pytest.mark.parametrize(("url", "code", "named"), [c[1:] for c in STORES], ids=[c[0] for c in STORES])
def test_store_flag(tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str], url: str,
                    code: int, named: str) -> None:
    config = tmp_path / "ferry.toml"
    config.write_text("[controlplane]\nstore_timeout_seconds = 0.3\n")
    assert main(["--config", str(config), "--store", url, "--listen", "127.0.0.1:0", "--insecure"]) == code
    assert named in capsys.readouterr().err + caplog.text
