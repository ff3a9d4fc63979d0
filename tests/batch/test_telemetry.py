"""Per-GPU busy share over a window, and the snapshot's derived figures."""

from __future__ import annotations

import pytest

from agent.batch.telemetry import BusyWindow, RuntimeLoad


@pytest.mark.parametrize(
    ("done", "running", "now", "expected"),
    [
        pytest.param([], [], 5.0, [0.0, 0.0], id="idle"),
        pytest.param([((0,), 4.0, 4.5)], [], 5.0, [0.5, 0.0], id="half-a-second-of-one-gpu"),
        pytest.param([((0, 1), 3.5, 4.5)], [], 5.0, [0.5, 0.5], id="gang-batch-clipped-to-the-window"),
        pytest.param([((1,), 1.0, 2.0)], [], 5.0, [0.0, 0.0], id="older-than-the-window"),
        pytest.param([], [((1,), 4.8)], 5.0, [0.0, 0.2], id="running-batch-counts-until-now"),
        pytest.param([((0,), 4.0, 4.5), ((0,), 4.5, 5.0)], [], 5.0, [1.0, 0.0], id="back-to-back"),
    ],
)
def test_busy_window(done: list[tuple[tuple[int, ...], float, float]], running: list[tuple[tuple[int, ...], float]],
                     now: float, expected: list[float]) -> None:
    window = BusyWindow(2, window_s=1.0)
    for gpus, start, end in done:
        window.record(gpus, start, end)
    assert window.utilization(now, running) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("shares", "failed", "mean"),
    [
        pytest.param((0.5, 1.0), 0, 0.75, id="all-healthy"),
        pytest.param((None, 1.0, 0.0), 1, 0.5, id="failed-gpu-left-out"),
        pytest.param((None,), 1, 0.0, id="none-healthy"),
    ],
)
def test_runtime_load_figures(shares: tuple[float | None, ...], failed: int, mean: float) -> None:
    load = RuntimeLoad(models=(), gpu_utilization=shares, gpus_in_use=0, drain_idle_gpu_s=0.0)
    assert (load.gpus_failed, load.mean_utilization) == (failed, pytest.approx(mean))
