"""The control-plane benchmarks run end to end at a small scale (real etcd, real control planes), so the
5,000-replica runs fail only when Ferry does, not because a benchmark rotted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


def run(module: str, out: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", module, "--replicas", "80", "--proxies", "4", "--out", str(out),
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def test_store_bench_small(tmp_path: Path) -> None:
    result = run("tools.bench.store", tmp_path / "store.json", "--rounds", "2", "--steady-seconds", "1")
    assert result["passed"] is True
    propagate = result["propagate"]
    assert propagate["all"]["samples"] == 4 * 4 and propagate["all"]["p99_ms"] > 0  # 4 proxies, 2 x 2 changes
    wire = propagate["wire"]
    assert wire["deltas"] > 0 and wire["fulls"] == 0 and propagate["resyncs"] == 0
    assert 0 < wire["delta_bytes_p50"] < wire["table_bytes"]
    assert result["steady"]["table_versions_per_s"] > 0
    runs = (tmp_path / "store-runs.jsonl").read_text().splitlines()
    assert len(runs) == 1 and json.loads(runs[0])["passed"] is True


def test_controlplane_bench_small(tmp_path: Path) -> None:
    result = run("tools.bench.controlplane", tmp_path / "cp.json", "--drains", "4", "--concurrency", "2",
                 "--steady-seconds", "1")
    assert result["steady"]["telemetry_messages_per_s"] > 0 and result["steady"]["rss_mib"] > 0
    burst = result["burst"]
    assert burst["refused"] == 0 and burst["calls"]["samples"] == 8
