"""Supervision (ferry.supervise, as ferry up uses it): a dead child is reaped, logged, restarted, given up on."""

from __future__ import annotations

import json
import logging
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from ferry.procs import Child, dying_with_parent, stop_all
from ferry.supervise import CrashLoop, Supervisor, exit_fields, pinned


class Program(Child):
    """A program that is not a Ferry component (``sleep 60`` or ``false``), ready as soon as it runs."""

    def __init__(self, name: str, workdir: Path, argv: list[str]) -> None:
        super().__init__(name, ["--listen", "127.0.0.1:0"], workdir)
        self.argv = argv

    def command(self) -> list[str]:
        return dying_with_parent(self.argv)

    def check_ready(self) -> dict[str, Any] | None:
        return {"pid": self.pid}


def _until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def _events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, Any]]:
    out = []
    for record in caplog.records:
        message = record.getMessage()
        if message.startswith("{") and json.loads(message).get("event") == name:
            out.append(json.loads(message))
    return out


def test_crash_loop_counts_deaths_in_a_sliding_window() -> None:
    loop = CrashLoop(limit=3, window=10.0)
    assert not loop.died(0.0) and not loop.died(5.0)
    assert not loop.died(11.0)  # the death at 0 is out of the window
    assert loop.died(12.0)  # 5, 11, 12
    with pytest.raises(ValueError):
        CrashLoop(limit=0)


def test_pinned_replaces_the_listen_address_and_exit_fields_name_the_signal() -> None:
    assert pinned(["proxy", "--listen", "127.0.0.1:0", "--id", "p"], "127.0.0.1:5000") == [
        "proxy", "--listen", "127.0.0.1:5000", "--id", "p"]
    assert pinned(["node"], "127.0.0.1:5000") == ["node"]
    assert exit_fields(-9) == {"exit_status": -9, "signal": "SIGKILL"}
    assert exit_fields(3) == {"exit_status": 3}


def test_a_killed_child_is_reaped_logged_and_restarted_on_its_address(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ferry.supervise")
    child = Program("worker", tmp_path, ["sleep", "60"]).start()
    child.ready = {"grpc": "127.0.0.1:4567"}
    changes: list[int] = []
    supervisor = Supervisor([child], on_change=lambda: changes.append(child.pid), initial=0.01, cap=0.02)
    try:
        first = child.pid
        supervisor.poll()
        assert supervisor.restarts == {"worker": 0} and not changes
        child.kill(signal.SIGKILL)
        _until(lambda: (supervisor.poll(), child.alive() and child.pid != first)[1], 5, "a restart")
        assert supervisor.restarts == {"worker": 1}
        assert child.args == ["--listen", "127.0.0.1:4567"]  # restarted on the address it had
        assert changes and changes[-1] == child.pid
        exited = _events(caplog, "child_exited")
        assert exited[0]["component"] == "worker" and exited[0]["pid"] == first
        assert exited[0]["exit_status"] == -9 and exited[0]["signal"] == "SIGKILL"
        assert _events(caplog, "child_restarted")[0]["pid"] == child.pid
        assert supervisor.registry.get_sample_value("ferry_up_restarts_total", {"component": "worker"}) == 1.0
    finally:
        stop_all([child])


def test_a_child_that_keeps_dying_is_given_up_on(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.INFO, logger="ferry.supervise")
    child = Program("crasher", tmp_path, ["false"]).start()
    supervisor = Supervisor([child], initial=0.01, cap=0.02, give_up_after=3, window_seconds=60)
    try:
        _until(lambda: (supervisor.poll(), supervisor.given_up)[1], 10, "giving up")
        assert supervisor.given_up == ["crasher"] and supervisor.restarts == {"crasher": 2}
        assert _events(caplog, "child_given_up")[0]["deaths"] == 3
        assert "giving up on crasher: it died 3 times within 60 s" in capsys.readouterr().err
        pid = child.pid
        for _ in range(5):
            supervisor.poll()
        assert child.pid == pid and not child.alive()
    finally:
        stop_all([child])
