"""A fleet of real processes on loopback, as ``ferry up`` runs: a control plane, proxies and nodes.

For the benchmarks (:mod:`tools.bench.tiers_real`) and the end-to-end tests. Each
component is a :class:`ferry.procs.Child` (port 0, ready file, log file
in ``workdir``, stopped by PID). Unlike ``ferry up`` it lets its user kill any
component by PID and restart the control plane on the same port, and it
takes config overrides (merged into a small default config of two tenants,
``ent`` and ``free``, and a fast simulated engine, :data:`FAST_REPLICA`).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import grpc
from tomli_w import dumps

from ferry.config import hash_api_key
from ferry.procs import Child, stop_all
from ferry.v1 import admin_pb2, inference_pb2_grpc
from ferry_cli.ctl.client import AdminClient
from ferry_cli.up.ready import wait_routable

# Fast engine so tests stay short: ~2 ms decode steps, cheap prefill.
FAST_REPLICA = {"decode_base_seconds": 0.002, "decode_seconds_per_request": 0.0001,
                "prefill_base_seconds": 0.001, "prefill_seconds_per_token": 1e-6}


class Fleet:
    """Start with :meth:`start`; everything stops in :meth:`stop` (the fixture calls it)."""

    def __init__(self, workdir: Path, nodes: dict[str, list[str]], *, config: dict[str, Any] | None = None,
                 proxies: int = 1, node_args: dict[str, list[str]] | None = None,
                 expect: set[str] | None = None) -> None:
        self.workdir = workdir
        self.nodes_spec = nodes
        self.node_args = node_args or {}
        self.expect = expect
        self.keys = {"ent": "fk_" + secrets.token_hex(8), "free": "fk_" + secrets.token_hex(8)}
        self.admin_token = "fat_" + secrets.token_hex(8)
        self.token_path = workdir / "admin-token"
        self.token_path.write_text(self.admin_token)
        base: dict[str, Any] = {
            "tenants": [
                {"name": "ent", "api_key_sha256": hash_api_key(self.keys["ent"]), "plan": "enterprise"},
                {"name": "free", "api_key_sha256": hash_api_key(self.keys["free"]), "plan": "free",
                 "tiers": ["standard", "batch"]},
            ],
            "models": [{"name": "chat", "min_gpus": 1}, {"name": "empty-model", "min_gpus": 1}],
            "controlplane": {"grace_seconds": 2.0},
            "replica": dict(FAST_REPLICA),
        }
        for key, value in (config or {}).items():
            base[key] = {**base[key], **value} if isinstance(value, dict) and key in base else value
        self.config_path = workdir / "ferry.toml"
        self.config_path.write_text(dumps(base))
        self.children: list[Child] = []
        self.control_plane: Child | None = None
        self.proxies: list[Child] = []
        self.nodes: dict[str, Child] = {}
        self.proxy_count = proxies
        self.cp_address = ""

    def _spawn(self, name: str, argv: list[str]) -> Child:
        child = Child(name, [*argv, "--config", str(self.config_path), "--insecure"], self.workdir).start()
        self.children.append(child)
        return child

    def start(self) -> Fleet:
        self.control_plane = self._spawn("controlplane", ["controlplane", "--listen", "127.0.0.1:0",
                                                          "--admin-token-file", str(self.token_path)])
        self.cp_address = self.control_plane.wait_ready()["grpc"]
        for i in range(self.proxy_count):
            self.proxies.append(self._spawn(f"proxy-{i + 1}", ["proxy", "--control-plane", self.cp_address,
                                                                "--id", f"proxy-{i + 1}", "--workers", "1"]))
        for name, models in self.nodes_spec.items():
            reps = [a for m in models for a in ("--replica", m)]
            self.nodes[name] = self._spawn(name, ["node", "--node", name, "--control-plane", self.cp_address, *reps,
                                                  *self.node_args.get(name, [])])
        for child in self.children:
            child.wait_ready()
        self.wait_routable(self.replica_ids())
        return self

    def replica_ids(self) -> set[str]:
        """The replicas the fleet must route to: the simulated ones, or ``expect`` when given."""
        if self.expect is not None:
            return set(self.expect)
        return {f"{name}-r{i}" for name, models in self.nodes_spec.items() for i in range(len(models))}

    def wait_routable(self, expected: set[str], timeout: float = 30.0) -> None:
        for proxy in self.proxies:
            wait_routable(self.cp_address, expected, proxy.ready["proxy_id"], timeout, [],
                          admin_token=self.admin_token)

    @property
    def data_plane(self) -> str:
        return str(self.proxies[0].ready["grpc"])

    def inference(self, channel: grpc.Channel) -> Any:
        return inference_pb2_grpc.InferenceStub(channel)

    def admin(self) -> tuple[grpc.Channel, Any]:
        channel = grpc.insecure_channel(self.cp_address)
        return channel, AdminClient(channel, self.admin_token)

    def replicas(self) -> dict[str, Any]:
        channel, admin = self.admin()
        with channel:
            return {r.replica_id: r for r in admin.ListReplicas(admin_pb2.ListReplicasRequest(), timeout=5).replicas}

    def restart_control_plane(self) -> None:
        """Start a new control plane on the port of the old one (which must be dead)."""
        assert self.control_plane is not None and not self.control_plane.alive()
        self.control_plane = self._spawn("controlplane", ["controlplane", "--listen", self.cp_address,
                                                          "--admin-token-file", str(self.token_path)])
        self.control_plane.wait_ready()

    def stop(self) -> None:
        stop_all(self.children)
