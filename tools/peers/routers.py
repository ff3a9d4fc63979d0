"""Start and stop the routers compared (Ferry and the peer routers) and their fresh simulated replicas.

- :class:`Replicas`: ``python -m tools.peers.replicas --count N --model M``
  (one process, N replicas, each with a KServe v2 gRPC face, an HTTP face and
  a Prometheus ``/metrics``), started afresh for every router so that every
  router meets empty prefix caches; :meth:`Replicas.counters` sums each
  replica's prefix-hit and lookup blocks and its successful and failed
  requests from its metrics.
- :func:`start_ferry`: ``ferry up --replicas 0 --triton GRPC,METRICS`` once
  per replica (an agent beside each external replica), one control plane,
  one proxy, ``--models chat``; waits for its ready file (``ferry up``
  writes it once every agent's replica is in the table and the proxy applied
  it) and checks with ``ferryctl --json replicas`` that all N are in the
  table. CPU roles: ``proxy``, ``controlplane``, ``agents`` (the N agent
  processes) and ``launcher`` (``ferry up`` itself). This is the Python
  relay (label ``ferry``, also ``ferry:relay``), run with ``--pickers 0``.
- :func:`start_ferry_envoy` (``ferry:envoy``): Ferry's native data path,
  Envoy forwarding OpenAI HTTP straight to the replicas' HTTP faces, its two
  endpoint pickers deciding each request over ``ext_proc``. ``ferry up
  --replicas 0 --pickers 2`` (control plane, pickers, Envoy; the relay proxy
  idles beside them) with the relay's ``--triton`` adoption of every replica
  plus its HTTP face (``--triton GRPC,METRICS,HTTP``), so both paths see the
  same replicas and telemetry. Waits for the table to list all N and for
  Envoy to answer a completion. The load is the peers'
  (:class:`load.HttpTarget`), with the enterprise tenant's key and tier
  ``interactive``. CPU roles: ``envoy`` (the Envoy
  binary, found from the ``ferry envoy`` wrapper's ready file or its
  children), ``picker-1``, ``picker-2``, ``envoy_wrapper`` (the ``ferry
  envoy`` process alone: it watches the table), ``proxy`` (idle),
  ``controlplane``, ``agents`` and ``launcher``. The data path is
  ``envoy`` + the pickers. The relay (``ferry``) runs with ``--pickers 0``.
- :func:`start_peer`: the peer router's own binary from its virtual
  environment under ``.venv-peers/`` (``sglang-router launch`` of
  sglang-router 0.3.2, ``vllm-router`` of vllm-router 0.1.17), bound to
  127.0.0.1 with its Prometheus endpoint on 127.0.0.1 too, the replicas'
  HTTP faces as workers, ``--worker-startup-check-interval 1`` (the default
  30 s only delays the start) and otherwise the defaults as shipped (retries,
  circuit breaker, log level). Waits for ``/health`` to answer 200 and the
  router's worker list to hold all N. CPU role: ``router`` (its process
  tree).
- :func:`ensure_peer`: creates the peer's virtual environment and installs its
  pinned package when missing (``python -m venv``, then ``pip install``).
  If another process is installing into it, waits for that install to end;
  a lock file keeps two benchmarks from installing at once.

Cost: starting is bounded by ``timeout`` per step; nothing here runs during a
measured replay.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agent.scrape import Samples, parse
from tools.peers import load
from tools.peers.procs import Proc, ProcFailed, free_port, http_get, wait_http, wait_json

ROOT = Path(__file__).resolve().parents[2]
PEER_VENVS = ROOT / ".venv-peers"
MODEL = "chat"


@dataclasses.dataclass(frozen=True)
class PeerPackage:
    """A peer router as installed: its pinned package, its command, its policies and how to list its workers."""

    requirement: str
    binary: str
    argv_prefix: tuple[str, ...]
    policies: tuple[str, ...]
    workers_path: str


PEERS = {
    "sglang": PeerPackage("sglang-router==0.3.2", "sglang-router", ("launch",),
                          ("cache_aware", "round_robin", "random", "power_of_two"), "/workers"),
    "vllm": PeerPackage("vllm-router==0.1.17", "vllm-router", (),
                        ("cache_aware", "consistent_hash", "round_robin", "random", "power_of_two"), "/list_workers"),
}


@dataclasses.dataclass(frozen=True)
class RouterSpec:
    """``ferry`` (the Python relay), ``ferry:envoy`` (Envoy and its pickers) or ``PEER:POLICY``."""

    kind: str
    policy: str = ""

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.policy}" if self.policy else self.kind


def parse_routers(text: str) -> list[RouterSpec]:
    """``ferry,sglang:cache_aware,…`` to specs; ValueError naming the first unknown one."""
    out = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        kind, _, policy = item.partition(":")
        if kind == "ferry" and policy in ("", "relay"):
            out.append(RouterSpec("ferry"))
        elif kind == "ferry" and policy == "envoy":
            out.append(RouterSpec("ferry", "envoy"))
        elif kind in PEERS and policy in PEERS[kind].policies:
            out.append(RouterSpec(kind, policy))
        else:
            known = ", ".join(["ferry", "ferry:envoy", *(f"{k}:{p}" for k, v in PEERS.items() for p in v.policies)])
            raise ValueError(f"unknown router {item!r}; known: {known}")
    if not out:
        raise ValueError("no router given")
    return out


# -- replicas ---------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class ReplicaCounters:
    """One replica's counters at one moment."""

    hit_blocks: float = 0.0
    lookup_blocks: float = 0.0
    success: float = 0.0
    failure: float = 0.0


class Replicas:
    """N simulated replicas in one process (``tools.peers.replicas``)."""

    def __init__(self, count: int, workdir: Path, *, engine: list[str], model: str = MODEL,
                 timeout: float = 120.0) -> None:
        self.count, self.workdir, self.engine, self.model, self.timeout = count, workdir, engine, model, timeout
        self.proc: Proc | None = None
        self.info: dict[str, Any] = {}

    def start(self) -> Replicas:
        ready = self.workdir / "replicas.ready.json"
        ready.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "tools.peers.replicas", "--count", str(self.count), "--model", self.model,
                "--ready-file", str(ready)]
        for item in self.engine:
            argv += ["--engine", item]
        self.proc = Proc("replicas", argv, self.workdir / "replicas.log", cwd=ROOT,
                         env={"GRPC_VERBOSITY": "ERROR"}).start()
        self.info = wait_json(ready, self.proc, self.timeout)
        if len(self.replicas) != self.count:
            raise ProcFailed(f"replicas: asked for {self.count}, the ready file lists {len(self.replicas)}")
        return self

    @property
    def replicas(self) -> list[dict[str, str]]:
        reps: list[dict[str, str]] = self.info.get("replicas", [])
        return reps

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise ProcFailed("replicas were not started")
        return self.proc.pid

    def counters(self) -> list[ReplicaCounters]:
        """Each replica's counters now, in ready-file order; ProcFailed if one does not answer."""
        out = []
        for rep in self.replicas:
            status, text = http_get(rep["metrics"], timeout=10.0)
            if status != 200:
                raise ProcFailed(f"replica {rep.get('id')}: {rep['metrics']} answered {status}: {text[:200]}")
            out.append(counters(Samples(parse(text))))
        return out

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


def counters(samples: Samples) -> ReplicaCounters:
    """Sums over every label set of the counters a replica exports."""
    def total(name: str) -> float:
        return float(sum(s.value for s in samples.all(name)))
    return ReplicaCounters(hit_blocks=total("ferry_replica_prefix_hit_blocks_total"),
                           lookup_blocks=total("ferry_replica_prefix_lookup_blocks_total"),
                           success=total("nv_inference_request_success"),
                           failure=total("nv_inference_request_failure"))


# -- routers ----------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Running:
    """A router serving: what to send requests to, its processes by role, how to stop it."""

    spec: RouterSpec
    proc: Proc
    make_target: Any                       # () -> load.Target, a fresh client for each replay
    roles: dict[str, list[int]]            # CPU roles: root pids (each counted with its descendants)
    solo: dict[str, int] = dataclasses.field(default_factory=dict)  # roles counted without descendants
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    extra: list[Proc] = dataclasses.field(default_factory=list)  # started beside it, stopped first
    data_path: tuple[str, ...] = ()        # the roles every request crosses (the router's own CPU)

    def target(self) -> load.Target:
        made: load.Target = self.make_target()
        return made

    def stop(self) -> int | None:
        for proc in self.extra:
            proc.stop()
        return self.proc.stop()


def start_router(spec: RouterSpec, replicas: Replicas, workdir: Path, *, timeout: float = 120.0,
                 ferry_config: str | None = None) -> Running:
    """Start one router in front of ``replicas``; ProcFailed (with its log's tail) if it does not come up."""
    workdir.mkdir(parents=True, exist_ok=True)
    if spec.kind == "ferry" and spec.policy == "envoy":
        return start_ferry_envoy(replicas, workdir, timeout=timeout, config=ferry_config)
    if spec.kind == "ferry":
        return start_ferry(replicas, workdir, timeout=timeout, config=ferry_config)
    return start_peer(spec, replicas, workdir, timeout=timeout)


def _ferry_up(replicas: Replicas, workdir: Path, *, pickers: int, timeout: float,
              config: str | None) -> tuple[Proc, dict[str, Any]]:
    """``ferry up`` adopting every replica by its KServe v2 address and metrics (``--triton``), and, with
    pickers, its OpenAI HTTP face too (the same telemetry whichever path serves); waits for the table."""
    ready = workdir / "up.json"
    ready.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "ferry", "up", "--replicas", "0", "--models", replicas.model,
            "--ready-file", str(ready), "--workdir", str(workdir / "up"), "--timeout", str(timeout),
            "--pickers", str(pickers)]
    if config:
        argv += ["--config", config]
    for rep in replicas.replicas:
        argv += ["--triton", f"{rep['grpc']},{rep['metrics']}" + (f",{rep['http']}" if pickers else "")]
    proc = Proc("ferry-envoy" if pickers else "ferry", argv, workdir / "ferry-up.log", cwd=ROOT,
                env={"GRPC_VERBOSITY": "ERROR"}).start()
    try:
        info = wait_json(ready, proc, timeout + 30)
        _wait_ferry_table(ready, replicas.count, proc, timeout)
    except BaseException:
        proc.stop()
        raise
    return proc, info


def start_ferry(replicas: Replicas, workdir: Path, *, timeout: float = 120.0, config: str | None = None) -> Running:
    proc, info = _ferry_up(replicas, workdir, pickers=0, timeout=timeout, config=config)
    pids: dict[str, int] = info.get("pids", {})
    roles = {"proxy": [pids["proxy"]], "controlplane": [pids["controlplane"]],
             "agents": [pid for name, pid in pids.items() if name.startswith("triton-")]}
    key = (info.get("api_keys") or {}).get("enterprise-1") or next(iter((info.get("api_keys") or {}).values()))
    model = (info.get("models") or [replicas.model])[0]
    address = info["data_plane"]
    return Running(RouterSpec("ferry"), proc, lambda: load.GrpcTarget(address, api_key=key, model=model), roles,
                   solo={"launcher": proc.pid}, data_path=("proxy",),
                   info={"data_plane": address, "metrics": f"http://{info['metrics']['proxy']}/metrics"})


def start_ferry_envoy(replicas: Replicas, workdir: Path, *, timeout: float = 120.0,
                      config: str | None = None) -> Running:
    """``ferry up`` with Envoy and two pickers over the replicas the relay adopts, with their HTTP faces."""
    proc, info = _ferry_up(replicas, workdir, pickers=2, timeout=timeout, config=config)
    up_dir = workdir / "up"
    try:
        if not info.get("envoy"):
            raise ProcFailed(f"ferry up started no Envoy (ready file {workdir / 'up.json'}); log {proc.log}")
        pids: dict[str, int] = info.get("pids", {})
        envoy_pid = envoy_binary_pid(pids["envoy"], up_dir)
        pickers = sorted(name for name in pids if name.startswith("picker-"))
        roles = {"envoy": [envoy_pid], **{name: [pids[name]] for name in pickers},
                 "proxy": [pids["proxy"]], "controlplane": [pids["controlplane"]],
                 "agents": [pid for name, pid in pids.items() if name.startswith("triton-")]}
        key = (info.get("api_keys") or {}).get("enterprise-1") or next(iter((info.get("api_keys") or {}).values()))
        base = f"http://{info['envoy']}"
        headers = {"Authorization": f"Bearer {key}", "x-ferry-tier": "interactive"}
        metrics = [f"http://{info['metrics'][name]}/metrics" for name in pickers if info["metrics"].get(name)]
        running = Running(RouterSpec("ferry", "envoy"), proc,
                          lambda: load.HttpTarget(base, model=replicas.model, headers=headers),
                          roles, solo={"envoy_wrapper": pids["envoy"], "launcher": proc.pid},
                          data_path=("envoy", *pickers),
                          info={"url": base, "metrics": metrics, "envoy_admin": info.get("envoy_admin", ""),
                                "envoy_pid": envoy_pid, "pickers": info.get("pickers", {})})
        _wait_completion(base, headers, replicas.model, proc, timeout)
    except BaseException:
        proc.stop()
        raise
    return running


def envoy_binary_pid(wrapper: int, workdir: Path) -> int:
    """The Envoy binary's pid: ``envoy_pid`` of the wrapper's ready file, else the wrapper's child named envoy."""
    for path in (workdir / "envoy.ready.json", workdir / "envoy" / "envoy.ready.json"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(json.loads(path.read_text()).get("envoy_pid") or 0)
            if pid:
                return pid
    for task in Path(f"/proc/{wrapper}/task").glob("*"):
        with contextlib.suppress(OSError, ValueError):
            for child in (task / "children").read_text().split():
                if "envoy" in Path(f"/proc/{child}/comm").read_text():
                    return int(child)
    raise ProcFailed(f"no Envoy binary under the ferry envoy process {wrapper}")


def _wait_completion(base: str, headers: dict[str, str], model: str, proc: Proc, timeout: float) -> None:
    """Until Envoy answers a one-token completion with 200 (its endpoints and the pickers' tables are in)."""
    body = json.dumps({"model": model, "prompt": "ready?", "max_tokens": 1}).encode()
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        request = urllib.request.Request(f"{base}/v1/completions", data=body, method="POST",
                                         headers={**headers, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10.0) as answer:
                if answer.status == 200:
                    return
                last = str(answer.status)
        except urllib.error.HTTPError as exc:
            last = f"{exc.code}: {exc.read()[:200]!r}"
        except OSError as exc:
            last = str(exc)
        proc.check()
        time.sleep(0.5)
    raise ProcFailed(f"ferry:envoy: no completion through Envoy in {timeout:.0f} s (last {last}); log {proc.log}")


def proxy_counters(running: Running) -> dict[str, dict[str, float]]:
    """Ferry's proxy counters that explain a run: picks by branch, ejections by reason, summed over the
    proxy or the pickers (empty for a peer)."""
    urls = running.info.get("metrics")
    if not urls:
        return {}
    if running.spec.kind != "ferry":
        return {}
    text = ""
    for url in ([urls] if isinstance(urls, str) else urls):
        status, body = http_get(str(url), timeout=10.0)
        if status == 200:
            text += body + "\n"
    if not text:
        return {}
    out: dict[str, dict[str, float]] = {"picks": {}, "ejections": {}}
    for line in text.splitlines():
        for family, label, into in (("ferry_proxy_picks_total{", "branch", "picks"),
                                    ("ferry_proxy_outlier_ejections_total{", "reason", "ejections")):
            if line.startswith(family):
                labels, value = line[len(family):].rsplit("} ", 1)
                name = dict(part.split("=", 1) for part in labels.split(",")).get(label, "").strip('"')
                out[into][name] = out[into].get(name, 0.0) + float(value)
    return out


def _wait_ferry_table(ready: Path, count: int, proc: Proc, timeout: float) -> None:
    """Poll ``ferryctl --json replicas`` until ``count`` replicas are in the table."""
    ctl = Path(sys.executable).with_name("ferryctl")
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        proc.check()
        done = subprocess.run([str(ctl), "--ready-file", str(ready), "--json", "replicas"], capture_output=True,
                              text=True, timeout=30, check=False, cwd=ROOT)
        if done.returncode == 0:
            rows = json.loads(done.stdout or "[]")
            in_table = sum(1 for r in rows if r.get("in_table"))
            if in_table >= count:
                return
            last = f"{in_table}/{count} replicas in the table"
        else:
            last = done.stderr.strip()[-300:]
        time.sleep(0.5)
    raise ProcFailed(f"ferry: replicas not all in the table after {timeout:.0f} s ({last}); log {proc.log}")


def start_peer(spec: RouterSpec, replicas: Replicas, workdir: Path, *, timeout: float = 120.0) -> Running:
    package = PEERS[spec.kind]
    binary = ensure_peer(spec.kind)
    port, metrics_port = free_port(), free_port()
    urls = [rep["http"] for rep in replicas.replicas]
    argv = [str(binary), *package.argv_prefix, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls,
            "--policy", spec.policy, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
            "--worker-startup-check-interval", "1"]
    proc = Proc(spec.label, argv, workdir / f"{spec.kind}-{spec.policy}.log", cwd=workdir).start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/health", proc, timeout)
        _wait_workers(f"{base}{package.workers_path}", urls, proc, timeout)
    except BaseException:
        proc.stop()
        raise
    return Running(spec, proc, lambda: load.HttpTarget(base, model=replicas.model), {"router": [proc.pid]},
                   data_path=("router",),
                   info={"url": base, "metrics": f"http://127.0.0.1:{metrics_port}/metrics", "argv": argv[1:]})


def _wait_workers(url: str, workers: list[str], proc: Proc, timeout: float) -> None:
    """Poll the router's worker list until every worker URL is in it."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        status, body = http_get(url, timeout=2.0)
        if status == 200:
            try:
                listed = {u.rstrip("/") for u in _urls(json.loads(body))}
            except ValueError:
                listed = set()
            missing = [w for w in workers if w.rstrip("/") not in listed]
            if not missing:
                return
            last = f"missing {len(missing)} of {len(workers)}"
        else:
            last = f"{status}: {body[:200]}"
        proc.check()
        time.sleep(0.2)
    raise ProcFailed(f"{proc.name}: workers not all registered after {timeout:.0f} s ({last}); log {proc.log}:\n"
                     f"{proc.tail()}")


def _urls(data: Any) -> list[str]:
    """Every string in a JSON document that looks like an HTTP URL (the routers' worker lists differ in shape)."""
    if isinstance(data, str):
        return [data] if data.startswith("http") else []
    if isinstance(data, dict):
        return [u for v in data.values() for u in _urls(v)]
    if isinstance(data, list):
        return [u for v in data for u in _urls(v)]
    return []


# -- peer environments ------------------------------------------------------------------------------------------------

def peer_binary(kind: str, root: Path = PEER_VENVS) -> Path:
    return root / kind / "bin" / PEERS[kind].binary


def installing(venv: Path) -> bool:
    """Whether a pip process is installing into ``venv`` (its command line names the environment)."""
    marks = (str(venv.resolve()) + "/", f"{venv.parent.name}/{venv.name}/")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if "pip" in cmdline and any(mark in cmdline for mark in marks):
            return True
    return False


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_peer(kind: str, root: Path = PEER_VENVS, *, wait: float = 1800.0) -> Path:
    """The peer's command, installing its environment first if needed (see the module docstring)."""
    venv, binary = root / kind, peer_binary(kind, root)
    deadline = time.monotonic() + wait
    with _locked(root / f".{kind}.lock"):
        while installing(venv):
            if time.monotonic() > deadline:
                raise ProcFailed(f"{venv}: another install still running after {wait:.0f} s")
            print(f"bench_peers: waiting for the install running in {venv}", file=sys.stderr, flush=True)
            time.sleep(10)
        if binary.exists():
            return binary
        print(f"bench_peers: installing {PEERS[kind].requirement} into {venv}", file=sys.stderr, flush=True)
        python = venv / "bin" / "python"
        if not python.exists():
            base = getattr(sys, "_base_executable", sys.executable)
            subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=300)
        env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", PEERS[kind].requirement], env=env,
                              capture_output=True, text=True, timeout=max(60.0, deadline - time.monotonic()),
                              check=False)
        if done.returncode != 0 or not binary.exists():
            raise ProcFailed(f"installing {PEERS[kind].requirement} into {venv} failed ({done.returncode}):\n"
                             f"{done.stderr[-2000:]}")
    return binary

