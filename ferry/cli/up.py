"""``ferry up``: the whole system on one machine, each component its own OS process.

Starts ``--control-planes`` control planes (default 1), one proxy and ``--replicas`` simulated replicas on
nodes of ``--replicas-per-node`` (each node is one process: its agent and its
replicas, which still talk over gRPC), on loopback ports chosen by the kernel.
Replica *i* serves model ``models[i % len(models)]``. Unless the config file
names tenants, three are made up with fresh API keys (one per plan). It waits
until every replica is in the region's table and the proxy applied it, writes
``--ready-file`` (``data_plane``, ``control_plane``, ``control_planes``,
``models``, ``api_keys``, and the pids, metrics and replicas of every
component), and runs until SIGINT or SIGTERM, then stops every child.

``--store`` chooses where the fleet's state lives: ``memory`` (the default:
the embedded store, one control plane), ``etcd`` (a local etcd started
through :mod:`ferry.etcd` in a temporary data dir that is deleted at the end;
the ready file gains ``etcd``) or ``etcd://host:port`` (an external one).
With etcd, the control planes elect a leader and every proxy and node is
given every control plane's address (each node's list starts at a different
one, so the agents spread over them).
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import signal
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import grpc

from ferry.cli.procs import Child, ChildFailed, stop_all
from ferry.cli.tomlw import dumps
from ferry.config import hash_api_key
from ferry.etcd import EtcdFailed, LocalEtcd, etcd_binary
from ferry.process import write_ready_file
from ferry.v1 import admin_pb2, admin_pb2_grpc

DEFAULT_MODELS = ("chat-large", "chat-small")
MODEL_GPUS = {"chat-large": 8, "chat-small": 1}
PLANS = {"enterprise-1": ("enterprise", ["interactive", "standard", "batch"]),
         "paid-1": ("paid", ["interactive", "standard", "batch"]),
         "free-1": ("free", ["standard", "batch"])}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=None,
                        help="simulated replicas in all (default 8, or 0 with --triton)")
    parser.add_argument("--replicas-per-node", type=int, default=2, help="replicas per node process (default 2)")
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated model names")
    parser.add_argument("--region", default="local")
    parser.add_argument("--config", help="a config file; its tenants and models replace the made-up ones")
    parser.add_argument("--ready-file", help="write the addresses and API keys here once everything is ready")
    parser.add_argument("--workdir", help="keep config, ready files and logs here (default: a temporary folder)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for readiness")
    parser.add_argument("--store", default="memory",
                        help="memory (default), etcd (start a local etcd) or etcd://host:port")
    parser.add_argument("--control-planes", type=int, default=1,
                        help="control planes (default 1; more than one needs an etcd store)")
    parser.add_argument("--triton", action="append", default=[], metavar="GRPC_ADDRESS[,METRICS_URL]",
                        help="a running Triton (or any KServe v2) server: an agent beside it adopts its LLM models "
                             "(repeatable; replaces the simulated replicas unless --replicas is given)")


def build_config(user: dict[str, Any], models: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The config file of the run, and the API keys it made up (tenant → key)."""
    config = dict(user)
    keys: dict[str, str] = {}
    if "tenants" not in config:
        tenants = []
        for name, (plan, tiers) in PLANS.items():
            keys[name] = "fk_" + secrets.token_hex(16)
            tenants.append({"name": name, "api_key_sha256": hash_api_key(keys[name]), "plan": plan, "tiers": tiers})
        config["tenants"] = tenants
    if "models" not in config:
        config["models"] = [{"name": m, "default_version": "v1", "min_gpus": MODEL_GPUS.get(m, 1)} for m in models]
    return config, keys


class Fleet:
    """The processes of one ``ferry up`` run."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.models = [m for m in args.models.split(",") if m]
        self.children: list[Child] = []
        self.control_plane: Child | None = None
        self.control_planes: list[Child] = []
        self.etcd: LocalEtcd | None = None
        self.store = "memory://"
        self.proxy: Child | None = None
        self.nodes: list[Child] = []
        self.api_keys: dict[str, str] = {}

    def start(self) -> dict[str, Any]:
        args = self.args
        user = tomllib.loads(Path(args.config).read_text()) if args.config else {}
        config, self.api_keys = build_config(user, self.models)
        config_path = self.workdir / "ferry.toml"
        config_path.write_text(dumps(config))
        cfg = ["--config", str(config_path)]
        self.store = self._store()
        count = max(1, args.control_planes)
        for i in range(count):
            name = "controlplane" if count == 1 else f"controlplane-{i + 1}"
            extra = [] if self.store == "memory://" else ["--store", self.store, "--id", name]
            self.control_planes.append(self._spawn(name, ["controlplane", "--listen", "127.0.0.1:0", *cfg, *extra]))
        addresses = [cp.wait_ready(args.timeout)["grpc"] for cp in self.control_planes]
        self.control_plane = self.control_planes[0]
        cp_addr = addresses[0]
        self.proxy = self._spawn("proxy", ["proxy", "--listen", "127.0.0.1:0", "--control-plane", ",".join(addresses),
                                           "--region", args.region, "--id", "proxy-1", *cfg])
        expected = []
        per_node = max(1, args.replicas_per_node)
        replicas = args.replicas if args.replicas is not None else (0 if args.triton else 8)
        for n, first in enumerate(range(0, replicas, per_node)):
            name = f"node-{n + 1}"
            reps = []
            for i in range(first, min(first + per_node, args.replicas)):
                reps += ["--replica", f"{self.models[i % len(self.models)]}:v1"]
                expected.append(f"{name}-r{i - first}")
            own = ",".join(addresses[n % count:] + addresses[:n % count])
            self.nodes.append(self._spawn(name, ["node", "--node", name, "--control-plane", own,
                                                 "--region", args.region, *reps, *cfg]))
        adopting = []
        for k, server in enumerate(args.triton):
            address, _, metrics = server.partition(",")
            name = f"triton-{k + 1}"
            adopting.append(name)
            extra = ["--triton-metrics", metrics] if metrics else []
            self.nodes.append(self._spawn(name, ["node", "--node", name, "--control-plane", ",".join(addresses),
                                                 "--region", args.region, "--triton", address, *extra, *cfg]))
        proxy = self.proxy.wait_ready(args.timeout)
        for node in self.nodes:
            node.wait_ready(args.timeout)
        wait_routable(cp_addr, set(expected), proxy["proxy_id"], args.timeout, self.children,
                      nodes_with_any=set(adopting))
        return self.describe()

    def _store(self) -> str:
        """The ``--store`` URL for the control planes; starts a local etcd for ``--store etcd``."""
        store: str = self.args.store
        count = max(1, self.args.control_planes)
        if store in ("memory", "memory://"):
            if count > 1:
                raise ChildFailed("more than one control plane needs a shared store: add --store etcd")
            return "memory://"
        if store == "etcd":
            if etcd_binary() is None:
                raise ChildFailed("--store etcd needs an etcd binary on PATH (tools/ensure_etcd.sh installs it), "
                                  "or give --store etcd://host:port")
            try:
                self.etcd = LocalEtcd(log_path=self.workdir / "etcd.log").start()
            except EtcdFailed as exc:
                raise ChildFailed(str(exc)) from exc
            return f"etcd://{self.etcd.endpoint}"
        if store.startswith("etcd://"):
            return store
        raise ChildFailed(f"--store {store!r}: expected memory, etcd or etcd://host:port")

    def _spawn(self, name: str, argv: list[str]) -> Child:
        child = Child(name, argv, self.workdir).start()
        self.children.append(child)
        return child

    def describe(self) -> dict[str, Any]:
        assert self.control_plane and self.proxy
        info: dict[str, Any] = {
            "data_plane": self.proxy.ready["grpc"],
            "control_plane": self.control_plane.ready["grpc"],
            "control_planes": [cp.ready["grpc"] for cp in self.control_planes],
            "region": self.args.region,
            "models": self.models,
            "api_keys": self.api_keys,
            "workdir": str(self.workdir),
            "pids": {c.name: c.pid for c in self.children},
            "metrics": {c.name: c.ready.get("metrics") for c in self.children},
            "replicas": [r for node in self.nodes for r in node.ready.get("replicas", [])],
        }
        if self.store != "memory://":
            info["etcd"] = self.store.removeprefix("etcd://")
        return info

    def stop(self) -> None:
        stop_all(self.children)
        if self.etcd is not None:
            self.etcd.close()


def wait_routable(cp_addr: str, expected: set[str], proxy_id: str, timeout: float, children: list[Child],
                  *, nodes_with_any: set[str] | None = None) -> None:
    """Poll the Admin API until every expected replica is in the table and the proxy applied it.

    ``nodes_with_any`` names nodes whose replicas are discovered (adopted endpoints):
    each must have at least one replica in the table.
    """
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    with grpc.insecure_channel(cp_addr) as channel:
        admin = admin_pb2_grpc.AdminStub(channel)
        while time.monotonic() < deadline:
            for child in children:
                if not child.alive():
                    raise ChildFailed(f"{child.name} exited with {child.returncode()}:\n{child.log_tail()}")
            try:
                reps = admin.ListReplicas(admin_pb2.ListReplicasRequest(), timeout=2)
                routable = {r.replica_id for r in reps.replicas if r.in_table}
                adopted = {r.node for r in reps.replicas if r.in_table}
                table = admin.GetTable(admin_pb2.GetTableRequest(), timeout=2)
                versions = {t.region: t.version for t in table.regions}
                synced = any(p.proxy_id == proxy_id and p.connected and p.applied_version == versions.get(p.region)
                             for p in table.proxies)
                if expected <= routable and (nodes_with_any or set()) <= adopted and synced:
                    return
                last = f"{len(expected & routable)}/{len(expected)} replicas routable, proxy synced: {synced}"
            except grpc.RpcError as exc:
                last = f"{exc.code().name}: {exc.details()}"
            time.sleep(0.05)
    raise ChildFailed(f"fleet not ready after {timeout:.0f} s: {last}")


def run(args: argparse.Namespace) -> int:
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    own_workdir = args.workdir is None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ferry-up-"))
    workdir.mkdir(parents=True, exist_ok=True)
    fleet = Fleet(args, workdir)
    try:
        try:
            info = fleet.start()
        except ChildFailed as exc:
            print(f"ferry up: {exc}", file=sys.stderr)
            return 1
        write_ready_file(args.ready_file, info)
        print_summary(info, len(fleet.nodes))
        while not stop:
            time.sleep(0.2)
        print("ferry up: stopping", flush=True)
        return 0
    finally:
        fleet.stop()
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def print_summary(info: dict[str, Any], nodes: int) -> None:
    counts: dict[str, int] = {}
    for r in info["replicas"]:
        counts[r["model"]] = counts.get(r["model"], 0) + 1
    models = ", ".join(f"{m} x{n}" for m, n in counts.items())
    planes = info["control_planes"]
    what = "1 control plane" if len(planes) == 1 else f"{len(planes)} control planes"
    print(f"ferry up: {what}, 1 proxy, {nodes} nodes, {len(info['replicas'])} replicas ({models}) "
          f"in region {info['region']}")
    print(f"  data plane     {info['data_plane']}")
    print(f"  control plane  {', '.join(planes)}")
    if "etcd" in info:
        print(f"  etcd           {info['etcd']}")
    for tenant, key in info["api_keys"].items():
        print(f"  api key        {tenant}: {key}")
    print("  Ctrl-C stops everything.", flush=True)
