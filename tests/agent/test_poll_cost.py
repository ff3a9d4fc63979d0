"""One poll's cost: ServerLive only when a ModelReady got no answer; only the families read are parsed."""

from __future__ import annotations

from pathlib import Path

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from agent.scrape import Samples, parse
from agent.triton import METRICS_READ, TritonEndpoint, from_metrics
from ferry.grpcutil import start_server

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "trtllm_metrics.txt"


class CountingRepository(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Counts ServerLive calls; ``chat`` is ready, ``broken`` answers UNAVAILABLE, anything else NOT_FOUND."""

    def __init__(self) -> None:
        self.live_calls = 0

    async def ServerLive(self, request, context):
        self.live_calls += 1
        return pb.ServerLiveResponse(live=True)

    async def ModelReady(self, request, context):
        if request.name == "broken":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "loading")
        if request.name != "chat":
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such model")
        return pb.ModelReadyResponse(ready=True)


async def test_server_live_is_asked_only_when_a_model_ready_got_no_answer() -> None:
    repo = CountingRepository()
    add = service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server
    server, port = await start_server([(add, repo, "inference.GRPCInferenceService")], "127.0.0.1:0")
    endpoint = TritonEndpoint(f"127.0.0.1:{port}", None, timeout_seconds=2.0)
    try:
        answered = await endpoint.poll([("chat", "1"), ("gone", "1")])  # an answer each, NOT_FOUND included
        assert answered.reachable and repo.live_calls == 0
        assert answered.models[("chat", "1")].ready and not answered.models[("gone", "1")].ready
        unanswered = await endpoint.poll([("chat", "1"), ("broken", "1")])
        assert unanswered.reachable and repo.live_calls == 1 and not unanswered.models[("broken", "1")].ready
        nothing_asked = await endpoint.poll([])
        assert nothing_asked.reachable and repo.live_calls == 2
    finally:
        await endpoint.close()
        await server.stop(None)


def test_parse_with_names_keeps_only_those_families() -> None:
    text = FIXTURE.read_text()
    every = parse(text)
    some = parse(text, names=METRICS_READ)
    assert {s.name for s in some} == {s.name for s in every} & METRICS_READ
    assert some == [s for s in every if s.name in METRICS_READ]
    for model in ("ensemble", "tensorrt_llm"):
        assert from_metrics(Samples(some), model, "1", ready=True) == from_metrics(Samples(every), model, "1",
                                                                                   ready=True)
    assert parse('a{x="1"} 1\nab 2\nb 3\n', names={"a", "b"}) == [s for s in parse('a{x="1"} 1\nab 2\nb 3\n')
                                                                  if s.name != "ab"]
