"""``ferryctl what-if`` and ``ferryctl tune`` end to end on files, with no control plane anywhere: the table,
the JSON's shape, the plot, the proposal file, and refusals that name the field (exit 2)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from ferry_cli.ctl.main import EXIT_USAGE, main
from tests.sim.recording import FLEET, conversations


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    monkeypatch.delenv("FERRY_CONTROL_PLANE", raising=False)  # nothing to find: the commands must not look
    traffic = tmp_path / "traffic.jsonl"
    traffic.write_text("".join(json.dumps(r) + "\n" for r in conversations()))
    engines = tmp_path / "engines.json"
    engines.write_text(json.dumps(FLEET))
    bad = tmp_path / "bad.toml"
    bad.write_text("[proxy]\ndetour_factor = 0.0\nplace_factor = 0.0\n")
    return {"traffic": traffic, "engines": engines, "bad": bad, "dir": tmp_path}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_what_if_prints_json_and_draws_the_plot(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    plot = files["dir"] / "whatif.png"
    code, out, err = run(capsys, "what-if", "--traffic", str(files["traffic"]), "--engines", str(files["engines"]),
                         "--config", str(files["bad"]), "--json", "--plot", str(plot), "--resamples", "200")
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    assert {"requests", "models", "proxies", "replicas", "window_s", "windows", "seed", "resamples", "level",
            "baseline", "candidate", "metrics", "per_window", "recorded", "plot"} <= set(data)
    assert data["candidate"]["file"] == str(files["bad"]) and data["baseline"]["file"] is None
    assert [m["metric"] for m in data["metrics"]] == ["ttft_p50_ms", "ttft_p99_ms", "e2e_p99_ms", "hit_ratio",
                                                      "refused_share", "gpu_utilisation"]
    for m in data["metrics"]:
        assert set(m) == {"metric", "baseline", "candidate", "change", "estimate", "low", "high", "verdict"}
    assert set(data["per_window"][0]) == {"start_s", "requests", "baseline", "candidate"}
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_what_if_prints_a_table(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "what-if", "--traffic", str(files["traffic"]), "--replicas", "3", "--config",
                         str(files["bad"]), "--baseline", str(files["bad"]), "--window", "5", "--resamples", "100")
    assert code == 0, err
    assert "3 replicas" in out and "windows of 5 s" in out and "candidate changes: none" in out
    assert out.count("no significant change") == 6


def test_refusals_name_the_field(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    typo = files["dir"] / "typo.toml"
    typo.write_text("[proxy]\nwalk_limitt = 1\n")
    engines = files["dir"] / "bad-engines.json"
    engines.write_text(json.dumps({"engines": [{**FLEET["engines"][0], "params": {"max_runing": 4}}]}))
    empty = files["dir"] / "empty.jsonl"
    empty.write_text("")
    for argv, named in (
            (["--config", str(typo)], "proxy.walk_limitt"),
            (["--config", str(files["bad"]), "--engines", str(engines)], "engines[0].params.max_runing"),
            (["--config", str(files["bad"]), "--traffic", str(empty)], "traffic: no requests"),
            ([], "--config")):
        code, _, err = run(capsys, "what-if", "--traffic", str(files["traffic"]), *argv)
        assert code == EXIT_USAGE and named in err, (argv, err)
    code, _, err = run(capsys, "tune", "--traffic", str(files["traffic"]), "--space", "walk_limit=0")
    assert code == EXIT_USAGE and "proxy.walk_limit" in err


def test_tune_writes_only_the_changed_keys(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    proposal = files["dir"] / "proposal.toml"
    code, out, err = run(capsys, "tune", "--traffic", str(files["traffic"]), "--engines", str(files["engines"]),
                         "--space", "load_factor=1.25,3.0", "--resamples", "300", "-o", str(proposal), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["proposal"] == {"load_factor": 3.0} and data["written"] == str(proposal)
    assert {"objective", "split", "budget", "runs", "fit", "held_out", "trials", "verdict"} <= set(data)
    assert tomllib.loads(proposal.read_text()) == {"proxy": {"load_factor": 3.0}}
    again = files["dir"] / "nothing.toml"
    code, out, err = run(capsys, "tune", "--traffic", str(files["traffic"]), "--engines", str(files["engines"]),
                         "--space", "detour_factor=0.0", "--budget", "2", "-o", str(again))
    assert code == 0, err
    assert "no change is significantly better" in out and f"nothing written to {again}" in out
    assert not again.exists()
