"""Health end to end: a replica made ten times slower (SIGUSR1 on its node) is ejected, then readmitted."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from collections import Counter

import grpc

from ferry.v1 import common_pb2, inference_pb2
from tests.e2e.harness import wait_for


def _ejections(metrics_address: str) -> float:
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("ferry_proxy_outlier_ejections_total{") and 'reason="latency"' in line)


def test_a_ten_times_slower_replica_is_ejected_within_10_s_and_readmitted_after_it_recovers(make_fleet) -> None:
    fleet = make_fleet({"node-a": ["chat:v1"], "node-b": ["chat:v1"], "node-c": ["chat:v1"]})
    key = (("x-api-key", fleet.keys["ent"]),)
    request = inference_pb2.InferRequest(model="chat", prompt="a b c d", max_tokens=20,
                                         tier=common_pb2.TIER_INTERACTIVE)
    served: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    lock = threading.Lock()
    stop = threading.Event()
    metrics = str(fleet.proxies[0].ready["metrics"])
    with grpc.insecure_channel(fleet.data_plane) as ch:
        stub = fleet.inference(ch)

        def worker() -> None:
            while not stop.is_set():
                try:
                    node = stub.Infer(request, metadata=key, timeout=10).replica_id.split("-r")[0]
                    with lock:
                        served[node] += 1
                except grpc.RpcError as exc:
                    with lock:
                        failures[exc.code().name] += 1

        threads = [threading.Thread(target=worker) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            wait_for(lambda: served["node-c"] >= 5, 10, "node-c to serve before it is slowed")
            os.kill(fleet.nodes["node-c"].pid, signal.SIGUSR1)  # ten times slower
            slowed = time.monotonic()
            wait_for(lambda: _ejections(metrics) >= 1, 10, "the slow replica to be ejected")
            ejected_after = time.monotonic() - slowed
            os.kill(fleet.nodes["node-c"].pid, signal.SIGUSR1)  # recovered
            with lock:
                before = served["node-c"]
            wait_for(lambda: served["node-c"] >= before + 20, 40, "the recovered replica to serve again")
        finally:
            stop.set()
            for t in threads:
                t.join()
    assert ejected_after < 10.0
    assert not failures, failures
