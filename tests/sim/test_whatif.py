"""What-if and tune (tools.sim.whatif, tools.sim.tune) on a small synthetic recording: the reader, the fleet
file, the intervals (the same config on both sides is no change; a bad candidate is worse), the search."""

from __future__ import annotations

import math

import pytest

from dataplane.config import ProxySettings
from ferry.errors import ConfigError
from tests.sim.recording import FLEET, conversations
from tools.sim import tune, whatif
from tools.sim.fleet import Fleet, FleetConfig
from tools.sim.policies import POLICIES
from tools.sim.workload import SimRequest

DEFAULTS = ProxySettings()


@pytest.fixture(scope="module")
def rows() -> list[whatif.Row]:
    return whatif.parse_rows(conversations())


@pytest.fixture(scope="module")
def fleet() -> whatif.FleetSpec:
    return whatif.parse_fleet(FLEET)


def _without_wall(result: dict[str, object]) -> dict[str, object]:
    out = dict(result)
    for side in ("baseline", "candidate"):
        out[side] = {k: v for k, v in result[side].items() if k != "wall_seconds"}  # type: ignore[attr-defined]
    return out


def test_a_plain_mooncake_trace_is_one_model_of_the_standard_tier() -> None:
    rows = whatif.parse_rows([{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]},
                              {"timestamp": 0, "input_length": 100, "output_length": 0, "hash_ids": [0]},
                              {"timestamp": 3000, "input_length": 100, "output_length": 9, "hash_ids": [2]}])
    assert [r.offset for r in rows] == [0.0, 1.5, 3.0]  # ties spread over the step to the next stamp
    assert {(r.model, r.tier, r.proxy, r.ttft_ms) for r in rows} == {("", "standard", "", None)}
    assert rows[1].output_tokens == 1  # at least one token generated
    fleet = whatif.default_fleet(rows, 2)
    assert fleet.models() == ["default"] and len(fleet.replicas("default")) == 2
    assert whatif.proxies_of(rows) == (1, [-1, -1, -1])
    assert whatif.recorded(rows) is None


def test_recorded_keys_are_read_and_bad_ones_named(rows: list[whatif.Row]) -> None:
    assert rows[0].tier == "interactive" and rows[0].proxy == "p0" and rows[0].ttft_ms == 50.0
    assert whatif.proxies_of(rows)[0] == 2
    assert whatif.default_fleet(rows).replicas("chat")[0][0] == "r0"  # the recording's replica ids
    good = conversations(1)[0]
    for key, value, named in (("tier", "gold", "traffic[0].tier"), ("input_length", -1, "traffic[0].input_length"),
                              ("timestamp", "soon", "traffic[0].timestamp"), ("ttft_ms", -3, "traffic[0].ttft_ms"),
                              ("hash_ids", [1, "x"], "traffic[0].hash_ids")):
        with pytest.raises(ConfigError) as caught:
            whatif.parse_rows([{**good, key: value}])
        assert caught.value.key == named
    with pytest.raises(ConfigError) as caught:
        whatif.parse_rows([])
    assert caught.value.key == "traffic" and "no requests" in str(caught.value)


def test_the_fleet_file_is_checked_naming_the_field() -> None:
    entry = FLEET["engines"][0]
    params = {"max_running": 16.0, "prefill_seconds_per_token": 1e-5}
    spec = whatif.parse_fleet({"engines": [{**entry, "params": params}]})
    assert spec.replicas("chat")[0][1].max_running == 16  # an integral float is taken for an integer field
    for params, named in (({"max_runing": 4}, "engines[0].params.max_runing"),
                          ({"max_running": 0}, "engines[0].params.max_running")):
        with pytest.raises(ConfigError) as caught:
            whatif.parse_fleet({"engines": [{**entry, "params": params}]})
        assert caught.value.key == named
    with pytest.raises(ConfigError) as caught:
        whatif.parse_fleet({"engines": [{**entry, "replicas": []}]})
    assert caught.value.key == "engines[0].replicas"
    with pytest.raises(ConfigError) as caught:  # traffic of a model the fleet does not have
        whatif.compare(whatif.parse_rows(conversations(20, models=("other",))), spec, DEFAULTS, DEFAULTS)
    assert caught.value.key == "traffic[0].model"


def test_configs_come_from_the_proxy_section() -> None:
    assert whatif.settings_from_toml("[proxy]\nwalk_limit = 2\n", "c.toml").pick.walk_limit == 2
    with pytest.raises(ConfigError) as caught:
        whatif.settings_from_toml("[proxy]\nwalk_limitt = 2\n", "c.toml")
    assert caught.value.key == "proxy.walk_limitt"
    with pytest.raises(ConfigError) as caught:
        whatif.settings_from_toml("[server]\n", "c.toml")
    assert caught.value.key == "proxy"
    changed = whatif.with_changes(DEFAULTS, {"load_factor": 2.0, "detour_factor": 6.0})
    assert whatif.changed(changed) == {"load_factor": 2.0, "detour_factor": 6.0}


def test_the_same_config_on_both_sides_is_no_change(rows: list[whatif.Row], fleet: whatif.FleetSpec) -> None:
    result = whatif.compare(rows, fleet, DEFAULTS, ProxySettings.from_section({}), resamples=200)
    assert result["requests"] == 600 and result["proxies"] == 2 and result["replicas"] == 4
    assert 10 <= result["windows"] <= 31 and len(result["per_window"]) == result["windows"]
    for m in result["metrics"]:
        assert m["baseline"] == m["candidate"], m
        null = 1.0 if m["change"] == "ratio" else 0.0
        assert m["estimate"] == null and m["low"] <= null <= m["high"], m
        assert m["verdict"] == "no significant change"
    util = next(m for m in result["metrics"] if m["metric"] == "gpu_utilisation")
    assert 0 < util["baseline"] < 1
    assert result["recorded"]["ttft_p50_ms"] == 53.0 and result["recorded"]["hit_ratio"] is not None


def test_the_same_seed_gives_the_same_answer(rows: list[whatif.Row], fleet: whatif.FleetSpec) -> None:
    candidate = whatif.with_changes(DEFAULTS, {"load_factor": 2.0})
    first = whatif.compare(rows, fleet, DEFAULTS, candidate, resamples=100)
    again = whatif.compare(rows, fleet, DEFAULTS, candidate, resamples=100)
    other = whatif.compare(rows, fleet, DEFAULTS, candidate, resamples=100, seed=2)
    assert _without_wall(first) == _without_wall(again)
    assert _without_wall(first) != _without_wall(other)


def test_a_bad_candidate_is_worse_with_an_interval_that_excludes_no_change(rows: list[whatif.Row],
                                                                           fleet: whatif.FleetSpec) -> None:
    # detour at any backlog difference and place every new conversation on the least busy replica: the
    # conversations scatter over the replicas, whose caches are too small to each hold them all
    bad = whatif.with_changes(DEFAULTS, {"detour_factor": 0.0, "place_factor": 0.0})
    result = whatif.compare(rows, fleet, DEFAULTS, bad)
    hit = next(m for m in result["metrics"] if m["metric"] == "hit_ratio")
    assert hit["candidate"] < hit["baseline"] and hit["high"] < 0 and hit["verdict"] == "worse", hit
    assert result["candidate"]["changed_from_baseline"] == {"detour_factor": 0.0, "place_factor": 0.0}
    text = whatif.render(result)
    assert "hit_ratio" in text and "worse" in text


def test_each_model_runs_on_its_own_replicas() -> None:
    rows = whatif.parse_rows(conversations(200, models=("chat", "code")))
    entry = FLEET["engines"][0]
    fleet = whatif.parse_fleet({"engines": [{**entry, "replicas": ["c0", "c1"]},
                                            {**entry, "model": "code", "replicas": ["k0"]}]})
    result = whatif.compare(rows, fleet, DEFAULTS, DEFAULTS, resamples=50)
    assert result["replicas"] == 3 and set(result["models"]) == {"chat", "code"}
    assert sum(result["models"].values()) == 200 and result["candidate"]["refused"] == 0


def test_the_fleet_counts_its_busy_time_per_bin() -> None:
    reqs = [SimRequest(i, 0.05 * i, 900, 20, (i,)) for i in range(100)]
    plain = Fleet(FleetConfig(replicas=2, proxies=1), POLICIES["ferry"], reqs).run()
    binned = Fleet(FleetConfig(replicas=2, proxies=1, busy_bin_seconds=0.5), POLICIES["ferry"], reqs).run()
    assert not plain.busy and [s.ttft for s in plain.served] == [s.ttft for s in binned.served]
    assert math.isclose(sum(binned.busy), sum(load.busy_seconds for load in binned.loads), rel_tol=1e-9)
    assert all(b <= 2 * 0.5 + 1e-9 for b in binned.busy)  # never more than the replicas x the bin


def test_a_step_starting_on_a_bins_edge_is_counted_and_ends() -> None:
    # 0.15 // 0.05 is 2.0 in floating point though 0.15 is the edge of bin 3: the bin is found, not looped on
    fleet = Fleet(FleetConfig(replicas=1, proxies=1, busy_bin_seconds=0.05), POLICIES["ferry"], [])
    for start in (0.15, 0.3, 0.7, 0.05 * 7, 1e6 * 0.05):
        fleet.busy.clear()
        fleet._count_busy(start, start + 0.01)
        assert math.isclose(sum(fleet.busy), 0.01, rel_tol=1e-6)


def test_tune_finds_a_better_setting_and_proposes_it(rows: list[whatif.Row], fleet: whatif.FleetSpec) -> None:
    # on this recording the default ring bound (1.25) moves conversations off their replica: a looser bound
    # keeps their caches, which the held-out half confirms
    result = tune.tune(rows, fleet, DEFAULTS, {"load_factor": (1.25, 3.0)}, resamples=300)
    assert result["fit"]["best_changes"] == {"load_factor": 3.0}
    held = result["held_out"]
    assert result["proposal"] == {"load_factor": 3.0} and held["gain_low"] > 0, held
    assert result["verdict"].startswith("proposed")
    assert held["requests"] + result["fit"]["requests"] == 600 and result["runs"] == 2
    fragment = tune.proposal_toml(result["proposal"], "note")
    assert fragment.startswith("# note\n")
    assert whatif.settings_from_toml(fragment, "p.toml").table.load_factor == 3.0


def test_tune_says_no_change_when_the_space_has_nothing_better(rows: list[whatif.Row],
                                                               fleet: whatif.FleetSpec) -> None:
    result = tune.tune(rows, fleet, DEFAULTS, {"detour_factor": (0.0, 24.0), "place_factor": (0.0,)}, budget=3)
    assert result["proposal"] is None and result["runs"] == 3
    assert result["verdict"].startswith("no change is significantly better")
    assert "no change is significantly better" in tune.render(result)


def test_tune_checks_its_space_split_and_budget(rows: list[whatif.Row], fleet: whatif.FleetSpec) -> None:
    assert tune.parse_space(["walk_limit=2,4", "detour_factor = 6.0, 12"]) == {"walk_limit": (2, 4),
                                                                             "detour_factor": (6.0, 12)}
    for items, named in ((["walk_limit=0"], "proxy.walk_limit"), (["walk_limitt=2"], "proxy.walk_limitt"),
                         (["walk_limit"], "space")):
        with pytest.raises(ConfigError) as caught:
            tune.parse_space(items)
        assert caught.value.key == named
    for kwargs, named in (({"split": 1.0}, "split"), ({"budget": 0}, "budget")):
        with pytest.raises(ConfigError) as caught:
            tune.tune(rows, fleet, DEFAULTS, {"walk_limit": (2,)}, **kwargs)  # type: ignore[arg-type]
        assert caught.value.key == named
    with pytest.raises(ConfigError):
        tune.Objective(metric="hit_ratio")
    first, cut, width = tune.split_rows(rows, 0.5)
    assert rows[first - 1].offset < cut <= rows[first].offset and math.isclose(cut / width, round(cut / width))
