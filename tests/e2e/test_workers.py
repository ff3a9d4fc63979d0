"""``ferry proxy --workers 2`` with real processes: two proxies on one gRPC port and one HTTP port, each its own
proxy to the control plane, both serving; a worker killed is restarted on the same ports; SIGTERM to the parent
drains both, their streams finishing whole."""

from __future__ import annotations

import os
import signal
import socket
import threading
import urllib.request
from pathlib import Path

import grpc

from ferry.process import read_ready_file
from ferry.procs import Child
from ferry.v1 import common_pb2, inference_pb2
from ferry_cli.up.ready import wait_routable
from tests.e2e.harness import wait_for
from tests.e2e.test_drain import SLOW_REPLICA, TOKENS, run_stream


def _served(metrics: str) -> float:
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("ferry_proxy_requests_total{") and 'status="OK"' in line)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead too
        return stat.read().split(")")[-1].split()[0] != "Z"


def _call_on_new_connections(address: str, key: tuple[tuple[str, str], ...], count: int) -> list[str]:
    request = inference_pb2.InferRequest(model="chat", prompt="a b", max_tokens=2, tier=common_pb2.TIER_INTERACTIVE)
    out = []
    for _ in range(count):  # one connection each: the kernel spreads connections, not calls
        with grpc.insecure_channel(address) as channel:
            try:
                out.append(channel.unary_unary(
                    "/ferry.v1.Inference/Infer", request_serializer=inference_pb2.InferRequest.SerializeToString,
                    response_deserializer=inference_pb2.InferResponse.FromString)(request, metadata=key,
                                                                                  timeout=10).replica_id and "OK")
            except grpc.RpcError as exc:
                out.append(exc.code().name)
    return out


def test_two_workers_share_the_ports_are_two_proxies_restart_when_killed_and_drain_on_sigterm(
        make_fleet, tmp_path: Path) -> None:
    fleet = make_fleet({"node-a": ["chat:v1"]}, proxies=0, config={"proxy": {"http_listen": "127.0.0.1:0"}})
    parent = Child("proxy-workers", ["proxy", "--workers", "2", "--control-plane", fleet.cp_address, "--id", "pw",
                                     "--config", str(fleet.config_path), "--insecure"], tmp_path).start()
    try:
        ready = parent.wait_ready()
        workers = ready["workers"]
        assert ready["pid"] == parent.pid and ready["proxy_id"] == "pw-1" and "http" in ready
        assert [w["proxy_id"] for w in workers] == ["pw-1", "pw-2"]
        assert len({w["pid"] for w in workers} | {parent.pid}) == 3
        assert len({w["metrics"] for w in workers}) == 2  # each its own /metrics
        for worker in workers:  # the control plane sees each as a proxy, and each applied the table
            wait_routable(fleet.cp_address, {"node-a-r0"}, worker["proxy_id"], 30, [parent],
                          admin_token=fleet.admin_token)
        key = (("x-api-key", fleet.keys["ent"]),)
        assert _call_on_new_connections(ready["grpc"], key, 24) == ["OK"] * 24
        assert all(_served(w["metrics"]) > 0 for w in workers), "the kernel spreads connections over both"

        os.kill(workers[1]["pid"], signal.SIGKILL)
        restarted = wait_for(lambda: (r := read_ready_file(parent.ready_path)) and r["workers"][1]["pid"] !=
                             workers[1]["pid"] and r, 30, "worker 2 restarted")
        assert restarted["grpc"] == ready["grpc"] and restarted["http"] == ready["http"]
        wait_routable(fleet.cp_address, {"node-a-r0"}, "pw-2", 30, [parent], admin_token=fleet.admin_token)
        assert _call_on_new_connections(ready["grpc"], key, 8) == ["OK"] * 8

        os.kill(parent.pid, signal.SIGTERM)
        assert parent.proc is not None and parent.proc.wait(60) == 0
        pids = [w["pid"] for w in restarted["workers"]]
        wait_for(lambda: not any(_alive(pid) for pid in pids), 10, "both workers gone")
    finally:
        parent.stop()


def test_workers_whose_port_is_taken_fail_the_parent_with_the_reason(tmp_path: Path) -> None:
    with socket.socket() as taken:  # a listener without SO_REUSEPORT: nobody may share its port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        parent = Child("proxy-workers", ["proxy", "--workers", "2", "--listen", f"127.0.0.1:{port}",
                                         "--control-plane", "127.0.0.1:1", "--insecure"], tmp_path).start()
        try:
            assert parent.proc is not None and parent.proc.wait(60) == 1
        finally:
            parent.stop()
    log = parent.log_path.read_text()
    assert "worker-1 exited" in log and "before it was ready" in log, log


def _inflight(metrics: str) -> float:
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("ferry_proxy_inflight "))


def test_sigterm_to_the_parent_drains_every_worker_with_its_streams_whole(make_fleet, tmp_path: Path) -> None:
    fleet = make_fleet({"node-a": ["chat:v1"]}, proxies=0, config={"replica": SLOW_REPLICA})
    parent = Child("proxy-workers", ["proxy", "--workers", "2", "--control-plane", fleet.cp_address, "--id", "pd",
                                     "--config", str(fleet.config_path), "--insecure"], tmp_path).start()
    channels: list[grpc.Channel] = []
    try:
        ready = parent.wait_ready()
        for worker in ready["workers"]:
            wait_routable(fleet.cp_address, {"node-a-r0"}, worker["proxy_id"], 30, [parent],
                          admin_token=fleet.admin_token)
        key = (("x-api-key", fleet.keys["ent"]),)
        results: list[tuple[str, int]] = []
        channels = [grpc.insecure_channel(ready["grpc"], options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(12)]  # each its own connection: the kernel spreads them over the workers
        starts = [threading.Event() for _ in channels]
        threads = [threading.Thread(target=run_stream, args=(fleet.inference(ch), key, s, results))
                   for ch, s in zip(channels, starts, strict=True)]
        for t in threads:
            t.start()
        for s in starts:
            assert s.wait(30), "every stream must start before the parent is told to stop"
        busy = [_inflight(w["metrics"]) for w in ready["workers"]]
        assert all(b > 0 for b in busy), f"streams on both workers: {busy}"
        os.kill(parent.pid, signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert parent.proc is not None and parent.proc.wait(60) == 0
    finally:
        for ch in channels:
            ch.close()
        parent.stop()
    assert results == [("OK", TOKENS)] * len(channels), results
