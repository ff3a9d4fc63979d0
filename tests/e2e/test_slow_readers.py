"""Slow readers end to end: streams nobody reads are cancelled upstream past the unread timeout.

A fleet of processes with ``stream_unread_timeout_seconds`` = 1; eight
streams opened by a client with a small receive window (no BDP probing,
1 KiB lookahead) and never read hold eight replica slots until the proxy
cancels them; normal requests are served meanwhile; the replicas report
their slots free again well before the streams' 8,000 tokens would be done.
"""

from __future__ import annotations

import grpc

from ferry.v1 import common_pb2, inference_pb2
from tests.e2e.harness import wait_for

SMALL_WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)]


def test_unread_streams_free_their_replicas_and_others_are_served(make_fleet) -> None:
    fleet = make_fleet({"node-a": ["chat:v1", "chat:v1"]}, config={"proxy": {"stream_unread_timeout_seconds": 1.0}})
    key = (("x-api-key", fleet.keys["ent"]),)
    with grpc.insecure_channel(fleet.data_plane, options=SMALL_WINDOW) as slow, \
            grpc.insecure_channel(fleet.data_plane) as fast:
        unread = [fleet.inference(slow).InferStream(
            inference_pb2.InferRequest(model="chat", prompt=f"s {i}", max_tokens=8000, tier=common_pb2.TIER_BATCH),
            metadata=key, timeout=60) for i in range(8)]
        for call in unread:
            assert next(call).text  # started; never read again
        wait_for(lambda: sum(r.load.running for r in fleet.replicas().values()) >= 8, 10,
                 "the replicas to report the unread streams running")
        stub = fleet.inference(fast)
        for i in range(10):  # served meanwhile
            reply = stub.Infer(inference_pb2.InferRequest(model="chat", prompt=f"p {i}", max_tokens=16,
                                                          tier=common_pb2.TIER_INTERACTIVE), metadata=key, timeout=10)
            assert reply.completion_tokens == 16
        # 8,000 tokens take the engine 16 s or more; the proxy cancels them after 1 s unread.
        wait_for(lambda: sum(r.load.running for r in fleet.replicas().values()) == 0, 8,
                 "the unread streams' replica slots to be freed")
        for call in unread:
            call.cancel()
