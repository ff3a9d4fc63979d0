"""``ferry proxy``: config loading, flags, ready file, clean stop on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from dataplane.config import ProxySettings, load, parse_addresses
from dataplane.main import main
from ferry.config import hash_api_key
from ferry.errors import ConfigError
from ferry.process import read_ready_file
from ferry.v1 import inference_pb2_grpc
from tests.dataplane.conftest import request

pytestmark = pytest.mark.timeout(30)

CONFIG = f"""
[[tenants]]
name = "acme"
api_key_sha256 = "{hash_api_key('k1')}"

[limits]
max_tokens = 64

[proxy]
region = "eu"
max_inflight = 8
retry_tiers = ["interactive", "standard"]
"""


def test_config_file_and_flag_overrides(tmp_path: Path) -> None:
    path = tmp_path / "ferry.toml"
    path.write_text(CONFIG)
    config = load(path)
    assert config.settings.region == "eu" and config.settings.server.max_inflight == 8
    assert config.settings.retries.retry_tiers == ("interactive", "standard") and config.settings.proxy_id
    assert config.limits.max_tokens == 64 and config.tenants[0].name == "acme"
    overridden = load(path, region="us", proxy_id="px")
    assert (overridden.settings.region, overridden.settings.proxy_id) == ("us", "px")


BAD_SETTINGS = [
    ("unknown-key", {"max_inflite": 3}, "proxy.max_inflite"),
    ("zero-inflight", {"max_inflight": 0}, "proxy.max_inflight"),
    ("unknown-retry-tier", {"retry_tiers": ["gold"]}, "proxy.retry_tiers"),
    ("stale-before-fresh", {"telemetry_stale_seconds": 0.5}, "proxy.telemetry_stale_seconds"),
    ("backoff-cap-below-start", {"reconnect_max_seconds": 0.01}, "proxy.reconnect_max_seconds"),
]


@pytest.mark.parametrize(("values", "key"), [b[1:] for b in BAD_SETTINGS], ids=[b[0] for b in BAD_SETTINGS])
def test_bad_settings_name_the_key(values: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        ProxySettings.from_section(values)
    assert info.value.key == key


def test_control_plane_addresses() -> None:
    assert parse_addresses("a:1, b:2,") == ("a:1", "b:2")
    with pytest.raises(ConfigError, match="'b'"):
        parse_addresses("a:1,b")


@pytest.mark.parametrize(("argv", "text"), [
    (["--config", "/nonexistent/ferry.toml"], "file not found"),
    (["--control-plane", "nohost"], "host:port"),
    (["--listen", "8080"], "--listen"),
], ids=["missing-config", "bad-control-plane", "bad-listen"])
def test_main_refuses_bad_config(argv: list[str], text: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert text in capsys.readouterr().err


def test_ferry_proxy_process_writes_ready_file_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "ferry.toml"
    config.write_text(CONFIG.replace('region = "eu"', 'region = "local"'))
    ready = tmp_path / "ready.json"
    code = "import sys; from dataplane.main import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "--ready-file", str(ready), "--config", str(config), "--id", "px",
         "--control-plane", "127.0.0.1:1", "--insecure", "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=Path(__file__).resolve().parents[2],
        env={"GRPC_VERBOSITY": "ERROR", "PATH": "/usr/bin:/bin"},
    )
    try:
        deadline = time.monotonic() + 20
        info = None
        while info is None:  # the ready file is the readiness signal
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "no ready file"
            info = read_ready_file(ready)
            if info is None:
                time.sleep(0.05)
        assert info["proxy_id"] == "px" and info["region"] == "local" and info["pid"] == proc.pid
        assert info["grpc"].startswith("127.0.0.1:") and info["metrics"].startswith("127.0.0.1:")
        with grpc.insecure_channel(info["grpc"]) as channel:
            with pytest.raises(grpc.RpcError) as err:
                inference_pb2_grpc.InferenceStub(channel).Infer(request(), metadata=(("x-api-key", "k1"),), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # no table from the (absent) control plane
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_picker_end_flag_overrides_the_file_and_a_bad_one_names_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "ferry.toml"
    path.write_text(CONFIG + 'picker_end = "report"\n')
    assert load(path).settings.picker.picker_end == "report"
    overridden = load(path, picker_end="stream")
    assert overridden.settings.picker.picker_end == "stream"
    assert overridden.settings.picker.picker_fallbacks == load(path).settings.picker.picker_fallbacks
    with pytest.raises(ConfigError, match="--picker-end"):
        load(path, picker_end="never")
    assert main(["--picker-end=never", "--config", str(path)]) == 2
