"""Processes of the peer benchmark: start in a session of their own, wait, stop by group, read their CPU time.

- :class:`Proc` starts a command in a new session (``start_new_session``),
  its output to a log file, so it and whatever it starts form one process
  group that :meth:`Proc.stop` ends: SIGTERM to the leader, up to ``grace``
  seconds for it to stop its own children, then SIGTERM and, past a second
  grace, SIGKILL to what is left of the group. Only processes started here
  are ever signalled.
- :func:`wait_json` polls a ready file (every 50 ms, bounded), failing early
  with the log's tail if the process exits; :func:`wait_http` polls a URL
  until it answers 200.
- :func:`cpu_seconds` reads user + system time from ``/proc/<pid>/stat``
  (fields 14 and 15, in clock ticks). A process's own line counts every one of
  its threads, those running and those that ended, so the threads'
  ``/proc/<pid>/task/*/stat`` lines are not added (they would miss the
  threads that ended). :func:`tree` lists a process and its descendants
  (one scan of ``/proc``); :class:`CpuMeter` snapshots the CPU time of named
  groups of processes (with their descendants) before and after a run and
  gives the difference per group.

Cost: a snapshot is one read of ``/proc/*/stat`` (O(processes on the machine)).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

POLL_S = 0.05
TICKS = os.sysconf("SC_CLK_TCK")


class ProcFailed(RuntimeError):
    """A process exited early or was not ready in time."""


class Proc:
    """One command in a session of its own, its output in ``log``."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, *, cwd: Path | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.name, self.argv, self.log, self.cwd = name, list(argv), log, cwd
        self.env = {**os.environ, **(env or {})}
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          cwd=self.cwd, env=self.env, start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        if self.popen is None:
            raise ProcFailed(f"{self.name} was not started")
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, limit: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-limit:]
        except OSError:
            return "(no log)"

    def check(self) -> None:
        """Raise :class:`ProcFailed` with the log's tail if the process exited."""
        if self.popen is not None and self.popen.poll() is not None:
            raise ProcFailed(f"{self.name} exited with {self.popen.returncode}; log {self.log}:\n{self.tail()}")

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM the leader, then the group, then SIGKILL the group; the leader's exit code."""
        if self.popen is None:
            return None
        pgid = self.popen.pid  # the leader of its own session and group
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(grace)
        for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
            if not _group_alive(pgid):
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
            deadline = time.monotonic() + wait
            while _group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(POLL_S)
        if self.popen.poll() is None:
            self.popen.kill()
        return self.popen.wait(5)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_json(path: Path, proc: Proc, timeout: float) -> dict[str, Any]:
    """The JSON object of a ready file once it is complete; :class:`ProcFailed` if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text())
            if isinstance(data, dict):
                return data
        proc.check()
        time.sleep(POLL_S)
    raise ProcFailed(f"{proc.name} wrote no ready file {path} in {timeout:.0f} s; log {proc.log}:\n{proc.tail()}")


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """Status and body of a GET (status 0 and the error when nothing answered)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode("utf-8", "replace")
    except (OSError, ValueError) as exc:
        return 0, str(exc)


def wait_http(url: str, proc: Proc, timeout: float) -> str:
    """Poll ``url`` until it answers 200; its body. :class:`ProcFailed` if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        status, body = http_get(url, timeout=2.0)
        if status == 200:
            return body
        last = f"{status}: {body[:200]}"
        proc.check()
        time.sleep(0.2)
    raise ProcFailed(f"{proc.name}: {url} did not answer 200 in {timeout:.0f} s (last {last}); log {proc.log}:\n"
                     f"{proc.tail()}")


# -- CPU time ---------------------------------------------------------------------------------------------------------

def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _stat(pid: int) -> tuple[int, float, int] | None:
    """(parent pid, user + system seconds, process group) of ``pid``, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # the command name may hold spaces and parentheses
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS, int(fields[2])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process, all its threads included; NaN if it is gone."""
    stat = _stat(pid)
    return stat[1] if stat is not None else float("nan")


def tree(roots: Sequence[int]) -> dict[int, float]:
    """CPU seconds of every process in the trees rooted at ``roots`` (roots included), by pid."""
    stats = {pid: s for pid in _pids() if (s := _stat(pid)) is not None}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, float] = {}
    todo = [r for r in roots if r in stats]
    while todo:
        pid = todo.pop()
        if pid not in out:
            out[pid] = stats[pid][1]
            todo += children.get(pid, [])
    return out


class CpuMeter:
    """CPU seconds used by named groups of processes (each root with its descendants) between two snapshots."""

    def __init__(self, groups: Mapping[str, Sequence[int]]) -> None:
        self.groups = {name: list(pids) for name, pids in groups.items()}
        self.before: dict[str, dict[int, float]] = {}

    def start(self) -> None:
        self.before = {name: tree(pids) for name, pids in self.groups.items()}

    def stop(self) -> dict[str, float]:
        """Seconds per group since :meth:`start` (a process started since counts from 0)."""
        out = {}
        for name, pids in self.groups.items():
            now, then = tree(pids), self.before.get(name, {})
            out[name] = round(sum(cpu - then.get(pid, 0.0) for pid, cpu in now.items()), 3)
        return out
