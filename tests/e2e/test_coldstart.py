"""Cold start end to end: a version whose only replica is still loading its model.

Node ``warm`` serves ``chat:v1``; node ``cold`` serves ``chat:v2`` from a
simulated replica that answers ModelReady false for its first seconds (as a
Triton loading a model does). Its agent reports it ``warming``; the control
plane keeps it out of the routable set and lists v2 as warming; the proxy
(told to expect the same warm-up) answers an interactive request for v2 at
once with UNAVAILABLE and a retry-after sized to the warm-up left, lets a
standard request (10 s queue timeout) wait and serves it on the v2 replica once
it is ready, and keeps serving v1 meanwhile.
"""

from __future__ import annotations

import time

import grpc
import pytest

from ferry.v1 import common_pb2, inference_pb2
from tests.e2e.harness import wait_for
from tools.process_fleet import Fleet

WARMUP = 6.0


def request(version: str, tier: int) -> inference_pb2.InferRequest:
    return inference_pb2.InferRequest(model="chat", version=version, prompt="a b c d", max_tokens=3, tier=tier)


def test_a_warming_version_is_refused_with_retry_after_or_waited_for_by_tier(make_fleet) -> None:
    started = time.monotonic()
    fleet: Fleet = make_fleet({"warm": ["chat:v1"], "cold": ["chat:v2"]}, expect={"warm-r0"},
                              node_args={"cold": ["--warmup-seconds", str(WARMUP)]},
                              config={"proxy": {"coldstart_warmup_seconds": WARMUP}})
    states = wait_for(lambda: {k: r.state for k, r in fleet.replicas().items()}.get("cold-r0"), 10,
                      "the v2 replica to register")
    assert states == common_pb2.REPLICA_STATE_WARMING and not fleet.replicas()["cold-r0"].in_table
    key = (("x-api-key", fleet.keys["ent"]),)
    with grpc.insecure_channel(fleet.data_plane) as channel:
        stub = fleet.inference(channel)
        assert stub.Infer(request("v1", common_pb2.TIER_INTERACTIVE), metadata=key, timeout=10).model_version == "v1"

        def refusal() -> grpc.RpcError | None:
            """The answer to an interactive request for v2, once the proxy's table lists v2 as warming."""
            with pytest.raises(grpc.RpcError) as info:
                stub.Infer(request("v2", common_pb2.TIER_INTERACTIVE), metadata=key, timeout=10)
            if info.value.code() == grpc.StatusCode.NOT_FOUND:  # the table naming v2 is not applied yet
                return None
            return info.value

        # Interactive may queue 2 s: less than the warm-up left, so it is refused at once, naming the version.
        refused = wait_for(refusal, 3, "the proxy to apply a table that lists v2 as warming", interval=0.1)
        left = WARMUP - (time.monotonic() - started)
        assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused.details()
        assert "v2" in (refused.details() or "")
        retry_after = float(dict(refused.trailing_metadata() or ())["retry-after"])
        assert 1.0 <= retry_after <= WARMUP and retry_after >= left - 2.0, (retry_after, left)

        # Standard may queue 10 s: it waits for the replica to be ready and is served there.
        asked = time.monotonic()
        reply = stub.Infer(request("v2", common_pb2.TIER_STANDARD), metadata=key, timeout=20)
        waited = time.monotonic() - asked
        assert (reply.replica_id, reply.model_version, reply.completion_tokens) == ("cold-r0", "v2", 3)
        assert waited > 0.5, waited  # it did wait for the warm-up, not find v2 ready
    assert fleet.replicas()["cold-r0"].state == common_pb2.REPLICA_STATE_READY
