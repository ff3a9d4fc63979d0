"""The pure engine model, driven table by table in virtual time."""

from __future__ import annotations

import dataclasses

import pytest

from agent.replica.engine import Engine, EngineParams, EngineRequest, Finished, SubmitOutcome
from agent.replica.prefix_cache import PrefixCache
from ferry.config import parse
from ferry.errors import ConfigError
from ferry.tokens import block_hashes

P = EngineParams(
    max_running=4, max_queue=8, kv_block_tokens=512, kv_blocks_total=64, prefix_cache_blocks=64,
    prefill_base_seconds=0.002, prefill_seconds_per_token=1e-5, decode_base_seconds=0.01,
    decode_seconds_per_request=0.001, max_context_tokens=16384, max_step_tokens=0,
)


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def req(rid: str, prompt: str | int, max_tokens: int = 4) -> EngineRequest:
    if isinstance(prompt, int):
        return EngineRequest(request_id=rid, prompt_tokens=prompt, max_tokens=max_tokens)
    return EngineRequest(request_id=rid, prompt_tokens=len(prompt.split()), max_tokens=max_tokens,
                         block_hashes=tuple(block_hashes(prompt, 512)))


def run_until_idle(engine: Engine, now: float = 0.0) -> tuple[float, list[Finished]]:
    """A minimal discrete-event driver: step back to back until nothing is left."""
    done: list[Finished] = []
    while (duration := engine.start_step(now)) is not None:
        now += duration
        done.extend(engine.finish_step(now).finished)
    return now, done


@pytest.mark.parametrize("prompt_tokens", [1, 100, 1000, 10000], ids=lambda n: f"prompt{n}")
def test_prefill_time_grows_with_uncached_tokens(prompt_tokens):
    engine = Engine(P)
    assert engine.submit(req("a", prompt_tokens), 0.0) is SubmitOutcome.QUEUED
    assert engine.start_step(0.0) == pytest.approx(0.002 + 1e-5 * prompt_tokens)


@pytest.mark.parametrize(
    ("first", "second", "cached"),
    [
        (words(1100), words(1100), 1100),
        (words(1100), words(1024) + " " + words(200, "x"), 1024),
        (words(1100), words(600) + " " + words(500, "x"), 512),
        (words(1100), words(1100, "x"), 0),
        (words(300), words(300), 300),
    ],
    ids=["identical-3-blocks", "shares-2-blocks", "shares-1-block", "no-shared-block", "partial-block-identical"],
)
def test_repeated_prefix_hits_the_cache(first, second, cached):
    engine = Engine(P)
    engine.submit(req("a", first), 0.0)
    now, _ = run_until_idle(engine)
    engine.submit(req("b", second), now)
    prompt = len(second.split())
    duration = engine.start_step(now)
    assert duration == pytest.approx(0.002 + 1e-5 * (prompt - cached))
    engine.finish_step(now + duration)
    run_until_idle(engine, now + duration)
    load = engine.load()
    assert load.prefix_lookup_blocks == len(block_hashes(first)) + len(block_hashes(second))
    assert load.prefix_hit_blocks == -(-cached // 512)


def test_finished_request_reports_cached_tokens_and_times():
    engine = Engine(P)
    engine.submit(req("a", words(600)), 0.0)
    run_until_idle(engine)
    engine.submit(req("b", words(600)), 10.0)
    engine.submit(req("c", words(600, "x"), max_tokens=2), 10.0)
    _, done = run_until_idle(engine, 10.0)
    by_id = {f.request_id: f for f in done}
    assert by_id["b"].cached_tokens == 600 and by_id["c"].cached_tokens == 0
    assert by_id["b"].completion_tokens == 4 and by_id["c"].completion_tokens == 2
    assert by_id["b"].queue_seconds == 0.0 and by_id["b"].service_seconds > 0


@pytest.mark.parametrize(
    ("kv_blocks", "prompt", "max_tokens", "submitted", "running"),
    [
        (64, 100, 100, 6, 4),      # slots bind: 4 of 6
        (8, 1000, 24, 6, 4),       # 2 blocks each: 4 fit in 8
        (8, 1000, 100, 6, 2),      # 3 blocks each: 2 fit in 8
        (8, 3000, 1000, 3, 1),     # 8 blocks each: 1 fits
    ],
    ids=["slots-bind", "kv-fits-4", "kv-fits-2", "kv-fits-1"],
)
def test_kv_cache_bounds_admission(kv_blocks, prompt, max_tokens, submitted, running):
    engine = Engine(dataclasses.replace(P, kv_blocks_total=kv_blocks))
    for i in range(submitted):
        assert engine.submit(req(f"r{i}", prompt, max_tokens), 0.0) is SubmitOutcome.QUEUED
    engine.start_step(0.0)
    load = engine.load()
    assert (load.running, load.queued) == (running, submitted - running)
    assert load.kv_blocks_free == kv_blocks - running * engine.blocks_needed(prompt, max_tokens)


@pytest.mark.parametrize("batch", [1, 2, 4], ids=lambda n: f"batch{n}")
def test_decode_step_time_grows_with_the_running_batch(batch):
    engine = Engine(P)
    for i in range(batch):
        engine.submit(req(f"r{i}", 10, max_tokens=5), 0.0)
    first = engine.start_step(0.0)
    assert first is not None
    result = engine.finish_step(first)
    assert sorted(result.first) == sorted(f"r{i}" for i in range(batch))
    assert engine.start_step(first) == pytest.approx(0.01 + 0.001 * batch)


def test_prefill_and_decode_share_a_step():
    engine = Engine(P)
    engine.submit(req("a", 10, max_tokens=5), 0.0)
    engine.finish_step(engine.start_step(0.0) or 0.0)
    engine.submit(req("b", 100), 1.0)
    assert engine.start_step(1.0) == pytest.approx(0.002 + 1e-5 * 100 + 0.01 + 0.001 * 1)
    result = engine.finish_step(2.0)
    assert result.tokens == {"a": 1, "b": 1} and result.first == ("b",)


@pytest.mark.parametrize(
    ("max_queue", "prompt", "max_tokens", "expected"),
    [
        (8, 10, 10, [SubmitOutcome.QUEUED] * 8 + [SubmitOutcome.QUEUE_FULL] * 2),
        (0, 10, 10, [SubmitOutcome.QUEUE_FULL]),
        (8, 16000, 1000, [SubmitOutcome.TOO_LONG]),
    ],
    ids=["queue-of-8", "no-queue", "over-max-context"],
)
def test_queue_bound_and_refusals(max_queue, prompt, max_tokens, expected):
    engine = Engine(dataclasses.replace(P, max_queue=max_queue))
    got = [engine.submit(req(f"r{i}", prompt, max_tokens), 0.0) for i in range(len(expected))]
    assert got == expected
    assert engine.load().rejected == sum(a is not SubmitOutcome.QUEUED for a in expected)


def test_request_over_the_whole_kv_cache_is_refused():
    engine = Engine(dataclasses.replace(P, kv_blocks_total=2))
    assert engine.submit(req("a", 1000, 100), 0.0) is SubmitOutcome.TOO_LONG


@pytest.mark.parametrize("where", ["queued", "running", "in-step"])
def test_cancel_frees_blocks(where):
    engine = Engine(dataclasses.replace(P, max_running=1))
    engine.submit(req("a", 1000, 100), 0.0)
    engine.submit(req("b", 1000, 100), 0.0)
    engine.start_step(0.0)
    if where != "in-step":
        engine.finish_step(0.1)
    victim = "b" if where == "queued" else "a"
    assert engine.cancel(victim) is True
    assert engine.cancel(victim) is False
    load = engine.load()
    assert load.cancelled == 1
    if where == "queued":
        assert (load.queued, load.running) == (0, 1)
    else:
        assert (load.running, load.kv_blocks_free) == (0, 64)
    if where == "in-step":
        assert "a" not in engine.finish_step(0.1).tokens
    engine.submit(req(victim, 10), 1.0)  # the id can be used again


@pytest.mark.parametrize(
    ("inserts", "lookup", "hits"),
    [
        ([[1, 2], [3, 4]], [1, 2], 2),
        ([[1, 2], [3, 4], [5, 6]], [1, 2], 0),          # evicted: least recently used
        ([[1, 2], [3, 4], [1], [5, 6]], [1, 2], 1),     # 1 touched, its tail 2 evicted
        ([[1, 2, 3, 4, 5]], [1, 2, 3, 4, 5], 4),        # longer than capacity: tail dropped first
        ([[1, 2]], [9, 2], 0),                          # stops at the first miss
    ],
    ids=["fits", "evicts-oldest", "touch-keeps-head", "tail-first", "chain-breaks"],
)
def test_prefix_cache_lru(inserts, lookup, hits):
    cache = PrefixCache(4)
    for chain in inserts:
        if chain == [1]:
            assert cache.lookup(chain) == 1
        else:
            cache.insert(chain)
    assert len(cache) <= 4
    assert cache.lookup(lookup) == hits


def test_lru_eviction_in_the_engine():
    engine = Engine(dataclasses.replace(P, prefix_cache_blocks=2))
    for rid, text in (("a", words(1024, "a")), ("b", words(1024, "b"))):
        engine.submit(req(rid, text), 0.0)
        run_until_idle(engine)
    engine.submit(req("c", words(1024, "a")), 0.0)
    assert engine.start_step(0.0) == pytest.approx(0.002 + 1e-5 * 1024)  # evicted by b


def test_virtual_time_run_completes_everything_in_order():
    engine = Engine(P)
    for i in range(8):
        engine.submit(req(f"r{i}", 50, max_tokens=3), 0.0)
    end, done = run_until_idle(engine)
    assert [f.request_id for f in done] == [f"r{i}" for i in range(8)]
    assert engine.idle and engine.load().completed == 8 and engine.load().kv_blocks_free == 64
    assert engine.load().busy_seconds == pytest.approx(end)
    assert done[4].queue_seconds > 0  # the second wave waited for slots


def test_step_protocol_is_enforced():
    engine = Engine(P)
    assert engine.start_step(0.0) is None
    with pytest.raises(RuntimeError):
        engine.finish_step(0.0)
    engine.submit(req("a", 10), 0.0)
    engine.start_step(0.0)
    with pytest.raises(RuntimeError):
        engine.start_step(0.0)
    with pytest.raises(ValueError):
        engine.submit(req("a", 10), 0.0)


def test_params_load_from_the_replica_section():
    cfg = parse({"replica": {"max_running": 8, "decode_base_seconds": 0.02}})
    params = cfg.section(EngineParams, "replica")
    assert params.max_running == 8 and params.decode_base_seconds == 0.02 and params.max_queue == 1024
    with pytest.raises(ConfigError, match="replica.max_running"):
        parse({"replica": {"max_running": 0}}).section(EngineParams, "replica")
    with pytest.raises(ConfigError, match="replica.bogus"):
        parse({"replica": {"bogus": 1}}).section(EngineParams, "replica")


def test_chunked_prefill_interleaves_a_long_prompt_with_decoding() -> None:
    """A 10,000-token prompt behind a running request, 4,096 prompt tokens a step: three steps of prefill, each
    also decoding the running request, the first token at the end of the third."""
    engine = Engine(dataclasses.replace(P, max_step_tokens=4096))
    assert engine.submit(req("short", 10, max_tokens=8), 0.0) is SubmitOutcome.QUEUED
    now = 0.0
    duration = engine.start_step(now)
    assert duration is not None
    now += duration
    engine.finish_step(now)
    assert engine.submit(req("long", 10_000, max_tokens=2), now) is SubmitOutcome.QUEUED
    steps, first_at = [], None
    while first_at is None:
        duration = engine.start_step(now)
        assert duration is not None
        steps.append(round(duration, 6))
        now += duration
        result = engine.finish_step(now)
        assert result.tokens.get("short") == 1  # the running request decodes at every step
        if "long" in result.first:
            first_at = now
    decode = 0.01 + 0.001
    assert steps == pytest.approx([0.002 + 4096e-5 + decode, 0.002 + 4096e-5 + decode, 0.002 + 1808e-5 + decode])


def test_a_step_admits_no_new_request_once_its_prefill_budget_is_spent() -> None:
    engine = Engine(dataclasses.replace(P, max_step_tokens=1000))
    for rid in ("a", "b"):
        assert engine.submit(req(rid, 1000), 0.0) is SubmitOutcome.QUEUED
    assert engine.start_step(0.0) == pytest.approx(0.002 + 1000e-5)
    assert engine.load().running == 1 and engine.load().queued == 1
    assert engine.finish_step(0.012).first == ("a",)
