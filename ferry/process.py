"""Process lifecycle for long-running commands: stop cleanly on SIGTERM and SIGINT.

A process started in the background by a non-interactive shell ignores SIGINT
and gets no KeyboardInterrupt, so every server main waits on :func:`stop_event`
rather than relying on Ctrl-C, and writes its bound addresses to a ready file
atomically (:func:`write_ready_file`) so that a parent never races on ports.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import signal
from pathlib import Path
from typing import Any


def stop_event() -> asyncio.Event:
    """An event set on the first SIGTERM or SIGINT of this process (call inside the running loop)."""
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, event.set)
    return event


def write_ready_file(path: str | Path | None, payload: dict[str, Any]) -> None:
    """Write ``payload`` as JSON to ``path`` atomically (temp file, then rename)."""
    if not path:
        return
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    tmp.replace(target)


def read_ready_file(path: str | Path) -> dict[str, Any] | None:
    """The JSON payload of a ready file, or None while it does not exist yet."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: ready file is not a JSON object")
    return data


def log_tail(path: str | Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a child's log file, for error messages ("(no log)" when absent)."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Get SIGKILL when the parent process dies (Linux); exit now if it is already gone."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os._exit(1)
