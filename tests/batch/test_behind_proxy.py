"""The batch runtime behind the proxy, as real processes: a GPU killed under load, a gang model that lost a GPU.

A control plane, a proxy and ``ferry node --batch-runtime`` on eight simulated
GPUs hosting ``batchstring`` (one GPU per batch) and ``big`` (all eight). Load
goes through the proxy's ``Inference.Infer``; a GPU is killed mid-load through
the fault injector (the reserved model ``ferry.fault`` on the runtime's own
address). Every request must be answered once, with its own answer, and the
runtime must have answered exactly as many as the clients received; ``big``
must leave the table (its replica reported ``warming``) while ``batchstring``
keeps serving, and come back when the GPU is restored.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_sync
from tritonclient.grpc import InferInput

from agent.batch.reference import transform
from agent.batch.server import FAULT_MODEL
from agent.scrape import Samples, parse
from ferry.v1 import common_pb2, inference_pb2
from tests.e2e.harness import wait_for
from tools.process_fleet import Fleet

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]
WARMING = common_pb2.REPLICA_STATE_WARMING
SMALL, BIG = "node-b-b0", "node-b-b1"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    node = ["--gpus", "8", "--batch-runtime", "--batch-gang-model", "big", "--allow-fault-injection"]
    f = Fleet(tmp_path, {"node-b": []}, node_args={"node-b": node}, expect={SMALL, BIG})
    try:
        yield f.start()
    finally:
        f.stop()


def fault(address: str, command: str) -> dict[str, Any]:
    tensor = InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([command.encode()], dtype=object))
    with triton_sync.InferenceServerClient(address) as client:
        result = client.infer(FAULT_MODEL, [tensor])
    return dict(json.loads(result.as_numpy("text_output").reshape(-1)[0]))


def runtime_counts(metrics_address: str) -> Samples:
    import urllib.request

    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5) as response:
        return Samples(parse(response.read().decode()))


def ask(stub: Any, key: str, prompt: str, model: str = "batchstring") -> Any:
    request = inference_pb2.InferRequest(model=model, prompt=prompt, max_tokens=16, tier=common_pb2.TIER_STANDARD)
    return stub.Infer(request, metadata=(("x-api-key", key),), timeout=20)


def test_gpu_killed_under_load_every_request_answered_once_and_gang_model_leaves_the_table(fleet: Fleet) -> None:
    runtime = fleet.nodes["node-b"].ready["batch_runtime"]
    outcomes: Counter[str] = Counter()
    wrong: list[str] = []
    lock = threading.Lock()
    ids = itertools.count()
    stop = threading.Event()
    with grpc.insecure_channel(fleet.data_plane) as channel:
        stub = fleet.inference(channel)
        assert ask(stub, fleet.keys["ent"], "gang", "big").text == transform("gang")

        def client(key: str) -> None:
            while not stop.is_set():
                prompt = f"q{next(ids)}"
                try:
                    reply = ask(stub, key, prompt)
                except grpc.RpcError as exc:
                    with lock:
                        outcomes[exc.code().name] += 1
                    continue
                with lock:
                    outcomes["OK"] += 1
                    if reply.text != transform(prompt):
                        wrong.append(prompt)

        with ThreadPoolExecutor(16) as pool:
            workers = [pool.submit(client, fleet.keys["ent" if i % 2 else "free"]) for i in range(16)]
            wait_for(lambda: outcomes["OK"] >= 100, 20, "load to flow")
            report = wait_for(lambda: _kill_a_running_batch(runtime["address"]), 10, "a GPU killed mid-batch")
            wait_for(lambda: outcomes["OK"] >= 300, 20, "load to go on after the kill")
            stop.set()
            for w in workers:
                w.result()

        assert set(outcomes) == {"OK"} and not wrong, (outcomes, wrong[:5])
        counts = runtime_counts(runtime["metrics"])
        answered = counts.get("nv_inference_request_success", model="batchstring", version="v1")
        assert answered == outcomes["OK"], "the runtime answered each request once: no more, no fewer"
        assert counts.get("ferry_batch_requeued_total", model="batchstring") == report["requeued"] > 0
        assert counts.get("ferry_batch_aborted_total", model="batchstring", version="v1") == 1

        # One of eight GPUs gone: the gang model leaves the table, the small model keeps serving.
        wait_for(lambda: not fleet.replicas()[BIG].in_table, 10, "the gang model to leave the table")
        views = fleet.replicas()
        assert views[BIG].state == WARMING and views[SMALL].in_table
        with pytest.raises(grpc.RpcError) as refused:
            ask(stub, fleet.keys["ent"], "gang", "big")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert ask(stub, fleet.keys["ent"], "still here").text == transform("still here")

        assert fault(runtime["address"], f"restore {report['gpu']}") == {"gpu": report["gpu"], "restored": True}
        wait_for(lambda: fleet.replicas()[BIG].in_table, 10, "the gang model back in the table")
        assert ask(stub, fleet.keys["ent"], "back", "big").text == transform("back")


def _kill_a_running_batch(address: str) -> dict[str, Any] | None:
    """Kill the GPU of the oldest running batch; if none was running, give the GPU back and try again."""
    report = fault(address, "kill")
    if report["batch_id"] is not None:
        assert report["failed"] == 0 and report["unavailable"] == ["big"]
        return report
    fault(address, f"restore {report['gpu']}")
    return None
