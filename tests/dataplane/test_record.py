"""The traffic recorder (dataplane.record): the sampler, the tenant hash, a row, the buffer's bounds, its metrics."""

from __future__ import annotations

import hashlib

import pytest
from prometheus_client import CollectorRegistry

from dataplane.config import ProxySettings
from dataplane.forward.kserve import Outcome
from dataplane.intake.validate import ValidRequest
from dataplane.record.recorder import Recorder
from dataplane.record.row import Sampler, row_of, tenant_hash
from dataplane.router import RequestState
from ferry.config import TenantConfig
from ferry.errors import ConfigError
from ferry.v1 import tables_pb2

PROMPT = b"the secret prompt text"


def state(request_id: str = "req-1", *, ttft: float = 0.05) -> RequestState:
    s = RequestState(request_id=request_id, started=10.0, model_label="chat", tier_label="interactive",
                     tenant=TenantConfig(name="acme", api_key_sha256="0" * 64),
                     request=ValidRequest(model="chat", version="", tier="interactive", prompt=PROMPT,
                                          prompt_tokens=700, max_tokens=64, prefix_key="", idempotency_key="",
                                          prefix_hashes=(2**64 - 1, 12345)),
                     replica_id="n1/r0", branch="affinity", streamed=True)
    s.outcome = Outcome(text="the secret answer", prompt_tokens=700, completion_tokens=60, cached_tokens=512,
                        ttft_seconds=ttft)
    return s


def test_the_sampler_is_deterministic_and_near_its_rate() -> None:
    half = Sampler(0.5)
    ids = [f"id-{i}" for i in range(20_000)]
    picked = [i for i in ids if half.sampled(i)]
    assert 0.47 < len(picked) / len(ids) < 0.53
    assert picked == [i for i in ids if Sampler(0.5).sampled(i)]  # the same ids on every proxy
    assert all(Sampler(1.0).sampled(i) for i in ids[:100]) and not any(Sampler(0.0).sampled(i) for i in ids[:100])
    assert set(picked) <= {i for i in ids if Sampler(0.8).sampled(i)}  # a higher rate records a superset
    with pytest.raises(ValueError):
        Sampler(1.5)


def test_the_tenant_hash_is_fixed_and_short() -> None:
    assert tenant_hash("acme") == hashlib.sha256(b"ferry-tenant\x00acme").hexdigest()[:16]
    assert tenant_hash("acme") != tenant_hash("acme2") and tenant_hash("") == ""


def test_a_row_holds_sizes_times_and_hashes_but_no_text() -> None:
    row = row_of(state(), "OK", 0.4, 1_700_000_000.0)
    assert (row.model, row.tier, row.tenant) == ("chat", "interactive", tenant_hash("acme"))
    assert (row.prompt_tokens, row.completion_tokens, row.cached_tokens, row.max_tokens) == (700, 60, 512, 64)
    assert list(row.hash_ids) == [2**64 - 1, 12345]
    assert (row.ttft_seconds, row.e2e_seconds, row.arrival) == (0.05, 0.4, 1_700_000_000.0)
    assert (row.replica_id, row.branch, row.outcome, row.streamed) == ("n1/r0", "affinity", "OK", True)
    wire = row.SerializeToString()
    assert b"secret" not in wire and b"acme" not in wire and b"req-1" not in wire
    failed = row_of(state(), "UNAVAILABLE", 0.1, 1.0)
    assert not failed.HasField("ttft_seconds")  # known only for an answer
    picker = row_of(state(ttft=0.0), "OK", 0.1, 1.0)
    assert not picker.HasField("ttft_seconds")  # the picker never sees a token
    refused = row_of(RequestState(request_id="x", started=0.0), "UNAUTHENTICATED", 0.001, 1.0)
    assert (refused.model, refused.tenant, refused.prompt_tokens, list(refused.hash_ids)) == ("_unknown", "", 0, [])


def test_the_buffer_is_bounded_and_reports_take_a_bounded_share() -> None:
    registry = CollectorRegistry()
    recorder = Recorder(max_rows=5, report_rows=2, wall=lambda: 100.0, registry=registry)
    for i in range(7):
        recorder.record(state(f"r{i}"), "OK", 1.0)
    assert len(recorder) == 5 and recorder.recorded == 5 and recorder.dropped == 2
    report = tables_pb2.Report(window_seconds=1.0)
    recorder.fill(report)
    assert len(report.traffic) == 2 and report.traffic_dropped == 2 and report.traffic[0].arrival == 99.0
    again = tables_pb2.Report(window_seconds=1.0)
    recorder.fill(again)
    assert len(again.traffic) == 2 and again.traffic_dropped == 0 and len(recorder) == 1
    assert registry.get_sample_value("ferry_proxy_recorded_total") == 5
    assert registry.get_sample_value("ferry_proxy_recorded_dropped_total") == 2
    assert registry.get_sample_value("ferry_proxy_recorded_waiting") == 1


def test_a_rate_records_the_share_of_requests_it_samples() -> None:
    recorder = Recorder(rate=0.25, max_rows=100_000)
    for i in range(4000):
        recorder.record(state(f"q{i}"), "OK", 0.1)
    assert 900 < len(recorder) < 1100 and recorder.dropped == 0
    nothing = Recorder(rate=0.0)
    nothing.record(state(), "OK", 0.1)
    assert len(nothing) == 0


@pytest.mark.parametrize(("fields", "key"), [
    ({"record_rate": -0.1}, "proxy.record_rate"), ({"record_rate": float("nan")}, "proxy.record_rate"),
    ({"record_max_rows": 0}, "proxy.record_max_rows"), ({"record_report_rows": 0}, "proxy.record_report_rows"),
])
def test_settings_are_checked(fields: dict[str, float], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        ProxySettings.from_section(fields)
    assert ProxySettings.from_section({"record_rate": 0.1}).record.record_rate == 0.1


def test_a_recorded_prompt_hashes_every_block_the_rest_as_sketches() -> None:
    from ferry.tokens import WHITESPACE, chain_hashes, sketch_hashes

    base = [f"w{i}" for i in range(20 * 512 + 100)]  # 21 blocks, the last partial
    exact = chain_hashes(base, 512, 16)
    plain = WHITESPACE.encode(" ".join(base), blocks=16)
    recorded = WHITESPACE.encode(" ".join(base), blocks=16, tail=4096)
    assert plain.hashes == tuple(exact) and recorded.hashes[:16] == plain.hashes and len(recorded.hashes) == 21
    assert recorded.count == plain.count == len(base)
    assert WHITESPACE.encode(" ".join(base), blocks=16, tail=18).hashes == recorded.hashes[:18]  # the bound
    grown = WHITESPACE.encode(" ".join([*base, "more", "words"]), blocks=16, tail=4096)
    assert grown.hashes[:20] == recorded.hashes[:20] and grown.hashes[20] != recorded.hashes[20]
    changed = list(base)
    changed[17 * 512] = "other"  # the first word of block 17: that block and every later one differ
    other = WHITESPACE.encode(" ".join(changed), blocks=16, tail=4096).hashes
    assert other[:17] == recorded.hashes[:17]
    assert all(a != b for a, b in zip(other[17:], recorded.hashes[17:], strict=True))
    ids = list(range(3 * 512))
    assert sketch_hashes(ids, 1, 3, 7) == sketch_hashes(list(ids), 1, 3, 7) != sketch_hashes(ids, 1, 3, 8)
    short = WHITESPACE.encode("a b c", blocks=16, tail=4096)
    assert len(short.hashes) == 1  # a prompt within the decision's depth: no sketch


def test_a_report_holds_rows_up_to_its_bytes_whatever_the_prompts_lengths() -> None:
    from collections import deque

    from dataplane.record.recorder import Recorder
    from ferry.grpcutil import chunks_within, take_within
    from ferry.v1 import tables_pb2

    long_row = tables_pb2.TrafficRow(model="m", hash_ids=list(range(2**62, 2**62 + 4096)))  # a 2M-token prompt
    size = long_row.ByteSize() + 6
    queue = deque([long_row] * 10)
    assert len(take_within(queue, max_rows=100, max_bytes=3 * size)) == 3 and len(queue) == 7
    assert len(take_within(queue, max_rows=100, max_bytes=1)) == 1  # one row always goes: never stuck
    assert [len(c) for c in chunks_within([long_row] * 7, max_rows=100, max_bytes=2 * size)] == [2, 2, 2, 1]
    assert [len(c) for c in chunks_within([long_row] * 7, max_rows=3, max_bytes=1 << 30)] == [3, 3, 1]
    recorder = Recorder(report_rows=2000, report_bytes=1 << 20)
    recorder._rows.extend([long_row] * 100)
    report = tables_pb2.Report(window_seconds=1.0)
    recorder.fill(report)
    assert 0 < len(report.traffic) < 100 and report.ByteSize() <= (1 << 20) + 64
