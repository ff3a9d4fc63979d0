"""Readiness and drain of the proxy, with real processes: NOT_SERVING before its first table, and SIGTERM mid-stream.

A proxy started before its control plane answers NOT_SERVING on gRPC health
until a table arrives. A proxy sent SIGTERM while streams run (gRPC and HTTP)
turns NOT_SERVING (gRPC health, and ``GET /health`` on HTTP), still serves during ``drain_delay_seconds``, then refuses
new work on both front doors while the streams finish whole, and exits 0.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tomli_w import dumps

from ferry.procs import Child, stop_all
from ferry.v1 import common_pb2, inference_pb2
from harness.etcd import free_port
from tests.e2e.harness import wait_for
from tools.process_fleet import FAST_REPLICA

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
TOKENS = 200  # at 20 ms a step: about 4 s a stream, well past the drain delay
SLOW_REPLICA = {**FAST_REPLICA, "decode_base_seconds": 0.02}


def health(address: str) -> int | None:
    """The server's gRPC health (the empty service name), or None when it does not answer."""
    with grpc.insecure_channel(address) as channel:
        try:
            return int(health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2).status)
        except grpc.RpcError:
            return None


def http_health(address: str) -> int | str:
    """The status of ``GET /health`` on the HTTP front door, or the error's name."""
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    except OSError as exc:
        return type(exc).__name__
    finally:
        conn.close()


def test_a_proxy_is_not_serving_before_its_first_table_and_serving_after(tmp_path: Path) -> None:
    config = tmp_path / "ferry.toml"
    config.write_text(dumps({"proxy": {"reconnect_initial_seconds": 0.05, "reconnect_max_seconds": 0.2},
                             "replica": FAST_REPLICA}))
    cp_address = f"127.0.0.1:{free_port()}"  # nothing answers there yet
    children: list[Child] = []
    try:
        proxy = Child("proxy", ["proxy", "--workers", "1", "--control-plane", cp_address, "--id", "p-ready",
                                "--http-listen", "127.0.0.1:0", "--config", str(config), "--insecure"],
                      tmp_path).start()
        children.append(proxy)
        ready = proxy.wait_ready()
        address = ready["grpc"]
        assert health(address) == NOT_SERVING  # it serves its port, but has no table to route by
        assert http_health(ready["http"]) == 503
        with grpc.insecure_channel(address) as channel:  # a known service, and an unknown one
            stub = health_pb2_grpc.HealthStub(channel)
            assert stub.Check(health_pb2.HealthCheckRequest(service="ferry.v1.Inference"),
                              timeout=2).status == NOT_SERVING
            try:
                stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=2)
                raise AssertionError("an unknown service must be NOT_FOUND")
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND
        cp = Child("controlplane", ["controlplane", "--listen", cp_address, "--config", str(config), "--insecure"],
                   tmp_path).start()
        children.append(cp)
        cp.wait_ready()
        wait_for(lambda: health(address) == SERVING, 30, "the proxy to be SERVING once a table is applied")
        assert http_health(ready["http"]) == 200
    finally:
        stop_all(children)


def run_stream(stub: Any, key: tuple[tuple[str, str], ...], started: threading.Event,
            results: list[tuple[str, int]]) -> None:
    request = inference_pb2.InferRequest(model="chat", prompt="a b c", max_tokens=TOKENS,
                                         tier=common_pb2.TIER_INTERACTIVE)
    delivered = 0
    try:
        for chunk in stub.InferStream(request, metadata=key, timeout=60):
            started.set()
            if chunk.final:
                results.append(("OK", delivered))
                return
            delivered += chunk.tokens
        results.append(("NO_SUMMARY", delivered))
    except grpc.RpcError as exc:
        results.append((exc.code().name, delivered))


def _http_stream(address: str, key: str, started: threading.Event, results: list[tuple[str, int]]) -> None:
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = json.dumps({"model": "chat", "prompt": "a b c", "max_tokens": TOKENS, "stream": True})
    try:
        conn.request("POST", "/v1/completions", body, {"Authorization": f"Bearer {key}",
                                                       "x-ferry-tier": "interactive"})
        response = conn.getresponse()
        if response.status != 200:
            results.append((f"HTTP {response.status}", 0))
            return
        pieces = 0
        for line in response:
            started.set()
            if line.startswith(b"data: [DONE]"):
                results.append(("OK", pieces))
                return
            if line.startswith(b"data: "):
                pieces += 1
        results.append(("NO_DONE", pieces))
    except OSError as exc:
        results.append((type(exc).__name__, 0))
    finally:
        conn.close()


def _new_unary(stub: Any, key: tuple[tuple[str, str], ...]) -> str:
    request = inference_pb2.InferRequest(model="chat", prompt="a", max_tokens=2, tier=common_pb2.TIER_INTERACTIVE)
    try:
        stub.Infer(request, metadata=key, timeout=10)
        return "OK"
    except grpc.RpcError as exc:
        return exc.code().name


def _new_http(address: str, key: str) -> str:
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("POST", "/v1/completions", json.dumps({"model": "chat", "prompt": "a", "max_tokens": 2}),
                     {"Authorization": f"Bearer {key}"})
        return f"HTTP {conn.getresponse().status}"
    except OSError as exc:
        return type(exc).__name__
    finally:
        conn.close()


def test_sigterm_turns_the_proxy_not_serving_lets_streams_finish_refuses_new_work_then_exits(make_fleet) -> None:
    fleet = make_fleet({"node-a": ["chat:v1"], "node-b": ["chat:v1"]},
                       config={"replica": SLOW_REPLICA,
                               "proxy": {"http_listen": "127.0.0.1:0", "drain_delay_seconds": 1.0,
                                         "drain_grace_seconds": 60.0}})
    proxy = fleet.proxies[0]
    address, http_address = proxy.ready["grpc"], proxy.ready["http"]
    key = (("x-api-key", fleet.keys["ent"]),)
    assert health(address) == SERVING
    results: list[tuple[str, int]] = []
    http_results: list[tuple[str, int]] = []
    with grpc.insecure_channel(address) as channel:
        stub = fleet.inference(channel)
        starts = [threading.Event() for _ in range(6)]
        threads = [threading.Thread(target=run_stream, args=(stub, key, s, results)) for s in starts[:4]]
        threads += [threading.Thread(target=_http_stream, args=(http_address, fleet.keys["ent"], s, http_results))
                    for s in starts[4:]]
        for t in threads:
            t.start()
        for s in starts:
            assert s.wait(30), "every stream must start before the proxy is told to stop"
        os.kill(proxy.pid, signal.SIGTERM)
        # NOT_SERVING at once, and new work still served during the delay (load balancers catch up).
        wait_for(lambda: health(address) == NOT_SERVING, 10, "NOT_SERVING after SIGTERM")
        # After the delay: new work refused on both front doors while the streams still run.
        wait_for(lambda: _new_unary(stub, key) == "UNAVAILABLE", 30, "a new gRPC request refused after the delay")
        refused_http = _new_http(http_address, fleet.keys["ent"])
        assert refused_http in ("ConnectionRefusedError", "HTTP 503"), refused_http
        assert any(t.is_alive() for t in threads), "the streams must outlast the delay for this test to mean much"
        for t in threads:
            t.join(60)
    assert proxy.proc is not None
    assert proxy.proc.wait(60) == 0, proxy.log_tail()
    assert results == [("OK", TOKENS)] * 4, results
    assert [status for status, _ in http_results] == ["OK", "OK"], http_results
    assert all(pieces > 1 for _, pieces in http_results), http_results
    log = proxy.log_path.read_text()
    assert "draining" in log and "stopped" in log


def test_a_request_during_the_drain_delay_is_still_served(make_fleet) -> None:
    fleet = make_fleet({"node-a": ["chat:v1"]},
                       config={"proxy": {"drain_delay_seconds": 30.0, "drain_grace_seconds": 5.0,
                                         "http_listen": "127.0.0.1:0"}})
    proxy = fleet.proxies[0]
    address = proxy.ready["grpc"]
    assert http_health(proxy.ready["http"]) == 200
    key = (("x-api-key", fleet.keys["ent"]),)
    with grpc.insecure_channel(address) as channel:
        stub = fleet.inference(channel)
        assert _new_unary(stub, key) == "OK"
        os.kill(proxy.pid, signal.SIGTERM)
        wait_for(lambda: health(address) == NOT_SERVING, 10, "NOT_SERVING after SIGTERM")
        assert [_new_unary(stub, key) for _ in range(5)] == ["OK"] * 5  # within the 30 s delay
        assert http_health(proxy.ready["http"]) == 503  # an HTTP load balancer sees the drain too
        assert _new_http(proxy.ready["http"], fleet.keys["ent"]) == "HTTP 200"
    assert proxy.alive()  # still in its delay
    proxy.kill()
