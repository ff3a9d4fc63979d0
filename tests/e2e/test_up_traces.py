"""``ferry up --trace-stdout``: a streamed request's span tree printed by ``ferry up`` itself, through the proxy
(gRPC) and through Envoy and a picker (OpenAI HTTP), each under the caller's trace id."""

from __future__ import annotations

import json
import signal
import urllib.request
from pathlib import Path

import grpc

from ferry.procs import Child
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tests.e2e.harness import wait_for

PROXY_TRACE = "0af7651916cd43dd8448eb211c80319c"
ENVOY_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def block(log: Path, trace_id: str) -> list[str]:
    """The printed tree of ``trace_id`` in ``ferry up``'s output (empty until it is printed)."""
    lines = log.read_text(errors="replace").splitlines()
    head = f"trace {trace_id}"
    for i, line in enumerate(lines):
        if line.startswith(head):
            end = next((j for j in range(i + 1, len(lines)) if not lines[j].startswith("  ")), len(lines))
            return lines[i:end]
    return []


def test_ferry_up_prints_the_span_tree_of_a_streamed_request(tmp_path: Path) -> None:
    up = Child("up", ["up", "--replicas", "2", "--models", "chat-small", "--pickers", "1", "--trace-stdout",
                      "--workdir", str(tmp_path / "fleet")], tmp_path).start()
    try:
        ready = up.wait_ready(90)
        assert ready["traces"]
        key = ready["api_keys"]["paid-1"]
        with grpc.insecure_channel(ready["data_plane"]) as channel:
            chunks = list(inference_pb2_grpc.InferenceStub(channel).InferStream(
                inference_pb2.InferRequest(model="chat-small", prompt="hello there", max_tokens=4,
                                           tier=common_pb2.TIER_INTERACTIVE),
                metadata=(("x-api-key", key), ("traceparent", f"00-{PROXY_TRACE}-00f067aa0ba902b7-01")),
                timeout=30))
        assert chunks[-1].final
        body = json.dumps({"model": "chat-small", "prompt": "hello there", "max_tokens": 4, "stream": True}).encode()
        request = urllib.request.Request(f"http://{ready['envoy']}/v1/completions", data=body, headers={
            "Authorization": f"Bearer {key}", "Content-Type": "application/json",
            "traceparent": f"00-{ENVOY_TRACE}-00f067aa0ba902b7-01"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200 and b"[DONE]" in answer.read()
        log = up.log_path
        proxied = wait_for(lambda: block(log, PROXY_TRACE), 30, "the proxy's trace printed")
        picked = wait_for(lambda: block(log, ENVOY_TRACE), 30, "the picker's trace printed")
        print("\n".join(proxied + picked))
        assert proxied[0].endswith("(ferry-proxy)")
        assert proxied[1].startswith("  ferry.v1.Inference/InferStream  ") and "status=OK" in proxied[1]
        names = [line.split()[0] for line in proxied[2:]]
        assert "decision" in names and "forward" in names and "·" in names  # the first token's event
        assert all(line.startswith("    ") for line in proxied[2:])  # the root's children, indented under it
        assert " ms" in proxied[1] and "outcome=ok" in "\n".join(proxied)
        assert picked[0].endswith("(ferry-picker)") and picked[1].startswith("  pick  ")
        assert "status=OK" in picked[1] and any(line.startswith("    forward  ") for line in picked)
        up.kill(signal.SIGINT)
        assert up.proc is not None and up.proc.wait(30) == 0
    finally:
        up.stop()
