"""Router config canary on real processes: a bad config at 50 % rolled back by the guard, a good one promoted,
no request failed (the drill of :mod:`tools.bench.router_canary`, bounded: 25 s per phase at most)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.bench.router_canary import run


@pytest.mark.timeout(180)
def test_a_bad_config_is_rolled_back_and_a_good_one_promoted(tmp_path: Path) -> None:
    figures = run(tmp_path, seconds=25.0, workers=3, max_requests=20_000, ratio=3.0, min_requests=20)
    assert figures["bad"]["state"] == "rolled_back", figures
    assert "harm" in figures["bad"]["reason"], figures
    assert figures["bad"]["seconds_to_every_proxy_on_default"] is not None, figures  # the canary proxy reverted
    assert figures["good"]["state"] == "promoted", figures
    assert figures["failed"] == 0, figures
    assert set(figures["good"]["proxies"].values()) == {figures["good"]["candidate_version"]}, figures
