"""The agent's step-counter deltas (restarts, gaps, sent once) and the replica's counters as the agent reads them."""

from __future__ import annotations

import pytest

from agent.inventory import Inventory, ReplicaSpec
from agent.openai import load_from_metrics
from agent.replica import metrics as replica_metrics
from agent.replica.engine import Engine, EngineParams, EngineRequest
from agent.replica.runner import RunnerStats
from agent.scrape import Samples, parse
from agent.stepcounters import COUNTERS, Counts, Reading, advance, delta, read, sample
from agent.triton import METRICS_READ, ModelLoad, from_metrics


def counts(sp: float, p: float, sd: float, d: float, t: float, intervals: int = 0) -> Counts:
    return Counts(prefill_steps=sp, prefill_tokens=p, decode_steps=sd, decode_tokens=d, step_seconds=t,
                  intervals=intervals)


def test_a_delta_is_the_difference_and_a_counter_that_went_down_is_a_restart() -> None:
    assert delta(counts(1, 10, 2, 5, 0.5), counts(3, 50, 7, 30, 0.9)) == counts(2, 40, 5, 25, pytest.approx(0.4), 1)
    assert delta(counts(1, 10, 2, 5, 0.5), counts(1, 10, 2, 5, 0.5)) == counts(0, 0, 0, 0, 0.0, 1)
    # the engine restarted between the scrapes: what it counted since is the delta
    assert delta(counts(100, 9000, 300, 900, 12.0), counts(2, 80, 3, 9, 0.1)) == counts(2, 80, 3, 9, 0.1, 1)
    # one counter lower is enough (they reset together)
    assert delta(counts(100, 9000, 300, 900, 12.0), counts(101, 9100, 301, 905, 11.0)) == counts(
        101, 9100, 301, 905, 11.0, 1)


def test_advance_sets_a_baseline_first_sums_deltas_and_spans_a_gap() -> None:
    last, pending = advance(None, None, counts(5, 50, 5, 5, 1.0))
    assert (last, pending) == (counts(5, 50, 5, 5, 1.0), None)  # the first reading is only a baseline
    last, pending = advance(last, pending, counts(6, 60, 7, 9, 1.5))
    last, pending = advance(last, pending, None)  # a failed scrape: nothing changes
    assert last == counts(6, 60, 7, 9, 1.5)
    last, pending = advance(last, pending, counts(8, 100, 10, 20, 2.0))
    assert pending == counts(3, 50, 5, 15, pytest.approx(1.0), 2)
    last, pending = advance(last, pending, counts(1, 1, 1, 1, 0.01))  # a restart: the reading is the delta
    assert pending == counts(4, 51, 6, 16, pytest.approx(1.01), 3) and last == counts(1, 1, 1, 1, 0.01)


def test_read_needs_every_counter_and_sample_carries_the_facts() -> None:
    values = dict(zip(COUNTERS, (1.0, 2.0, 3.0, 4.0, 0.5), strict=True))
    assert read(values.get) == Reading(counts=counts(1, 2, 3, 4, 0.5), max_step_tokens=None)
    assert read({**values, "ferry_replica_max_step_tokens": 256.0}.get).max_step_tokens == 256  # type: ignore[union-attr]
    assert read({**values, "ferry_replica_prefix_cache_blocks": 1024.0}.get).prefix_cache_blocks == 1024  # type: ignore[union-attr]
    assert read({k: v for k, v in values.items() if k != COUNTERS[4]}.get) is None
    assert sample(None, kv_blocks_total=1, kv_block_tokens=1, max_running=1, max_step_tokens=1) is None
    s = sample(counts(2, 300, 4, 9, 0.25, 2), kv_blocks_total=64, kv_block_tokens=16, max_running=8,
               max_step_tokens=0)
    assert s is not None
    assert (s.prefill_steps, s.prefill_tokens, s.decode_steps, s.decode_tokens, s.intervals) == (2, 300, 4, 9, 2)
    assert (s.kv_blocks_total, s.kv_block_tokens, s.max_running, s.max_step_tokens, s.unchunked) == (
        64, 16, 8, 0, True)
    assert not sample(counts(0, 0, 0, 0, 0), kv_blocks_total=0, kv_block_tokens=0, max_running=0,
                      max_step_tokens=None).unchunked  # type: ignore[union-attr]


def test_telemetry_carries_the_pending_deltas_once() -> None:
    inv = Inventory(4)
    inv.upsert(ReplicaSpec(replica_id="r0", model="m", version="v1", address="a:1", max_concurrency=8,
                           kv_block_tokens=16))
    inv.upsert(ReplicaSpec(replica_id="r1", model="m", version="v1", address="a:2"))  # exports no counters
    r0, r1 = inv.replicas["r0"], inv.replicas["r1"]
    for t in (1.0, 1.5, 2.5):
        r0.observe(ModelLoad(ready=True, kv_blocks_total=64, steps=Reading(counts=counts(t, t, t, t, t),
                                                                           max_step_tokens=512)))
        r1.observe(ModelLoad(ready=True))
    loads = {load.replica_id: load for load in inv.telemetry().telemetry.replicas}
    assert not loads["r1"].HasField("engine")
    e = loads["r0"].engine
    assert (e.prefill_steps, e.intervals, e.max_running, e.kv_block_tokens, e.max_step_tokens) == (2, 2, 8, 16, 512)
    assert e.step_seconds == pytest.approx(1.5)
    assert not inv.telemetry().telemetry.replicas[0].HasField("engine")  # sent once


def test_the_replicas_counters_read_back_through_both_adapters() -> None:
    params = EngineParams(max_running=4, kv_block_tokens=16, kv_blocks_total=64, max_step_tokens=100,
                          max_context_tokens=1024)
    engine = Engine(params)
    engine.submit(EngineRequest(request_id="a", prompt_tokens=250, max_tokens=3), 0.0)
    engine.submit(EngineRequest(request_id="b", prompt_tokens=10, max_tokens=2), 0.0)
    now = 0.0
    while (duration := engine.start_step(now)) is not None:
        now += duration
        engine.finish_step(now)
    load = engine.load()
    # 260 prompt tokens in chunks of at most 100 a step, interleaved with decoding: the modelled busy time is
    # exactly the four counts times the four parameters
    modelled = (params.prefill_base_seconds * load.prefill_steps
                + params.prefill_seconds_per_token * load.prefill_tokens
                + params.decode_base_seconds * load.decode_steps
                + params.decode_seconds_per_request * load.decode_tokens)
    assert load.busy_seconds == pytest.approx(modelled)
    assert load.prefill_tokens == 260 and load.prefill_steps >= 3 and load.decode_tokens >= 3
    stats = RunnerStats(step_seconds=1.25)
    text = replica_metrics.render(model="m", version="v1", load=load, stats=stats, utilization=0.0, gpu_uuid="g")
    expected = Reading(counts=counts(load.prefill_steps, load.prefill_tokens, load.decode_steps, load.decode_tokens,
                                     1.25), max_step_tokens=100, prefix_cache_blocks=4096)
    assert from_metrics(Samples(parse(text, names=METRICS_READ)), "m", "v1", ready=True).steps == expected
    for engine_name in ("vllm", "sglang", "trtllm"):
        assert load_from_metrics(text, engine_name, "m", ready=True).steps == expected
    assert from_metrics(Samples(parse(text, names=METRICS_READ)), "m", "v1", ready=True).max_running == 4
