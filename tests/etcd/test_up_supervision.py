"""``ferry up --store etcd``: a killed etcd is restarted on its own data dir and port, and the fleet serves on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from ferry.procs import Child
from tests.etcd.harness import wait_for
from tests.etcd.test_up import _alive, _healthy


def test_a_killed_etcd_comes_back_on_its_data_dir(tmp_path: Path) -> None:
    up = Child("up", ["up", "--store", "etcd", "--replicas", "2", "--workdir", str(tmp_path / "fleet")],
               tmp_path).start()
    try:
        ready = up.wait_ready(90)
        old = ready["pids"]["etcd"]
        os.kill(old, signal.SIGKILL)
        after = wait_for(lambda: (r := up.check_ready()) and r["pids"]["etcd"] != old and r, 30,
                         "a new etcd pid in the ready file")
        assert after["restarts"]["etcd"] == 1 and after["etcd"] == ready["etcd"]
        assert _healthy(after["etcd"]) and not _alive(old)
        call = subprocess.run([sys.executable, "-m", "ferry", "call", "--ready-file", str(up.ready_path),
                               "--model", "chat-small", "--prompt", "hi", "--max-tokens", "3"],
                              capture_output=True, text=True, timeout=60)
        assert call.returncode == 0, call.stderr
    finally:
        up.stop(15)
