"""Property tests of the pure checks: any telemetry load either passes in range or is refused naming its field."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.api import join as admission
from controlplane.fleet.telemetry import MAX_KV_BLOCKS, MAX_REQUESTS, check_loads
from ferry.errors import ConfigError, InvalidArgument
from ferry.v1 import common_pb2, fleet_pb2

u32 = st.integers(0, 2**32 - 1)
loads = st.builds(
    common_pb2.ReplicaLoad, replica_id=st.sampled_from(["r0", "r1", "r2"]), state=st.integers(0, 6),
    queued=u32, running=u32, kv_blocks_free=u32, kv_blocks_total=u32,
    gpu_utilization=st.floats(allow_nan=True, allow_infinity=True), requests_total=st.integers(0, 2**64 - 1))


@settings(max_examples=400, deadline=None, database=None, derandomize=True)
@given(batch=st.lists(loads, max_size=4))
def test_a_load_passes_only_within_range_else_its_field_is_named(batch: list[common_pb2.ReplicaLoad]) -> None:
    telemetry = fleet_pb2.Telemetry(seq=1, replicas=batch)
    try:
        check_loads(telemetry, max_loads=3)
    except InvalidArgument as exc:
        assert exc.field.startswith("telemetry.replicas")
        return
    assert len(batch) <= 3 and len({b.replica_id for b in batch}) == len(batch)
    for load in batch:
        assert math.isfinite(load.gpu_utilization) and 0 <= load.gpu_utilization <= 1
        assert load.queued <= MAX_REQUESTS and load.running <= MAX_REQUESTS
        assert load.kv_blocks_free <= load.kv_blocks_total <= MAX_KV_BLOCKS


JOIN = "fjt_token"
SOURCES = [
    ("file", "file", {}, "", admission.sha256_hex(JOIN), None),
    ("env", None, {"FERRY_JOIN_TOKEN": JOIN}, "", admission.sha256_hex(JOIN), None),
    ("config-hash", None, {}, admission.sha256_hex(JOIN), admission.sha256_hex(JOIN), None),
    ("none", None, {}, "", "", None),
    ("mismatch", "file", {}, admission.sha256_hex("other"), "", "controlplane.join_token_sha256"),
    ("bad-hash", None, {}, "xyz", "", "controlplane.join_token_sha256"),
    ("missing-file", "missing", {}, "", "", "--join-token-file"),
]


@pytest.mark.parametrize(("file", "env", "config", "expected", "error"), [c[1:] for c in SOURCES],
                         ids=[c[0] for c in SOURCES])
def test_the_join_token_comes_from_file_env_or_config(tmp_path: Path, file: str | None, env: dict[str, str],
                                                      config: str, expected: str, error: str | None) -> None:
    path = None
    if file is not None:
        path = str(tmp_path / file)
        if file == "file":
            (tmp_path / file).write_text(JOIN + "\n")
    if error is not None:
        with pytest.raises(ConfigError) as info:
            admission.load(config, path, mutual_tls=False, env=env)
        assert info.value.key == error
        return
    got = admission.load(config, path, mutual_tls=False, env=env)
    assert got.join_token_sha256 == expected and got.open == (not expected)
