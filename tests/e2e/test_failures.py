"""Failures end to end: drain, a replica killed under load, the control plane killed and restarted."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc

from ferry.v1 import admin_pb2, common_pb2, inference_pb2
from tests.e2e.harness import wait_for

READY = common_pb2.REPLICA_STATE_READY
DRAINED = common_pb2.REPLICA_STATE_DRAINED


def req(max_tokens: int = 4, tier: int = common_pb2.TIER_INTERACTIVE) -> inference_pb2.InferRequest:
    return inference_pb2.InferRequest(model="chat", prompt="a b c d", max_tokens=max_tokens, tier=tier)


def test_drain_takes_no_new_work_and_running_streams_finish(make_fleet) -> None:
    fleet = make_fleet({"node-a": ["chat:v1"], "node-b": ["chat:v1"]})
    key = (("x-api-key", fleet.keys["ent"]),)
    with grpc.insecure_channel(fleet.data_plane) as ch:
        stub = fleet.inference(ch)
        # A long stream pinned to whichever replica it lands on; drain that replica mid-stream.
        stream = stub.InferStream(req(max_tokens=400), metadata=key, timeout=30)
        first = next(stream)
        assert not first.final
        channel, admin = fleet.admin()
        busy = wait_for(lambda: next((r for r in fleet.replicas().values() if r.load.running > 0), None), 5,
                        "the replica running the stream to report it")
        with channel:
            view = admin.Drain(admin_pb2.DrainRequest(replica_id=busy.replica_id), timeout=5).replica
        assert view.drain_requested and not view.in_table
        rest = list(stream)
        assert rest[-1].final and rest[-1].summary.completion_tokens == 400
        assert rest[-1].summary.replica_id == busy.replica_id
        # New work never lands on the drained replica.
        others = {stub.Infer(req(), metadata=key, timeout=10).replica_id for _ in range(30)}
        assert busy.replica_id not in others
        wait_for(lambda: fleet.replicas()[busy.replica_id].state == DRAINED, 10, "the replica to report drained")
        channel, admin = fleet.admin()
        with channel:
            admin.Undrain(admin_pb2.DrainRequest(replica_id=busy.replica_id), timeout=5)
        wait_for(lambda: fleet.replicas()[busy.replica_id].in_table, 10, "the undrained replica back in the table")
        wait_for(lambda: busy.replica_id in {stub.Infer(req(), metadata=key, timeout=10).replica_id
                                             for _ in range(20)}, 10, "traffic to reach the undrained replica")


def test_replica_killed_under_load_costs_no_interactive_request(make_fleet) -> None:
    fleet = make_fleet({"node-a": ["chat:v1", "chat:v1"], "node-b": ["chat:v1", "chat:v1"]})
    key = (("x-api-key", fleet.keys["ent"]),)
    outcomes: Counter[str] = Counter()
    replicas_seen: Counter[str] = Counter()
    retried = 0
    lock = threading.Lock()
    stop_at = time.monotonic() + 6.0
    with grpc.insecure_channel(fleet.data_plane) as ch:
        stub = fleet.inference(ch)

        def worker() -> None:
            nonlocal retried
            while time.monotonic() < stop_at:
                try:
                    r = stub.Infer(req(max_tokens=20), metadata=key, timeout=10)
                    with lock:
                        outcomes["OK"] += 1
                        replicas_seen[r.replica_id.split("-r")[0]] += 1
                        retried += r.attempts > 1
                except grpc.RpcError as exc:
                    with lock:
                        outcomes[exc.code().name] += 1

        with ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(worker) for _ in range(16)]
            time.sleep(2.0)
            fleet.nodes["node-a"].kill()  # SIGKILL: its agent and both replicas die at once
            for f in futures:
                f.result()
    assert outcomes["OK"] > 100 and set(outcomes) == {"OK"}, outcomes
    assert replicas_seen["node-a"] > 0 and replicas_seen["node-b"] > 0
    assert retried > 0, "requests in flight on the killed node must have been retried elsewhere"
    wait_for(lambda: not any(r.in_table for r in fleet.replicas().values() if r.node == "node-a"), 10,
             "the dead node's replicas to leave the table")


def test_proxy_serves_on_last_table_while_control_plane_is_dead_and_resyncs(make_fleet) -> None:
    fleet = make_fleet({"node-a": ["chat:v1"], "node-b": ["chat:v1"]})
    key = (("x-api-key", fleet.keys["ent"]),)
    assert fleet.control_plane is not None
    fleet.control_plane.kill()
    with grpc.insecure_channel(fleet.data_plane) as ch:
        stub = fleet.inference(ch)
        seen = set()
        deadline = time.monotonic() + 4.0  # longer than the membership grace: nothing expires at the proxy
        while time.monotonic() < deadline:
            seen.add(stub.Infer(req(), metadata=key, timeout=10).replica_id)
        assert seen == fleet.replica_ids()
        fleet.restart_control_plane()
        fleet.wait_routable(fleet.replica_ids(), timeout=30)  # agents re-registered, the proxy applied the table
        for _ in range(10):
            assert stub.Infer(req(), metadata=key, timeout=10).replica_id in fleet.replica_ids()
