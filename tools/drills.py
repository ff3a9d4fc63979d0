"""Failure drills against ``ferry up`` processes under load: each scenario injures the fleet and measures.

``python -m tools.drills [--scenario NAME ...] [--seconds S] [--rate R]`` runs
each scenario on a fresh ``ferry up`` (real processes on loopback, in a
temporary workdir), drives it with :class:`Load` for ``S`` seconds (default
20) at ``R`` requests per second (default 20), injures it a third of the way
in, and writes every scenario's figures to ``bench-results/drills.json``.
Bounded: at most ``S × R`` requests per scenario, each with a 10 s deadline,
and a 90 s start; it stops by itself. ``tests/drills/`` runs the same
scenarios under ``pytest -m drills`` and asserts their :func:`verdict`.

The load is mixed: requests cycle over the three tiers (interactive with the
enterprise key, standard and batch with the paid key) and alternate unary
``Infer`` with server-streamed ``InferStream``, over 4 channels to the one
data-plane address. The client behaves as a service is told to: every call
waits for a connection (``wait_for_ready``) and one that fails with
UNAVAILABLE before any output is tried again once, with the same idempotency
key (a stream only if it delivered nothing); ``failed`` counts the final
outcome, ``first_failed`` the failures a client without that retry would have
seen.

Scenarios (``SCENARIOS``): ``baseline``; ``node_kill`` (SIGKILL a node);
``leader_kill`` (SIGKILL the leading control plane of two on etcd; figures:
when a new leader answered); ``etcd_stop`` (SIGSTOP etcd 10 s, then
SIGCONT); ``etcd_kill`` (SIGKILL etcd; ``ferry up`` restarts it on its data
dir; figures: when its new pid was in the ready file); ``proxy_kill``
(SIGKILL one of two proxies behind one address). Each expects zero failed
requests in every tier. Figures per scenario: per tier ``failed``/``total``,
``first_failed``, p50 and p99 latency of the successes (seconds), the
recovery time, and the proxies' peak RSS (bytes, ``/proc/PID/status``).

``--path envoy|relay`` chooses the door of a scenario that has both:
``unread_streams`` drives Envoy by default (``ferry up``'s ``envoy``
address, OpenAI ``POST /v1/completions`` over HTTP/1.1, :class:`HttpLoad`:
the same tiers, keys and unary/streamed mix, tier in ``x-ferry-tier``, a
request that fails with no output, a 503 or a broken connection, tried
again once), its 200 unread streams are HTTP streams whose sockets are
never read, and its slots count as freed once both pickers'
``ferry_proxy_inflight`` gauges are back to 0 (and the replicas idle). The
other scenarios drive the Python relay (gRPC) only.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from ferry.procs import Child, cpu_seconds
from ferry.v1 import admin_pb2, common_pb2, fleet_pb2, fleet_pb2_grpc, inference_pb2, inference_pb2_grpc
from ferry_cli.ctl.client import AdminClient
from tools.peers.routers import envoy_binary_pid

TIERS = (("interactive", common_pb2.TIER_INTERACTIVE, "enterprise-1"),
         ("standard", common_pb2.TIER_STANDARD, "paid-1"),
         ("batch", common_pb2.TIER_BATCH, "paid-1"))
DEADLINE_SECONDS = 10.0
LEADER_SECONDS = 5.0  # target: a new leader, and its table applied by a proxy, within this of the kill
P99_RATIO = 1.2  # target: normal requests' p99 with 200 unread streams within this factor of the p99 without


@dataclass
class Outcome:
    """One request of the load: its tier, kind, result and latency (seconds)."""

    tier: str
    kind: str
    ok: bool
    first_ok: bool
    code: str
    first_code: str
    seconds: float
    started: float


class Load:
    """Mixed unary and streaming requests over three tiers at ``rate`` per second to one address, bounded."""

    ADDRESS = "data_plane"  # the ready file's key of the address it loads

    def __init__(self, ready: dict[str, Any], rate: float = 20.0, channels: int = 4, model: str = "chat-small",
                 max_tokens: int = 4) -> None:
        self.max_tokens = max_tokens
        self.address = ready[self.ADDRESS]
        self.keys = ready["api_keys"]
        self.rate = rate
        self.model = model
        self._channels = self._connect(channels)
        self._stubs = [inference_pb2_grpc.InferenceStub(c) for c in self._channels]
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()

    def _connect(self, channels: int) -> list[grpc.Channel]:
        """``channels`` gRPC connections to the address, spread over the proxies behind it."""
        return [grpc.insecure_channel(self.address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(channels)]

    def _call(self, n: int) -> None:
        name, tier, tenant = TIERS[n % len(TIERS)]
        kind = "stream" if (n // len(TIERS)) % 2 else "unary"
        stub = self._stubs[n % len(self._stubs)]
        request = inference_pb2.InferRequest(model=self.model, tier=tier, prompt=f"drill {n % 50} hello",
                                             max_tokens=self.max_tokens, idempotency_key=uuid.uuid4().hex)
        metadata = (("x-api-key", self.keys[tenant]),)
        started = time.monotonic()
        deadline = started + DEADLINE_SECONDS
        first_ok, ok, code, first_code = False, False, "OK", "OK"
        for attempt in range(2):
            delivered = 0
            try:
                remaining = max(0.1, deadline - time.monotonic())
                if kind == "unary":
                    stub.Infer(request, metadata=metadata, timeout=remaining, wait_for_ready=True)
                else:
                    for _ in stub.InferStream(request, metadata=metadata, timeout=remaining, wait_for_ready=True):
                        delivered += 1
                ok, code = True, "OK"
            except grpc.RpcError as exc:
                code = exc.code().name
                if attempt == 0:
                    first_code = code
                if code == "UNAVAILABLE" and delivered == 0 and attempt == 0:
                    continue
            if attempt == 0:
                first_ok = ok
            break
        with self._lock:
            self.outcomes.append(Outcome(name, kind, ok, first_ok, code, first_code, time.monotonic() - started,
                                         started))

    def run(self, seconds: float, during: Callable[[], None] | None = None, at: float = 0.33) -> None:
        """Send ``seconds × rate`` requests evenly; call ``during`` (in a thread) after ``at`` of the run."""
        total = int(seconds * self.rate)
        start = time.monotonic()
        injury: threading.Thread | None = None
        with ThreadPoolExecutor(max_workers=64) as pool:
            for n in range(total):
                time.sleep(max(0.0, start + n / self.rate - time.monotonic()))
                if during is not None and injury is None and n >= total * at:
                    injury = threading.Thread(target=during, daemon=True)
                    injury.start()
                pool.submit(self._call, n)
        if injury is not None:
            injury.join(60)
        for channel in self._channels:
            channel.close()

    def figures(self, injured_at: float | None = None) -> dict[str, Any]:
        """Per tier: failed, first_failed, total, p50 and p99 seconds of the successes, codes of the failures;
        with ``injured_at`` (monotonic) also ``in_flight_failed``: failures of requests started before it."""
        out: dict[str, Any] = {}
        for name, _, _ in TIERS:
            rows = [o for o in self.outcomes if o.tier == name]
            times = sorted(o.seconds for o in rows if o.ok)
            out[name] = {"total": len(rows), "failed": sum(not o.ok for o in rows),
                         "first_failed": sum(not o.first_ok for o in rows),
                         "p50": _quantile(times, 0.5), "p99": _quantile(times, 0.99),
                         "codes": sorted({o.code for o in rows if not o.ok}),
                         "first_codes": sorted({f"{o.kind}:{o.first_code}" for o in rows if not o.first_ok})}
            if injured_at is not None:
                out[name]["in_flight_failed"] = sum(not o.ok and o.started < injured_at for o in rows)
        return out


class HttpLoad(Load):
    """:class:`Load` through Envoy: OpenAI ``/v1/completions`` over HTTP/1.1, unary and streamed (``stream``)."""

    ADDRESS = "envoy"

    def _connect(self, channels: int) -> list[grpc.Channel]:
        return []  # one HTTP connection per request (_once)

    def _once(self, n: int, tier: str, tenant: str, stream: bool, remaining: float) -> tuple[str, int]:
        """One attempt: (code, bytes of output seen); code ``OK``, ``HTTP <status>``, ``CONNECTION`` or
        ``INCOMPLETE``."""
        host, _, port = self.address.rpartition(":")
        body = json.dumps({"model": self.model, "prompt": f"drill {n % 50} hello", "max_tokens": self.max_tokens,
                           "stream": stream}).encode()
        conn = http.client.HTTPConnection(host, int(port), timeout=remaining)
        try:
            conn.request("POST", "/v1/completions", body, {
                "Content-Type": "application/json", "Authorization": f"Bearer {self.keys[tenant]}",
                "x-ferry-tier": tier, "Idempotency-Key": uuid.uuid4().hex})
            answer = conn.getresponse()
            data = answer.read()
            if answer.status != 200:
                return f"HTTP {answer.status}", 0
            if stream and b"[DONE]" not in data:
                return "INCOMPLETE", len(data)
            return "OK", len(data)
        except (OSError, http.client.HTTPException):
            return "CONNECTION", 0
        finally:
            conn.close()

    def _call(self, n: int) -> None:
        name, _, tenant = TIERS[n % len(TIERS)]
        kind = "stream" if (n // len(TIERS)) % 2 else "unary"
        started = time.monotonic()
        deadline = started + DEADLINE_SECONDS
        first_ok, ok, code, first_code = False, False, "OK", "OK"
        for attempt in range(2):
            code, seen = self._once(n, name, tenant, kind == "stream", max(0.1, deadline - time.monotonic()))
            ok = code == "OK"
            if attempt == 0:
                first_ok, first_code = ok, code
            if ok or seen or code not in ("CONNECTION", "HTTP 503"):
                break
        with self._lock:
            self.outcomes.append(Outcome(name, kind, ok, first_ok, code, first_code, time.monotonic() - started,
                                         started))


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, int(q * len(values)))], 4)


def rss_bytes(pid: int) -> int:
    """The resident set size of ``pid`` (``VmRSS``), 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def read_ready(child: Child) -> dict[str, Any]:
    return child.check_ready() or {}


def wait_until(predicate: Callable[[], Any], timeout: float) -> float | None:
    """Seconds until ``predicate`` is truthy (polled every 20 ms), or None after ``timeout``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return round(time.monotonic() - start, 3)
        time.sleep(0.02)
    return None


@dataclass
class Scenario:
    """A drill: the ``ferry up`` flags it needs, and the injury (it returns its recovery figures)."""

    name: str
    flags: list[str]
    injure: Callable[[Child, dict[str, Any]], dict[str, Any]] | None
    max_tokens: int = 4
    in_flight_may_fail: bool = False  # the injury kills what holds the client's connection
    drive: Callable[[Child, dict[str, Any], float, float], dict[str, Any]] | None = None  # its own load, if any
    drive_envoy: Callable[[Child, dict[str, Any], float, float], dict[str, Any]] | None = None  # the same, via Envoy

def _kill_pid_and_wait_restart(up: Child, component: str) -> dict[str, Any]:
    old = read_ready(up)["pids"][component]
    killed = time.monotonic()
    os.kill(old, signal.SIGKILL)
    seconds = wait_until(lambda: read_ready(up).get("pids", {}).get(component, old) != old, 30)
    return {"killed": component, "restarted_after_seconds": seconds,
            "restarts": read_ready(up).get("restarts", {}).get(component), "at": killed}


def _connections(pid: int, port: str) -> int:
    """Established connections ``pid`` holds on local port ``port`` (``ss``; 0 when ss is missing)."""
    try:
        out = subprocess.run(["ss", "-Htnp", "state", "established", "sport", "=", f":{port}"],
                             capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(f"pid={pid}," in line for line in out.splitlines())


def _proxy_kill(up: Child, ready: dict[str, Any]) -> dict[str, Any]:
    port = ready["data_plane"].rpartition(":")[2]
    pid = ready["pids"]["proxy-1"]
    held = _connections(pid, port)
    return {"client_connections_on_killed": held, **_kill_pid_and_wait_restart(up, "proxy-1")}


def _leader(ready: dict[str, Any]) -> str:
    """The id of the control plane that answers as the leader itself (role ``leader``), or ``""``."""
    for address in ready["control_planes"]:
        try:
            with grpc.insecure_channel(address) as channel:
                status = AdminClient(channel, ready["admin_token"]).GetStatus(admin_pb2.GetStatusRequest(), timeout=2)
                if status.role == "leader":
                    return str(status.control_plane_id)
        except grpc.RpcError:
            continue
    return ""


def _leader_kill(up: Child, ready: dict[str, Any]) -> dict[str, Any]:
    """SIGKILL the leader; recovered once a live process answers as leader (another one, or it restarted)."""
    leader_id = _leader(ready)
    old = ready["pids"][leader_id]
    os.kill(old, signal.SIGKILL)

    def led() -> str:
        now = _leader(ready)
        return now if now and (now != leader_id or read_ready(up).get("pids", {}).get(now) != old) else ""

    killed = time.monotonic()
    seconds = wait_until(led, 30)
    table = wait_until(lambda: _table_served(ready, led(), len(ready["replicas"])), 30) if seconds is not None else None
    return {"killed": leader_id, "new_leader_after_seconds": seconds, "new_leader": _leader(ready),
            "table_after_seconds": None if table is None else round(time.monotonic() - killed, 3)}


def _table_served(ready: dict[str, Any], leader_id: str, replicas: int) -> bool:
    """Whether ``leader_id``'s table holds every replica and a proxy (watching any control plane) applied it."""
    if not leader_id:
        return False
    statuses = {}
    for address in ready["control_planes"]:
        try:
            with grpc.insecure_channel(address) as channel:
                status = AdminClient(channel, ready["admin_token"]).GetStatus(admin_pb2.GetStatusRequest(), timeout=2)
                statuses[status.control_plane_id] = status
        except grpc.RpcError:
            continue
    if leader_id not in statuses:
        return False
    versions = {t.region: (t.version, t.replicas) for t in statuses[leader_id].regions}
    return any(versions.get(p.region, (0, 0)) == (p.applied_version, replicas) and p.connected
               for status in statuses.values() for p in status.proxies)


def _etcd_stop(up: Child, ready: dict[str, Any]) -> dict[str, Any]:
    pid = ready["pids"]["etcd"]
    os.kill(pid, signal.SIGSTOP)
    time.sleep(10)  # the injury itself lasts 10 s
    os.kill(pid, signal.SIGCONT)
    return {"stopped": "etcd", "stopped_seconds": 10}


def _admin(ready: dict[str, Any]) -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(ready["control_plane"])
    return channel, AdminClient(channel, ready["admin_token"])


def _replicas(ready: dict[str, Any]) -> dict[str, Any]:
    channel, admin = _admin(ready)
    with channel:
        return {r.replica_id: r for r in admin.ListReplicas(admin_pb2.ListReplicasRequest(), timeout=5).replicas}


def _fake_agent(up: Child, ready: dict[str, Any]) -> dict[str, Any]:
    """Register a node ``intruder`` with the join token that claims a live replica at a dead address."""
    token = (Path(ready["workdir"]) / "join-token").read_text().strip()
    before = _replicas(ready)
    victim = next(r for r in before.values() if r.in_table)
    claim = fleet_pb2.ReplicaInfo(replica_id=victim.replica_id, model=victim.model, version=victim.version,
                                  address="127.0.0.1:1", kserve_model=victim.model, gpus=1, max_concurrency=8,
                                  kv_block_tokens=16, max_context_tokens=4096, state=common_pb2.REPLICA_STATE_READY)
    register = fleet_pb2.AgentMessage(register=fleet_pb2.Register(
        node="intruder", region=ready["region"], gpus=1, replicas=[claim], agent_version="drill", join_token=token))
    hold = threading.Event()

    def messages() -> Any:
        yield register
        hold.wait(5)

    figures: dict[str, Any] = {"claimed": victim.replica_id}
    with grpc.insecure_channel(ready["control_plane"]) as channel:
        call = fleet_pb2_grpc.FleetStub(channel).Connect(messages(), timeout=5)
        try:
            first = next(call)
            figures.update(refused=False, answer=first.WhichOneof("body"))
        except grpc.RpcError as exc:
            figures.update(refused=True, code=exc.code().name, details=exc.details())
        except StopIteration:
            figures.update(refused=True, code="OK", details="stream ended")
        time.sleep(2.0)  # a few table ticks (0.5 s) for a claim that was taken to show
        after = _replicas(ready).get(victim.replica_id)
        hold.set()
        call.cancel()
    details = str(figures.get("details", ""))
    figures["field_named"] = "replica" in details and "replica_id" in details
    figures["table_unchanged"] = (after is not None and after.node == victim.node and after.address == victim.address
                                  and after.in_table)
    return figures


def _halves(alone: Load, loaded: Load) -> tuple[dict[str, Any], float | None, float | None, float | None]:
    """The two halves of an unread-streams run: per-tier figures of both, and the p99 of the normal requests
    without and with the unread streams, and their ratio (None when a half answered nothing)."""
    fig_alone, fig_loaded = alone.figures(), loaded.figures()
    tiers = {t: {**fig_loaded[t], "total": fig_loaded[t]["total"] + fig_alone[t]["total"],
                 "failed": fig_loaded[t]["failed"] + fig_alone[t]["failed"]} for t in fig_loaded}
    p99_alone = _quantile(sorted(o.seconds for o in alone.outcomes if o.ok), 0.99)
    p99_loaded = _quantile(sorted(o.seconds for o in loaded.outcomes if o.ok), 0.99)
    ratio = round(p99_loaded / p99_alone, 3) if p99_alone and p99_loaded else None
    return tiers, p99_alone, p99_loaded, ratio


def _unread_streams(up: Child, ready: dict[str, Any], seconds: float, rate: float) -> dict[str, Any]:
    """Normal load alone for ``seconds/2``, then with 200 batch streams of the free tenant never read."""
    half = seconds / 2
    pids = ready["pids"]

    def cpu(names: Callable[[str], bool]) -> float:
        return sum(cpu_seconds(pid) or 0.0 for name, pid in pids.items() if names(name))

    groups: dict[str, Callable[[str], bool]] = {"proxy": lambda n: n == "proxy",
                                                "nodes": lambda n: n.startswith("node")}
    shares: dict[str, float] = {}

    def share(label: str, before: dict[str, float], since: float) -> None:
        wall = time.monotonic() - since
        for group, names in groups.items():
            shares[f"{group}_cpu_cores_{label}"] = round((cpu(names) - before[group]) / wall, 3)

    at, used = time.monotonic(), {g: cpu(n) for g, n in groups.items()}
    alone = Load(ready, rate)
    alone.run(half)
    share("without", used, at)
    channel = grpc.insecure_channel(ready["data_plane"], options=[("grpc.use_local_subchannel_pool", 1)])
    stub = inference_pb2_grpc.InferenceStub(channel)
    metadata = (("x-api-key", ready["api_keys"]["free-1"]),)  # a tenant of its own: its limits are its own
    rss_before = rss_bytes(ready["pids"]["proxy"])
    calls = [stub.InferStream(inference_pb2.InferRequest(model="chat-small", tier=common_pb2.TIER_BATCH,
                                                         prompt=f"unread {i}", max_tokens=4096),
                              metadata=metadata, timeout=half + 30) for i in range(200)]
    peak = [rss_before]

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes(ready["pids"]["proxy"]))
            done.wait(0.5)

    done = threading.Event()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    at, used = time.monotonic(), {g: cpu(n) for g, n in groups.items()}
    loaded = Load(ready, rate)
    loaded.run(half)
    share("with", used, at)
    done.set()
    sampler.join(2)
    refused = sum(1 for c in calls if c.done() and c.code() != grpc.StatusCode.OK)
    for c in calls:
        c.cancel()
    channel.close()

    def busy() -> int:
        return sum(r.load.running + r.load.queued for r in _replicas(ready).values())

    freed = wait_until(lambda: busy() == 0, 20)
    tiers, p99_alone, p99_loaded, ratio = _halves(alone, loaded)
    return {"tiers": tiers, "recovery": {
        "unread_streams": len(calls), "unread_refused": refused, "held_seconds": round(half, 1),
        "p99_without": p99_alone, "p99_with": p99_loaded, "p99_ratio": ratio,
        "proxy_rss_before_bytes": rss_before, "proxy_rss_peak_bytes": peak[0], "slots_freed_after_seconds": freed,
        **shares}}


def _picker_inflight(ready: dict[str, Any]) -> float | None:
    """The pickers' ``ferry_proxy_inflight`` summed (None when a picker's metrics do not answer)."""
    total = 0.0
    for name in ready.get("pickers", {}):
        address = (ready.get("metrics") or {}).get(name)
        try:
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=2) as answer:
                text = answer.read().decode()
        except OSError:
            return None
        total += sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                     if line.startswith("ferry_proxy_inflight ") or line.startswith("ferry_proxy_inflight{"))
    return total


def _unread_http(address: str, key: str, count: int) -> list[socket.socket]:
    """``count`` streamed batch completions (4,096 tokens each) sent through Envoy on sockets never read."""
    host, _, port = address.rpartition(":")
    socks = []
    for i in range(count):
        body = json.dumps({"model": "chat-small", "prompt": f"unread {i}", "max_tokens": 4096,
                           "stream": True}).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n"
                f"Authorization: Bearer {key}\r\nx-ferry-tier: batch\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        sock = socket.create_connection((host, int(port)), timeout=5)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # never read: let back-pressure reach Envoy
        sock.sendall(head + body)
        socks.append(sock)
    return socks


def _unread_streams_envoy(up: Child, ready: dict[str, Any], seconds: float, rate: float) -> dict[str, Any]:
    """:func:`_unread_streams` through Envoy: HTTP load alone for ``seconds/2``, then with 200 unread HTTP streams
    of the free tenant; slots freed once the pickers' in-flight gauges and the replicas are back to 0."""
    half = seconds / 2
    pids = ready["pids"]
    envoy = envoy_binary_pid(pids["envoy"], Path(ready["workdir"]))
    watched = {"envoy": [envoy], "pickers": [pid for n, pid in pids.items() if n.startswith("picker-")],
               "proxy": [pids["proxy"]], "nodes": [pid for n, pid in pids.items() if n.startswith("node")],
               "controlplane": [pid for n, pid in pids.items() if n.startswith("controlplane")]}

    def cpu() -> dict[str, float]:
        return {g: sum(cpu_seconds(pid) or 0.0 for pid in group) for g, group in watched.items()}

    shares: dict[str, float] = {}

    def share(label: str, before: dict[str, float], since: float, requests: int) -> None:
        wall, now = time.monotonic() - since, cpu()
        for group in watched:
            shares[f"{group}_cpu_cores_{label}"] = round((now[group] - before[group]) / wall, 3)
            if requests:
                shares[f"{group}_cpu_ms_per_request_{label}"] = round((now[group] - before[group]) * 1000 / requests,
                                                                      3)

    def rss() -> int:
        return rss_bytes(envoy) + sum(rss_bytes(pid) for pid in watched["pickers"])

    at, used = time.monotonic(), cpu()
    alone = HttpLoad(ready, rate)
    alone.run(half)
    share("without", used, at, len(alone.outcomes))
    rss_before = rss()
    socks = _unread_http(ready["envoy"], ready["api_keys"]["free-1"], 200)
    peak = [rss_before]
    inflight_peak = [0.0]

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            inflight_peak[0] = max(inflight_peak[0], _picker_inflight(ready) or 0.0)
            done.wait(0.5)

    done = threading.Event()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    at, used = time.monotonic(), cpu()
    loaded = HttpLoad(ready, rate)
    loaded.run(half)
    share("with", used, at, len(loaded.outcomes))
    done.set()
    sampler.join(2)
    refused = 0
    for sock in socks:  # a refusal (429/503) came back at once, in the first bytes
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            first = sock.recv(64)
            refused += first.startswith(b"HTTP/1.1 4") or first.startswith(b"HTTP/1.1 5")
        sock.close()

    def busy() -> int:
        return sum(r.load.running + r.load.queued for r in _replicas(ready).values())

    closed = time.monotonic()
    freed = wait_until(lambda: _picker_inflight(ready) == 0 and busy() == 0, 20)
    inflight_after = _picker_inflight(ready)
    tiers, p99_alone, p99_loaded, ratio = _halves(alone, loaded)
    return {"tiers": tiers, "recovery": {
        "path": "envoy", "unread_streams": len(socks), "unread_refused": refused, "held_seconds": round(half, 1),
        "p99_without": p99_alone, "p99_with": p99_loaded, "p99_ratio": ratio,
        "envoy_pickers_rss_before_bytes": rss_before, "envoy_pickers_rss_peak_bytes": peak[0],
        "pickers_inflight_peak": inflight_peak[0], "pickers_inflight_after": inflight_after,
        "slots_freed_after_seconds": freed, "closed_at_s": round(closed - at, 1), **shares}}


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("baseline", ["--replicas", "4"], None),
    Scenario("node_kill", ["--replicas", "4"], lambda up, r: _kill_pid_and_wait_restart(up, "node-1")),
    Scenario("leader_kill", ["--replicas", "4", "--store", "etcd", "--control-planes", "2"], _leader_kill),
    Scenario("etcd_stop", ["--replicas", "4", "--store", "etcd", "--control-planes", "2"], _etcd_stop),
    Scenario("etcd_kill", ["--replicas", "4", "--store", "etcd", "--control-planes", "2"],
             lambda up, r: _kill_pid_and_wait_restart(up, "etcd")),
    Scenario("proxy_kill", ["--replicas", "4", "--proxies", "2"], lambda up, r: _proxy_kill(up, r), max_tokens=64,
             in_flight_may_fail=True),
    Scenario("unread_streams", ["--replicas", "4"], None, drive=_unread_streams, drive_envoy=_unread_streams_envoy),
    Scenario("fake_agent", ["--replicas", "4"], _fake_agent),
)}


def default_path(name: str) -> str:
    """``envoy`` for a scenario with an Envoy variant, else ``relay``."""
    return "envoy" if SCENARIOS[name].drive_envoy is not None else "relay"


def run_scenario(name: str, seconds: float, rate: float, workdir: Path, path: str | None = None) -> dict[str, Any]:
    """Start ``ferry up`` with the scenario's flags, load it (through ``path``: ``envoy`` or ``relay``, default
    :func:`default_path`), injure it, and return the figures."""
    scenario = SCENARIOS[name]
    path = path or default_path(name)
    if path == "envoy" and scenario.drive_envoy is None:
        raise ValueError(f"scenario {name} has no Envoy variant: use --path relay")
    # Answers run to max_tokens (no natural end), as when the figures of docs/evaluation.md were measured.
    up = Child("up", ["up", *scenario.flags, "--answer-tokens", "0", "--workdir", str(workdir / "fleet")],
               workdir).start()
    try:
        ready = up.wait_ready(90)
        load = Load(ready, rate, max_tokens=scenario.max_tokens)
        proxies = dict(ready.get("proxies") or {"proxy": ready["pids"].get("proxy")})
        peak: dict[str, int] = {}
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                for pname, pid in (read_ready(up).get("proxies") or proxies).items():
                    peak[pname] = max(peak.get(pname, 0), rss_bytes(pid))
                stop.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        recovery: dict[str, Any] = {}

        def injure() -> None:
            if scenario.injure is not None:
                recovery.update(scenario.injure(up, ready))

        started = time.monotonic()
        drive = scenario.drive_envoy if path == "envoy" else scenario.drive
        if drive is not None:
            driven = drive(up, ready, seconds, rate)
            stop.set()
            return {"scenario": name, "path": path, "seconds": round(time.monotonic() - started, 2), "rate": rate,
                    "tiers": driven["tiers"], "recovery": driven["recovery"], "proxy_peak_rss_bytes": peak,
                    "restarts": read_ready(up).get("restarts", {})}
        load.run(seconds, injure if scenario.injure else None)
        stop.set()
        sampler.join(2)
        at = recovery.pop("at", None)
        return {"scenario": name, "seconds": round(time.monotonic() - started, 2), "rate": rate,
                "in_flight_may_fail": scenario.in_flight_may_fail, "tiers": load.figures(at),
                "recovery": recovery, "proxy_peak_rss_bytes": peak,
                "restarts": read_ready(up).get("restarts", {})}
    finally:
        up.stop(15)


def verdict(figures: dict[str, Any]) -> list[str]:
    """What a scenario's figures miss of its target (empty: it passed): zero failed requests in every tier.

    Where the injury kills the process holding the client's connection (``proxy_kill``), requests in flight
    at that moment are reported (``in_flight_failed``) and not counted: no server can finish them.
    """
    misses = []
    for tier, row in figures["tiers"].items():
        if row["total"] == 0:
            misses.append(f"{tier}: no requests")
        failed = row["failed"] - (row.get("in_flight_failed", 0) if figures.get("in_flight_may_fail") else 0)
        if failed:
            misses.append(f"{tier}: {failed}/{row['total']} failed ({', '.join(row['codes'])})")
    recovery = figures["recovery"]
    for key, value in recovery.items():
        if key.endswith("_seconds") and value is None:
            misses.append(f"{key}: not within the bound")
        elif key in ("new_leader_after_seconds", "table_after_seconds") and value > LEADER_SECONDS:
            misses.append(f"{key}: {value} s, target {LEADER_SECONDS} s")
    if "p99_ratio" in recovery and (recovery["p99_ratio"] is None or recovery["p99_ratio"] > P99_RATIO):
        misses.append(f"p99 with unread streams {recovery['p99_ratio']}x the p99 without (target {P99_RATIO}x)")
    if "claimed" in recovery:
        for key in ("refused", "field_named", "table_unchanged"):
            if not recovery.get(key):
                misses.append(f"fake agent: not {key} ({recovery.get('code')}: {recovery.get('details')})")
    return misses


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the scenarios, print a line each, write ``bench-results/drills.json``."""
    parser = argparse.ArgumentParser(prog="python -m tools.drills", description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), help="repeatable; default all")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--path", choices=("envoy", "relay"), default=None,
                        help="the door: envoy (default where a scenario has an Envoy variant) or relay")
    parser.add_argument("--out", default="bench-results/drills.json")
    args = parser.parse_args(argv)
    names = args.scenario or list(SCENARIOS)
    if args.path == "envoy" and any(SCENARIOS[n].drive_envoy is None for n in names):
        parser.error(f"--path envoy: only {', '.join(n for n, s in SCENARIOS.items() if s.drive_envoy)} "
                     "have an Envoy variant")
    results = []
    failed = 0
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"ferry-drill-{name}-") as tmp:
            figures = run_scenario(name, args.seconds, args.rate, Path(tmp), args.path)
        figures["misses"] = verdict(figures)
        failed += bool(figures["misses"])
        results.append(figures)
        tiers = ", ".join(f"{t} {r['failed']}/{r['total']} failed p99 {r['p99']}" for t, r in figures["tiers"].items())
        print(f"{name}: {'PASS' if not figures['misses'] else 'MISS'}: {tiers}; {figures['recovery']}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python -m tools.drills " + " ".join(sys.argv[1:] if argv is None else argv)
    out.write_text(json.dumps({"command": command.strip(), "results": results}, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
