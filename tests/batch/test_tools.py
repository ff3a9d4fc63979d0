"""Smoke runs of the capacity calculator and the gang bench, and what the simulator measures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.batch.dispatch import ModelContract
from agent.batch.gpusched import SchedulerConfig
from agent.batch.simulate import Scenario, Stream, percentile, run
from tools import capacity
from tools.bench import gang as bench_gang


def test_capacity_smoke_at_a_small_rate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "capacity.json"
    assert capacity.main(["--rate", "2000", "--duration", "2", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert (data["floor_gpus"], data["rule_of_thumb_gpus"]) == (2, 6)
    assert data["measured_min_gpus"] == 3  # 2 GPUs run at rho = 1: never chosen
    assert data["measured_min_gpus_with_failure"] == 4
    assert data["p95_ms_at_measured_min"] <= 500 and data["lost"] == 0 and data["duplicated"] == 0
    assert data["max_wait_ms"] == pytest.approx(50)
    printed = capsys.readouterr().out
    assert "800 million a day" in printed and "about 9,300" in printed and "about 4,600" in printed


def test_gang_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "gang.json"
    assert bench_gang.main(["--duration", "3", "--out", str(out)]) == 0
    rows = {r["policy"]: r for r in json.loads(out.read_text())["policies"]}
    assert rows["aging"]["small"]["p95_ms"] < rows["no-aging"]["small"]["p95_ms"]  # aging protects small work
    assert rows["greedy"]["large"]["longest_batch_wait_ms"] > 1000  # no reservation: the gang starves
    assert rows["no-aging"]["large"]["longest_batch_wait_ms"] <= rows["aging"]["large"]["longest_batch_wait_ms"]
    assert all(r["lost"] == 0 and r["duplicated"] == 0 for r in rows.values())


@pytest.mark.parametrize(
    ("rate", "gpus", "kill", "requeued"),
    [pytest.param(3000, 4, None, 0, id="no-failure"), pytest.param(3000, 5, 1.0, 100, id="gpu-killed")],
)
def test_simulation_answers_every_request_once(rate: float, gpus: int, kill: float | None, requeued: int) -> None:
    result = run(Scenario(contracts=(ModelContract(name="m"),), scheduler=SchedulerConfig(gpus=gpus),
                          streams=(Stream(model="m", rate=rate),), duration_s=2.0, kill_at_s=kill, seed=3))
    m = result.models["m"]
    assert (result.lost, result.duplicated, m.failed, m.shed) == (0, 0, 0, 0)
    assert result.requeued == requeued and m.mean_fill > 95
    assert m.p95_ms < 500


def test_percentile_nearest_rank() -> None:
    assert percentile([], 0.95) == 0.0
    assert percentile([float(i) for i in range(1, 101)], 0.95) == 95.0
