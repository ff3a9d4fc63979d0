"""Streaming continuity end to end: SIGKILL of the node running a stream; the client sees one whole stream."""

from __future__ import annotations

import grpc

from ferry.v1 import common_pb2, inference_pb2
from tests.e2e.harness import wait_for

TOKENS = 1500  # ~3 s at the harness's 2 ms decode steps: long enough to find and kill its node


def test_a_stream_survives_the_sigkill_of_its_replica_with_the_full_token_count(make_fleet) -> None:
    fleet = make_fleet({"node-a": ["chat:v1"], "node-b": ["chat:v1"]})
    key = (("x-api-key", fleet.keys["ent"]),)
    request = inference_pb2.InferRequest(model="chat", prompt="a b c d", max_tokens=TOKENS,
                                         tier=common_pb2.TIER_INTERACTIVE)
    with grpc.insecure_channel(fleet.data_plane) as ch:
        stream = fleet.inference(ch).InferStream(request, metadata=key, timeout=30)
        chunks = [next(stream)]
        busy = wait_for(lambda: next((r for r in fleet.replicas().values() if r.load.running > 0), None), 5,
                        "the replica running the stream to report it")
        fleet.nodes[busy.node].kill()  # SIGKILL: agent and replica die mid-stream
        chunks.extend(stream)
    final = chunks[-1]
    assert final.final, "the stream must end with its summary, not an error"
    delivered = sum(c.tokens for c in chunks if not c.final)
    assert delivered == TOKENS and final.summary.completion_tokens == TOKENS
    assert final.summary.replica_id != busy.replica_id and final.summary.attempts == 2
