"""``ferry up --regions 3``: three regions a, b, c, a proxy each, replicas spread over them, round trips set."""

from __future__ import annotations

import tomllib
from pathlib import Path

import grpc

from ferry.procs import Child
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc


def test_ferry_up_lays_out_three_regions_each_serving_its_own(tmp_path: Path) -> None:
    workdir = tmp_path / "fleet"
    up = Child("up", ["up", "--regions", "3", "--replicas", "3", "--replicas-per-node", "1", "--models", "chat",
                      "--workdir", str(workdir)], tmp_path).start()
    try:
        ready = up.wait_ready(90)
        assert set(ready["data_planes"]) == {"a", "b", "c"}
        config = tomllib.loads((workdir / "ferry.toml").read_text())
        assert config["controlplane"]["region_rtt_ms"] == {"a:b": 40.0, "a:c": 200.0, "b:c": 180.0}
        key = next(iter(ready["api_keys"].values()))
        for region, address in ready["data_planes"].items():
            with grpc.insecure_channel(address) as channel:
                reply = inference_pb2_grpc.InferenceStub(channel).Infer(
                    inference_pb2.InferRequest(model="chat", prompt="a b", max_tokens=2,
                                               tier=common_pb2.TIER_STANDARD),
                    metadata=(("x-api-key", key),), timeout=20)
            assert reply.region == region and reply.completion_tokens == 2  # an idle region serves its own
    finally:
        up.stop()
