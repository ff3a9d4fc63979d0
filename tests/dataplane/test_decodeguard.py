"""A malformed request body is refused INVALID_ARGUMENT naming the message type and the field at fault."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from ferry.decodeguard import fault, reason
from ferry.v1 import inference_pb2
from tests.dataplane.conftest import PAID, Rig

INFER = inference_pb2.InferRequest


@pytest.mark.parametrize(("data", "where"), [
    (b"\x0a\x05ab", "field 1 (model): length 5 runs past the end (2 byte(s) left)"),
    (b"\x22\x02\xff\xfe", "field 4 (prompt): not valid UTF-8"),
    (b"\x28", "field 5 (max_tokens): truncated varint"),
    (b"\x0a\x01m\x07", "byte 3: field number 0"),
    (b"\x0a\x01m\x8f", "byte 3: truncated field tag"),
])
def test_the_walk_names_the_field_at_fault(data: bytes, where: str) -> None:
    with pytest.raises(Exception) as caught:
        INFER.FromString(data)
    assert fault(INFER.DESCRIPTOR, data) == where
    assert reason(INFER.FromString, data, caught.value) == f"request body: not a valid ferry.v1.InferRequest: {where}"


def test_a_nested_message_is_named_by_its_path() -> None:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x")
    data = request.SerializeToString().replace(b"\x01x", b"\x01\xff")
    assert fault(pb.ModelInferRequest.DESCRIPTOR, data) == "field 5 (inputs) > field 1 (name): not valid UTF-8"


def test_a_valid_body_has_no_fault() -> None:
    data = INFER(model="m", prompt="hi", max_tokens=3).SerializeToString()
    assert fault(INFER.DESCRIPTOR, data) is None


async def test_the_proxy_answers_a_malformed_body_naming_the_field(rig: Any) -> None:
    r: Rig = await rig({"a": None})
    assert r.channel is not None
    for method in ("/ferry.v1.Inference/Infer", "/ferry.v1.Inference/InferStream"):
        if method.endswith("Stream"):
            call: Any = r.channel.unary_stream(method)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in call(b"\x22\x02\xff\xfe", metadata=PAID, timeout=5):
                    pass
        else:
            call = r.channel.unary_unary(method)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(b"\x22\x02\xff\xfe", metadata=PAID, timeout=5)
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        details = caught.value.details() or ""
        assert details.startswith("request body: not a valid ferry.v1.InferRequest: field 4 (prompt): not valid UTF-8")
