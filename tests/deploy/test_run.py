"""The single-region manifests' own commands run the system on loopback, and a proxy stopped mid-stream costs nothing.

One etcd, then the Deployments as rendered: two control planes, two GPU pods
(a simulated replica in place of Triton, the agent sidecar as the manifest
runs it), two proxies (:mod:`tests.deploy.local` maps what a cluster
provides to loopback). A tenant is added with ``ferryctl`` and the admin
token of the rendered Secret, as docs/deploy.md says; traffic goes through
both proxies, over gRPC streams and the HTTP front door; then one proxy gets
SIGTERM, as the kubelet sends it, while streams run on both. Neither proxy
fails a request: the stopped one drains (``drain_delay_seconds``,
``drain_grace_seconds`` of the rendered ``ferry.toml``) and exits cleanly.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from pathlib import Path

import grpc
import pytest

from ferry.v1 import admin_pb2, common_pb2, inference_pb2, inference_pb2_grpc
from ferry_cli.ctl.client import AdminClient
from tests.deploy.conftest import ROOT
from tests.deploy.local import LocalCluster, Pod, StandIn, local_cluster
from tests.e2e.harness import wait_for


class Traffic:
    """Streams sent in a loop through one proxy from a few threads, until told to stop; outcomes counted."""

    def __init__(self, address: str, key: str, model: str, threads: int = 3) -> None:
        self.address, self.key, self.model = address, key, model
        self.ok = 0
        self.failed: Counter[str] = Counter()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]

    def _loop(self) -> None:
        request = inference_pb2.InferRequest(model=self.model, prompt="the quick brown fox " * 8, max_tokens=48,
                                             tier=common_pb2.TIER_STANDARD)
        with grpc.insecure_channel(self.address) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            while not self.stop.is_set():
                try:
                    chunks = list(stub.InferStream(request, metadata=(("x-api-key", self.key),), timeout=30))
                    assert chunks[-1].final
                    with self.lock:
                        self.ok += 1
                except grpc.RpcError as exc:
                    with self.lock:
                        self.failed[exc.code().name] += 1

    def start(self) -> Traffic:
        """Start the threads."""
        for thread in self.threads:
            thread.start()
        return self

    def join(self) -> None:
        """Stop starting streams, and wait for the threads."""
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)


def nodes_in_table(address: str, token: str) -> set[str]:
    """The nodes with a replica in the table, as the control plane at ``address`` lists them."""
    with grpc.insecure_channel(address) as channel:
        try:
            replicas = AdminClient(channel, token).ListReplicas(admin_pb2.ListReplicasRequest(), timeout=2)
        except grpc.RpcError:
            return set()
    return {r.node for r in replicas.replicas if r.in_table}


def add_tenant(addresses: list[str], token: str, key: str) -> None:
    """``ferryctl tenants add`` with the admin token in the environment, as docs/deploy.md does."""
    env = {**os.environ, "FERRY_ADMIN_TOKEN": token}
    answers = []
    for address in addresses:
        done = subprocess.run([sys.executable, "-m", "ferry_cli.ctl.main", "--control-plane", address, "tenants",
                               "add", "demo", "--plan", "enterprise", "--api-key", key],
                              capture_output=True, text=True, env=env, timeout=30, check=False)
        if done.returncode == 0:
            return
        answers.append(done.stderr.strip())
    raise AssertionError(f"no control plane took the tenant: {answers}")


def serves(address: str, key: str, model: str) -> bool:
    """Whether the proxy at ``address`` answers one request for ``model``."""
    with grpc.insecure_channel(address) as channel:
        try:
            inference_pb2_grpc.InferenceStub(channel).Infer(
                inference_pb2.InferRequest(model=model, prompt="hello", max_tokens=2),
                metadata=(("x-api-key", key),), timeout=5)
        except grpc.RpcError:
            return False
    return True


@pytest.mark.e2e
@pytest.mark.etcd
@pytest.mark.timeout(120)
def test_the_manifests_commands_serve_traffic_and_a_proxy_stopped_mid_stream_loses_nothing(
        rendered, tmp_path: Path) -> None:
    objects = rendered["overlays/single-region"]
    with local_cluster(objects, tmp_path) as cluster:
        model = next(line.split('"')[1] for line in cluster.find("ConfigMap", next(
            o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap" and "ferry.toml" in o["data"]))
            ["data"]["ferry.toml"].splitlines() if line.startswith("name ="))
        token = cluster.secret("ferry-tokens", "admin-token")
        traffic: list[Traffic] = []
        try:
            control_planes = cluster.start_workload("controlplane")
            addresses = [pod.children["controlplane"].wait_ready()["grpc"] for pod in control_planes]
            assert all(a.startswith("127.0.0.1:") for a in addresses)

            def triton(pod: Pod) -> StandIn:
                return StandIn(f"{pod.name}-triton", "tests.deploy.standin", [model], tmp_path)

            gpu_pods = cluster.start_workload("triton", {"triton": triton})
            for pod in gpu_pods:
                pod.children["agent"].wait_ready()
            wait_for(lambda: nodes_in_table(addresses[0], token) >= {p.node for p in gpu_pods}, 30,
                     "both agents' Triton replicas in the table")
            proxies = [pod.children["proxy"] for pod in cluster.start_workload("proxy")]
            ready = [proxy.wait_ready() for proxy in proxies]
            key = "fk_" + secrets.token_hex(16)
            add_tenant(addresses, token, key)
            for proxy in ready:
                wait_for(lambda p=proxy: serves(p["grpc"], key, model), 30, f"proxy {proxy['proxy_id']} to serve")

            body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 4}).encode()
            request = urllib.request.Request(f"http://{ready[1]['http']}/v1/completions", data=body,
                                             headers={"Authorization": f"Bearer {key}",
                                                      "Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as answer:
                assert json.loads(answer.read())["choices"][0]["text"]

            stopped, survivor = (Traffic(r["grpc"], key, model).start() for r in ready)
            traffic = [stopped, survivor]
            wait_for(lambda: stopped.ok >= 10 and survivor.ok >= 10, 30, "streams completed through both proxies")
            stopped.stop.set()  # its clients take no new stream there once it is terminating
            proxies[0].kill(signal.SIGTERM)
            assert proxies[0].proc is not None
            assert proxies[0].proc.wait(timeout=30) == 0
            after = survivor.ok
            wait_for(lambda: survivor.ok >= after + 20, 30, "streams through the survivor after the stop")
            for t in traffic:
                t.join()
            assert dict(stopped.failed) == {}  # its streams in flight at SIGTERM finished
            assert dict(survivor.failed) == {}
            assert survivor.ok >= after + 20
        finally:
            for t in traffic:
                t.stop.set()


def test_an_address_the_cluster_does_not_provide_is_refused(rendered, tmp_path: Path) -> None:
    cluster = LocalCluster(rendered["overlays/single-region"], tmp_path, ["ferry"], "127.0.0.1:1")
    with pytest.raises(AssertionError, match="no pod started"):
        cluster.service_addresses("controlplane", 7070)
    with pytest.raises(ValueError, match="entry point"):
        LocalCluster([], tmp_path, ["python", "-m", "ferry"], "127.0.0.1:1")
    assert str(ROOT) in str(Path(__file__).resolve())
