"""A short run of the real-time batch bench: its processes, its open loop, its kill, its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.bench import batch as bench_batch

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


def test_bench_batch_smoke(tmp_path: Path) -> None:
    out = tmp_path / "batch.json"
    assert bench_batch.main(["--rates", "100", "--seconds", "2", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    (run,) = data["runs"]
    assert run["target_rate"] == 100 and run["sent"] == run["arrivals"] > 0
    assert run["errors"] == {} and run["wrong_answers"] == 0 and run["runtime_answered"] == run["ok"]
    assert run["batch"]["batches"] > 0 and run["batch"]["mean_size"] >= 1
    assert set(run["cpu_cores"]) == {"controlplane", "proxy", "node", "load_generator"}
    kill = data["kill"]
    assert kill["kill"]["batch_id"] is not None and kill["requeued"] == kill["kill"]["requeued"] > 0
    assert (kill["lost"], kill["duplicated"], kill["aborted_batches"]) == (0, 0, 1)
