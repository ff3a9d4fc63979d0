"""The traffic recorder end to end: ``ferry up`` (real processes), requests, ``ferryctl traffic export``.

Every request is recorded (``record_rate`` 1.0, the default); the rows ride on
the proxy's usage reports to the control plane, which keeps them in segment
files under the run's workdir; the export is a Mooncake-layout trace that
``tools.trace.load`` reads, with the same block hash for requests that share
a prefix, times for every row, and no text of any prompt or answer.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc

from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from ferry_cli.ctl.traffic import KEYS
from tests.e2e.harness import wait_for
from tests.e2e.test_usage_views import ENV, start_up
from tools.trace import load

SHARED = " ".join(f"shared{i}" for i in range(600))  # more than one 512-word block, the same for the first four
LONG = " ".join(f"long{i}" for i in range(17 * 512 + 10))  # 18 blocks: past the decision's 16, all recorded
PROMPTS = [f"{SHARED} tail{i} question{i}" for i in range(4)] + [f"alone{i} " * 50 for i in range(4)] + [LONG]


def export(up: dict[str, Any], out: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "ferry_cli.ctl.main", "--ready-file", up["ready_file"], "traffic",
                             "export", "--since", "10m", "-o", str(out)],
                            capture_output=True, text=True, timeout=60, env=ENV)
    assert result.returncode == 0, result.stderr
    return result


def test_recorded_requests_export_as_a_trace(tmp_path: Path) -> None:
    child, up = start_up(tmp_path, "--replicas", "2", "--pickers", "0")
    try:
        metadata = (("x-api-key", up["api_keys"]["paid-1"]),)
        with grpc.insecure_channel(up["data_plane"]) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            for i, prompt in enumerate(PROMPTS):
                request = inference_pb2.InferRequest(model="chat-small", prompt=prompt, max_tokens=3,
                                                     tier=common_pb2.TIER_STANDARD)
                if i % 2:
                    list(stub.InferStream(request, metadata=metadata, timeout=20))
                else:
                    stub.Infer(request, metadata=metadata, timeout=20)
        out = tmp_path / "traffic.jsonl"

        def exported() -> list[dict[str, Any]] | None:
            export(up, out)
            rows = [json.loads(line) for line in out.read_text().splitlines()]
            return rows if len(rows) >= len(PROMPTS) else None

        rows = wait_for(exported, 20, "every request's row in the export", interval=0.5)
        stdout = export(up, out).stdout
    finally:
        child.stop()
    assert len(rows) == len(PROMPTS)
    assert all(list(row) == list(KEYS) for row in rows)
    assert all(r["model"] == "chat-small" and r["tier"] == "standard" and r["outcome"] == "OK" for r in rows)
    assert all(r["proxy"] == "proxy-1" and r["region"] == "local" and r["replica"] and r["branch"] for r in rows)
    assert all(r["ttft_ms"] > 0 and r["e2e_ms"] >= r["ttft_ms"] and r["output_length"] > 0 for r in rows)
    assert len({r["tenant"] for r in rows}) == 1 and len(rows[0]["tenant"]) == 16
    assert sorted(r["streamed"] for r in rows) == [False] * 5 + [True] * 4
    assert [r["timestamp"] for r in rows] == sorted(r["timestamp"] for r in rows) and rows[0]["timestamp"] == 0
    long = [r for r in rows if r["input_length"] > 8192]
    assert len(long) == 1 and len(long[0]["hash_ids"]) == 18  # every block, not the decision's first 16
    shared = [r for r in rows if 600 < r["input_length"] <= 8192]
    alone = [r for r in rows if r["input_length"] <= 600]
    assert len(shared) == 4 and len(alone) == 4
    assert len({r["hash_ids"][0] for r in shared}) == 1  # the shared first block hashes alike
    assert len({tuple(r["hash_ids"]) for r in shared}) == 4 and all(len(r["hash_ids"]) == 2 for r in shared)
    assert len({r["hash_ids"][0] for r in alone}) == 4
    text = out.read_text()
    assert "shared0" not in text and "alone" not in text and "long1" not in text
    assert "question" not in text and "acme" not in text
    trace = load(out)
    assert len(trace) == len(PROMPTS) and {t.input_tokens for t in trace} == {r["input_length"] for r in rows}
    assert f"exported {len(PROMPTS)} rows from 1 proxies" in stdout and "0 rows dropped" in stdout
    assert list((tmp_path / "fleet" / "traffic" / "controlplane").glob("traffic-*.jsonl"))


def test_what_if_and_tune_on_the_control_planes_recording(tmp_path: Path) -> None:
    """``--since``: the rows, the fitted engines and the baseline come from the control plane, not from files."""
    child, up = start_up(tmp_path, "--replicas", "2", "--pickers", "0")
    candidate = tmp_path / "candidate.toml"
    candidate.write_text("[proxy]\nwalk_limit = 1\ndetour_factor = 0.0\n")
    try:
        metadata = (("x-api-key", up["api_keys"]["paid-1"]),)
        with grpc.insecure_channel(up["data_plane"]) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            for i in range(24):
                request = inference_pb2.InferRequest(model="chat-small", prompt=PROMPTS[i % 4], max_tokens=4,
                                                     tier=common_pb2.TIER_STANDARD)
                stub.Infer(request, metadata=metadata, timeout=20)
        out = tmp_path / "traffic.jsonl"

        def recorded() -> bool:
            export(up, out)
            return sum(1 for _ in out.open()) >= 24

        wait_for(recorded, 20, "every request recorded", interval=0.5)

        def ctl(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "ferry_cli.ctl.main", "--ready-file", up["ready_file"],
                                   *args], capture_output=True, text=True, timeout=120, env=ENV)

        what = ctl("what-if", "--since", "10m", "--config", str(candidate), "--resamples", "50", "--json")
        tuned = ctl("tune", "--since", "10m", "--budget", "3", "--resamples", "50", "--json")
        both = ctl("what-if", "--since", "10m", "--traffic", str(out), "--config", str(candidate))
        nothing = ctl("what-if", "--since", "1s", "--config", str(candidate))
    finally:
        child.stop()
    assert what.returncode == 0, what.stderr
    result = json.loads(what.stdout)
    assert result["requests"] == 24 and result["proxies"] == 1
    assert {m["metric"] for m in result["metrics"]} >= {"ttft_p50_ms", "ttft_p99_ms", "hit_ratio"}
    assert "24 rows recorded in the last 600 s" in what.stderr and "baseline: today's defaults" in what.stderr
    assert tuned.returncode == 0, tuned.stderr
    assert json.loads(tuned.stdout)["fit"]["requests"] > 0
    assert both.returncode == 2 and "--since asks the control plane" in both.stderr
    assert nothing.returncode == 2 and "no traffic recorded in the last 1 s" in nothing.stderr
