"""Simulator workloads: both trace formats, Azure's synthetic conversations, load scaling."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferry.tokens import BLOCK_TOKENS, blocks_for
from tools.sim import workload


def test_mooncake_block_ids_are_kept(mooncake_trace: Path) -> None:
    reqs = workload.requests(mooncake_trace)
    assert len(reqs) == 240 and reqs[0].hash_ids[0] == 0
    assert all(len(r.hash_ids) == blocks_for(r.prompt_tokens) for r in reqs)


def test_azure_conversations_share_the_previous_turns_full_blocks(azure_trace: Path) -> None:
    reqs = workload.requests(azure_trace, seed=3)
    assert all(len(r.hash_ids) == blocks_for(r.prompt_tokens) and r.hash_ids[0] == 0 for r in reqs)
    seen: set[int] = set()
    continued = 0
    for r in reqs:
        continued += len(r.hash_ids) > 1 and r.hash_ids[1] in seen
        seen.update(r.hash_ids)
    assert continued > 10  # some requests continue a conversation past its system block
    again = workload.requests(azure_trace, seed=3)
    assert [r.hash_ids for r in again] == [r.hash_ids for r in reqs]  # deterministic for a seed
    assert [r.hash_ids for r in workload.requests(azure_trace, seed=4)] != [r.hash_ids for r in reqs]


def test_a_continuation_repeats_the_earlier_turns_full_blocks() -> None:
    from tools.trace import TraceRequest
    rows = [TraceRequest(0.0, 1200, 100, ()), TraceRequest(1.0, 3000, 50, ())]
    out = workload.converse(rows, seed=1, follow=1.0)
    first, second = out[0].hash_ids, out[1].hash_ids
    assert second[:1200 // BLOCK_TOKENS] == first[:1200 // BLOCK_TOKENS] and len(second) == blocks_for(3000)
    assert set(second[2:]).isdisjoint(first)


@pytest.mark.parametrize("load", [0.25, 0.5, 1.0])
def test_at_load_sets_the_mean_rate(mooncake_trace: Path, load: float) -> None:
    reqs = workload.requests(mooncake_trace)
    assert workload.rate(workload.at_load(reqs, load, capacity=20.0)) == pytest.approx(load * 20.0)


def test_minutes_limit_the_window(mooncake_trace: Path) -> None:
    assert len(workload.requests(mooncake_trace, minutes=1.0)) == 120  # 2 per second


def test_shorten_answers_a_share_of_the_long_prompts_in_a_few_tokens() -> None:
    reqs = [workload.SimRequest(i, float(i), 8_000 if i % 2 else 100, 300, ()) for i in range(2_000)]
    out = workload.shorten(reqs, 0.5, seed=3)
    short = [r for r in out if r.max_tokens <= 10]
    assert all(r.prompt_tokens >= workload.LONG_PROMPT for r in short)
    assert 400 < len(short) < 600  # half of the 1,000 long prompts
    assert workload.shorten(reqs, 0.5, seed=3) == out and workload.shorten(reqs, 0.0) == reqs
