"""Child processes of ``ferry up``, the benchmarks and the end-to-end tests.

A :class:`Child` runs one component (``python -m ferry COMPONENT …``) with a
ready file; :meth:`Child.wait_ready` polls the file (every 20 ms, bounded by a
deadline) and fails early, with the child's last log lines, if the child exits
first. Children get SIGKILL when their parent dies (Linux ``PR_SET_PDEATHSIG``, set
by the child itself from ``FERRY_PARENT_PID``: a ``preexec_fn`` would force a
plain fork, and gRPC's fork handlers then crash the child before its exec), so
an interrupted test or a killed ``ferry up`` leaves nothing behind. Stopping
sends SIGTERM, waits, then SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ferry.process import log_tail, read_ready_file


class ChildFailed(RuntimeError):
    """A child exited, or was not ready in time."""


class Child:
    """One component process with a ready file and a log file in ``workdir``."""

    def __init__(self, name: str, args: list[str], workdir: Path, *, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.ready_path = workdir / f"{name}.ready.json"
        self.log_path = workdir / f"{name}.log"
        self.args = args
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready: dict[str, Any] = {}

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} not started"
        return self.proc.pid

    def start(self) -> Child:
        """Start the process (its stdout and stderr go to its log file)."""
        self.ready_path.unlink(missing_ok=True)
        env = {**os.environ, "GRPC_VERBOSITY": os.environ.get("GRPC_VERBOSITY", "ERROR"),
               "FERRY_PARENT_PID": str(os.getpid()), **(self.env or {})}
        cmd = [sys.executable, "-m", "ferry", *self.args, "--ready-file", str(self.ready_path)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env,
            )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float = 30.0) -> dict[str, Any]:
        """Block until the child wrote its ready file; raise ChildFailed with its log tail otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            payload = read_ready_file(self.ready_path)
            if payload is not None:
                self.ready = payload
                return payload
            if not self.alive():
                raise ChildFailed(
                    f"{self.name} exited with {self.returncode()} before it was ready:\n{self.log_tail()}")
            time.sleep(0.02)
        raise ChildFailed(f"{self.name} not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = 20) -> str:
        return log_tail(self.log_path, lines)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (SIGKILL by default) and reap the process if it ends."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)
            if sig == signal.SIGKILL:
                self.proc.wait()

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL. Returns the exit code."""
        if self.proc is None:
            return None
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def stop_all(children: list[Child], timeout: float = 5.0) -> None:
    """Stop children in reverse start order, SIGTERM to all first so they stop in parallel."""
    for child in reversed(children):
        if child.alive():
            assert child.proc is not None
            child.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for child in reversed(children):
        if child.proc is None:
            continue
        try:
            child.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()
