"""A control plane's gRPC health follows its store, with a real etcd: SERVING while etcd answers and a leader is
known, NOT_SERVING while etcd is gone, SERVING again when it is back; SIGTERM turns it NOT_SERVING before it
exits, and Watch streams see each change."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tomli_w import dumps

from ferry.procs import Child
from harness.etcd import LocalEtcd
from tests.e2e.harness import wait_for
from tests.e2e.test_drain import NOT_SERVING, SERVING, health


def test_control_plane_readiness_follows_the_store_and_sigterm_turns_it_not_serving(
        tmp_path: Path, etcd: LocalEtcd) -> None:
    config = tmp_path / "ferry.toml"
    config.write_text(dumps({"controlplane": {"store_timeout_seconds": 0.5, "drain_delay_seconds": 1.0,
                                              "drain_grace_seconds": 5.0}}))
    cp = Child("controlplane", ["controlplane", "--listen", "127.0.0.1:0", "--store", f"etcd://{etcd.endpoint}",
                                "--id", "cp-1", "--config", str(config), "--insecure"], tmp_path).start()
    seen: list[int] = []
    try:
        address = cp.wait_ready()["grpc"]
        wait_for(lambda: health(address) == SERVING, 30, "SERVING with etcd up and a leader elected")
        channel = grpc.insecure_channel(address)
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=120)

        def follow() -> None:
            try:
                for answer in watch:
                    seen.append(answer.status)
            except grpc.RpcError:
                pass

        watcher = threading.Thread(target=follow)
        watcher.start()
        etcd.signal(signal.SIGKILL)
        wait_for(lambda: health(address) == NOT_SERVING, 30, "NOT_SERVING once etcd is gone")
        etcd.start()  # same data dir and port
        wait_for(lambda: health(address) == SERVING, 30, "SERVING again once etcd answers")
        os.kill(cp.pid, signal.SIGTERM)
        wait_for(lambda: health(address) == NOT_SERVING, 10, "NOT_SERVING at once on SIGTERM")
        assert cp.proc is not None and cp.proc.wait(30) == 0, cp.log_tail()
        watcher.join(30)
        channel.close()
    finally:
        cp.stop()
    assert seen[:3] == [SERVING, NOT_SERVING, SERVING] and seen[-1] == NOT_SERVING, seen
