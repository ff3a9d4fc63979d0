"""The fleet simulator: deterministic for a seed, a small run of every policy, its invariants."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from agent.replica.engine import EngineParams
from tools import simulate
from tools.sim import capacity, workload
from tools.sim.fleet import Fleet, FleetConfig
from tools.sim.policies import POLICIES
from tools.sim.radix import ApproxTree
from tools.sim.report import summarize

ENGINE = EngineParams(max_running=8, prefix_cache_blocks=256)
SMALL = FleetConfig(replicas=4, proxies=2, engine=ENGINE)


def run(path: Path, policy: str, *, seed: int = 1, load: float = 0.8) -> dict[str, object]:
    reqs = workload.requests(path)
    cap = capacity.measure(reqs, SMALL, per_replica=40)
    config = FleetConfig(**{**SMALL.__dict__, "seed": seed})
    return summarize([Fleet(config, POLICIES[policy], workload.at_load(reqs, load, cap)).run()])


def test_the_simulator_is_deterministic_for_a_seed(mooncake_trace: Path) -> None:
    first, again, other = run(mooncake_trace, "ferry"), run(mooncake_trace, "ferry"), run(mooncake_trace, "ferry",
                                                                                              seed=2)
    assert first == again
    assert first != other


@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_policy_serves_every_request(mooncake_trace: Path, policy: str) -> None:
    result = run(mooncake_trace, policy)
    assert result["requests"] == 240 and result["rejected"] == 0
    assert math.isfinite(float(result["ttft_p99_ms"])) and float(result["ttft_p50_ms"]) > 0
    assert 0.0 < float(result["hit_ratio"]) < 1.0 and 0.0 < float(result["utilisation"]) <= 1.0


def test_prefix_affinity_beats_a_blind_spread_on_hits(mooncake_trace: Path) -> None:
    assert run(mooncake_trace, "ferry")["hit_ratio"] > run(mooncake_trace, "round_robin")["hit_ratio"]


def test_capacity_grows_with_the_fleet(mooncake_trace: Path) -> None:
    reqs = workload.requests(mooncake_trace)
    small = capacity.measure(reqs, FleetConfig(replicas=2, proxies=1, engine=ENGINE), per_replica=60)
    large = capacity.measure(reqs, FleetConfig(replicas=4, proxies=1, engine=ENGINE), per_replica=60)
    assert 1.5 < large / small < 2.5
    with pytest.raises(ValueError, match="saturated"):
        capacity.measure(reqs, FleetConfig(replicas=4, proxies=1), per_replica=60)  # 60 slots each: too few


def test_approximate_tree_matches_the_longest_prefix_and_evicts() -> None:
    tree = ApproxTree(replicas=2, max_blocks=4)
    tree.insert(0, [1, 2, 3])
    tree.insert(1, [1, 2, 9])
    assert tree.match([1, 2, 3, 4]) == ({0}, 3)
    assert tree.match([1, 2]) == ({0, 1}, 2)
    assert tree.match([5]) == (set(), 0)
    tree.insert(0, [7, 8])  # five blocks for replica 0: its least recently used goes (2, the head's child)
    assert tree.size(0) == 4 and tree.match([1, 2, 3])[1] <= 3


def test_cli_writes_the_report_and_the_plot(mooncake_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    code = simulate.main(["--trace", str(mooncake_trace), "--replicas", "4", "--proxies", "2", "--load", "0.5,0.9",
                          "--engine", "max_running=8", "--engine", "prefill_seconds_per_token=2e-5",
                          "--policies", "ferry,round_robin", "--seeds", "1", "--out", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    rows = {(r["policy"], r["load"]) for r in report["results"]}
    assert rows == {(p, load) for p in ("ferry", "round_robin") for load in (0.5, 0.9)}
    fields = {"policy", "load", "ttft_p50_ms", "ttft_p99_ms", "e2e_p99_ms", "hit_ratio", "max_mean_load",
              "utilisation"}
    assert all(fields <= set(r) for r in report["results"])
    assert (tmp_path / "simulate-mini_mooncake.png").stat().st_size > 10_000
