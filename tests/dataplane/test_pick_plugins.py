"""The pick as plug-ins: the registry, ``[proxy.pick]`` composed and refused by key, per-step metrics, the debug log,
and a scorer added as one file under tests/ (tests/dataplane/scorer_queued.py) with no product file changed."""

from __future__ import annotations

import json
import logging
import random
import tomllib
from pathlib import Path
from typing import Any

import pytest

import tests.dataplane.scorer_queued  # noqa: F401 (registers the scorer "queued")
from dataplane.config import ProxySettings, load
from dataplane.pick.decide import Ask, DecideParams, Local, Routing, View, decide
from dataplane.pick.p2c import Branch, LocalLoad, Need
from dataplane.pick.plugin import REGISTRY, Filter, Picker, Scorer, compose, default_plan, known
from dataplane.pick.settings import PickSettings, PlanSettings, ScorerSettings
from dataplane.pick.state import PickState
from dataplane.regions.remote import EMPTY
from dataplane.table.local import build_table
from dataplane.table.pool import Replica, make_pool
from ferry.errors import ConfigError
from tests.dataplane.conftest import PAID, request
from tests.dataplane.fakes import Behaviour, snapshot

TABLE = build_table(snapshot(1, []), region="local", applied_at=0.0)


def plan_of(text: str) -> Any:
    """The plan ``text`` (a ``[proxy]`` file) composes."""
    return compose(ProxySettings.from_section(tomllib.loads(text)["proxy"]).pick)


def test_every_builtin_is_registered_once_with_its_kind_and_what_it_consumes() -> None:
    assert known("filter") == ["avoid", "ejected", "fresh", "room", "tried", "tried_nodes"]
    assert {"kv", "load", "staleness"} <= set(known("scorer"))
    assert known("picker") == ["p2c", "prefix"]
    plan = default_plan()
    for part in (*plan.hard, *plan.soft, *plan.takers):
        assert isinstance(part, Filter) and part.consumes
    for scorer in plan.scorers:
        assert isinstance(scorer, Scorer) and scorer.consumes
    assert isinstance(plan.picker, Picker)
    assert all(REGISTRY[name].type_name == name for name in REGISTRY)
    assert [s.weight for s in plan.scorers] == [1.0, 0.5, 1.0]  # load, kv_weight, stale_weight


@pytest.mark.parametrize(("text", "key", "words"), [
    ('[proxy.pick]\nscorers = [{type = "load"}, {type = "x"}]', "proxy.pick.scorers[1].type",
     'unknown scorer "x"; known: kv, load, queued, staleness'),
    ('[proxy.pick]\nfilters = ["tried", "nope"]', "proxy.pick.filters[1]", 'unknown filter "nope"; known: avoid'),
    ('[proxy.pick]\npicker = "kv"', "proxy.pick.picker", 'unknown picker "kv"; known: p2c, prefix'),
    ('[proxy.pick]\nscorers = [{type = "kv", weight = nan}]', "proxy.pick.scorers[0].weight", "finite"),
    ('[proxy.pick]\nscorers = [{type = "kv", params = {depth = 2}}]', "proxy.pick.scorers[0].params.depth",
     "unknown parameter (known: none)"),
    ('[proxy.pick]\nscorers = [{type = "staleness", params = {fresh_seconds = "a"}}]',
     "proxy.pick.scorers[0].params.fresh_seconds", "must be a valid number"),
    ('[proxy.pick]\nscorers = [{type = "kv", wieght = 1}]', "proxy.pick.scorers[0].wieght", "unknown key"),
    ('[proxy.pick]\nscorers = []', "proxy.pick.scorers", "at least one"),
    ('[proxy.pick]\nfilters = ["room", "room"]', "proxy.pick.filters[1]", "listed twice"),
], ids=["unknown-scorer", "unknown-filter", "unknown-picker", "weight-nan", "unknown-param", "param-type",
        "unknown-key", "no-scorer", "filter-twice"])
def test_a_bad_composition_is_refused_naming_the_key(text: str, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        plan_of("[proxy]\n" + text)
    assert caught.value.key == key
    assert words in str(caught.value)


def test_the_proxy_file_composes_the_pick_and_the_picker_state_runs_it(tmp_path: Path) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text('[proxy]\nwalk_limit = 4\n[proxy.pick]\nfilters = ["tried"]\npicker = "p2c"\n'
                    '[[proxy.pick.scorers]]\ntype = "kv"\nweight = 2.0\n'
                    '[[proxy.pick.scorers]]\ntype = "staleness"\nweight = 0.25\nparams = {stale_seconds = 30}\n')
    pick = load(path).settings.pick
    assert pick.plan() == PlanSettings(filters=("tried",), picker="p2c", scorers=(
        ScorerSettings(type="kv", weight=2.0), ScorerSettings(type="staleness", weight=0.25,
                                                              params={"stale_seconds": 30})))
    state = PickState.from_settings(pick, random.Random(1))
    plan = state.params.plan
    assert [(s.type_name, s.weight) for s in plan.scorers] == [("kv", 2.0), ("staleness", 0.25)]
    assert plan.scorers[1].stale_seconds == 30.0 and plan.picker.type_name == "p2c" and not plan.takers


def rep(i: int, **kw: Any) -> Replica:
    return Replica(replica_id=f"r{i}", address=f"h:{i}", kserve_model="m", version="v1", node=f"n{i}",
                   max_concurrency=4, kv_block_tokens=16, kv_blocks_total=1000, **kw)


def decide_with(plan: Any, replicas: list[Replica], key: int | None = None) -> Any:
    pool = make_pool("m/v1", replicas, vnodes=16, load_factor=1.25, rings={})
    ask = Ask(routing=Routing("v1", pool, key, Need(160, 100)))
    return decide(View(TABLE, EMPTY, DecideParams(plan=plan)), ask, Local(LocalLoad()), random.Random(1), 0.0)


def test_kv_weight_is_configured_by_the_scorer_entry() -> None:
    """r0 carries one more request, r1 has its KV cache nearly full: the kv weight decides which costs less."""
    replicas = [rep(0, running=1, kv_blocks_free=900), rep(1, kv_blocks_free=100)]
    weigh = '[proxy]\n[proxy.pick]\nscorers = [{type = "load"}, {type = "kv", weight = %s}]'
    assert decide_with(plan_of(weigh % "0.1"), replicas).replica.replica_id == "r1"
    assert decide_with(plan_of(weigh % "2.0"), replicas).replica.replica_id == "r0"


def test_the_p2c_picker_ignores_prefix_keys() -> None:
    replicas = [rep(i, kv_blocks_free=1000) for i in range(4)]
    assert decide_with(default_plan(), replicas, key=12345).branch is Branch.AFFINITY
    assert decide_with(plan_of('[proxy]\n[proxy.pick]\npicker = "p2c"'), replicas, key=12345).branch is Branch.P2C


def test_a_live_reconfigure_recomposes_the_plan_with_the_new_telemetry_ages() -> None:
    state = PickState.from_settings(PickSettings(), random.Random(1))
    from dataplane.config import OutlierSettings, RegionSettings, RetrySettings
    state.reconfigure(PickSettings(telemetry_fresh_seconds=2.0, telemetry_stale_seconds=12.0),
                      regions=RegionSettings(), capacity_share=1.0, outliers=OutlierSettings(),
                      retries=RetrySettings())
    plan = state.params.plan
    assert (plan.scorers[2].fresh_seconds, plan.scorers[2].stale_seconds, plan.takers[1].stale_seconds) == \
        (2.0, 12.0, 12.0)


def _pick_events(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(r.getMessage()) for r in caplog.records
            if r.name == "ferry.proxy.pick" and '"event": "pick"' in r.getMessage()]


QUEUED = """
[proxy]
[proxy.pick]
picker = "p2c"

[[proxy.pick.scorers]]
type = "queued"
weight = 1.0
params = {cap = 100}
"""


async def test_a_scorer_added_in_one_file_is_configured_by_name_and_its_score_is_in_the_debug_log(
        rig: Any, caplog: pytest.LogCaptureFixture) -> None:
    """tests/dataplane/scorer_queued.py registers ``queued``; a real proxy configured with it alone sends the
    request to the replica with the shorter queue, and the decision's debug log shows each raw term."""
    caplog.set_level(logging.DEBUG, logger="ferry.proxy.pick")
    section = tomllib.loads(QUEUED)["proxy"]
    r = await rig({"r1": Behaviour(), "r2": Behaviour()}, settings=section,
                  loads={"r1": {"queued": 8}, "r2": {"queued": 2}})
    await r.stub.Infer(request(), metadata=PAID, timeout=5)
    assert r.served() == {"r1": 0, "r2": 1}
    (logged,) = _pick_events(caplog)
    assert logged["branch"] == "p2c" and logged["replica"] == "r2"
    assert {s["replica"]: s["queued"] for s in logged["scores"]} == {"r1": 2.0, "r2": 0.5}  # queued / 4 slots
    assert logged["plan"]["scorers"] == ["queued(Replica.queued, Replica.max_concurrency)"]
    # each step's time is in the proxy's metrics, by step and branch
    metrics = r.proxy.metrics
    assert metrics.value("proxy_pick_step_seconds_count", step="filter", branch="p2c") == 1
    assert metrics.value("proxy_pick_step_seconds_count", step="pick", branch="p2c") == 1


async def test_the_default_decision_logs_nothing_below_debug(rig: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ferry.proxy.pick")
    r = await rig({"r1": Behaviour(), "r2": Behaviour()})
    await r.stub.Infer(request(), metadata=PAID, timeout=5)
    assert _pick_events(caplog) == []
    assert sum(r.proxy.metrics.value("proxy_pick_step_seconds_count", step="pick", branch=b.value)
               for b in Branch) == 1
