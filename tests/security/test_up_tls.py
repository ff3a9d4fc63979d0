"""``ferry up --tls``: every channel over TLS end to end, usable from the ready file, plain text refused."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx2
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ferry.procs import Child

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Child, dict[str, Any]]]:
    work = tmp_path_factory.mktemp("up-tls")
    child = Child("up", ["up", "--tls", "--replicas", "2", "--workdir", str(work / "fleet")], work).start()
    try:
        yield child, child.wait_ready(90)
    finally:
        child.stop()


def ferry(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    return subprocess.run([sys.executable, "-m", "ferry", *args], capture_output=True, text=True, timeout=60,
                          env={**clean, **(env or {})})


def ctl(*args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    code = "import sys; from ferry_cli.ctl.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, env=clean)


def health(address: str, creds: grpc.ChannelCredentials | None) -> str:
    channel = grpc.secure_channel(address, creds) if creds else grpc.insecure_channel(address)
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
            return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
        except grpc.RpcError as exc:
            return str(exc.code().name)


def test_the_ready_file_names_the_ca_and_the_operator_certificate(up: tuple[Child, dict[str, Any]]) -> None:
    _, ready = up
    assert set(ready["tls"]) == {"ca", "client_cert", "client_key"}
    assert all(Path(p).is_file() for p in ready["tls"].values())
    assert oct(Path(ready["tls"]["client_key"]).stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_a_call_through_the_proxy_over_tls(up: tuple[Child, dict[str, Any]], stream: bool) -> None:
    child, _ = up
    args = ["call", "--ready-file", str(child.ready_path), "--model", "chat-small", "--prompt", "hello",
            "--max-tokens", "3", "--json", *(["--stream"] if stream else [])]
    result = ferry(*args)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["completion_tokens"] == 3


def test_the_http_front_door_is_https_under_tls(up: tuple[Child, dict[str, Any]]) -> None:
    """The OpenAI-compatible HTTP API takes TLS like the gRPC one (no client certificate); plain HTTP gets nothing."""
    _, ready = up
    key = next(iter(ready["api_keys"].values()))
    with openai.DefaultHttpx2Client(verify=ssl.create_default_context(cafile=ready["tls"]["ca"]), timeout=30) as http:
        client = openai.OpenAI(base_url=f"https://{ready['http']}/v1", api_key=key, http_client=http, max_retries=0)
        answer = client.completions.create(model="chat-small", prompt="hello", max_tokens=3)
        assert answer.usage is not None and answer.usage.completion_tokens == 3
    with httpx2.Client(timeout=5) as plain, pytest.raises(httpx2.HTTPError):
        plain.get(f"http://{ready['http']}/v1/models", headers={"authorization": f"Bearer {key}"})


def test_ferryctl_over_mutual_tls_with_the_admin_certificate_alone(up: tuple[Child, dict[str, Any]]) -> None:
    _, ready = up
    t = ready["tls"]
    result = ctl("replicas", "--json", "--control-plane", ready["control_plane"], "--tls-ca", t["ca"],
                 "--tls-cert", t["client_cert"], "--tls-key", t["client_key"])  # no admin token anywhere
    assert result.returncode == 0, result.stderr
    assert {r["id"] for r in json.loads(result.stdout)} == {r["replica_id"] for r in ready["replicas"]}
    via_ready = ctl("--ready-file", str(up[0].ready_path), "status", "--json")
    assert via_ready.returncode == 0, via_ready.stderr


def test_ferryctl_with_a_non_admin_certificate_and_no_token_is_refused(up: tuple[Child, dict[str, Any]]) -> None:
    _, ready = up
    d = Path(ready["tls"]["ca"]).parent
    result = ctl("replicas", "--control-plane", ready["control_plane"], "--tls-ca", str(d / "ca.pem"),
                 "--tls-cert", str(d / "agent.pem"), "--tls-key", str(d / "agent.key"))
    assert result.returncode == 1 and "UNAUTHENTICATED" in result.stderr, result.stderr


def test_plain_text_and_certificate_less_peers_are_refused(up: tuple[Child, dict[str, Any]]) -> None:
    _, ready = up
    ca = Path(ready["tls"]["ca"]).read_bytes()
    only_ca = grpc.ssl_channel_credentials(root_certificates=ca)
    replica = ready["replicas"][0]["address"]
    assert health(ready["data_plane"], only_ca) == "SERVING"  # the public API asks for no client certificate
    assert health(ready["data_plane"], None) == "UNAVAILABLE"
    for internal in (ready["control_plane"], replica):  # mutual TLS inside
        assert health(internal, None) == "UNAVAILABLE"
        assert health(internal, only_ca) == "UNAVAILABLE"
    result = ctl("replicas", "--control-plane", ready["control_plane"], "--admin-token", ready["admin_token"])
    assert result.returncode == 2 and "unreachable" in result.stderr, result.stderr


@pytest.mark.etcd
def test_two_control_planes_follow_the_leader_over_mutual_tls(tmp_path: Path) -> None:
    """Each node starts on another control plane: the table holds all four replicas only if Admin.Follow works."""
    if shutil.which("etcd") is None:
        pytest.skip("no etcd binary on PATH (tools/ensure_etcd.sh installs it)")
    child = Child("up", ["up", "--tls", "--store", "etcd", "--control-planes", "2", "--replicas", "4", "--workdir",
                         str(tmp_path / "fleet")], tmp_path).start()
    try:
        ready = child.wait_ready(90)
        status = ctl("--ready-file", str(child.ready_path), "status", "--json")
        assert status.returncode == 0, status.stderr
        data = json.loads(status.stdout)
        assert sorted(p["role"] for p in data["control_planes"]) == ["follower", "leader"]
        assert all(p["reachable"] for p in data["control_planes"])
        assert data["regions"][0]["replicas"] == 4 and data["members"] == 2
        for address in ready["control_planes"]:
            assert health(address, None) == "UNAVAILABLE"
        call = ferry("call", "--ready-file", str(child.ready_path), "--model", "chat-small", "--prompt", "hi",
                     "--max-tokens", "2")
        assert call.returncode == 0, call.stderr
    finally:
        child.stop()
