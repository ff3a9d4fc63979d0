"""Prefix keys: the depth ladder, tenant separation, cheap leading hashes, the hot-key sketch."""

from __future__ import annotations

import random

import pytest

from dataplane.pick.prefix import DEPTHS, HotKeys, explicit_key, leading_hashes, prefix_keys
from ferry.tokens import block_hashes, prompt_from_blocks

KEYS = [
    # id, hashes, depths reached
    ("one-block", [11], [1]),
    ("three-blocks", [11, 12, 13], [1, 2]),
    ("sixteen-blocks", list(range(16)), [1, 2, 4, 8, 16]),
    ("long-prompt-stops-at-16", list(range(200)), [1, 2, 4, 8, 16]),
    ("empty", [], []),
]


@pytest.mark.parametrize(("hashes", "depths"), [k[1:] for k in KEYS], ids=[k[0] for k in KEYS])
def test_one_key_per_depth_reached(hashes: list[int], depths: list[int]) -> None:
    keys = prefix_keys("t", hashes)
    assert len(keys) == len(depths)
    assert keys == tuple(prefix_keys("t", hashes[:d])[-1] for d in depths)  # key_d depends on the first d only


def test_keys_follow_the_shared_prefix_and_the_tenant() -> None:
    turn1, turn2 = [7, 8, 9], [7, 8, 9, 10, 11]     # chained ids: turn 2 extends turn 1
    other = [7, 99, 100]                           # shares block 0 only
    assert prefix_keys("t", turn1)[:2] == prefix_keys("t", turn2)[:2]
    assert prefix_keys("t", turn1)[0] == prefix_keys("t", other)[0] != prefix_keys("u", other)[0]
    assert prefix_keys("t", turn1)[1] != prefix_keys("t", other)[1]
    assert explicit_key("t", "doc-1") != explicit_key("u", "doc-1")


def test_leading_hashes_are_the_prompts_first_block_hashes() -> None:
    prompt = prompt_from_blocks(list(range(40)), 40 * 512)     # 20,480 words
    words = prompt.split()
    assert leading_hashes(words, DEPTHS[-1]) == block_hashes(prompt)[:16]
    short = prompt_from_blocks([1, 2], 700)
    assert leading_hashes(short.split(), 16) == block_hashes(short)  # two blocks, the last partial


def test_a_key_carrying_a_large_share_becomes_hot_and_a_rare_one_does_not() -> None:
    hot = HotKeys(capacity=64, window=256)
    rng = random.Random(1)
    for _ in range(300):
        hot.observe([1, rng.getrandbits(64)])  # key 1 in every request, the second key always new
    assert hot.hot(1, share=0.1)
    assert not hot.hot(2, share=0.1)
    assert hot.first_cool([1, 2, 3], share=0.1) == 1
    assert hot.first_cool([1], share=0.1) == 1  # all hot: past the end
    assert len(hot) <= 64


def test_the_sketch_forgets_a_key_that_cooled_down() -> None:
    hot = HotKeys(capacity=64, window=100, min_count=4)
    for _ in range(200):
        hot.observe([5])
    assert hot.hot(5, share=0.5)
    for i in range(1000):
        hot.observe([1000 + i])
    assert not hot.hot(5, share=0.05)


def test_min_count_keeps_a_quiet_start_from_calling_everything_hot() -> None:
    hot = HotKeys(min_count=8)
    hot.observe([1])
    assert not hot.hot(1, share=0.0)
