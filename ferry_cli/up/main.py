"""``ferry up``: the whole system on one machine, each component its own OS process.

Starts ``--control-planes`` control planes (default 1), ``--proxies`` proxies
per region (default 1) and ``--replicas`` simulated replicas on nodes of
``--replicas-per-node`` (each node is one process: its agent and its
replicas, which still talk over gRPC), and the native data path of the first
region: ``--pickers`` endpoint pickers (default 2, in failover; 0: none) and
one ``ferry envoy`` asking them, on loopback ports chosen by the kernel.
Replica *i* serves model ``models[i % len(models)]``. Unless the config file
names tenants, three are made up with fresh API keys (one per plan). It waits
until every replica is in the region's table and the proxy applied it, writes
``--ready-file`` (``data_plane``, ``http`` (the proxy's OpenAI-compatible HTTP
API, docs/api.md; ``http_by_region`` with regions), ``envoy`` (Envoy's
listener: OpenAI HTTP and KServe v2 gRPC, a picker deciding), ``envoy_admin``,
``pickers`` (name to address), ``control_plane``, ``control_planes``,
``models`` (those served: with a replica in the tables, as the control plane
lists them, ``--models`` order first), ``api_keys``, ``admin_token``, and the pids, metrics and replicas
of every component; ``pids`` also holds etcd's when it started one), and runs
until SIGINT or SIGTERM, then stops every child. While it runs it supervises
them (:mod:`ferry.supervise`): a child that dies is logged and
restarted with backoff on its own address, and the ready file is rewritten
with the new pids, ``restarts``, ``given_up`` and ``up_metrics`` (where
``ferry_up_restarts_total`` is served); ``--no-supervise`` turns it off.
``--proxies N`` runs N proxies per region on one address: the first binds a
port chosen by the kernel, the others bind the same one (gRPC servers set
``SO_REUSEPORT`` on Linux, and the kernel spreads connections over them);
``proxies`` in the ready file maps their names to pids.
``--trace-stdout`` traces every request of the proxies and pickers and
prints each finished trace's span tree with durations to standard output
(``--trace-file PATH``: appended to PATH), through an OTLP receiver in this
process (:mod:`ferry_cli.up.traces`; ``traces`` in the ready file).
It makes up a fresh admin token for the Admin API, hands it to its control
planes in a file of the workdir (mode 0600, ``--admin-token-file``) and puts
it in the ready file, where ``ferryctl --ready-file`` finds it.

``--store`` chooses where the fleet's state lives: ``memory`` (the default:
the embedded store, one control plane), ``etcd`` (a local etcd started
through :mod:`harness.etcd`, a child like the others, in a temporary data dir
that is deleted at the end, stopped after the control planes; the ready file
gains ``etcd``, its client address, and ``pids["etcd"]``) or ``etcd://host:port`` (an external one).
With etcd, the control planes elect a leader and every proxy and node is
given every control plane's address (each node's list starts at a different
one, so the agents spread over them).

Transport: by default every child runs with ``--insecure`` (plain text on
loopback). ``--tls`` makes a throw-away CA and certificates in the workdir
(:mod:`harness.tlsgen`: ``controlplane``, ``proxy``, ``agent``, ``admin``), runs
every child with its certificate (mutual TLS inside, TLS on the public API)
and adds ``tls`` (``ca``, ``client_cert``, ``client_key``: the operator's
certificate, common name ``admin``) to the ready file, where ``ferry call``
and ``ferryctl --ready-file`` find them. Either way a fresh join token goes
to the control planes (``--join-token-file``) and to the nodes (env
``FERRY_JOIN_TOKEN``).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from prometheus_client import start_http_server
from tomli_w import dumps

from ferry.config import hash_api_key
from ferry.process import write_ready_file
from ferry.procs import Child, ChildFailed, stop_all
from ferry.supervise import Supervisor
from ferry_cli import clienttls
from ferry_cli.up.ready import served_models, wait_routable
from ferry_cli.up.regions import region_names, with_regions
from ferry_cli.up.traces import TraceSink, proxy_settings
from harness import tlsgen
from harness.etcd import LocalEtcd, etcd_binary

DEFAULT_MODELS = ("chat-large", "chat-small")
MODEL_GPUS = {"chat-large": 8, "chat-small": 1}
# [replica] answer_tokens of the simulated replicas: a chat without max_tokens may run to the whole context, so
# answers end by themselves; 48 is a short reply (1 s of decode on a full replica), docs/operations.md.
ANSWER_TOKENS = 48
PLANS = {"enterprise-1": ("enterprise", ["interactive", "standard", "batch"]),
         "paid-1": ("paid", ["interactive", "standard", "batch"]),
         "free-1": ("free", ["standard", "batch"])}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=None,
                        help="simulated replicas in all (default 8, or 0 with --triton)")
    parser.add_argument("--replicas-per-node", type=int, default=2, help="replicas per node process (default 2)")
    parser.add_argument("--answer-tokens", type=int, default=None, metavar="N", help="simulated replicas' mean "
                        f"natural answer length (default: --config's [replica] answer_tokens, else {ANSWER_TOKENS}; "
                        "0: every answer runs to max_tokens)")
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated model names")
    parser.add_argument("--region", default="local")
    parser.add_argument("--regions", type=int, default=1,
                        help="lay out N regions a, b, c, … with a proxy each and round trips between them "
                             "(ferry_cli.up.regions; default 1: --region only)")
    parser.add_argument("--config", help="a config file; its tenants and models replace the made-up ones")
    parser.add_argument("--ready-file", help="write the addresses and API keys here once everything is ready")
    parser.add_argument("--workdir", help="keep config, ready files and logs here (default: a temporary folder)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for readiness")
    parser.add_argument("--store", default="memory",
                        help="memory (default), etcd (start a local etcd) or etcd://host:port")
    parser.add_argument("--proxies", type=int, default=1,
                        help="proxy processes per region behind one address (SO_REUSEPORT; default 1)")
    parser.add_argument("--pickers", type=int, default=2,
                        help="endpoint pickers Envoy asks per request (dataplane.epp; default 2; 0: no Envoy path)")
    parser.add_argument("--no-supervise", dest="supervise", action="store_false",
                        help="do not restart children that die (ferry.supervise)")
    parser.add_argument("--control-planes", type=int, default=1,
                        help="control planes (default 1; more than one needs an etcd store)")
    parser.add_argument("--tls", action="store_true",
                        help="make a throw-away CA and certificates and run everything over (mutual) TLS; "
                             "without it the children run with --insecure")
    parser.add_argument("--trace-stdout", action="store_true",
                        help="trace every request of the proxies and pickers and print each finished trace's spans, "
                             "with their durations, as an indented tree (ferry_cli.up.traces)")
    parser.add_argument("--trace-file", metavar="PATH",
                        help="as --trace-stdout, into PATH (appended) instead of standard output")
    parser.add_argument("--batch-gpus", type=int, default=0, metavar="N",
                        help="also run ferry's fixed-batch runtime (model batchstring) on a node of N GPUs")
    parser.add_argument("--triton", action="append", default=[], metavar="GRPC_ADDRESS[,METRICS_URL[,OPENAI_URL]]",
                        help="a running Triton (or any KServe v2) server: an agent beside it adopts its LLM models "
                             "(repeatable; replaces the simulated replicas unless --replicas is given); with its "
                             "OpenAI front end's URL, Envoy also reaches them over OpenAI HTTP")


def build_config(user: dict[str, Any], models: list[str],
                 answer_tokens: int | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """The config file of the run, and the API keys it made up (tenant → key)."""
    config = dict(user)
    replica = config["replica"] = dict(config.get("replica", {}))  # answers end naturally unless told otherwise
    replica["answer_tokens"] = answer_tokens if answer_tokens is not None else replica.get("answer_tokens",
                                                                                          ANSWER_TOKENS)
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


def write_config(user_path: str | None, models: list[str], regions: list[str],
                 path: Path, answer_tokens: int | None = None, *,
                 trace_endpoint: str = "") -> tuple[dict[str, Any], dict[str, str]]:
    """Write the run's config file at ``path``: the user's ``--config`` (if any) with the made-up tenants,
    models and region layout it lacks, and with ``trace_endpoint``, the proxies' traces sent there
    (:func:`ferry_cli.up.traces.proxy_settings`). Returns the config written and the API keys made up."""
    user = tomllib.loads(Path(user_path).read_text(encoding="utf-8")) if user_path else {}
    config, keys = build_config(user, models, answer_tokens)
    config = with_regions(config, regions)
    if trace_endpoint:
        config["proxy"] = proxy_settings(trace_endpoint, config.get("proxy", {}))
    path.write_text(dumps(config), encoding="utf-8")
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
        self.proxies: dict[str, Child] = {}
        self.siblings: list[Child] = []  # proxies beyond the first of a region, on its address
        self.pickers: list[Child] = []  # endpoint pickers of the first region (dataplane.epp)
        self.envoy: Child | None = None  # Envoy asking them (dataplane.envoy)
        self.nodes: list[Child] = []
        self.api_keys: dict[str, str] = {}
        self.admin_token = "fat_" + secrets.token_hex(16)
        self.join_token = "fjt_" + secrets.token_hex(16)
        self.tls_dir: Path | None = None
        self.supervisor: Supervisor | None = None
        self.served: list[str] = []  # the models with a replica in the tables (served_models)
        self.metrics_address = ""
        self.traces: TraceSink | None = None  # --trace-stdout, --trace-file: the traces printed
        self._trace_out: TextIO | None = None

    def supervise(self, on_change: Callable[[], None]) -> Supervisor:
        """Watch every child (etcd included) from now on, and serve ``ferry_up_restarts_total`` on loopback."""
        watched: list[Child] = [*([self.etcd] if self.etcd else []), *self.children]
        self.supervisor = Supervisor(watched, on_change=on_change)
        server, _ = start_http_server(0, addr="127.0.0.1", registry=self.supervisor.registry)
        self.metrics_address = f"127.0.0.1:{server.server_port}"
        return self.supervisor

    def start(self) -> dict[str, Any]:
        args = self.args
        regions = region_names(getattr(args, "regions", 1), args.region)
        config_path = self.workdir / "ferry.toml"
        endpoint = ""
        if getattr(args, "trace_stdout", False) or getattr(args, "trace_file", None):
            self._trace_out = open(args.trace_file, "a", encoding="utf-8") if args.trace_file else None  # noqa: SIM115
            self.traces = TraceSink(self._trace_out or sys.stdout)
            endpoint = self.traces.start()
        _, self.api_keys = write_config(args.config, self.models, regions, config_path,
                                        getattr(args, "answer_tokens", None), trace_endpoint=endpoint)
        cfg = ["--config", str(config_path)]
        token_path = self.workdir / "admin-token"
        token_path.touch(mode=0o600)
        token_path.chmod(0o600)  # also when --workdir held one already
        token_path.write_text(self.admin_token + "\n")
        self._secure()
        self.store = self._store()
        count = max(1, args.control_planes)
        for i in range(count):
            name = "controlplane" if count == 1 else f"controlplane-{i + 1}"
            extra = [] if self.store == "memory://" else ["--store", self.store, "--id", name]
            extra += ["--admin-token-file", str(token_path), "--traffic-dir", str(self.workdir / "traffic" / name)]
            self.control_planes.append(self._spawn(name, ["controlplane", "--listen", "127.0.0.1:0", *cfg, *extra]))
        addresses = [cp.wait_ready(args.timeout)["grpc"] for cp in self.control_planes]
        self.control_plane = self.control_planes[0]
        cp_addr = addresses[0]
        per_region = max(1, getattr(args, "proxies", 1))
        for region in regions:  # "proxy" (id proxy-1) alone, else proxy-a, proxy-b, … and -1, -2 … per region
            base = "proxy" if len(regions) == 1 else f"proxy-{region}"
            listen, http_listen = "127.0.0.1:0", "127.0.0.1:0"
            for k in range(per_region):
                name = base if per_region == 1 else f"{base}-{k + 1}"
                pid = "proxy-1" if len(regions) == 1 and per_region == 1 else name
                child = self._spawn(name, ["proxy", "--workers", "1", "--listen", listen, "--http-listen", http_listen,
                                           "--control-plane", ",".join(addresses), "--region", region,
                                           "--id", pid, *cfg])
                if k == 0:
                    self.proxies[region] = child
                    if per_region > 1:  # the siblings bind the same ports (SO_REUSEPORT: gRPC's default, HTTP's own)
                        ready = child.wait_ready(args.timeout)
                        listen, http_listen = ready["grpc"], ready["http"]
                else:
                    self.siblings.append(child)
        self.proxy = self.proxies[regions[0]]
        self._envoy(addresses, regions[0], cfg)
        expected = []
        by_region: dict[str, set[str]] = {r: set() for r in regions}
        per_node = max(1, args.replicas_per_node)
        replicas = args.replicas if args.replicas is not None else (0 if args.triton else 8)
        for n, first in enumerate(range(0, replicas, per_node)):
            name = f"node-{n + 1}"
            reps = []
            for i in range(first, min(first + per_node, replicas)):
                reps += ["--replica", f"{self.models[i % len(self.models)]}:v1"]
                expected.append(f"{name}-r{i - first}")
                by_region[regions[n % len(regions)]].add(expected[-1])
            own = ",".join(addresses[n % count:] + addresses[:n % count])
            self.nodes.append(self._spawn(name, ["node", "--node", name, "--control-plane", own,
                                                 "--region", regions[n % len(regions)], *reps, *cfg]))
        adopting = []
        for k, server in enumerate(args.triton):
            address, _, rest = server.partition(",")
            metrics, _, front = rest.partition(",")
            name = f"triton-{k + 1}"
            adopting.append(name)
            extra = (["--triton-metrics", metrics] if metrics else []) + (["--triton-openai", front] if front else [])
            self.nodes.append(self._spawn(name, ["node", "--node", name, "--control-plane", ",".join(addresses),
                                                 "--region", args.region, "--triton", address, *extra, *cfg]))
        if args.batch_gpus > 0:
            self.nodes.append(self._spawn("batch-1", ["node", "--node", "batch-1", "--control-plane",
                                                      ",".join(addresses), "--region", regions[0], "--batch-runtime",
                                                      "--gpus", str(args.batch_gpus), *cfg]))
        for node in self.nodes:
            node.wait_ready(args.timeout)
            if node.name == "batch-1":
                batch = [r["replica_id"] for r in node.ready.get("replicas", [])]
                expected += batch
                by_region[regions[0]].update(batch)
        if self.envoy is not None:
            self.envoy.wait_ready(args.timeout)  # ready once Envoy serves and its endpoints came from a table
        for child in [*self.proxies.values(), *self.siblings, *self.pickers]:
            proxy = child.wait_ready(args.timeout)
            region = proxy.get("region", regions[0])
            wait_routable(cp_addr, set(expected) if len(regions) == 1 else by_region[region], proxy["proxy_id"],
                          args.timeout, self.children, nodes_with_any=set(adopting), admin_token=self.admin_token,
                          credentials=clienttls.credentials(ready={"tls": self.tls_section()}))
        self.served = served_models(cp_addr, self.models, admin_token=self.admin_token,
                                    credentials=clienttls.credentials(ready={"tls": self.tls_section()}))
        return self.describe()

    def _envoy(self, addresses: list[str], region: str, cfg: list[str]) -> None:
        """``--pickers`` endpoint pickers of ``region``, each its own process and port, and Envoy asking them."""
        count = max(0, getattr(self.args, "pickers", 0))
        if not count:
            return
        control = ",".join(addresses)
        for k in range(count):
            name = f"picker-{k + 1}"
            self.pickers.append(self._spawn(name, ["picker", "--listen", "127.0.0.1:0", "--control-plane", control,
                                                   "--region", region, "--id", name, *cfg]))
        pickers = ",".join(child.wait_ready(self.args.timeout)["picker"] for child in self.pickers)
        self.envoy = self._spawn("envoy", ["envoy", "--pickers", pickers, "--control-plane", control,
                                           "--region", region, "--id", "envoy", "--workdir",
                                           str(self.workdir / "envoy"), *cfg])

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
            self.etcd = LocalEtcd(log_path=self.workdir / "etcd.log")
            self.etcd.start(self.args.timeout)  # raises EtcdFailed, a ChildFailed
            return f"etcd://{self.etcd.endpoint}"
        if store.startswith("etcd://"):
            return store
        raise ChildFailed(f"--store {store!r}: expected memory, etcd or etcd://host:port")

    def _secure(self) -> None:
        """The join token file (mode 0600) and, with ``--tls``, the throw-away CA and certificates."""
        join_path = self.workdir / "join-token"
        join_path.touch(mode=0o600)
        join_path.chmod(0o600)
        join_path.write_text(self.join_token + "\n")
        if self.args.tls:
            if self.args.triton:
                raise ChildFailed("--tls with --triton is not supported: a Triton endpoint serves plain text")
            self.tls_dir = self.workdir / "tls"
            tlsgen.generate(self.tls_dir, ("controlplane", "proxy", "agent", "admin"))

    def tls_section(self) -> dict[str, str]:
        """The ready file's ``tls``: the CA and the operator's client certificate (common name admin)."""
        if self.tls_dir is None:
            return {}
        d = self.tls_dir
        return {"ca": str(d / "ca.pem"), "client_cert": str(d / "admin.pem"), "client_key": str(d / "admin.key")}

    def _transport(self, component: str) -> tuple[list[str], dict[str, str] | None]:
        """Flags (TLS files or --insecure, the join token) and environment of a child."""
        identity = {"controlplane": "controlplane", "proxy": "proxy", "picker": "proxy", "envoy": "proxy",
                    "node": "agent"}[component]
        flags = tlsgen.paths(self.tls_dir, identity) if self.tls_dir is not None else ["--insecure"]
        if component == "controlplane":
            return [*flags, "--join-token-file", str(self.workdir / "join-token")], None
        if component == "node":
            return flags, {"FERRY_JOIN_TOKEN": self.join_token}  # in the environment, not in ps
        return flags, None

    def _spawn(self, name: str, argv: list[str]) -> Child:
        flags, env = self._transport(argv[0])
        child = Child(name, [*argv, *flags], self.workdir, env=env).start()
        self.children.append(child)
        return child

    def describe(self) -> dict[str, Any]:
        assert self.control_plane and self.proxy
        info: dict[str, Any] = {
            "data_plane": self.proxy.ready["grpc"],
            "data_planes": {region: child.ready["grpc"] for region, child in self.proxies.items()},
            "http": self.proxy.ready.get("http", ""),  # the OpenAI-compatible HTTP API (dataplane.api.http)
            # Envoy forwarding OpenAI HTTP and KServe v2 gRPC, its pickers deciding (dataplane.envoy, .epp)
            "envoy": self.envoy.ready.get("http", "") if self.envoy is not None else "",
            "envoy_admin": self.envoy.ready.get("admin", "") if self.envoy is not None else "",
            "pickers": {c.name: c.ready.get("picker", "") for c in self.pickers},
            "http_by_region": {region: child.ready.get("http", "") for region, child in self.proxies.items()},
            "control_plane": self.control_plane.ready["grpc"],
            "control_planes": [cp.ready["grpc"] for cp in self.control_planes],
            "region": self.args.region,
            "models": self.served,  # what the tables route to, not what --models asked for
            "api_keys": self.api_keys,
            "admin_token": self.admin_token,
            "tls": self.tls_section(),
            "workdir": str(self.workdir),
            "pids": {c.name: c.pid for c in self.children} | ({self.etcd.name: self.etcd.pid} if self.etcd else {}),
            "metrics": {c.name: c.ready.get("metrics") for c in self.children},
            "replicas": [r for node in self.nodes for r in node.ready.get("replicas", [])],
            "proxies": {c.name: c.pid for c in [*self.proxies.values(), *self.siblings]},
            "restarts": self.supervisor.restarts if self.supervisor else {},
            "given_up": self.supervisor.given_up if self.supervisor else [],
        }
        if self.metrics_address:
            info["up_metrics"] = self.metrics_address
        if self.traces is not None:
            info["traces"] = self.traces.address
        if self.store != "memory://":
            info["etcd"] = self.store.removeprefix("etcd://")
        return info

    def stop(self) -> None:
        stop_all(self.children)
        if self.etcd is not None:  # after the control planes, which may still write to it as they stop
            self.etcd.close()
        if self.traces is not None:  # after the proxies, which send what they still hold as they stop
            self.traces.stop()
        if self._trace_out is not None:
            self._trace_out.close()


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
        supervisor = None
        if args.supervise:
            supervisor = fleet.supervise(lambda: write_ready_file(args.ready_file, fleet.describe()))
            info = fleet.describe()
        write_ready_file(args.ready_file, info)
        print_summary(info, len(fleet.nodes))
        while not stop:
            if supervisor is not None:
                supervisor.poll()
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
    proxies = len(info.get("proxies", {})) or 1
    what += f", {proxies} {'proxy' if proxies == 1 else 'proxies'}"
    print(f"ferry up: {what}, {nodes} nodes, {len(info['replicas'])} replicas ({models}) "
          f"in region {info['region']}")
    print(f"  data plane     {info['data_plane']}")
    print(f"  HTTP API       http://{info['http']}/v1")
    if info.get("envoy"):
        print(f"  Envoy          http://{info['envoy']}/v1 (OpenAI HTTP) and {info['envoy']} (KServe v2 gRPC), "
              f"{len(info['pickers'])} pickers deciding")
    print(f"  control plane  {', '.join(planes)}")
    if "etcd" in info:
        print(f"  etcd           {info['etcd']}")
    for tenant, key in info["api_keys"].items():
        print(f"  api key        {tenant}: {key}")
    print(f"  admin token    {info['admin_token']} (ferryctl --ready-file finds it there too)")
    if info.get("tls"):
        print(f"  tls            CA {info['tls']['ca']}, operator certificate {info['tls']['client_cert']}")
    if "up_metrics" in info:
        print(f"  supervision    children restarted on exit; ferry_up_restarts_total at "
              f"http://{info['up_metrics']}/metrics")
    if "traces" in info:
        print(f"  traces         every request's spans printed as a tree (OTLP received at {info['traces']})")
    print("  Ctrl-C stops everything.", flush=True)
