"""ferryctl tells operators the truth about what is dead: a real ``ferry up`` fleet on etcd with two control planes.

``ferry up --store etcd --control-planes 2 --replicas 4``: two nodes, one
proxy, a local etcd. The tests run in order and each leaves something dead
for good: a node (its replicas shown dead, without load), the proxy (shown
disconnected in ``status`` and ``top``, and in the control plane's
``ferry_controlplane_proxy_behind_seconds``), etcd for a while (a drain
refused with exit 3, not "unreachable"), then the first control plane
(``--ready-file`` and a ``--control-plane`` list still reach the second;
``status`` shows the first unreachable).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from ferry.procs import Child
from tests.e2e.harness import wait_for

pytestmark = pytest.mark.etcd
ENV = {k: v for k, v in os.environ.items() if k not in ("FERRY_ADMIN_TOKEN", "FERRY_CONTROL_PLANE")}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("ferryctl-truth")  # unsupervised: what these tests kill must stay dead
    child = Child("up", ["up", "--store", "etcd", "--control-planes", "2", "--replicas", "4", "--no-supervise",
                         "--pickers", "0", "--workdir", str(work / "fleet")], work).start()  # the relay's proxy alone
    try:
        ready = child.wait_ready(90)
        yield {**ready, "ready_file": str(child.ready_path)}
    finally:
        child.stop()


def ctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ferry_cli.ctl.main", *args], capture_output=True, text=True,
                          timeout=60, env=ENV)


def data(up: dict[str, Any], *args: str) -> Any:
    result = ctl("--ready-file", up["ready_file"], *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_dead_node_s_replicas_are_shown_dead_without_load(up: dict[str, Any]) -> None:
    rows = data(up, "replicas")
    victim = rows[0]["node"]
    os.kill(up["pids"][victim], signal.SIGKILL)
    wait_for(lambda: all(r["state"] == "dead" for r in data(up, "replicas") if r["node"] == victim), 15,
             f"{victim}'s replicas shown dead")
    for row in data(up, "replicas"):
        if row["node"] == victim:
            assert (row["queue"], row["running"], row["free_kv"], row["total_kv"]) == (None, None, None, None), row
        else:
            assert row["state"] == "ready" and row["total_kv"] > 0, row
    human = ctl("--ready-file", up["ready_file"], "replicas").stdout
    assert "dead" in human


def _behind(up: dict[str, Any], proxy: str) -> float:
    """The largest ``ferry_controlplane_proxy_behind_seconds`` of ``proxy`` among the control planes."""
    seen = 0.0
    for name in ("controlplane-1", "controlplane-2"):
        with urllib.request.urlopen(f"http://{up['metrics'][name]}/metrics", timeout=5) as page:
            for line in page.read().decode().splitlines():
                if line.startswith(f'ferry_controlplane_proxy_behind_seconds{{proxy="{proxy}"}}'):
                    seen = max(seen, float(line.split()[-1]))
    return seen


def test_a_dead_proxy_is_shown_disconnected_in_status_and_top_and_measured(up: dict[str, Any]) -> None:
    assert _behind(up, "proxy-1") == 0.0
    os.kill(up["pids"]["proxy"], signal.SIGKILL)
    wait_for(lambda: not any(p["connected"] for p in data(up, "status")["proxies"]), 15, "the proxy disconnected")
    frame = json.loads(ctl("--ready-file", up["ready_file"], "top", "--iterations", "1", "--interval", "0.2",
                           "--json").stdout.splitlines()[0])
    assert [(p["proxy_id"], p["connected"]) for p in frame["proxies"]] == [("proxy-1", False)]
    human = ctl("--ready-file", up["ready_file"], "top", "--iterations", "1", "--interval", "0.2").stdout
    assert "DISCONNECTED (proxy-1)" in human, human
    assert "DISCONNECTED (proxy-1)" in ctl("--ready-file", up["ready_file"], "status").stdout
    wait_for(lambda: _behind(up, "proxy-1") > 0.5, 10, "the control plane to count the proxy's silence")


def test_a_drain_refused_while_etcd_is_away_says_so_with_its_own_exit_code(up: dict[str, Any]) -> None:
    alive = next(r["id"] for r in data(up, "replicas") if r["state"] == "ready")
    os.kill(up["pids"]["etcd"], signal.SIGSTOP)
    try:
        result = ctl("--ready-file", up["ready_file"], "drain", alive)
    finally:
        os.kill(up["pids"]["etcd"], signal.SIGCONT)
    assert result.returncode == 3, (result.returncode, result.stderr)
    head, _, detail = result.stderr.partition("; nothing was changed")
    assert head.startswith("ferryctl: the control plane at") and "answered" in head and "store" in head, head
    assert "store" in detail and "refused" in detail, detail


def test_ferryctl_tries_every_control_plane_and_shows_the_dead_one(up: dict[str, Any]) -> None:
    first, second = up["control_planes"]
    os.kill(up["pids"]["controlplane-1"], signal.SIGKILL)
    status = data(up, "status")  # the ready file names both: the second answers
    planes = {p["address"]: p for p in status["control_planes"]}
    assert planes[first]["reachable"] is False and planes[second]["reachable"] is True, planes
    human = ctl("--ready-file", up["ready_file"], "status").stdout
    assert first in human
    listed = ctl("--admin-token", up["admin_token"], "--control-plane", f"{first},{second}", "replicas", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout), listed.stderr
    dead = ctl("--admin-token", up["admin_token"], "--control-plane", first, "replicas")
    assert dead.returncode == 2 and "unreachable" in dead.stderr
