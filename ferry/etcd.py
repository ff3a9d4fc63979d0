"""A local etcd server for ``ferry up``, the benchmarks and the tests (a shared helper: it imports no plane).

:class:`LocalEtcd` runs one ``etcd`` process on 127.0.0.1 with a data dir of
its own (a fresh temporary folder unless one is given; a folder it made is
deleted by :meth:`LocalEtcd.close`). Ports are taken from the kernel (bind
port 0, read it, release it) unless given, and kept across
:meth:`LocalEtcd.restart`, so a test can kill etcd and bring it back on the
same data dir and port. Readiness is ``GET /health`` answering
``"health": "true"``, polled every 20 ms up to a deadline; never a sleep.

The child gets SIGKILL when its parent dies (``PR_SET_PDEATHSIG``, set by a
tiny Python shim that then ``exec``s etcd: a ``preexec_fn`` would force a
plain fork), so an interrupted test or ``ferry up`` leaves no etcd behind.
Flags are those of a single-member cluster that elects itself in about 0.1 s
(heartbeat 10 ms, election timeout 100 ms), with periodic compaction
(``compaction_retention``, default ``5m``) so a long run's history stays
bounded. Cost: one process, about 25 MB of memory and a 64 MB WAL segment
preallocated on disk.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from ferry.process import log_tail

_SHIM = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, 9)\n"  # PR_SET_PDEATHSIG, SIGKILL
    "if os.getppid() != int(sys.argv[1]): os._exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


class EtcdFailed(RuntimeError):
    """etcd is not installed, exited, or did not become healthy in time."""


def etcd_binary() -> str | None:
    """The path of the ``etcd`` binary on PATH, or None."""
    return shutil.which("etcd")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalEtcd:
    """One etcd member on loopback; :meth:`start`, then :meth:`close` (or use it as a context manager)."""

    def __init__(
        self,
        *,
        data_dir: str | Path | None = None,
        client_port: int = 0,
        peer_port: int = 0,
        name: str = "ferry",
        log_path: str | Path | None = None,
        compaction_retention: str = "5m",
        binary: str | None = None,
    ) -> None:
        self.binary = binary or etcd_binary() or ""
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="ferry-etcd-"))
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        self.name = name
        self.log_path = Path(log_path) if log_path is not None else self.data_dir.parent / f"{self.data_dir.name}.log"
        self.compaction_retention = compaction_retention
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT`` of the client API (what ``--store etcd://`` takes)."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def command(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            self.binary, "--name", self.name, "--data-dir", str(self.data_dir / "member-data"),
            "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"{self.name}={peer}", "--initial-cluster-state", "new",
            "--heartbeat-interval", "10", "--election-timeout", "100",
            "--auto-compaction-mode", "periodic", "--auto-compaction-retention", self.compaction_retention,
            "--log-level", "error", "--logger", "zap",
        ]

    def start(self, timeout: float = 15.0) -> LocalEtcd:
        """Start etcd and wait until it is healthy; raises EtcdFailed with its log tail otherwise."""
        if not self.binary:
            raise EtcdFailed("no etcd binary on PATH (tools/ensure_etcd.sh installs Debian's etcd-server)")
        if self.alive():
            raise EtcdFailed(f"etcd already running (pid {self.pid})")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _SHIM, str(os.getpid()), *self.command()],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        self.wait_healthy(timeout)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "etcd not started"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self, timeout: float = 1.0) -> bool:
        """Whether ``GET /health`` answers ``"health": "true"`` now."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=timeout) as response:
                return bool(json.loads(response.read()).get("health") == "true")
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def wait_healthy(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise EtcdFailed(f"etcd exited with {self.returncode()} before it was healthy:\n{self.log_tail()}")
            if self.healthy(timeout=0.5):
                return
            time.sleep(0.02)
        raise EtcdFailed(f"etcd not healthy after {timeout:.0f} s:\n{self.log_tail()}")

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = 20) -> str:
        return log_tail(self.log_path, lines)

    def signal(self, sig: int) -> None:
        """Send ``sig`` (SIGSTOP and SIGCONT pause and resume it); SIGKILL also reaps it."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)
            if sig == signal.SIGKILL:
                self.proc.wait()

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM (after SIGCONT, in case it is paused), wait, then SIGKILL."""
        if self.proc is None or not self.alive():
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def restart(self, timeout: float = 15.0) -> LocalEtcd:
        """Stop it if it runs, then start it again on the same data dir and ports."""
        self.stop()
        return self.start(timeout)

    def close(self) -> None:
        """Stop it and delete the data dir (and log) if this object made them."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> LocalEtcd:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
