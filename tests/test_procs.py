"""``Child`` for a program that is not a Ferry component: its own command and readiness, same life cycle."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ferry.procs import Child, ChildFailed, dying_with_parent, stop_all


class Sleeper(Child):
    """``sleep``, ready once a marker file exists (as etcd is once its health check answers)."""

    def __init__(self, workdir: Path, seconds: str = "60") -> None:
        super().__init__("sleeper", [], workdir)
        self.seconds = seconds
        self.marker = workdir / "marker"

    def command(self) -> list[str]:
        return dying_with_parent(["sleep", self.seconds])

    def check_ready(self) -> dict[str, Any] | None:
        return {"pid": self.pid} if self.marker.exists() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(pid: int, timeout: float = 5.0) -> bool:
    """Whether ``sleep`` at ``pid`` ends within ``timeout`` (a zombie not yet reaped counts as ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _cmdline(pid) != ["sleep", "60"]:
            return True
        time.sleep(0.02)
    return False


def test_a_program_child_starts_waits_reports_its_pid_and_stops(tmp_path: Path) -> None:
    child = Sleeper(tmp_path).start()
    try:
        with pytest.raises(ChildFailed, match="sleeper not ready"):
            child.wait_ready(0.1)
        child.marker.touch()
        assert child.wait_ready(5) == {"pid": child.pid} == child.ready
        with pytest.raises(ChildFailed, match="already running"):
            child.start()
        child.kill(signal.SIGSTOP)  # a paused child still stops on SIGTERM
        assert child.stop(5) == -signal.SIGTERM and not child.alive()
    finally:
        stop_all([child])


def test_a_child_that_exits_before_it_is_ready_fails_with_its_log(tmp_path: Path) -> None:
    child = Sleeper(tmp_path, seconds="not-a-number").start()
    with pytest.raises(ChildFailed, match="sleeper exited with 1 before it was ready") as info:
        child.wait_ready(10)
    assert "sleep" in str(info.value)  # its log tail: sleep's complaint


def test_a_program_child_dies_with_its_parent(tmp_path: Path) -> None:
    code = (
        "import sys, time; from pathlib import Path; from tests.test_procs import Sleeper\n"
        "child = Sleeper(Path(sys.argv[1])).start()\n"
        "print(child.pid, flush=True); time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        deadline = time.monotonic() + 5
        while _cmdline(pid) != ["sleep", "60"] and time.monotonic() < deadline:  # the shim exec'd sleep
            time.sleep(0.02)
        assert _cmdline(pid) == ["sleep", "60"]
    finally:
        parent.kill()
        parent.wait()
    assert _wait_gone(pid), "the child outlived its parent"


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except FileNotFoundError:
        return []
