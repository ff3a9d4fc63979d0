"""The day replay at small scale (not timed): the control plane's own plan, GPU-hours saved, the ramp ahead,
the scale-down bounds, and the ramp's TTFT measured in the engines."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest

from controlplane.scaling import plan as scaling_plan
from tools import simulate_day
from tools.fetch_traces import BUNDLED
from tools.sim import day, workload
from tools.sim.day import Arrivals, DayConfig, share_at, simulate

SMALL = DayConfig(peak_replicas=6.0, startup_seconds=600.0, replacement_seconds=1800.0, plan_seconds=120.0,
                  days=2, ramp_hours=(6.0, 9.0), sample_every_seconds=3600.0, sample_seconds=10.0,
                  warmup_seconds=5.0, proxies=1)


@pytest.fixture(scope="module")
def report() -> dict[str, object]:
    return simulate(SMALL, workload.requests(BUNDLED))


def test_the_simulator_calls_the_control_planes_plan() -> None:
    assert day.plan is scaling_plan.plan and day.needed_for is scaling_plan.needed_for


def test_gpu_hours_saved_against_peak_all_day(report: dict) -> None:
    g = report["gpu_hours"]
    assert 0 < g["scaled"] < g["peak_all_day"]
    assert report["saved_share"] == pytest.approx(1 - g["scaled"] / g["peak_all_day"], abs=1e-3)
    assert g["peak_all_day"] == report["peak_replicas"] * SMALL.gpus_per_replica * 24


def test_the_ramp_is_met_ahead_with_history_and_late_without(report: dict) -> None:
    scaled, reactive = report["series"]["scaled"], report["series"]["reactive"]
    assert len(scaled) == len(reactive) == 24 * 3600 / SMALL.plan_seconds
    ramp = [(s, r) for s, r in zip(scaled, reactive, strict=True) if 6.0 <= s["hour"] < 9.0]
    assert any(s["needed_for_ramp"] > s["needed_now"] for s, _ in ramp)  # asked for before it is needed
    assert all(s["ready"] >= r["ready"] for s, r in ramp)
    assert any(s["ready"] > r["ready"] for s, r in ramp)
    assert all(r["needed_for_ramp"] == 0 for r in reactive)  # no history, no forecast


def test_scale_down_is_bounded_and_never_below_the_floor(report: dict) -> None:
    targets = SMALL.targets
    for run in report["series"].values():
        last_change = None
        for before, after in itertools.pairwise(run):
            assert after["desired"] >= targets.floor
            if after["desired"] != before["desired"]:
                if after["desired"] < before["desired"]:
                    assert before["desired"] - after["desired"] <= targets.step_down
                    if last_change is not None:
                        assert (after["hour"] - last_change) * 3600 >= targets.cooldown_seconds - 1e-6
                last_change = after["hour"]


def test_the_ramp_is_replayed_in_the_engines(report: dict) -> None:
    for name in ("scaled", "reactive", "peak_all_day"):
        ramp = report["ramp"][name]
        assert [w["hour"] for w in ramp["windows"]] == [6.0, 7.0, 8.0]
        assert ramp["requests"] == sum(w["requests"] for w in ramp["windows"]) > 0
        assert isinstance(ramp["within_target"], bool)
    assert all(w["replicas"] == report["peak_replicas"] for w in report["ramp"]["peak_all_day"]["windows"])


def test_repeated_passes_get_fresh_prefixes() -> None:
    reqs = workload.requests(BUNDLED)[:3]
    arrivals = Arrivals(reqs, seed=1)
    first = arrivals.window(1000.0, 0.0, queued=3)
    second = arrivals.window(1000.0, 0.0, queued=3)
    assert [r.hash_ids for r in first] == [r.hash_ids for r in reqs]
    assert all(set(a.hash_ids).isdisjoint(b.hash_ids) for a, b in zip(first, second, strict=True))
    assert [r.arrival for r in second] == [0.0] * 3


def test_the_curve() -> None:
    assert share_at(9 * 3600) == 1.0 and share_at(3 * 3600) == 0.1
    assert share_at(7.5 * 3600) == pytest.approx((0.35 + 0.75) / 2)
    assert share_at(24 * 3600) == share_at(0)


def test_bad_configurations_are_refused() -> None:
    with pytest.raises(ValueError, match="ramp_hours"):
        dataclasses.replace(SMALL, ramp_hours=(10.0, 6.0))
    with pytest.raises(ValueError, match="peak_replicas"):
        dataclasses.replace(SMALL, peak_replicas=0.0)
    assert simulate_day.main(["--peak-replicas", "0", "--out", "/dev/null"]) == 2


def test_the_command_writes_the_report_and_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "day.json"
    code = simulate_day.main(["--peak-replicas", "2", "--sample-every", "7200", "--sample-seconds", "5",
                              "--warmup-seconds", "2", "--out", str(out)])
    assert code == 0
    written = json.loads(out.read_text())
    assert {"gpu_hours", "saved_share", "ramp", "series", "ttft_target_s", "mix"} <= set(written)
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert "GPU-hours over the day" in capsys.readouterr().out
