"""Sampling parameters on both fronts: forwarded as the inputs the model declares, refused by name otherwise."""

from __future__ import annotations

import json
import struct
from typing import Any

import grpc
import pytest

from agent.replica.server import stop_limit
from agent.replica.tensors import DECLARED, LlmRequest, cut_at_stop
from dataplane.intake.validate import check_sampling, validate_request
from ferry import sampling
from ferry.config import Limits
from ferry.errors import InvalidArgument
from tests.dataplane.conftest import PAID, request
from tests.dataplane.fakes import Behaviour, route, snapshot
from tests.dataplane.test_http import front, post

pytestmark = pytest.mark.timeout(20)

TRTLLM = ("text_input", "max_tokens", "stream", "temperature", "top_p", "top_k", "stop_words", "random_seed")


async def declaring(rig: Any, inputs: tuple[str, ...]) -> tuple[Any, str]:
    """A rig whose replica r1 declares ``inputs`` (a second table pushed with them)."""
    r, base = await front(rig, {"r1": Behaviour()})
    routed = route(r.replicas["r1"])
    routed.inputs.extend(inputs)
    r.cp.push(snapshot(2, [routed], extra_models=("empty",)))
    ack = await r.cp.next_ack()
    assert ack.applied and ack.version == 2
    return r, base


def tensors_of(sent: Any) -> dict[str, tuple[str, list[int], bytes]]:
    return {t.name: (t.datatype, list(t.shape), sent.raw_input_contents[i]) for i, t in enumerate(sent.inputs)}


async def test_tensor_inputs_reach_the_replica(rig) -> None:
    r, base = await declaring(rig, TRTLLM)
    status, body, _ = await post(base, "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2,
                                                           "temperature": 0.5, "top_k": 7, "seed": 42,
                                                           "stop": ["END", "\n"]})
    assert status == 200, body
    got = tensors_of(r.replicas["r1"].requests[0])
    assert got["temperature"] == ("FP32", [1, 1], struct.pack("<f", 0.5))
    assert got["top_k"] == ("INT32", [1, 1], struct.pack("<i", 7))
    assert got["random_seed"] == ("UINT64", [1, 1], struct.pack("<Q", 42))
    assert got["stop_words"][:2] == ("BYTES", [1, 2]) and b"END" in got["stop_words"][2]


async def test_json_sampling_parameters_for_a_vllm_model(rig) -> None:
    r, base = await declaring(rig, ("text_input", "max_tokens", "stream", "sampling_parameters"))
    status, body, _ = await post(base, "/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "top_p": 0.5,
        "presence_penalty": 1.0, "temperature": 0.7})
    assert status == 200, body
    raw = tensors_of(r.replicas["r1"].requests[0])["sampling_parameters"][2]
    assert json.loads(raw[4:]) == {"top_p": 0.5, "presence_penalty": 1.0, "temperature": 0.7}


async def test_a_parameter_the_model_does_not_declare_is_refused_by_name(rig) -> None:
    r, base = await declaring(rig, TRTLLM)
    status, body, _ = await post(base, "/v1/completions", {"model": "m", "prompt": "hi", "frequency_penalty": 1})
    assert status == 400 and body["error"]["param"] == "frequency_penalty"
    assert "does not accept" in body["error"]["message"]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await r.stub.Infer(request(frequency_penalty=1.0), metadata=PAID, timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "frequency_penalty" in err.value.details()
    assert not r.replicas["r1"].requests  # nothing was sent


async def test_grpc_callers_have_them_too(rig) -> None:
    r, _ = await declaring(rig, TRTLLM)
    reply = await r.stub.Infer(request(temperature=1.5, max_tokens=3), metadata=PAID, timeout=5)
    assert reply.finish_reason == "length"
    assert tensors_of(r.replicas["r1"].requests[0])["temperature"][2] == struct.pack("<f", 1.5)


@pytest.mark.parametrize(("fields", "field"), [
    ({"temperature": 3.0}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"stop": ["a"] * 5}, "stop"),
    ({"stop": ["x" * 65]}, "stop[0]"), ({"presence_penalty": -2.5}, "presence_penalty"),
])
def test_ranges_name_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        validate_request(request(**fields), Limits())
    assert err.value.field == field


def test_accepted_and_encoded() -> None:
    valid = validate_request(request(top_k=3, stop=["z"]), Limits())
    assert sampling.accepted(DECLARED) == frozenset(sampling.PARAMETERS)
    assert [t[0] for t in check_sampling(valid, DECLARED, "m", "v1")] == ["top_k", "stop_words"]
    with pytest.raises(InvalidArgument) as err:
        check_sampling(valid, ("text_input", "max_tokens"), "m", "v1")
    assert err.value.field == "top_k"


def test_the_simulated_replica_honours_stop() -> None:
    assert cut_at_stop("the ferry crosses a river", ["river", "zzz"]) == ("the ferry crosses a", 4)
    assert cut_at_stop("the ferry", ["zzz"]) is None
    limit = stop_limit(LlmRequest(prompt="p", max_tokens=8, sampling={"stop": ("river",)}))
    assert (limit.words, limit.reason) == (4, "stop")
    assert stop_limit(LlmRequest(prompt="p", max_tokens=8)).reason == "length"
