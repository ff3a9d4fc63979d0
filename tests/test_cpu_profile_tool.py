"""tools.profile_cpu's pure parts, and the cheaper forwarding it led to: the same request on the wire."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import InferInput, service_pb2
from tritonclient.grpc._utils import _get_inference_request

from dataplane.forward.kserve import Call, ForwardFailed, _text, request_message
from tools import profile_cpu


def test_cpu_seconds_reads_this_process_and_none_for_a_gone_one() -> None:
    spent = profile_cpu.cpu_seconds(os.getpid())
    assert spent is not None and spent > 0
    assert profile_cpu.cpu_seconds(2**22 + 1) is None  # above pid_max: never a process


def test_children_of_finds_a_child(tmp_path: Path) -> None:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert child.pid in profile_cpu.children_of(os.getpid())
    finally:
        child.kill()
        child.wait()


def test_groups_by_name() -> None:
    names = ["controlplane", "controlplane-2", "proxy", "proxy-a", "triton-3", "node-1", "replica-8", "ferry-up"]
    assert [profile_cpu.group(n) for n in names] == ["controlplane", "controlplane", "proxy", "proxy", "agent",
                                                     "agent", "replica", "other"]


def test_summary_per_thousand_and_groups() -> None:
    pids = {"proxy": 1, "triton-1": 2, "triton-2": 3, "gone": 4}
    before = {"proxy": 1.0, "triton-1": 0.5, "triton-2": 0.5, "gone": 0.0}
    after = {"proxy": 3.0, "triton-1": 0.7, "triton-2": 0.9}
    result = profile_cpu.summarize_cpu(pids, before, after, streamed=500, wall=10.0)
    assert result["processes"]["proxy"]["per_1000"] == 4.0 and "gone" not in result["processes"]
    agents = result["groups"]["agent"]
    assert agents["processes"] == 2 and agents["per_1000"] == pytest.approx(1.2)
    assert agents["per_1000_each"] == pytest.approx(0.6) and agents["cores"] == pytest.approx(0.06)


def test_collapsed_ranking_counts_self_and_cumulative_once_per_stack(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text("main (a.py:1);f (a.py:5);g (b.py:2) 3\n"
                   "main (a.py:1);f (a.py:6) 1\n"
                   "main (a.py:1);f (a.py:5);f (a.py:5) 1\n")
    ranking = profile_cpu.collapsed_ranking(raw, top=10)
    assert ranking["samples"] == 5
    cumulative = dict(ranking["cumulative"])
    assert cumulative["main (a.py)"] == 1.0 and cumulative["f (a.py)"] == 1.0 and cumulative["g (b.py)"] == 0.6
    assert dict(ranking["self"]) == {"g (b.py)": 0.6, "f (a.py)": 0.4}


CALLS = [Call(request_id="req-1", prompt="héllo there".encode(), prompt_tokens=2, max_tokens=32,
              tier="interactive", priority=1, tenant="acme", plan="paid"),
         Call(request_id="", prompt=b"", prompt_tokens=0, max_tokens=1, tier="batch", priority=0, tenant="t",
              plan="free")]


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("call", CALLS, ids=["usual", "empty"])
def test_request_message_is_what_tritonclient_builds(call: Call, stream: bool) -> None:
    text = InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[call.prompt]], dtype=np.object_))
    tokens = InferInput("max_tokens", [1, 1], "INT32")
    tokens.set_data_from_numpy(np.array([[call.max_tokens]], dtype=np.int32))
    inputs = [text, tokens]
    if stream:
        flag = InferInput("stream", [1, 1], "BOOL")
        flag.set_data_from_numpy(np.array([[True]], dtype=np.bool_))
        inputs.append(flag)
    expected = _get_inference_request(
        model_name="chat", inputs=inputs, model_version="", request_id=call.request_id, outputs=None,
        sequence_id=0, sequence_start=False, sequence_end=False, priority=call.priority, timeout=None,
        parameters={"ferry_tier": call.tier, "ferry_tenant": call.tenant, "ferry_plan": call.plan})
    assert request_message(call, "chat", stream=stream) == expected


def _response(outputs: list[tuple[str, str, bytes | None]]) -> service_pb2.ModelInferResponse:
    response = service_pb2.ModelInferResponse(model_name="chat")
    for name, datatype, raw in outputs:
        out = response.outputs.add(name=name, datatype=datatype, shape=[1, 1])
        if raw is None:
            out.contents.bytes_contents.append("typed ü".encode())
        else:
            response.raw_output_contents.append(raw)
    return response


def test_text_reads_raw_bytes_typed_contents_and_refuses_empty() -> None:
    word = "wörd".encode()
    raw = struct.pack("<I", len(word)) + word
    assert _text(_response([("other", "INT32", b"\0\0\0\0"), ("text_output", "BYTES", raw)]), "r", False,
                 required=True) == "wörd"
    assert _text(_response([("text_output", "BYTES", None)]), "r", False, required=True) == "typed ü"
    assert _text(_response([]), "r", True, required=False) == ""
    with pytest.raises(ForwardFailed) as missing:
        _text(_response([]), "r", False, required=True)
    assert missing.value.kind == "bad_response" and missing.value.retryable
    with pytest.raises(ForwardFailed) as empty:
        _text(_response([("text_output", "BYTES", b"")]), "r", True, required=False)
    assert empty.value.kind == "bad_response" and not empty.value.retryable
