"""Shared helpers: config loading, prompt blocks, the TOML writer."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from ferry import config, tokens
from ferry.errors import ConfigError

KEY = config.hash_api_key("k")


@pytest.mark.parametrize(("data", "key"), [
    ({"bogus": {}}, "bogus"),
    ({"limits": {"max_tokenz": 1}}, "limits.max_tokenz"),
    ({"limits": {"max_tokens": "many"}}, "limits.max_tokens"),
    ({"tenants": [{"name": "a", "api_key_sha256": KEY, "plan": "gold"}]}, "tenants.a.plan"),
    ({"tenants": [{"name": "a", "api_key_sha256": KEY, "tiers": ["vip"]}]}, "tenants.a.tiers"),
    ({"tenants": [{"name": "a", "api_key_sha256": "short"}]}, "tenants.a.api_key_sha256"),
    ({"tenants": [{"name": "a", "api_key_sha256": KEY, "colour": "red"}]}, "tenants[0].colour"),
    ({"models": [{"name": "m", "min_gpus": 1.5}]}, "models[0].min_gpus"),
], ids=["section", "key", "type", "plan", "tier", "hash", "tenant-key", "model-type"])
def test_config_errors_name_the_key(data, key):
    with pytest.raises(ConfigError) as info:
        config.parse(data)
    assert info.value.key == key


def test_config_plane_section_is_strict():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Settings:
        tick_seconds: float = 0.5
        name: str = "x"

    cfg = config.parse({"controlplane": {"tick_seconds": 1}})
    assert cfg.section(Settings, "controlplane") == Settings(tick_seconds=1.0)
    assert cfg.section(Settings, "proxy") == Settings()
    with pytest.raises(ConfigError, match="controlplane.tick"):
        config.parse({"controlplane": {"tick": 1}}).section(Settings, "controlplane")


@pytest.mark.parametrize(("a", "b", "shared"), [
    ([0, 1, 2], [0, 1, 3], 2),
    ([0, 1, 2], [0, 4, 2], 1),
    ([5], [6], 0),
], ids=["two-blocks", "one-block", "none"])
def test_prompts_from_trace_blocks_share_exactly_the_shared_prefix(a, b, shared):
    ha = tokens.block_hashes(tokens.prompt_from_blocks(a, 512 * len(a)))
    hb = tokens.block_hashes(tokens.prompt_from_blocks(b, 512 * len(b)))
    same = sum(1 for _ in itertools.takewhile(lambda p: p[0] == p[1], zip(ha, hb, strict=False)))
    assert same == shared


@pytest.mark.parametrize(("n", "blocks"), [(0, 0), (1, 1), (512, 1), (513, 2), (1200, 3)])
def test_prompt_length_and_blocks(n, blocks):
    prompt = tokens.prompt_from_blocks([1, 2, 3], n)
    assert tokens.count_tokens(prompt) == n
    assert len(tokens.block_hashes(prompt)) == blocks == tokens.blocks_for(n)
