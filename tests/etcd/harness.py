"""A fleet of real processes on a real etcd: control planes (``--store etcd://``), proxies and nodes.

Control plane *i* is ``controlplane-{i+1}``; the first is started (and has
campaigned) before the others, so it leads. Proxy *i* and node *i* get every
control plane's address, their list starting at control plane ``i % n``, so
they spread over them. Any component can be killed by PID and a control plane
restarted on its port. Load generators and polls are bounded by deadlines.
"""

from __future__ import annotations

import secrets
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
from tomli_w import dumps

from ferry.config import hash_api_key
from ferry.procs import Child, stop_all
from ferry.v1 import admin_pb2, common_pb2, inference_pb2, inference_pb2_grpc
from ferry_cli.ctl.client import AdminClient
from ferry_cli.up.ready import wait_routable
from harness.etcd import LocalEtcd
from tests.e2e.harness import wait_for
from tools.process_fleet import FAST_REPLICA

TTL = 2.0  # leader_lease_seconds and grace_seconds of these fleets
TICK = 0.5


class EtcdFleet:
    """Start with :meth:`start`; everything stops in :meth:`stop` (the fixture calls it)."""

    def __init__(self, workdir: Path, etcd: LocalEtcd, nodes: dict[str, list[str]], *, control_planes: int = 2,
                 proxies: int = 1) -> None:
        self.workdir = workdir
        self.etcd = etcd
        self.nodes_spec = nodes
        self.key = "fk_" + secrets.token_hex(8)
        self.admin_token = "fat_" + secrets.token_hex(8)
        self.token_path = workdir / "admin-token"
        self.token_path.write_text(self.admin_token)
        config = {
            "tenants": [{"name": "ent", "api_key_sha256": hash_api_key(self.key), "plan": "enterprise"}],
            "models": [{"name": "chat", "min_gpus": 1}],
            "controlplane": {"grace_seconds": TTL, "leader_lease_seconds": TTL, "tick_seconds": TICK},
            "replica": dict(FAST_REPLICA),
        }
        self.config_path = workdir / "ferry.toml"
        self.config_path.write_text(dumps(config))
        self.count = control_planes
        self.proxy_count = proxies
        self.children: list[Child] = []
        self.cps: list[Child] = []
        self.addresses: list[str] = []
        self.proxies: list[Child] = []
        self.nodes: dict[str, Child] = {}

    def _spawn(self, name: str, argv: list[str]) -> Child:
        child = Child(name, [*argv, "--config", str(self.config_path), "--insecure"], self.workdir).start()
        self.children.append(child)
        return child

    def _cp_argv(self, i: int, listen: str = "127.0.0.1:0") -> list[str]:
        return ["controlplane", "--listen", listen, "--store", f"etcd://{self.etcd.endpoint}",
                "--id", f"controlplane-{i + 1}", "--admin-token-file", str(self.token_path)]

    def rotated(self, i: int) -> str:
        n = len(self.addresses)
        return ",".join(self.addresses[i % n:] + self.addresses[:i % n])

    def start(self) -> EtcdFleet:
        for i in range(self.count):
            self.cps.append(self._spawn(f"controlplane-{i + 1}", self._cp_argv(i)))
            self.addresses.append(self.cps[-1].wait_ready()["grpc"])
        for i in range(self.proxy_count):
            self.proxies.append(self._spawn(f"proxy-{i + 1}", ["proxy", "--control-plane", self.rotated(i),
                                                                "--id", f"proxy-{i + 1}", "--workers", "1"]))
        for i, (name, models) in enumerate(self.nodes_spec.items()):
            reps = [a for m in models for a in ("--replica", m)]
            self.nodes[name] = self._spawn(name, ["node", "--node", name, "--control-plane", self.rotated(i), *reps])
        for child in self.children:
            child.wait_ready()
        for i, proxy in enumerate(self.proxies):  # each proxy is synced on the control plane it watches from
            wait_routable(self.addresses[i % self.count], self.replica_ids(), proxy.ready["proxy_id"], 30, [],
                          admin_token=self.admin_token)
        return self

    def replica_ids(self) -> set[str]:
        return {f"{name}-r{i}" for name, models in self.nodes_spec.items() for i in range(len(models))}

    def admin(self, i: int) -> tuple[grpc.Channel, Any]:
        channel = grpc.insecure_channel(self.addresses[i])
        return channel, AdminClient(channel, self.admin_token)

    def status(self, i: int, timeout: float = 2.0) -> admin_pb2.GetStatusResponse:
        channel, admin = self.admin(i)
        with channel:
            return admin.GetStatus(admin_pb2.GetStatusRequest(), timeout=timeout)

    def replicas(self, i: int) -> dict[str, admin_pb2.ReplicaView]:
        channel, admin = self.admin(i)
        with channel:
            return {r.replica_id: r for r in admin.ListReplicas(admin_pb2.ListReplicasRequest(), timeout=5).replicas}

    def roles(self) -> list[str]:
        roles = []
        for i, cp in enumerate(self.cps):
            try:
                roles.append(self.status(i).role if cp.alive() else "dead")
            except grpc.RpcError:
                roles.append("unreachable")
        return roles

    def restart_cp(self, i: int) -> None:
        """Start control plane ``i`` again on its port (it must be dead)."""
        assert not self.cps[i].alive()
        self.cps[i] = self._spawn(f"controlplane-{i + 1}", self._cp_argv(i, self.addresses[i]))
        self.cps[i].wait_ready()

    def stop(self) -> None:
        stop_all(self.children)


def etcd_keys(etcd: LocalEtcd, prefix: str) -> list[str]:
    """The keys under ``prefix``, read with etcdctl (independently of Ferry's client)."""
    out = subprocess.run(["etcdctl", "--endpoints", etcd.url, "get", "--prefix", "--keys-only", prefix],
                         capture_output=True, text=True, timeout=10, check=True,
                         env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin:/usr/local/bin"})
    return sorted(line for line in out.stdout.splitlines() if line)


class Load:
    """Threads sending interactive requests to every proxy until stopped; outcomes counted by status."""

    def __init__(self, fleet: EtcdFleet, threads_per_proxy: int = 4) -> None:
        self.fleet = fleet
        self.outcomes: Counter[str] = Counter()
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(p.ready["grpc"],), daemon=True)
                         for p in fleet.proxies for _ in range(threads_per_proxy)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _run(self, address: str) -> None:
        request = inference_pb2.InferRequest(model="chat", prompt="a b c d", max_tokens=4,
                                             tier=common_pb2.TIER_INTERACTIVE)
        with grpc.insecure_channel(address) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            while not self._stop.is_set():
                try:
                    stub.Infer(request, metadata=(("x-api-key", self.fleet.key),), timeout=10)
                    outcome = "OK"
                except grpc.RpcError as exc:
                    outcome = exc.code().name
                    with self._lock:
                        self.errors.append(f"{time.monotonic():.3f} {outcome}: {exc.details()}")
                with self._lock:
                    self.outcomes[outcome] += 1

    def ok(self) -> int:
        with self._lock:
            return self.outcomes["OK"]


__all__ = ["TICK", "TTL", "EtcdFleet", "Load", "etcd_keys", "wait_for"]
