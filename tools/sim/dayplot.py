"""The day replay's figure: replicas and standby over the day against the arrival rate; the ramp's TTFT p99."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def plot_day(report: dict[str, Any], path: Path) -> Path:
    """Write the two-panel figure of ``report`` (:func:`tools.sim.day.simulate`'s JSON) to ``path``."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 8.5), constrained_layout=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    scaled, reactive = report["series"]["scaled"], report["series"]["reactive"]
    hours = [r["hour"] for r in scaled]
    top.plot(hours, [r["ready"] for r in scaled], color="tab:blue", linewidth=2.5, label="ready replicas (plan)")
    top.plot(hours, [r["desired"] for r in scaled], color="tab:blue", linestyle="--", linewidth=1.2,
             label="desired (plan)")
    top.plot(hours, [r["needed_now"] for r in scaled], color="tab:cyan", linewidth=1, label="needed now")
    top.plot(hours, [r["ready"] for r in reactive], color="tab:orange", linewidth=1.5,
             label="ready replicas (reactive: no history)")
    top.plot(hours, [r["standby"] for r in scaled], color="tab:green", linewidth=1.5, label="standby nodes (plan)")
    top.axhline(report["peak_replicas"], color="tab:gray", linestyle=":", label="peak capacity all day")
    start, end = report["config"]["ramp_hours"]
    top.axvspan(start, end, color="tab:gray", alpha=0.12, label="morning ramp (replayed in the engines)")
    top.set_xlabel("hour of the day (UTC)")
    top.set_ylabel("replicas / nodes")
    top.set_xlim(0, 24)
    top.set_xticks(range(0, 25, 2))
    top.grid(True, alpha=0.3)
    rate_axis = top.twinx()
    rate_axis.plot(hours, [r["rate"] for r in scaled], color="black", alpha=0.35, linewidth=1)
    rate_axis.set_ylabel("arrival rate (req/s, grey)")
    rate_axis.set_ylim(0, 1.15 * max(r["rate"] for r in scaled))
    top.legend(loc="upper left", fontsize=8)
    g = report["gpu_hours"]
    top.set_title(f"GPU-hours: plan {g['scaled']:.0f}, reactive {g['reactive']:.0f}, peak all day "
                  f"{g['peak_all_day']:.0f} (saved {100 * report['saved_share']:.1f} %)", fontsize=11)
    styles = {"scaled": ("tab:blue", "*"), "reactive": ("tab:orange", "o"), "peak_all_day": ("tab:gray", "s")}
    for name, ramp in report["ramp"].items():
        points = [(w["hour"], w["ttft_p99_s"]) for w in ramp["windows"]]
        colour, marker = styles.get(name, ("black", "x"))
        finite = [(x, y) for x, y in points if y is not None]
        p99 = ramp["ttft_p99_s"]
        label = (f"{name}: pooled p99 {p99:.2f} s" if p99 is not None
                 else f"{name}: pooled p99 a miss ({ramp['misses']} refused; x: windows with refusals)")
        bottom.plot([x for x, _ in finite], [y for _, y in finite], marker=marker, color=colour, label=label)
        missed = [x for x, y in points if y is None]
        if missed:
            bottom.scatter(missed, [report["ttft_target_s"] * 2.5] * len(missed), marker="x", color=colour)
    bottom.axhline(report["ttft_target_s"], color="tab:red", linestyle="--", label="TTFT p99 target")
    bottom.set_xlabel("hour of the day (UTC), morning ramp")
    bottom.set_ylabel("TTFT p99 per window (s)")
    bottom.set_yscale("log")
    bottom.grid(True, which="both", alpha=0.3)
    bottom.legend(loc="upper left", fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
