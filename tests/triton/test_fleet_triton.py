"""Ferry in front of two real Triton servers: an agent beside each, traffic through the proxy.

The agents adopt the servers' LLM models (``llm``: decoupled, for streams;
``llm-unary``: for unary calls), register them, and report their telemetry
from Triton's own statistics and metrics. Then one server is drained, and the
other is killed with SIGKILL while the first keeps every interactive request.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from ferry.v1 import admin_pb2, common_pb2, inference_pb2
from tests.e2e.harness import wait_for
from tools.process_fleet import Fleet
from tools.triton.launch import TritonProcess

pytestmark = [pytest.mark.triton, pytest.mark.timeout(180)]

MODELS = [{"name": "llm", "default_version": "1"}, {"name": "llm-unary", "default_version": "1"}]


def ids(node: str) -> set[str]:
    return {f"{node}-llm-1", f"{node}-llm-unary-1"}


@pytest.fixture
def triton_fleet(tmp_path: Path, triton_factory: Callable[[], TritonProcess]) -> Iterator[tuple[Fleet, list]]:
    servers = [triton_factory(), triton_factory()]
    fleet = Fleet(tmp_path, {"t1": [], "t2": []}, config={"models": MODELS},
                  node_args={f"t{i + 1}": ["--triton", s.grpc, "--triton-metrics", s.metrics_url]
                             for i, s in enumerate(servers)},
                  expect=ids("t1") | ids("t2"))
    try:
        yield fleet.start(), servers
    finally:
        fleet.stop()


def req(model: str, tokens: int = 6, n: int = 0) -> inference_pb2.InferRequest:
    # Distinct prompts: identical ones share a prefix, and prefix affinity rightly keeps them on one replica.
    return inference_pb2.InferRequest(model=model, prompt=f"question {n}: tell me about ferries", max_tokens=tokens,
                                      tier=common_pb2.TIER_INTERACTIVE)


def test_routes_unary_and_streams_to_real_triton_then_survives_drain_and_kill(triton_fleet) -> None:
    fleet, servers = triton_fleet
    key = (("x-api-key", fleet.keys["ent"]),)
    with grpc.insecure_channel(fleet.data_plane) as ch:
        stub = fleet.inference(ch)
        unary = [stub.Infer(req("llm-unary", n=n), metadata=key, timeout=20) for n in range(16)]
        assert all(len(r.text.split()) == 6 for r in unary)
        assert {r.replica_id for r in unary} == {"t1-llm-unary-1", "t2-llm-unary-1"}, "both servers take work"
        chunks = list(stub.InferStream(req("llm", 5), metadata=key, timeout=20))
        assert chunks[-1].final and len("".join(c.text for c in chunks[:-1]).split()) == 5
        assert len(chunks) >= 3, "a real decoupled model streams several responses"

        # Telemetry from real Triton is visible to operators.
        listing = subprocess.run([sys.executable, "-c", "import sys; from ferry_cli.ctl.main import main; "
                                  "sys.exit(main(sys.argv[1:]))", "--control-plane", fleet.cp_address,
                                  "--admin-token", fleet.admin_token, "replicas", "--json"],
                                 capture_output=True, text=True, timeout=30)
        rows = {r["id"]: r for r in json.loads(listing.stdout)}
        assert set(rows) == ids("t1") | ids("t2") and all(r["state"] == "ready" for r in rows.values())
        assert all(r["telemetry_age_s"] < 3 for r in rows.values())

        # Drain t1's unary replica: no new work lands there.
        channel, admin = fleet.admin()
        with channel:
            admin.Drain(admin_pb2.DrainRequest(replica_id="t1-llm-unary-1"), timeout=5)
            # The call returns once the leader's table has the drain; the proxy applies it a push later.
            version = max(t.version for t in admin.GetStatus(admin_pb2.GetStatusRequest(), timeout=5).regions)
            wait_for(lambda: all(p.applied_version >= version for p in admin.GetStatus(
                admin_pb2.GetStatusRequest(), timeout=5).proxies), 5, "the proxy to apply the drained table")
        assert {stub.Infer(req("llm-unary", n=n), metadata=key, timeout=20).replica_id for n in range(6)} == {
            "t2-llm-unary-1"}
        wait_for(lambda: fleet.replicas()["t1-llm-unary-1"].state == common_pb2.REPLICA_STATE_DRAINED, 15,
                 "the drained Triton replica to report drained")
        channel, admin = fleet.admin()
        with channel:
            admin.Undrain(admin_pb2.DrainRequest(replica_id="t1-llm-unary-1"), timeout=5)
        wait_for(lambda: fleet.replicas()["t1-llm-unary-1"].in_table, 15, "the undrained replica back")

        # Kill t2's Triton with SIGKILL under interactive load: t1 keeps every request.
        outcomes: Counter[str] = Counter()
        lock = threading.Lock()
        stop_at = time.monotonic() + 6.0

        def worker() -> None:
            while time.monotonic() < stop_at:
                try:
                    r = stub.Infer(req("llm-unary", 3, n=int(time.monotonic() * 1000)), metadata=key, timeout=20)
                    with lock:
                        outcomes["OK " + r.replica_id] += 1
                except grpc.RpcError as exc:
                    with lock:
                        outcomes[exc.code().name] += 1

        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(worker) for _ in range(6)]
            time.sleep(2.0)
            servers[1].kill()
            for f in futures:
                f.result()
        failed = {k: v for k, v in outcomes.items() if not k.startswith("OK")}
        assert failed == {}, outcomes
        assert outcomes["OK t1-llm-unary-1"] > 0
        wait_for(lambda: fleet.replicas()["t2-llm-unary-1"].state == common_pb2.REPLICA_STATE_DEAD
                 or not fleet.replicas()["t2-llm-unary-1"].in_table, 15, "the killed server's replica to leave")
