"""Start and stop a real Triton Inference Server from the main environment (tests, ``ferry up``).

``start_triton(workdir)`` picks three free loopback ports, runs
``tools/triton/serve.py`` under the Triton environment's interpreter
(``$(repo)/.venv-triton``, built by ``tools/triton/setup_env.sh``) in a session
of its own, waits for its ready file with a bounded deadline and returns a
:class:`TritonProcess` with the addresses and pids. ``stop()`` sends SIGTERM
and waits; ``kill()`` sends SIGKILL to the server's process group (the server,
its tritonserver child and the backend stubs: a crash, for failure tests) and
removes what a crash leaves behind (workspace, shared-memory regions named
after the server's pid).

tritonserver takes no port 0, so ports are chosen here; if another process
takes one between the choice and the bind, the start is tried again on new
ports (``attempts``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO_ROOT / ".venv-triton"
SERVE_SCRIPT = Path(__file__).resolve().with_name("serve.py")
SETUP_SCRIPT = "tools/triton/setup_env.sh"
HOST = "127.0.0.1"
POLL_S = 0.05
# Unix socket paths are limited to 107 bytes; pytriton puts its sockets (up to 26 bytes of name) in the workspace.
MAX_WORKSPACE_PATH = 80
SCRATCH_PREFIX = "ferry-triton-ws-"
SHM_DIR = Path("/dev/shm")


class TritonLaunchError(RuntimeError):
    """The Triton test server could not be started."""


class TritonEnvironmentMissing(TritonLaunchError):
    """The Triton environment (``.venv-triton``) is not installed."""

    def __init__(self, venv: Path) -> None:
        self.venv = venv
        super().__init__(
            f"the Triton environment {venv} is missing or incomplete: run {SETUP_SCRIPT} "
            "(it installs nvidia-pytriton, which bundles tritonserver, into its own virtual environment)"
        )


@dataclass(frozen=True)
class ServeOptions:
    """Knobs of the served models (see ``serve.py --help``)."""

    batch_seconds: float = 0.1
    max_queue_delay_us: int = 50_000
    token_seconds: float = 0.01
    exit_timeout_secs: int = 3
    metrics_config: tuple[str, ...] = ()  # tritonserver --metrics-config settings, e.g. "summary_latencies=true"


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that were free on 127.0.0.1 a moment ago."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in sockets:
            sock.bind((HOST, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def pid_alive(pid: int | None) -> bool:
    """Whether ``pid`` is a running process (a zombie counts as gone)."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")


def _is_tritonserver(pid: int | None) -> bool:
    """Whether ``pid`` is still a running tritonserver (and not another process that got its pid since)."""
    if not pid_alive(pid):
        return False
    try:
        return b"tritonserver" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _wait_gone(pids: list[int | None], deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while any(pid_alive(p) for p in pids):
        if time.monotonic() > end:
            return False
        time.sleep(POLL_S)  # poll interval of a bounded wait
    return True


class TritonProcess:
    """One running ``serve.py``: its addresses, pids, log, and how to stop it."""

    def __init__(
        self, proc: subprocess.Popen[bytes], ready: dict[str, Any], rundir: Path, workspace: Path, log_path: Path
    ) -> None:
        self._proc = proc
        self.grpc: str = str(ready["grpc"])
        self.http: str = str(ready["http"])
        self.metrics_url: str = str(ready["metrics"])
        self.pid: int = int(ready["pid"])
        self.tritonserver_pid: int | None = ready.get("tritonserver_pid")
        self.models: list[str] = list(ready["models"])
        self.startup_seconds: float = float(ready.get("startup_seconds", 0.0))
        self.rundir = rundir
        self.workspace = workspace
        self.log_path = log_path

    def __repr__(self) -> str:
        return f"TritonProcess(grpc={self.grpc!r}, pid={self.pid}, tritonserver_pid={self.tritonserver_pid})"

    def alive(self) -> bool:
        """Whether ``serve.py`` is still running."""
        return self._proc.poll() is None

    def stop(self, timeout_s: float = 20.0, sig: signal.Signals = signal.SIGTERM) -> int | None:
        """Send ``sig`` (SIGTERM or SIGINT), wait up to ``timeout_s``, else :meth:`kill`. Exit code; None if killed."""
        if self._proc.poll() is None:
            self._proc.send_signal(sig)
            try:
                self._proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
                return None
        if not _wait_gone([self.tritonserver_pid], timeout_s):
            self.kill()
            return None
        _remove_leftovers(self._proc.pid, self.workspace)
        return self._proc.returncode

    def kill(self) -> None:
        """SIGKILL the whole server (its process group), wait until it is gone, remove what it leaves."""
        if self._proc.returncode is None:  # not reaped yet, so its pid (the group's id) cannot have been reused
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait(timeout=10)
        child = self.tritonserver_pid
        if child is not None and _is_tritonserver(child):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        _wait_gone([self.tritonserver_pid], 10.0)
        _remove_leftovers(self._proc.pid, self.workspace)

    def __enter__(self) -> TritonProcess:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _workspace_for(rundir: Path) -> Path:
    """The pytriton workspace (must not exist yet): in ``rundir``, or in a short temporary folder if too long."""
    workspace = rundir / "workspace"
    if len(str(workspace)) > MAX_WORKSPACE_PATH:
        workspace = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX)) / "workspace"
    return workspace


def _kill_stragglers(workspace: Path) -> None:
    """SIGKILL any process still running from ``workspace`` (a Python backend stub its server left behind)."""
    mark = str(workspace).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if mark in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)


def _remove_leftovers(pid: int, workspace: Path) -> None:
    """Processes left running from the workspace (:func:`_kill_stragglers`), shared-memory regions named after
    ``pid`` (the Python backend's), the workspace and its scratch folder."""
    _kill_stragglers(workspace)
    with contextlib.suppress(OSError):
        for region in SHM_DIR.glob(f"pytrtion{pid}-*"):
            region.unlink(missing_ok=True)
    shutil.rmtree(workspace, ignore_errors=True)
    if workspace.parent.name.startswith(SCRATCH_PREFIX):
        shutil.rmtree(workspace.parent, ignore_errors=True)


def _child_env() -> dict[str, str]:
    """This environment less what would make the Triton interpreter import the main environment's packages."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _log_tail(path: Path, limit: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""


def _start_once(
    python: Path, workdir: Path, options: ServeOptions, deadline_s: float
) -> tuple[TritonProcess | None, str]:
    rundir = Path(tempfile.mkdtemp(prefix="triton-", dir=workdir))
    workspace = _workspace_for(rundir)
    ready_file = rundir / "ready.json"
    log_path = rundir / "serve.log"
    grpc_port, http_port, metrics_port = free_ports(3)
    argv = [
        str(python), str(SERVE_SCRIPT),
        "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--metrics-port", str(metrics_port),
        "--ready-file", str(ready_file), "--workspace", str(workspace),
        "--batch-seconds", str(options.batch_seconds), "--max-queue-delay-us", str(options.max_queue_delay_us),
        "--token-seconds", str(options.token_seconds), "--exit-timeout-secs", str(options.exit_timeout_secs),
    ]  # fmt: skip
    for setting in options.metrics_config:
        argv += ["--metrics-config", setting]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            cwd=REPO_ROOT, env=_child_env(), start_new_session=True,
        )  # fmt: skip
    end = time.monotonic() + deadline_s
    while True:
        if ready_file.exists():
            ready = json.loads(ready_file.read_text())
            return TritonProcess(proc, ready, rundir, workspace, log_path), ""
        if proc.poll() is not None:
            _remove_leftovers(proc.pid, workspace)
            return (
                None,
                f"serve.py exited with {proc.returncode} before it was ready; log {log_path}:\n{_log_tail(log_path)}",
            )
        if time.monotonic() > end:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            _remove_leftovers(proc.pid, workspace)
            raise TritonLaunchError(
                f"Triton not ready within {deadline_s:.0f} s; log {log_path}:\n{_log_tail(log_path)}"
            )
        time.sleep(POLL_S)  # poll interval of a bounded wait on the ready file


def start_triton(
    workdir: str | Path,
    *,
    venv: str | Path | None = None,
    options: ServeOptions | None = None,
    deadline_s: float = 90.0,
    attempts: int = 2,
) -> TritonProcess:
    """Start one real Triton server with Ferry's test models; return once every model is ready.

    ``workdir`` holds the run folder (ready file, log, pytriton workspace). Raises
    :class:`TritonEnvironmentMissing` when ``.venv-triton`` is not installed and
    :class:`TritonLaunchError` when the server does not come up.
    """
    venv_path = Path(venv) if venv else Path(os.environ.get("FERRY_TRITON_VENV", DEFAULT_VENV))
    python = venv_path / "bin" / "python"
    if not python.exists() or not (venv_path / ".ferry-triton-ready").exists():
        raise TritonEnvironmentMissing(venv_path)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    for _ in range(max(1, attempts)):
        process, error = _start_once(python, workdir, options or ServeOptions(), deadline_s)
        if process is not None:
            return process
        errors.append(error)
    raise TritonLaunchError("\n---\n".join(errors))
