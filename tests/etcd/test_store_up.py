"""``ferry_controlplane_store_up`` follows a real etcd: 1 while it answers, 0 once it is stopped, 1 again on its
return (what ``FerryEtcdUnreachable`` pages on)."""

from __future__ import annotations

import signal
import urllib.request
from pathlib import Path

from tomli_w import dumps

from ferry.procs import Child
from harness.etcd import LocalEtcd
from tests.e2e.harness import wait_for


def store_up(metrics: str) -> float | None:
    """The gauge's value on the control plane's metrics port (None: not exported)."""
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("ferry_controlplane_store_up "):
                return float(line.split()[1])
    return None


def test_store_up_gauge_is_one_with_etcd_and_zero_once_it_stops(tmp_path: Path, etcd: LocalEtcd) -> None:
    config = tmp_path / "ferry.toml"
    config.write_text(dumps({"controlplane": {"store_timeout_seconds": 0.5, "tick_seconds": 0.2}}))
    cp = Child("controlplane", ["controlplane", "--listen", "127.0.0.1:0", "--store", f"etcd://{etcd.endpoint}",
                                "--id", "cp-1", "--config", str(config), "--insecure"], tmp_path).start()
    try:
        metrics = cp.wait_ready()["metrics"]
        wait_for(lambda: store_up(metrics) == 1.0, 30, "store_up 1 with etcd up")
        etcd.signal(signal.SIGKILL)
        wait_for(lambda: store_up(metrics) == 0.0, 30, "store_up 0 once etcd is stopped")
        etcd.start()  # same data dir and port
        wait_for(lambda: store_up(metrics) == 1.0, 30, "store_up 1 again once etcd answers")
    finally:
        cp.stop()
