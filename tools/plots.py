"""PNG plots of a replay: latency percentiles over time per tier, load per replica, shed rate.

Time is bucketed into ``windows`` equal windows over the run (by the time each
request was sent); percentiles are nearest-rank within a window. Load per
replica is the number of requests in flight at it, sampled on the same grid
from each request's send and finish times (what the client saw).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from tools.report import Result, percentile

TIER_COLOURS = {"interactive": "tab:red", "standard": "tab:blue", "batch": "tab:green"}


def _grid(results: Sequence[Result], windows: int) -> tuple[float, list[float]]:
    end = max((r.sent_s + r.latency_s for r in results), default=1.0)
    width = max(end / windows, 1e-3)
    return width, [i * width for i in range(windows + 1)]


def latency_over_time(results: Sequence[Result], path: Path, windows: int = 20) -> None:
    width, grid = _grid(results, windows)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for tier in sorted({r.tier for r in results}):
        for p, style in ((50, "--"), (99, "-")):
            xs, ys = [], []
            for start in grid[:-1]:
                lat = [r.latency_s for r in results
                       if r.tier == tier and r.status == "OK" and start <= r.sent_s < start + width]
                if lat:
                    xs.append(start + width / 2)
                    ys.append(percentile(lat, p) * 1000)
            ax.plot(xs, ys, style, color=TIER_COLOURS.get(tier), label=f"{tier} p{p}")
    ax.set(xlabel="time since start of replay (s)", ylabel="end-to-end latency (ms)",
           title="Latency percentiles over time, per tier")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(ncol=3, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load_per_replica(results: Sequence[Result], path: Path, windows: int = 60) -> None:
    _, grid = _grid(results, windows)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for replica in sorted({r.replica for r in results if r.replica}):
        mine = [r for r in results if r.replica == replica]
        ys = [sum(r.sent_s <= t < r.sent_s + r.latency_s for r in mine) for t in grid]
        ax.plot(grid, ys, label=replica, linewidth=1)
    ax.set(xlabel="time since start of replay (s)", ylabel="requests in flight",
           title="Load per replica (requests in flight, as the client saw them)")
    ax.grid(True, alpha=0.3)
    ax.legend(ncol=4, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def shed_rate(results: Sequence[Result], path: Path, windows: int = 20) -> None:
    width, grid = _grid(results, windows)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for tier in sorted({r.tier for r in results}):
        xs, ys = [], []
        for start in grid[:-1]:
            sent = [r for r in results if r.tier == tier and start <= r.sent_s < start + width]
            if sent:
                xs.append(start + width / 2)
                ys.append(100.0 * sum(r.status == "RESOURCE_EXHAUSTED" for r in sent) / len(sent))
        ax.plot(xs, ys, marker=".", color=TIER_COLOURS.get(tier), label=tier)
    ax.set(xlabel="time since start of replay (s)", ylabel="shed (% of requests sent)",
           title="Shed rate (RESOURCE_EXHAUSTED) over time, per tier", ylim=(-2, 102))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(results: Sequence[Result], prefix: Path) -> list[Path]:
    """Write the three plots as ``{prefix}-latency.png``, ``-load.png``, ``-shed.png``; return the paths."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    paths = [prefix.with_name(prefix.name + s) for s in ("-latency.png", "-load.png", "-shed.png")]
    if not results or math.isnan(max((r.latency_s for r in results), default=math.nan)):
        return []
    latency_over_time(results, paths[0])
    load_per_replica(results, paths[1])
    shed_rate(results, paths[2])
    return paths
