"""The failure drills of ``tools.drills`` under load, each asserting its target: zero failed requests per tier.

``node_kill`` depends on the proxy retrying requests that never reached a
replica (the data plane's part); the others on supervision in ``ferry up``
and the planes' static stability. Each runs ``DRILL_SECONDS`` (default 12)
at 20 requests per second on a fresh ``ferry up``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools.drills import SCENARIOS, run_scenario, verdict

SECONDS = float(os.environ.get("DRILL_SECONDS", "12"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_drill(name: str, tmp_path: Path) -> None:
    figures = run_scenario(name, SECONDS, 20.0, tmp_path)
    assert figures["tiers"]["interactive"]["total"] > 0
    assert verdict(figures) == [], figures
    if name != "baseline":
        assert figures["recovery"], figures
    if name in ("etcd_kill", "proxy_kill", "node_kill"):
        assert figures["restarts"][figures["recovery"]["killed"]] >= 1
