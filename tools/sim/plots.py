"""PNG plots of a simulator report: per policy against load, TTFT p50 and p99, prefix hit ratio, max/mean load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STYLE = {  # policy -> (colour, marker); Ferry drawn last, thick
    "round_robin": ("tab:gray", "s"),
    "random": ("tab:brown", "v"),
    "least_loaded": ("tab:purple", "D"),
    "consistent_hash": ("tab:orange", "^"),
    "cache_aware": ("tab:green", "o"),
    "ferry": ("tab:blue", "*"),
}
PANELS = (  # field, label, log scale, linear axis floor
    ("ttft_p50_ms", "TTFT p50 (ms)", True, None),
    ("ttft_p99_ms", "TTFT p99 (ms)", True, None),
    ("hit_ratio", "prefix-cache hit ratio (share of prompt tokens)", False, 0.0),
    ("max_mean_load", "max / mean replica load", False, 1.0),
)


def plot(report: dict[str, Any], path: Path) -> Path:
    """Write the four-panel figure of ``report`` (the simulator's JSON) to ``path``."""
    rows = report["results"]
    policies = [p for p in STYLE if any(r["policy"] == p for r in rows)]
    policies += sorted({r["policy"] for r in rows} - set(policies))
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), constrained_layout=True)
    for ax, (field, label, log, floor) in zip(axes.flat, PANELS, strict=True):
        for policy in policies:
            points = sorted((r["load"], r[field]) for r in rows if r["policy"] == policy and r[field] is not None)
            colour, marker = STYLE.get(policy, ("black", "x"))
            ax.plot([x for x, _ in points], [y for _, y in points], marker=marker, color=colour, label=policy,
                    linewidth=3 if policy == "ferry" else 1.5, markersize=9 if policy == "ferry" else 6)
        ax.set_xlabel("offered load (share of fleet capacity)")
        ax.set_ylabel(label)
        if log:
            ax.set_yscale("log")
        else:
            ax.set_ylim(floor, floor + 1.15 * (max(r[field] for r in rows if r[field] is not None) - floor))
        ax.grid(True, which="both", alpha=0.3)
    axes.flat[0].legend(loc="upper left", fontsize=9)
    fig.suptitle(f"{report['trace']}: {report['replicas']} replicas, {report['proxies']} proxies, "
                 f"table every {report['refresh_ms']:g} ms, capacity {report['capacity_rps']:.1f} req/s, "
                 f"{report['seeds']} seeds pooled", fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
