"""Tiers end to end: shedding with retry-after from the tier queues, and idempotency keys, over real processes."""

from __future__ import annotations

import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from ferry.v1 import common_pb2, inference_pb2
from tests.e2e.harness import wait_for
from tools.process_fleet import Fleet

# One replica of two slots; tiny tier queues with a 1 s timeout.
TIGHT = {"replica": {"max_running": 2}, "proxy": {"queue_bounds": [2, 2, 2], "queue_timeouts": [1.0, 1.0, 1.0]}}


def request(**kw: object) -> inference_pb2.InferRequest:
    fields = {"model": "chat", "prompt": "the quick brown fox", "max_tokens": 8,
              "tier": common_pb2.TIER_STANDARD, **kw}
    return inference_pb2.InferRequest(**fields)  # type: ignore[arg-type]


def test_full_tier_queue_sheds_with_retry_after(make_fleet) -> None:  # type: ignore[no-untyped-def]
    fleet: Fleet = make_fleet({"node-a": ["chat:v1"]}, config=TIGHT)
    key = (("x-api-key", fleet.keys["ent"]),)
    with grpc.insecure_channel(fleet.data_plane) as ch:
        stub = fleet.inference(ch)

        def one(_: int) -> tuple[str, dict[str, str], str]:
            try:
                stub.Infer(request(max_tokens=150), metadata=key, timeout=20)
                return "OK", {}, ""
            except grpc.RpcError as exc:
                return exc.code().name, dict(exc.trailing_metadata() or ()), exc.details() or ""

        with ThreadPoolExecutor(10) as pool:
            outcomes = list(pool.map(one, range(10)))
    statuses = Counter(s for s, _, _ in outcomes)
    assert statuses["OK"] >= 2 and statuses["RESOURCE_EXHAUSTED"] >= 1, statuses
    assert set(statuses) <= {"OK", "RESOURCE_EXHAUSTED"}, outcomes
    for status, md, details in outcomes:
        if status == "RESOURCE_EXHAUSTED":
            assert float(md["retry-after"]) > 0 and "standard queue" in details, (md, details)


def test_idempotency_join_replay_mismatch_and_tenant(make_fleet) -> None:  # type: ignore[no-untyped-def]
    fleet: Fleet = make_fleet({"node-a": ["chat:v1"]})
    ent = (("x-api-key", fleet.keys["ent"]),)
    free = (("x-api-key", fleet.keys["free"]),)
    body = request(max_tokens=100, idempotency_key="order-42")
    with grpc.insecure_channel(fleet.data_plane) as ch:
        stub = fleet.inference(ch)
        with ThreadPoolExecutor(3) as pool:
            first = list(pool.map(lambda _: stub.Infer(body, metadata=ent, timeout=20), range(3)))
        assert len({r.request_id for r in first}) == 1  # joined the one in flight
        again = stub.Infer(body, metadata=ent, timeout=20)
        assert again.request_id == first[0].request_id and again.text == first[0].text  # its recent result
        with pytest.raises(grpc.RpcError) as info:
            stub.Infer(request(max_tokens=99, idempotency_key="order-42"), metadata=ent, timeout=20)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "idempotency_key" in (info.value.details() or "")
        other = stub.Infer(body, metadata=free, timeout=20)
        assert other.request_id != first[0].request_id  # results never cross tenants


def test_interactive_preempts_batch_which_is_requeued_and_answered_once(make_fleet) -> None:  # type: ignore[no-untyped-def]
    fleet: Fleet = make_fleet({"node-a": ["chat:v1"]}, config={"replica": {"max_running": 2}})
    key = (("x-api-key", fleet.keys["ent"]),)
    metrics_url = f"http://{fleet.proxies[0].ready['metrics']}/metrics"
    with grpc.insecure_channel(fleet.data_plane) as ch:
        stub = fleet.inference(ch)
        with ThreadPoolExecutor(3) as pool:
            batch = [pool.submit(stub.Infer, request(max_tokens=400, tier=common_pb2.TIER_BATCH), metadata=key,
                                 timeout=30) for _ in range(2)]
            wait_for(lambda: _metric(metrics_url, 'ferry_proxy_admitted_total{model="chat",tier="batch"}') >= 2,
                     10, "both batch requests dispatched")
            interactive = stub.Infer(request(max_tokens=8, tier=common_pb2.TIER_INTERACTIVE), metadata=key,
                                     timeout=10)
            assert not all(f.done() for f in batch)  # interactive did not wait for the batch to finish
            answers = [f.result() for f in batch]
    assert interactive.completion_tokens == 8
    assert [a.completion_tokens for a in answers] == [400, 400]  # requeued and answered once, in full
    assert _metric(metrics_url, 'ferry_proxy_preempted_total{model="chat",reason="reclaim"}') >= 1


def _metric(url: str, series: str) -> float:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0
