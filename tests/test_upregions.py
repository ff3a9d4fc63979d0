"""``ferry up --regions``: region names, default round trips, the config they add; inline tables in TOML."""

from __future__ import annotations

import tomllib

import pytest
from tomli_w import dumps

from controlplane.config import ControlPlaneSettings
from ferry.config import parse
from ferry_cli.up.regions import default_rtt, region_names, with_regions


@pytest.mark.parametrize(("count", "expected"), [(1, ["local"]), (0, ["local"]), (3, ["a", "b", "c"])],
                         ids=["one", "zero", "three"])
def test_region_names(count: int, expected: list[str]) -> None:
    assert region_names(count, "local") == expected


def test_too_many_regions_is_refused() -> None:
    with pytest.raises(ValueError, match="at most 26"):
        region_names(27, "local")


def test_three_regions_get_the_issue_round_trips() -> None:
    assert default_rtt(["a", "b", "c"]) == {"a:b": 40.0, "a:c": 200.0, "b:c": 180.0}
    assert default_rtt(["a", "b", "c", "d"])["a:d"] == 120.0


def test_the_region_config_round_trips_through_toml_into_the_settings() -> None:
    config = with_regions({"controlplane": {"grace_seconds": 2.0}}, ["a", "b", "c"])
    text = dumps(config)
    assert tomllib.loads(text) == config
    settings = parse(tomllib.loads(text)).section(ControlPlaneSettings, "controlplane")
    assert settings.region_rtt_ms == {"a:b": 40.0, "a:c": 200.0, "b:c": 180.0}
    assert config["proxy"] == {"simulate_region_rtt": True}


def test_a_config_that_sets_its_own_round_trips_keeps_them() -> None:
    config = with_regions({"controlplane": {"region_rtt_ms": {"a:b": 5.0}}}, ["a", "b"])
    assert config["controlplane"]["region_rtt_ms"] == {"a:b": 5.0}
    assert with_regions({}, ["local"]) == {}
