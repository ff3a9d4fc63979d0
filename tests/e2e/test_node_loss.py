"""A node killed under mixed load costs no request of any tier: refusals and lost connections are retried.

Three nodes of two replicas each, 12 clients sending unary and streaming
requests over the three tiers; one node is SIGKILLed (its agent and both
replicas die at once) while they run. Requests in flight there, and those
sent there before the proxy or the table knew, are retried or continued
elsewhere; none may fail.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc

from ferry.v1 import common_pb2, inference_pb2
from tests.e2e.harness import wait_for

TIERS = (common_pb2.TIER_INTERACTIVE, common_pb2.TIER_STANDARD, common_pb2.TIER_BATCH)


def test_a_node_killed_under_load_costs_no_request_of_any_tier(make_fleet) -> None:
    fleet = make_fleet({"node-a": ["chat:v1", "chat:v1"], "node-b": ["chat:v1", "chat:v1"],
                        "node-c": ["chat:v1", "chat:v1"]})
    key = (("x-api-key", fleet.keys["ent"]),)
    outcomes: Counter[tuple[str, int, bool]] = Counter()
    served: Counter[str] = Counter()
    retried = 0
    lock = threading.Lock()
    killed = threading.Event()
    stop_at = [time.monotonic() + 60.0]
    with grpc.insecure_channel(fleet.data_plane) as ch:
        stub = fleet.inference(ch)

        def worker(index: int) -> None:
            nonlocal retried
            for n in itertools.count():
                if time.monotonic() >= stop_at[0]:
                    return
                tier, streaming = TIERS[(index + n) % 3], (index + n) % 2 == 1
                request = inference_pb2.InferRequest(model="chat", prompt=f"w{index} {n} a b c", max_tokens=24,
                                                     tier=tier)
                try:
                    if streaming:
                        chunks = list(stub.InferStream(request, metadata=key, timeout=15))
                        assert chunks[-1].final and chunks[-1].summary.completion_tokens == 24
                        summary = chunks[-1].summary
                    else:
                        summary = stub.Infer(request, metadata=key, timeout=15)
                    with lock:
                        outcomes[("OK", tier, streaming)] += 1
                        served[summary.replica_id.split("-r")[0]] += 1
                        retried += summary.attempts > 1 and killed.is_set()
                except grpc.RpcError as exc:
                    with lock:
                        outcomes[(f"{exc.code().name}: {exc.details()}", tier, streaming)] += 1

        with ThreadPoolExecutor(12) as pool:
            futures = [pool.submit(worker, i) for i in range(12)]
            wait_for(lambda: served["node-a"] >= 10 and sum(served.values()) >= 60, 20, "load on every node")
            fleet.nodes["node-a"].kill()  # SIGKILL: its agent and both replicas die at once
            killed.set()
            stop_at[0] = time.monotonic() + 4.0  # past the membership grace (2 s): the table drops the node
            for f in futures:
                f.result()
    failed = {k: v for k, v in outcomes.items() if k[0] != "OK"}
    assert not failed, failed
    assert {(tier, streaming) for _, tier, streaming in outcomes} == set(itertools.product(TIERS, (False, True)))
    assert sum(outcomes.values()) > 200, outcomes
    assert retried > 0, "requests sent to the killed node must have been retried elsewhere"
    wait_for(lambda: not any(r.in_table for r in fleet.replicas().values() if r.node == "node-a"), 10,
             "the dead node's replicas to leave the table")
