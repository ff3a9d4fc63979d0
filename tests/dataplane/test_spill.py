"""The proxy's region choice: spill weights applied with one uniform draw per request."""

from __future__ import annotations

import pytest

from dataplane.spill import RegionBranch, SpillTarget, choose_region

TARGETS = (SpillTarget("b", 0.3, 40.0), SpillTarget("c", 0.1, 200.0))
BOTH = ("b", "c")


@pytest.mark.parametrize(
    ("u", "tier", "usable", "region", "branch"),
    [
        (0.0, "interactive", BOTH, "b", RegionBranch.SPILLED),
        (0.29, "interactive", BOTH, "b", RegionBranch.SPILLED),
        (0.3, "interactive", BOTH, "c", RegionBranch.SPILLED),
        (0.39, "interactive", BOTH, "c", RegionBranch.SPILLED),
        (0.4, "interactive", BOTH, "a", RegionBranch.LOCAL),
        (0.0, "standard", BOTH, "a", RegionBranch.LOCAL),
        (0.0, "batch", BOTH, "a", RegionBranch.LOCAL),
        (0.0, "interactive", ("c",), "a", RegionBranch.LOCAL),  # b has no replica of the model: stay local
    ],
    ids=["b-low", "b-edge", "c-low", "c-edge", "local", "standard-stays", "batch-stays", "unusable-stays"],
)
def test_the_draw_picks_the_region_by_cumulative_weight(u: float, tier: str, usable: tuple[str, ...], region: str,
                                                        branch: RegionBranch) -> None:
    choice = choose_region("a", TARGETS, tier=tier, u=u, usable=usable)
    assert (choice.region, choice.branch) == (region, branch)
    assert choice.rtt_ms == {"a": 0.0, "b": 40.0, "c": 200.0}[region]


def test_no_targets_means_local() -> None:
    assert choose_region("a", (), tier="interactive", u=0.0).branch is RegionBranch.LOCAL
