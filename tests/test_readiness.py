"""Readiness, drain and workers: the drain settings refused with their key, the control plane's readiness rule,
the workers' arguments, and the health servicer on a real gRPC server (Check, Watch, the drain)."""

from __future__ import annotations

import asyncio
import math

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controlplane.config import ControlPlaneSettings
from controlplane.server import ready
from controlplane.store.base import StoreHealth
from dataplane.config import ProxySettings
from dataplane.main import main as proxy_main
from dataplane.workers import cores, metrics_address, without, worker_argv
from ferry.errors import ConfigError
from ferry.grpcutil import start_server
from ferry.readiness import MAX_DRAIN_SECONDS, NOT_SERVING, SERVING, DrainTimes, Readiness


@pytest.mark.parametrize("key", ["drain_delay_seconds", "drain_grace_seconds"])
@pytest.mark.parametrize("value", [-1.0, math.nan, MAX_DRAIN_SECONDS + 1])
def test_a_bad_drain_setting_is_refused_naming_its_key(key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"proxy.{key}"):
        ProxySettings.from_section({key: value})
    with pytest.raises(ConfigError, match=f"controlplane.{key}"):
        ControlPlaneSettings(**{key: value})  # type: ignore[arg-type]


def test_drain_defaults_serve_no_longer_and_give_calls_a_minute() -> None:
    assert ProxySettings().server.drain() == DrainTimes(delay=0.0, grace=60.0)
    assert ControlPlaneSettings().drain() == DrainTimes(delay=0.0, grace=60.0)
    assert ProxySettings.from_section({"drain_delay_seconds": 5, "drain_grace_seconds": 0}).server.drain() == \
        DrainTimes(delay=5.0, grace=0.0)


@pytest.mark.parametrize(("ok", "leader", "expected"), [
    (True, True, True), (False, True, False), (True, False, False), (False, False, False)])
def test_a_control_plane_is_ready_only_with_its_store_answering_and_a_leader_known(
        ok: bool, leader: bool, expected: bool) -> None:
    assert ready(StoreHealth("etcd", "127.0.0.1:2379", ok=ok), leader) is expected


def test_without_drops_flags_in_both_forms() -> None:
    argv = ["--listen", "a:1", "--id=x", "--insecure", "--workers", "2", "--ready-file", "r.json"]
    assert without(argv, ["--id", "--workers", "--ready-file"]) == ["--listen", "a:1", "--insecure"]


def test_each_worker_gets_its_own_id_and_metrics_port_and_the_bound_addresses() -> None:
    argv = ["--control-plane", "cp:1", "--listen", "127.0.0.1:0", "--workers", "4", "--id", "p",
            "--metrics-listen", "127.0.0.1:9100", "--ready-file", "r.json", "--insecure"]
    assert worker_argv(argv, 1, proxy_id="p", metrics_listen="127.0.0.1:9100", listen="127.0.0.1:0") == [
        "proxy", "--control-plane", "cp:1", "--insecure", "--listen", "127.0.0.1:0", "--workers", "1",
        "--id", "p-1", "--metrics-listen", "127.0.0.1:9100"]
    assert worker_argv(argv, 3, proxy_id="p", metrics_listen="127.0.0.1:9100", listen="127.0.0.1:5000",
                       http_listen="127.0.0.1:5001") == [
        "proxy", "--control-plane", "cp:1", "--insecure", "--listen", "127.0.0.1:5000",
        "--http-listen", "127.0.0.1:5001", "--workers", "1", "--id", "p-3", "--metrics-listen", "127.0.0.1:9102"]
    assert metrics_address("127.0.0.1:0", 3) == "127.0.0.1:0"


@pytest.mark.parametrize("count", ["0", "-1", "257"])
def test_ferry_proxy_refuses_a_bad_worker_count_naming_the_flag(count: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert proxy_main(["--workers", count, "--insecure"]) == 2
    assert "--workers" in capsys.readouterr().err


async def test_health_watchers_see_each_change_and_end_on_drain_so_the_grace_is_not_held() -> None:
    readiness = Readiness(ready=False)
    server, port = await start_server([], "127.0.0.1:0", readiness=readiness)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            watch = stub.Watch(health_pb2.HealthCheckRequest())
            unknown = stub.Watch(health_pb2.HealthCheckRequest(service="nope"))
            assert (await watch.read()).status == NOT_SERVING
            assert (await unknown.read()).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
            readiness.set(True)
            assert (await watch.read()).status == SERVING
            assert (await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)).status == SERVING
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
            assert refused.value.code() == grpc.StatusCode.NOT_FOUND
            await readiness.drain()
            readiness.set(True)  # ignored once draining
            assert (await watch.read()).status == NOT_SERVING
            assert await watch.read() == grpc.aio.EOF and await watch.code() == grpc.StatusCode.OK
            assert await unknown.read() == grpc.aio.EOF
            assert (await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)).status == NOT_SERVING
        async with asyncio.timeout(30):  # a watcher left open would hold the whole 600 s grace
            await server.stop(600)
    finally:
        await server.stop(0)


@pytest.mark.parametrize(("affinity", "cpu_max", "expected"), [
    (64, None, 64), (64, "max 100000", 64), (64, "200000 100000", 2), (64, "150000 100000", 2),
    (2, "800000 100000", 2), (4, "1000 100000", 1), (0, None, 1), (8, "garbage", 8), (8, "x 100000", 8)])
def test_the_default_workers_are_the_cores_usable_within_the_cpu_quota(affinity: int, cpu_max: str | None,
                                                                        expected: int) -> None:
    assert cores(affinity, cpu_max) == expected
