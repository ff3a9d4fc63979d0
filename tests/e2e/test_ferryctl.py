"""Every ferryctl command against a fleet started by ``ferry up``, in both output modes.

``ferry up --replicas 4`` runs two nodes of eight GPUs, each with a
chat-large and a chat-small replica of four GPUs: no node is free, so an
eight-GPU allocation must drain one node's replicas. ferryctl finds the
control plane and the admin token in the ready file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from ferry.procs import Child
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tests.e2e.harness import wait_for

ENV = {k: v for k, v in os.environ.items() if k not in ("FERRY_ADMIN_TOKEN", "FERRY_CONTROL_PLANE")}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("ferryctl")
    child = Child("up", ["up", "--replicas", "4", "--workdir", str(work / "fleet")], work).start()
    try:
        ready = child.wait_ready(90)
        yield {**ready, "ready_file": str(child.ready_path)}
    finally:
        child.stop()


def ctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ferry_cli.ctl.main", *args], capture_output=True, text=True,
                          timeout=60, env=env or ENV)


def ok(up: dict[str, Any], *args: str) -> str:
    result = ctl("--ready-file", up["ready_file"], *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def data(up: dict[str, Any], *args: str) -> Any:
    return json.loads(ok(up, *args, "--json"))


def test_completion_scripts_complete_commands_and_options() -> None:
    script = ctl("completion", "bash")
    assert script.returncode == 0 and "complete -F _ferryctl ferryctl" in script.stdout
    if shutil.which("bash"):
        def complete(*words: str) -> set[str]:
            probe = (f"source /dev/stdin <<'EOF'\n{script.stdout}\nEOF\n"
                     f"COMP_WORDS=({' '.join(words)}); COMP_CWORD={len(words) - 1}; _ferryctl; "
                     "printf '%s\\n' \"${COMPREPLY[@]}\"")
            out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=10)
            return set(out.stdout.split())
        assert complete("ferryctl", "co") == {"completion", "cordon"}
        assert {"--gpus", "--replicas", "--list", "--release"} <= complete("ferryctl", "alloc", "--")
        after = complete("ferryctl", "--control-plane", "x:1", "completion", "''")  # the value is skipped
        assert {w for w in after if not w.startswith("-")} == {"bash", "zsh"}
    zsh = ctl("completion", "zsh")
    assert zsh.returncode == 0 and zsh.stdout.startswith("#compdef ferryctl") and "top" in zsh.stdout
    if shutil.which("zsh"):
        assert subprocess.run(["zsh", "-n"], input=zsh.stdout, text=True, timeout=10).returncode == 0


def test_without_the_admin_token_every_command_is_refused_and_says_how(up: dict[str, Any]) -> None:
    for args in (("nodes",), ("status", "--json"), ("alloc", "chat-large", "--gpus", "8")):
        result = ctl("--control-plane", up["control_plane"], *args)
        assert result.returncode == 1 and result.stdout == ""
        assert "UNAUTHENTICATED" in result.stderr and "--admin-token" in result.stderr
        assert "FERRY_ADMIN_TOKEN" in result.stderr
    wrong = ctl("--control-plane", up["control_plane"], "--admin-token", "fat_wrong", "models")
    assert wrong.returncode == 1 and "not accepted" in wrong.stderr
    from_env = ctl("--control-plane", up["control_plane"], "models",
                   env={**ENV, "FERRY_ADMIN_TOKEN": up["admin_token"]})
    assert from_env.returncode == 0 and "chat-large" in from_env.stdout


def test_read_commands_in_both_modes(up: dict[str, Any]) -> None:
    status = data(up, "status")
    assert status["members"] == 2 and status["regions"][0]["replicas"] == 4
    assert "leader: controlplane" in ok(up, "status")
    replicas = {r["id"]: r for r in data(up, "replicas")}
    assert set(replicas) == {"node-1-r0", "node-1-r1", "node-2-r0", "node-2-r1"}
    assert all(r["in_table"] and not r["cordoned"] for r in replicas.values())
    assert "CORDONED" in ok(up, "replicas", "--model", "chat-small")
    nodes = {n["node"]: n for n in data(up, "nodes")}
    assert {k: nodes["node-1"][k] for k in ("gpus", "gpus_allocated", "gpus_free", "replicas", "agent_connected",
                                            "control_plane", "cordoned")} == {
        "gpus": 8, "gpus_allocated": 8, "gpus_free": 0, "replicas": 2, "agent_connected": True,
        "control_plane": "controlplane", "cordoned": False}
    human = ok(up, "nodes")
    assert "GPUS_ALLOCATED" in human and "node-2" in human and "CONTROL_PLANE" in human
    models = {m["model"]: m for m in data(up, "models")}
    assert (models["chat-large"]["gpus_each"], models["chat-large"]["ready"], models["chat-large"]["total"]) == (
        8, 2, 2)
    assert models["chat-small"]["versions"] == ["v1"] and "DEFAULT_VERSION" in ok(up, "models")
    table = data(up, "table")
    # every table consumer: the relay's proxy, the two pickers and Envoy (its endpoint list)
    assert table["regions"][0]["replicas"] == 4
    assert sorted(p["proxy_id"] for p in table["proxies"]) == ["envoy", "picker-1", "picker-2", "proxy-1"]
    assert "proxy-1" in ok(up, "table")
    assert data(up, "alloc", "--list") == {"slots": [], "pending": []}


def test_top_shows_rate_queue_utilisation_p99_and_shed(up: dict[str, Any]) -> None:
    stop = threading.Event()

    def load() -> None:
        request = inference_pb2.InferRequest(model="chat-small", prompt="a b c", max_tokens=2,
                                             tier=common_pb2.TIER_STANDARD)
        with grpc.insecure_channel(up["data_plane"]) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            while not stop.is_set():
                stub.Infer(request, metadata=(("x-api-key", up["api_keys"]["paid-1"]),), timeout=10)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    try:
        frames = [json.loads(line) for line in ok(up, "top", "--iterations", "2", "--json").splitlines()]
        human = ok(up, "top", "--iterations", "2")
    finally:
        stop.set()
        thread.join(15)
    assert len(frames) == 2
    rows = [{r["model"]: r for r in f["rows"]} for f in frames]
    assert all(set(r) == {"chat-large", "chat-small"} for r in rows)
    assert max(r["chat-small"]["replica_rate_per_s"] for r in rows) > 0  # from requests_total between frames
    assert max(r["chat-small"]["rate_per_s"] for r in rows) > 0  # from the proxies' usage reports
    assert all(r["chat-small"]["shed"] == 0 for r in rows)
    assert {"queue", "running", "kv_util", "gpu_util", "ready", "p99_ms"} <= set(rows[0]["chat-small"])
    assert human.count("ferryctl top") == 2 and "RATE_PER_S" in human and "n/a" not in human


def test_drain_and_undrain(up: dict[str, Any]) -> None:
    assert "drain: node-2-r1 is" in ok(up, "drain", "node-2-r1")
    assert not {r["id"]: r for r in data(up, "replicas")}["node-2-r1"]["in_table"]
    row = data(up, "undrain", "node-2-r1")
    assert row["id"] == "node-2-r1" and not row["drain_requested"]
    wait_for(lambda: all(r["in_table"] for r in data(up, "replicas")), 10, "the agent to report it ready again")
    missing = ctl("--ready-file", up["ready_file"], "drain", "no-such-replica")
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr


def test_cordon_takes_a_node_out_of_the_table_and_uncordon_puts_it_back(up: dict[str, Any]) -> None:
    before = str(data(up, "table")["regions"][0]["version"])
    assert "node node-1 is cordoned" in ok(up, "cordon", "node-1")
    replicas = {r["id"]: r for r in data(up, "replicas")}
    assert [i for i, r in sorted(replicas.items()) if r["in_table"]] == ["node-2-r0", "node-2-r1"]
    assert replicas["node-1-r0"]["cordoned"] and replicas["node-1-r0"]["state"] == "ready"  # still running
    assert {n["node"]: n["cordoned"] for n in data(up, "nodes")} == {"node-1": True, "node-2": False}
    diff = data(up, "table", "--diff", before, "0")  # to the current version (loads may have moved too)
    assert sorted((c["change"], c["replica_id"]) for c in diff["changes"] if c["change"] != "load") == [
        ("removed", "node-1-r0"), ("removed", "node-1-r1")]
    assert "removed  chat-large  node-1-r0" in ok(up, "table", "--diff", before, "0")
    node = data(up, "uncordon", "node-1")
    assert node["node"] == "node-1" and not node["cordoned"]
    assert all(r["in_table"] for r in data(up, "replicas"))
    unknown = ctl("--ready-file", up["ready_file"], "cordon", "node-9")
    assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stderr and "node-9" in unknown.stderr


def test_alloc_places_an_eight_gpu_replica_by_draining_a_node(up: dict[str, Any]) -> None:
    human = ok(up, "alloc", "chat-large", "--gpus", "8", "--replicas", "1")
    assert "0,1,2,3,4,5,6,7" in human and "DISPLACES" in human
    [slot] = data(up, "alloc", "--list")["slots"]
    node = slot["node"]
    assert slot["gpus"] == list(range(8)) and slot["model"] == "chat-large"
    assert slot["displaces"] == [f"{node}-r0", f"{node}-r1"] and slot["drain_cost"] == 20.0
    assert slot["state"] in ("draining", "placed")
    nodes = {n["node"]: n for n in data(up, "nodes")}
    assert (nodes[node]["slots"], nodes[node]["gpus_allocated"]) == (1, 8)
    wait_for(lambda: all(r["state"] == "drained" for r in data(up, "replicas") if r["node"] == node), 10,
             "the agent to drain the displaced replicas")
    assert data(up, "alloc", "--list")["slots"][0]["state"] == "placed"
    assert {m["model"]: m["slots"] for m in data(up, "models")}["chat-large"] == 1
    more = data(up, "alloc", "chat-large", "--gpus", "8", "--replicas", "2")  # one more node, then none
    [other] = more["slots"]
    [waiting] = more["pending"]
    assert other["node"] != node and "can free 8 GPUs" in waiting["reason"]
    assert "REASON" in ok(up, "alloc", "--list")
    for replica_id in (waiting["request_id"], other["replica_id"]):  # the waiting one first: it would take the node
        assert data(up, "alloc", "--release", replica_id)["released"]
    released = data(up, "alloc", "--release", slot["replica_id"])
    assert released == {"released": True, "undrained": [f"{node}-r0", f"{node}-r1"]}
    wait_for(lambda: all(r["in_table"] for r in data(up, "replicas")), 10, "every replica back in the table")
    usage = ctl("--ready-file", up["ready_file"], "alloc", "--list", "--release", "x")
    assert usage.returncode == 2 and "alloc: give MODEL" in usage.stderr


# Every command of the parser, each in both output modes, against the same fleet. Write commands come in
# pairs that undo each other, so the fleet ends as it started; alloc's writes have their own test above.
BOTH_MODES: list[tuple[str, ...]] = [
    ("status",), ("replicas",), ("nodes",), ("models",), ("table",), ("alloc", "--list"),
    ("top", "--iterations", "1"), ("tiers",), ("spill",), ("cache",), ("scale",), ("rollout",), ("tenants",),
    ("engines",), ("router",), ("traffic", "export", "--since", "1h", "-o", os.devnull),
    ("drain", "node-2-r1"), ("undrain", "node-2-r1"), ("cordon", "node-2"), ("uncordon", "node-2"),
    ("rollout", "chat-small", "--version", "v2", "--canary", "5"), ("rollout", "chat-small"),
    ("rollout", "chat-small", "--rollback"),
    ("tenants", "add", "ops-probe", "--generate-key", "--tiers", "batch"),
    ("tenants", "set", "ops-probe", "--rps", "5"),
    ("tenants", "remove", "ops-probe"),
]


def test_every_command_runs_in_both_output_modes(up: dict[str, Any]) -> None:
    from ferry_cli.ctl.main import COMMANDS

    drawn = {"board"}  # both modes in tests/e2e/test_board.py (it writes files and needs graphviz)
    drawn |= {c.name for c in COMMANDS if c.local}  # what-if, tune: tests/ctl (on files), test_traffic_export (--since)
    remote = {c.name for c in COMMANDS if c.remote}
    assert {args[0] for args in BOTH_MODES} == remote - drawn, "a command the parser has is missing here"
    for json_first in (False, True):  # each write pair runs once human-first, once JSON-first
        for i, args in enumerate(BOTH_MODES):
            as_json = json_first == (i % 2 == 0)
            if as_json:
                parsed = data(up, *args)
                assert parsed is not None and parsed != "", args
            else:
                assert ok(up, *args).strip(), args
    assert all(r["in_table"] for r in data(up, "replicas")) and not any(n["cordoned"] for n in data(up, "nodes"))
    assert "ops-probe" not in ok(up, "tenants")
