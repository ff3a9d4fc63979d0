"""Where a simulated answer ends (agent.replica.answer) and the engine running that length."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from agent.replica import tensors
from agent.replica.answer import Limit, _window, answer_limit, natural_length
from agent.replica.engine import Engine, EngineParams, EngineRequest, SubmitOutcome
from ferry.config import parse
from ferry.errors import ConfigError
from tests.agent.helpers import with_natural

ON = EngineParams(answer_tokens=48, answer_min_tokens=8)
PROMPTS = [f"prompt number {i}: tell me about the river" for i in range(4000)]


# -- the natural length -------------------------------------------------------------------------------------------


def test_the_same_prompt_always_gets_the_same_length_and_others_vary():
    first = [natural_length(p, 48, 8) for p in PROMPTS[:200]]
    assert first == [natural_length(p, 48, 8) for p in PROMPTS[:200]]
    assert len(set(first)) > 50


def test_the_mean_over_many_prompts_is_the_setting_and_none_is_below_the_floor():
    lengths = [natural_length(p, 48, 8) for p in PROMPTS]
    assert 46.0 < statistics.fmean(lengths) < 50.0  # geometric: sd 40, so the mean of 4,000 is 48 +- 0.7
    assert min(lengths) == 8  # the floor is reached (P(G = 0) = 1/41) and never passed
    assert 0.1 < sum(n > 88 for n in lengths) / len(lengths) < 0.2  # the tail: P(G > 80) = (40/41)^81 = 0.14
    assert max(lengths) < 8 + 44 * 40  # the longest draw the hash allows


@pytest.mark.parametrize(("mean", "floor", "expected"), [(8, 8, 8), (3, 8, 8), (9, 9, 9)], ids=str)
def test_a_mean_at_or_below_the_floor_gives_the_floor(mean, floor, expected):
    assert {natural_length(p, mean, floor) for p in PROMPTS[:50]} == {expected}


def test_non_utf8_text_is_hashed_too():
    assert natural_length("lone surrogate \ud800", 48, 8) >= 8


# -- the limit: min(natural, stop, max_tokens) --------------------------------------------------------------------


def test_off_every_answer_runs_to_max_tokens():
    prompt, _ = with_natural(ON, 8, 20)
    for params in (None, EngineParams(), dataclasses.replace(ON, answer_tokens=0)):
        assert answer_limit(prompt, 500, params=params) == Limit(words=500, reason="length")


def test_a_natural_end_before_max_tokens_is_a_stop():
    prompt, n = with_natural(ON, 10, 30)
    assert answer_limit(prompt, 1000, params=ON) == Limit(words=n, reason="stop")
    assert answer_limit(prompt, n + 1, params=ON) == Limit(words=n, reason="stop")


def test_max_tokens_at_or_before_the_natural_end_is_length():
    prompt, n = with_natural(ON, 10, 30)
    assert answer_limit(prompt, n, params=ON) == Limit(words=n, reason="length")  # the budget ran out first
    assert answer_limit(prompt, 5, params=ON) == Limit(words=5, reason="length")


def test_ignore_eos_turns_the_natural_end_off():
    prompt, _ = with_natural(ON, 10, 30)
    assert answer_limit(prompt, 700, params=ON, ignore_eos=True) == Limit(words=700, reason="length")


def test_a_stop_string_inside_the_answer_ends_it_and_one_past_the_end_does_not():
    prompt, n = with_natural(ON, 8, 9)  # the reply's words 0..n-1: "the ferry crosses a river of tokens and"
    assert answer_limit(prompt, 1000, ["river"], params=ON) == Limit(words=4, reason="stop", matched="river")
    assert answer_limit(prompt, 3, ["river"], params=ON) == Limit(words=3, reason="length")
    late = tensors.generated_text(n, 1).strip()  # the word just past the natural end
    assert late not in tensors.generated_text(0, n)
    assert answer_limit(prompt, 1000, [late], params=ON) == Limit(words=n, reason="stop")  # natural, not matched
    assert answer_limit(prompt, 1000, [late], params=ON, ignore_eos=True).matched == late


def test_the_earliest_stop_string_wins_and_names_itself():
    limit = answer_limit("p", 50, ["tokens", "crosses", "zzz", ""])
    assert limit == Limit(words=2, reason="stop", matched="crosses")


def test_a_stop_string_at_the_very_start_leaves_no_words():
    assert answer_limit("p", 9, ["the"]) == Limit(words=0, reason="stop", matched="the")


def _stops_to_try() -> list[str]:
    text = tensors.generated_text(0, 60)
    found = {text[i:i + size] for size in (1, 2, 3, 5, 8, 13, 40, 60) for i in range(0, 120, 3)}
    return sorted(found | {"zzz", "back the ferry crosses a river of tokens and comes back the ferry", " the"})


@pytest.mark.parametrize("stop", _stops_to_try())
def test_the_window_finds_what_the_whole_reply_would(stop):
    """The cut on the short window equals the cut on the whole text of every length (the reply is periodic)."""
    assert _window([stop]) < 200
    for length in (1, 2, 3, 7, 10, 11, 19, 25, 60, 150, 400):
        whole = tensors.cut_at_stop(tensors.generated_text(0, length), [stop])
        limit = answer_limit("p", length, [stop])
        assert (limit.words, limit.reason) == ((whole[1], "stop") if whole else (length, "length")), length


# -- settings ------------------------------------------------------------------------------------------------------


def test_the_settings_load_from_the_replica_section_and_bad_ones_name_the_key():
    params = parse({"replica": {"answer_tokens": 48, "answer_min_tokens": 4}}).section(EngineParams, "replica")
    assert (params.answer_tokens, params.answer_min_tokens) == (48, 4)
    assert (EngineParams().answer_tokens, EngineParams().answer_min_tokens) == (0, 8)  # off by default
    with pytest.raises(ConfigError, match="replica.answer_tokens"):
        EngineParams(answer_tokens=-1)
    with pytest.raises(ConfigError, match="replica.answer_min_tokens"):
        EngineParams(answer_min_tokens=0)


# -- the engine runs the answer's real length ---------------------------------------------------------------------

P = EngineParams(max_running=4, max_queue=8, kv_block_tokens=16, kv_blocks_total=8, prefix_cache_blocks=8,
                 max_context_tokens=1000, max_step_tokens=0)


def test_the_engine_stops_at_output_tokens_and_reserves_blocks_for_them():
    engine = Engine(P)
    assert engine.submit(EngineRequest(request_id="a", prompt_tokens=10, max_tokens=900, output_tokens=3),
                         0.0) is SubmitOutcome.QUEUED  # 910 tokens would need 57 blocks of the 8: only 13 are held
    now, steps = 0.0, 0
    while (duration := engine.start_step(now)) is not None:
        if steps == 0:
            assert engine.load().kv_blocks_free == 8 - 1  # ceil((10 + 3) / 16)
        now += duration
        result = engine.finish_step(now)
        steps += 1
    assert [f.completion_tokens for f in result.finished] == [3] and steps == 3
    assert engine.load().kv_blocks_free == 8


def test_the_context_is_checked_against_max_tokens_not_the_real_length():
    engine = Engine(P)
    over = EngineRequest(request_id="a", prompt_tokens=10, max_tokens=991, output_tokens=3)
    assert engine.submit(over, 0.0) is SubmitOutcome.TOO_LONG


def test_output_tokens_past_max_tokens_is_a_programming_error():
    with pytest.raises(ValueError, match="output_tokens"):
        Engine(P).submit(EngineRequest(request_id="a", prompt_tokens=1, max_tokens=3, output_tokens=4), 0.0)
