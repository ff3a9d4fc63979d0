"""Child processes of ``ferry up``, the proxy's workers (``ferry proxy --workers N``), the benchmarks and the tests.

A :class:`Child` runs one component (``python -m ferry COMPONENT …``) with a
ready file; :meth:`Child.wait_ready` polls :meth:`Child.check_ready` (the
ready file; every 20 ms, bounded by a deadline) and fails early, with the
child's last log lines, if the child exits first. Another program is a
subclass that overrides :meth:`Child.command` and :meth:`Child.check_ready`
(:class:`harness.etcd.LocalEtcd`: etcd, ready once ``GET /health`` says so);
it starts, waits, reports its pid and stops the same way.

Children get SIGKILL when their parent dies (Linux ``PR_SET_PDEATHSIG``): a
Ferry component sets it itself from ``FERRY_PARENT_PID``, another program
runs through :func:`dying_with_parent`, a tiny Python shim that sets it and
then ``exec``s the program (a ``preexec_fn`` would force a plain fork, and
gRPC's fork handlers then crash the child before its exec), so an interrupted
test or a killed ``ferry up`` leaves nothing behind. Stopping sends SIGCONT
(in case the child is paused) and SIGTERM to its pid, waits, then SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Self

from ferry.process import log_tail, read_ready_file

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

_SHIM = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, 9)\n"  # PR_SET_PDEATHSIG, SIGKILL
    "if os.getppid() != int(sys.argv[1]): os._exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def dying_with_parent(argv: list[str]) -> list[str]:
    """``argv`` run so that it gets SIGKILL when this process dies (a program that is not a Ferry component)."""
    return [sys.executable, "-c", _SHIM, str(os.getpid()), *argv]


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after ``pid (comm)`` (``[0]`` is the state letter, ``[11]``/``[12]``
    utime/stime in clock ticks); None once the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()  # the command name may hold spaces and parentheses


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` so far, every thread included; None once it is gone."""
    fields = stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class ChildFailed(RuntimeError):
    """A child exited, or was not ready in time."""


class Child:
    """One component process with a ready file and a log file (default ``workdir/NAME.log``) in ``workdir``.

    With ``inherit_output`` its output goes to this process's standard output and error instead of a
    log file (the workers of ``ferry proxy --workers N``, whose lines an operator reads where the proxy's are).
    """

    def __init__(self, name: str, args: list[str], workdir: Path, *, env: dict[str, str] | None = None,
                 log_path: Path | None = None, module: str = "ferry", inherit_output: bool = False) -> None:
        self.inherit_output = inherit_output
        self.name = name
        self.module = module  # run as ``python -m MODULE`` (a tool such as tools.guardrail, or ferry itself)
        self.ready_path = workdir / f"{name}.ready.json"
        self.log_path = log_path if log_path is not None else workdir / f"{name}.log"
        self.args = args
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready: dict[str, Any] = {}

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} not started"
        return self.proc.pid

    def command(self) -> list[str]:
        """The argv of the process: ``python -m MODULE ARGS --ready-file PATH`` (MODULE: ferry by default)."""
        return [sys.executable, "-m", self.module, *self.args, "--ready-file", str(self.ready_path)]

    def check_ready(self) -> dict[str, Any] | None:
        """What the child reports once it is ready (its ready file), or None while it is not."""
        return read_ready_file(self.ready_path)

    def start(self) -> Self:
        """Start the process (its stdout and stderr go to its log file); :meth:`wait_ready` waits for it."""
        if self.alive():
            raise ChildFailed(f"{self.name} already running (pid {self.pid})")
        self.ready_path.unlink(missing_ok=True)
        self.ready = {}
        env = {**os.environ, "GRPC_VERBOSITY": os.environ.get("GRPC_VERBOSITY", "ERROR"),
               "FERRY_PARENT_PID": str(os.getpid()), **(self.env or {})}
        if self.inherit_output:
            self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, env=env)
            return self
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env,
            )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float = 30.0) -> dict[str, Any]:
        """Block until the child is ready (:meth:`check_ready`); raise ChildFailed with its log tail otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            payload = self.check_ready()
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
        if self.inherit_output:
            return "(its output is this process's)"
        return log_tail(self.log_path, lines)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (SIGKILL by default) and reap the process if it ends."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)
            if sig == signal.SIGKILL:
                self.proc.wait()

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGCONT and SIGTERM, wait up to ``timeout`` seconds, then SIGKILL. Returns the exit code."""
        if self.proc is None:
            return None
        if self.alive():
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def stop_all(children: list[Child], timeout: float = 5.0) -> None:
    """Stop children in reverse start order, SIGCONT and SIGTERM to all first so they stop in parallel."""
    for child in reversed(children):
        if child.alive():
            assert child.proc is not None
            child.proc.send_signal(signal.SIGCONT)
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
