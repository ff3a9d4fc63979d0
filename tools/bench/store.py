"""Fleet state in etcd at scale: publish and propagate a 5,000-replica table, and etcd's steady write rate.

Three measurements:

1. **compute** (in process, no I/O): :func:`controlplane.tables.compute.compute_tables`
   plus versioning for ``--replicas`` replicas (default 5,000 on nodes of
   ``--per-node``, 8), p50/p99 over ``--rounds`` x 3 runs, each draining
   another replica; and what a change costs on the wire: the delta
   (:func:`controlplane.tables.delta.table_delta`), its bytes against the
   whole table's, its serialization, and a proxy's parse and apply
   (:func:`ferry.tabledelta.apply_delta`) against parsing the whole table;
   and the control plane's work to hand one version to ``--proxies``
   streams, a copy serialized per proxy against one serialization shared
   (:func:`controlplane.tables.feed.stamp`).
2. **publish and propagate** (real processes): a local etcd, two control
   planes (``ferry controlplane --store etcd://``, the first leads), the
   replicas registered by fake agents (one gRPC stream per node, spread over
   both control planes) and ``--proxies`` fake proxies (50, half on each
   control plane) that watch the table with deltas, apply each one with the
   proxies' own function (:func:`ferry.tabledelta.apply_delta`; once per
   version for all the proxies that hold its base, as each real proxy applies
   in its own process), ask for a resync when one does not fit, and ack; agents and proxies reconnect as the
   real ones do when a stream ends. Each round drains (then undrains) one
   replica through the leader's Admin API at ``t0``; for each proxy, the
   time from ``t0`` until it holds a table that reflects it. p50/p99 over
   every proxy and round, and apart for the proxies of the leader and those
   of the follower (relayed). Loads are constant here, so each table differs
   from the last by the drain and the telemetry ages. The bytes each proxy
   received per change are counted from the wire (full tables and deltas
   apart).
3. **steady etcd writes**: the agents send changing loads every second (so
   the leader publishes a new version every tick) for ``--steady-seconds``;
   etcd's own counters before and after give puts, transactions, deletes and
   raft proposals per second, and lease keep-alives (not writes in etcd 3.4:
   renewal is leader-local) apart. The bound it is compared with: one write
   per replica per tick. The table versions per second are those the proxies
   received in the window (versions are not a count across leadership terms:
   a new term starts above the clock), with the terms the leader went
   through.

Every run appends its figures (or why it failed) to
``bench-results/store-runs.jsonl`` and writes them to
``bench-results/store.json``. It fails (exit 1) only when Ferry does: a
proxy that never gets the table or a drain, an Admin call refused; the
message says what did not arrive where.

Usage: ``python -m tools.bench.store [--replicas 5000] [--proxies 50] [--compute-only]``.
One 2-core machine runs everything (etcd, both control planes, every fake
agent and proxy): the figures include that contention.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import random
import re
import secrets
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from tomli_w import dumps

from controlplane.fleet.view import FleetView
from controlplane.tables.compute import TableVersions, compute_tables
from controlplane.tables.delta import table_delta
from controlplane.tables.feed import stamp
from ferry.backoff import Backoff
from ferry.config import ModelConfig
from ferry.grpcutil import StreamWriter
from ferry.procs import Child, stop_all
from ferry.tabledelta import DeltaMismatch, apply_delta
from ferry.v1 import admin_pb2, common_pb2, fleet_pb2, fleet_pb2_grpc, tables_pb2
from ferry_cli.ctl.client import AdminClient
from harness.etcd import LocalEtcd
from tools.report import percentile

ROOT = Path(__file__).resolve().parents[2]
READY = common_pb2.REPLICA_STATE_READY
TICK = 0.5
WATCH = "/ferry.v1.Tables/Watch"
OPTIONS = [("grpc.max_receive_message_length", 64 << 20)]


class FerryFailed(Exception):
    """Ferry did not deliver something the benchmark waits for; the message says what and where."""


class Skipped(Exception):
    """``--compute-only``: the fleet is not started."""
COUNTERS = {
    "puts": "etcd_mvcc_put_total", "txns": "etcd_mvcc_txn_total", "deletes": "etcd_mvcc_delete_total",
    "raft_proposals": "etcd_server_proposals_committed_total",
    "wal_fsyncs": "etcd_disk_wal_fsync_duration_seconds_count",
    "lease_renewals": "etcd_debugging_lease_renewed_total",
    "lease_grants": "etcd_debugging_lease_granted_total", "lease_revokes": "etcd_debugging_lease_revoked_total",
}


def registration(n: int, per_node: int) -> fleet_pb2.Register:
    node = f"node-{n:04d}"
    replicas = [fleet_pb2.ReplicaInfo(replica_id=f"{node}-r{i}", model="chat", version="v1",
                                      address=f"10.0.{n // 250}.{n % 250}:{9000 + i}", gpus=1, max_concurrency=60,
                                      kv_block_tokens=16, max_context_tokens=8192, state=READY)
                for i in range(per_node)]
    return fleet_pb2.Register(node=node, region="local", gpus=per_node, replicas=replicas, agent_version="bench")


def loads(reg: fleet_pb2.Register, rng: random.Random | None) -> list[common_pb2.ReplicaLoad]:
    return [common_pb2.ReplicaLoad(replica_id=r.replica_id, state=READY, queued=rng.randrange(8) if rng else 1,
                                   running=rng.randrange(60) if rng else 10, kv_blocks_free=2048, kv_blocks_total=4096)
            for r in reg.replicas]


def ms(values: list[float]) -> dict[str, float]:
    """p50, p99 and max in milliseconds, and the number of samples."""
    if not values:
        return {"samples": 0}
    return {"p50_ms": round(percentile(values, 50) * 1000, 1), "p99_ms": round(percentile(values, 99) * 1000, 1),
            "max_ms": round(max(values) * 1000, 1), "samples": len(values)}


def bench_compute(replicas: int, per_node: int, rounds: int, proxies: int = 50) -> dict[str, Any]:
    """Pure computation: the fleet view in memory, the table computed and versioned ``rounds`` times; the delta
    of each version from the one before, its bytes, and a proxy's parse and apply of it against the full table's."""
    fleet = FleetView(clock=time.monotonic, grace_seconds=3600)
    rng = random.Random(1)
    for n in range(replicas // per_node):
        member = fleet.register(registration(n, per_node))
        fleet.apply_telemetry(member, fleet_pb2.Telemetry(seq=1, replicas=loads(registration(n, per_node), rng)))
    versions = TableVersions(1)
    catalog = (ModelConfig(name="chat"),)
    times: list[float] = []
    deltas: list[float] = []
    serialize: list[float] = []
    parse_full: list[float] = []
    apply: list[float] = []
    delta_bytes: list[float] = []
    size = 0
    previous: tables_pb2.TableSnapshot | None = None
    for i in range(rounds):
        drains = {f"node-{i:04d}-r0"}  # a different content each round: a new version is issued
        started = time.perf_counter()
        tables = compute_tables(fleet.members(), catalog, drains, now=time.monotonic(), grace_seconds=3600)
        (published,) = versions.publish(tables, time.time())
        times.append(time.perf_counter() - started)
        snapshot = published.snapshot
        started = time.perf_counter()
        full = snapshot.SerializeToString()
        serialize.append(time.perf_counter() - started)
        size = len(full)
        started = time.perf_counter()
        tables_pb2.TableSnapshot.FromString(full)
        parse_full.append(time.perf_counter() - started)
        if previous is not None:
            started = time.perf_counter()
            delta = table_delta(previous, snapshot)
            deltas.append(time.perf_counter() - started)
            assert delta is not None
            raw = delta.SerializeToString()
            delta_bytes.append(len(raw))
            started = time.perf_counter()
            applied = apply_delta(previous, tables_pb2.TableSnapshot.FromString(raw))
            apply.append(time.perf_counter() - started)
            if applied != snapshot:
                raise SystemExit(f"bench bug: the delta to version {snapshot.version} does not give its table")
        previous = snapshot
    assert previous is not None
    return {**ms(times), "table_bytes": size, "delta": ms(deltas), "delta_bytes_p50": percentile(delta_bytes, 50),
            "serialize_full": ms(serialize), "proxy_parse_full": ms(parse_full), "proxy_parse_apply_delta": ms(apply),
            "fan_out": fan_out(previous, proxies, rounds)}


def fan_out(snapshot: tables_pb2.TableSnapshot, proxies: int, rounds: int) -> dict[str, Any]:
    """The control plane's work to hand one version to ``proxies`` streams: a stamped copy serialized per proxy
    (as the watchers did before the feed), against one serialization shared with each proxy's nonce appended."""
    per_proxy: list[float] = []
    shared: list[float] = []
    for _ in range(rounds):
        started = time.perf_counter()
        for i in range(proxies):
            stamped = tables_pb2.TableSnapshot()
            stamped.CopyFrom(snapshot)
            stamped.nonce = str(i + 1)
            stamped.SerializeToString()
        per_proxy.append(time.perf_counter() - started)
        started = time.perf_counter()
        body = snapshot.SerializeToString()
        for i in range(proxies):
            stamp(body, str(i + 1))
        shared.append(time.perf_counter() - started)
    return {"proxies": proxies, "copy_and_serialize_per_proxy": ms(per_proxy), "serialize_once_and_stamp": ms(shared)}


class Agents:
    """One Fleet.Connect stream per node, spread over ``addresses``; commands are read and dropped; telemetry
    of all the node's replicas every ``interval`` (loads constant until ``varying``). A stream that ends is
    opened again after a jittered backoff (:class:`ferry.backoff.Backoff`) with the node registered again,
    and each write gives up at the call's end (:class:`ferry.grpcutil.StreamWriter`), as an agent does."""

    def __init__(self, addresses: list[str], replicas: int, per_node: int, *, interval: float = 1.0,
                 varying: bool = False) -> None:
        self.channels = [grpc.aio.insecure_channel(a, options=OPTIONS) for a in addresses]
        self.regs = [registration(n, per_node) for n in range(replicas // per_node)]
        self.interval = interval
        self.varying = varying
        self.sent = 0  # telemetry messages written
        self.reconnects = 0
        self.errors: dict[str, str] = {}  # node -> why its last stream ended
        self.registered: set[str] = set()  # nodes whose stream is open and was answered `registered`
        self._tasks: list[asyncio.Task[None]] = []
        self.abandoned = 0  # writes given up because the stream had ended (StreamWriter)

    async def start(self) -> None:
        for n, reg in enumerate(self.regs):
            self._tasks.append(asyncio.create_task(self._agent(n, reg)))

    async def _agent(self, n: int, reg: fleet_pb2.Register) -> None:
        rng = random.Random(n)
        backoff = Backoff(0.1, 5.0, rng=rng)  # an agent's defaults (agent.config), reset once registered
        while True:
            call = fleet_pb2_grpc.FleetStub(self.channels[n % len(self.channels)]).Connect()
            commands = asyncio.ensure_future(self._read(call, backoff, reg.node))
            writer = StreamWriter(call, commands)  # as the agent writes: never past the call's end
            try:
                sent = await writer.write(fleet_pb2.AgentMessage(register=reg))
                await asyncio.sleep(rng.random() * self.interval)  # spread the agents over the interval
                seq = 0
                while sent:
                    seq += 1
                    body = fleet_pb2.Telemetry(seq=seq, replicas=loads(reg, rng if self.varying else None))
                    sent = await writer.write(fleet_pb2.AgentMessage(telemetry=body))
                    if sent:
                        self.sent += 1
                        await asyncio.wait({commands}, timeout=self.interval)
                        sent = not commands.done()
                await asyncio.wait({commands}, timeout=5.0)
                self.errors[reg.node] = commands.result() if commands.done() else "the call ended, its reader did not"
            except grpc.aio.AioRpcError as exc:
                self.errors[reg.node] = f"{exc.code().name}: {exc.details()}"
            except (grpc.aio.UsageError, asyncio.InvalidStateError) as exc:
                self.errors[reg.node] = f"stream closed: {exc!r}"
            finally:
                self.abandoned += writer.abandoned
                commands.cancel()
                call.cancel()
                self.registered.discard(reg.node)
            self.reconnects += 1
            await asyncio.sleep(backoff.next_delay())

    async def _read(self, call: Any, backoff: Backoff, node: str) -> str:
        """Read (and drop) what the control plane sends; the backoff is reset once the node is registered."""
        try:
            while (message := await call.read()) is not grpc.aio.EOF:
                if message.WhichOneof("body") == "registered":
                    backoff.reset()
                    self.registered.add(node)
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
        return "stream ended"

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for channel in self.channels:
            await channel.close()


@dataclass(frozen=True)
class Received:
    """One message a fake proxy read: when (monotonic), which proxy, version, full or delta, its bytes."""

    at: float
    proxy: int
    version: int
    delta: bool
    size: int


class Proxies:
    """Fake proxies: each watches region ``local`` on one control plane with deltas, applies what it gets with
    :func:`ferry.tabledelta.apply_delta` (a resync when a delta does not fit), acks, and reconnects with the
    version it holds after a backoff when its stream ends, as a proxy does. The raw bytes are counted."""

    def __init__(self, addresses: list[str], count: int) -> None:
        self.channels = [grpc.aio.insecure_channel(a, options=OPTIONS) for a in addresses]
        self.count = count
        self.on = [i % len(addresses) for i in range(count)]  # the control plane each one watches from
        self.latest: list[tables_pb2.TableSnapshot | None] = [None] * count
        self.received: list[Received] = []
        self.errors: list[str] = [""] * count  # why each one's last stream ended
        self.reconnects = [0] * count
        self.resyncs = 0
        # Proxies that hold the table a delta starts from get the same table from it: applied once per version
        # here and shared (each real proxy applies in its own process; 50 here would queue on one core).
        self._applied: dict[int, tables_pb2.TableSnapshot] = {}
        self.changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for i in range(self.count):
            self._tasks.append(asyncio.create_task(self._watch(i)))

    async def _watch(self, i: int) -> None:
        backoff = Backoff(0.1, 2.0, rng=random.Random(i))
        while True:
            call = self.channels[self.on[i]].stream_stream(
                WATCH, request_serializer=tables_pb2.WatchRequest.SerializeToString, response_deserializer=None)()
            try:
                held = self.latest[i]
                sub = tables_pb2.Subscribe(proxy_id=f"bench-proxy-{i:02d}", region="local",
                                           have_version=held.version if held is not None else 0, deltas=True)
                writer = StreamWriter(call)  # a write the call's end abandons: the next read says why
                await writer.write(tables_pb2.WatchRequest(subscribe=sub))
                while True:
                    raw = await call.read()
                    if raw is grpc.aio.EOF:
                        self.errors[i] = "stream ended"
                        break
                    await writer.write(tables_pb2.WatchRequest(ack=self._apply(i, raw)))
                    backoff.reset()
            except grpc.aio.AioRpcError as exc:
                self.errors[i] = f"{exc.code().name}: {exc.details()}"
            finally:
                call.cancel()
            self.reconnects[i] += 1
            await asyncio.sleep(backoff.next_delay())

    def _apply(self, i: int, raw: bytes) -> tables_pb2.Ack:
        message = tables_pb2.TableSnapshot.FromString(raw)
        is_delta = message.HasField("delta")
        self.received.append(Received(time.monotonic(), i, message.version, is_delta, len(raw)))
        held = self.latest[i]
        if is_delta:
            try:
                if held is None:
                    raise DeltaMismatch("a delta, and no table is held")
                if held.version != message.delta.base_version:
                    raise DeltaMismatch(f"a delta from version {message.delta.base_version}, {held.version} is held")
                applied = self._applied.get(message.version)
                if applied is None:
                    applied = apply_delta(held, message)
                    self._applied[message.version] = applied
                    while len(self._applied) > 16:
                        del self._applied[min(self._applied)]
                message = applied
            except DeltaMismatch as exc:
                self.resyncs += 1
                return tables_pb2.Ack(version=message.version, nonce=message.nonce, applied=False, error=exc.reason,
                                      resync=True)
        self.latest[i] = message
        self.changed.set()
        return tables_pb2.Ack(version=message.version, nonce=message.nonce, applied=True)

    async def until(self, predicate: Any, seconds: float) -> dict[int, float]:
        """Per proxy, when (monotonic) its latest table first satisfied ``predicate``."""
        seen: dict[int, float] = {}
        judged: dict[tuple[int, int], bool] = {}  # proxies share table objects: each judged once
        deadline = time.monotonic() + seconds
        while len(seen) < self.count and time.monotonic() < deadline:
            self.changed.clear()
            now = time.monotonic()
            for i, snapshot in enumerate(self.latest):
                if i in seen or snapshot is None:
                    continue
                key = (id(snapshot), snapshot.version)
                if key not in judged:
                    judged[key] = predicate(snapshot)
                if judged[key]:
                    seen[i] = now
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.05):
                    await self.changed.wait()
        return seen

    def missing(self, seen: dict[int, float], what: str, limit: int = 5) -> str:
        """What did not arrive where: the proxies that lack ``what``, with what they hold and their streams' ends."""
        lacking = [i for i in range(self.count) if i not in seen]
        lines = [f"{len(lacking)} of {self.count} proxies never got {what}:"]
        for i in lacking[:limit]:
            held = self.latest[i]
            holds = f"version {held.version} with {len(routed(held))} replicas" if held is not None else "no table"
            lines.append(f"  bench-proxy-{i:02d} on controlplane-{self.on[i] + 1}: holds {holds}; "
                         f"{self.reconnects[i]} reconnects; last stream end: {self.errors[i] or 'none'}")
        if len(lacking) > limit:
            lines.append(f"  ... and {len(lacking) - limit} more")
        return "\n".join(lines)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for channel in self.channels:
            await channel.close()


def routed(snapshot: tables_pb2.TableSnapshot) -> set[str]:
    return {r.replica_id for m in snapshot.models for r in m.replicas}


def etcd_counters(etcd: LocalEtcd) -> dict[str, float]:
    with urllib.request.urlopen(f"{etcd.url}/metrics", timeout=5) as response:
        text = response.read().decode()
    values = {key: 0.0 for key in COUNTERS}
    for key, metric in COUNTERS.items():
        found = re.search(rf"^{metric} (\S+)$", text, re.MULTILINE)
        values[key] = float(found.group(1)) if found else 0.0
    found = re.search(r'^grpc_server_msg_received_total\{grpc_method="LeaseKeepAlive"[^}]*\} (\S+)$', text, re.M)
    values["keepalive_messages"] = float(found.group(1)) if found else 0.0
    return values


async def admin_call(what: str, call: Any) -> Any:
    """An Admin call's answer; a refusal is Ferry failing, named."""
    try:
        return await call
    except grpc.aio.AioRpcError as exc:
        raise FerryFailed(f"{what} refused: {exc.code().name}: {exc.details()}") from None


def wire(received: list[Received], table_bytes: int, proxies: int) -> dict[str, Any]:
    """The bytes the proxies read per change (a version), full tables and deltas apart."""
    deltas = [float(r.size) for r in received if r.delta]
    fulls = [float(r.size) for r in received if not r.delta]
    per_version: dict[int, float] = {}
    for r in received:
        per_version[r.version] = per_version.get(r.version, 0.0) + r.size
    totals = list(per_version.values())
    return {"messages": len(received), "deltas": len(deltas), "fulls": len(fulls),
            "delta_bytes_p50": percentile(deltas, 50) if deltas else 0,
            "delta_bytes_p99": percentile(deltas, 99) if deltas else 0,
            "full_bytes_p50": percentile(fulls, 50) if fulls else 0,
            "table_bytes": table_bytes,
            "all_proxies_bytes_per_change_p50": percentile(totals, 50) if totals else 0,
            "all_proxies_bytes_per_change_if_full": table_bytes * proxies}


async def propagate(args: argparse.Namespace, admin: Any, proxies: Proxies, table_bytes: int) -> dict[str, Any]:
    """Drain then undrain one replica per round through the leader; per proxy, until its table shows it."""
    every: list[float] = []
    by_role: dict[str, list[float]] = {"leader": [], "follower": []}
    calls: list[float] = []
    first = len(proxies.received)
    resyncs = proxies.resyncs
    for r in range(args.rounds):
        replica_id = f"node-{(r * 7) % (args.replicas // args.per_node):04d}-r1"
        for drain in (True, False):
            what = f"the {'drain' if drain else 'undrain'} of {replica_id}"
            method = admin.Drain if drain else admin.Undrain
            t0 = time.monotonic()
            await admin_call(what, method(admin_pb2.DrainRequest(replica_id=replica_id), timeout=30))
            calls.append(time.monotonic() - t0)
            seen = await proxies.until(lambda t, rid=replica_id, d=drain: (rid in routed(t)) != d, 30)
            for i, at in seen.items():
                every.append(at - t0)
                by_role["leader" if proxies.on[i] == 0 else "follower"].append(at - t0)
            if len(seen) < proxies.count:
                raise FerryFailed(proxies.missing(seen, f"{what} within 30 s (round {r + 1})"))
    return {"all": ms(every), "proxies_on_leader": ms(by_role["leader"]),
            "proxies_on_follower": ms(by_role["follower"]), "admin_call": ms(calls),
            "wire": wire(proxies.received[first:], table_bytes, proxies.count), "resyncs": proxies.resyncs - resyncs}


async def bench_fleet(args: argparse.Namespace, etcd: LocalEtcd, workdir: Path, results: dict[str, Any]) -> None:
    """The real processes: fills ``results`` as each phase ends; raises FerryFailed naming what did not arrive."""
    config = workdir / "ferry.toml"
    config.write_text(dumps({"models": [{"name": "chat"}], "controlplane": {"tick_seconds": TICK}}))
    cps = []
    token = secrets.token_hex(16)  # the Admin API's: the followers present it to the leader too
    for i in range(2):
        cps.append(Child(f"controlplane-{i + 1}", ["controlplane", "--store", f"etcd://{etcd.endpoint}",
                                                    "--id", f"controlplane-{i + 1}", "--config", str(config),
                                                    "--log-level", "WARNING", "--insecure"], workdir,
                         env={"FERRY_ADMIN_TOKEN": token}).start())
        cps[-1].wait_ready(30)
    addresses = [cp.ready["grpc"] for cp in cps]
    agents = Agents(addresses, args.replicas, args.per_node)
    proxies = Proxies(addresses, args.proxies)
    channel = grpc.aio.insecure_channel(addresses[0])
    try:
        await agents.start()
        await proxies.start()
        everyone = {r.replica_id for reg in agents.regs for r in reg.replicas}
        seen = await proxies.until(lambda t: routed(t) == everyone, 180)
        if len(seen) < args.proxies:
            out = [reg.node for reg in agents.regs if reg.node not in agents.registered]
            ended = "; ".join(f"{k}: {agents.errors.get(k, 'no stream ended')}" for k in out[:5]) or "none"
            ended = f"{len(out)} nodes not registered now: {ended}"
            raise FerryFailed(proxies.missing(seen, f"the full table of {len(everyone)} replicas within 180 s") +
                              f"\nagents: {agents.reconnects} reconnects; {ended}")
        table_bytes = max(t.ByteSize() for t in proxies.latest if t is not None)  # the whole table, as sent in full
        admin = AdminClient(channel, token)
        status = await admin_call("GetStatus", admin.GetStatus(admin_pb2.GetStatusRequest(), timeout=10))
        if status.role != "leader":
            raise FerryFailed(f"controlplane-1 is {status.role}, expected leader")
        results["propagate"] = await propagate(args, admin, proxies, table_bytes)
        agents.varying = True
        await asyncio.sleep(3.0)  # let the changing loads settle into a steady state
        before, t0 = etcd_counters(etcd), time.monotonic()
        first = len(proxies.received)
        await asyncio.sleep(args.steady_seconds)
        after, elapsed = etcd_counters(etcd), time.monotonic() - t0
        later = await admin_call("GetStatus", admin.GetStatus(admin_pb2.GetStatusRequest(), timeout=10))
        window = proxies.received[first:]
        versions = [float(len({r.version for r in window if r.proxy == i})) for i in range(args.proxies)]
        rates = {f"{k}_per_s": round((after[k] - before[k]) / elapsed, 2) for k in after}
        writes = rates["puts_per_s"] + rates["txns_per_s"] + rates["deletes_per_s"]
        bound = args.replicas / TICK
        results["steady"] = {**rates, "writes_per_s": round(writes, 2), "seconds": round(elapsed, 1),
                             "table_versions_per_s": round(percentile(versions, 50) / elapsed, 2),
                             "leader_terms": {"before": status.term, "after": later.term,
                                              "leader_before": status.leader_id, "leader_after": later.leader_id},
                             "wire": wire(window, table_bytes, args.proxies),
                             "one_write_per_replica_per_tick_per_s": bound,
                             "fraction_of_that_bound": round(writes / bound, 6)}
        results["reconnects"] = {"agents": agents.reconnects, "agent_writes_abandoned": agents.abandoned,
                                 "proxies": sum(proxies.reconnects), "proxy_resyncs": proxies.resyncs}
    finally:
        await proxies.stop()
        await agents.stop()
        await channel.close()
        stop_all(cps)


def head() -> str:
    """The commit measured (empty outside a git checkout)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    return ""


def report(result: dict[str, Any], proxies: int) -> None:
    """Print the figures of one run."""
    c = result.get("compute")
    if c:
        print(f"compute+version of a {result['replicas']}-replica table: p50 {c['p50_ms']} ms, p99 {c['p99_ms']} ms "
              f"({c['table_bytes']} bytes); its delta from the version before: p50 {c['delta']['p50_ms']} ms, "
              f"{c['delta_bytes_p50']} bytes; serialize the table {c['serialize_full']['p50_ms']} ms; a proxy parses "
              f"the table in {c['proxy_parse_full']['p50_ms']} ms, parses and applies the delta in "
              f"{c['proxy_parse_apply_delta']['p50_ms']} ms; handing one version to {c['fan_out']['proxies']} "
              f"proxies: {c['fan_out']['copy_and_serialize_per_proxy']['p50_ms']} ms copied and serialized per proxy, "
              f"{c['fan_out']['serialize_once_and_stamp']['p50_ms']} ms serialized once", flush=True)
    p = result.get("propagate")
    if p:
        w = p["wire"]
        print(f"drain -> table at all {proxies} proxies: p50 {p['all']['p50_ms']} ms, p99 {p['all']['p99_ms']} ms "
              f"(leader's proxies p99 {p['proxies_on_leader']['p99_ms']} ms, follower's p99 "
              f"{p['proxies_on_follower']['p99_ms']} ms); per change a proxy read {w['delta_bytes_p50']} bytes "
              f"(delta p50; p99 {w['delta_bytes_p99']}) against {w['table_bytes']} for the full table; all proxies "
              f"{w['all_proxies_bytes_per_change_p50']} bytes per change against "
              f"{w['all_proxies_bytes_per_change_if_full']} in full; {w['deltas']} deltas, {w['fulls']} full tables, "
              f"{p['resyncs']} resyncs")
    s = result.get("steady")
    if s:
        w = s["wire"]
        terms = s["leader_terms"]
        print(f"steady etcd writes with {result['replicas']} replicas: {s['writes_per_s']}/s (raft proposals "
              f"{s['raft_proposals_per_s']}/s; lease keep-alives {s['keepalive_messages_per_s']}/s, not writes) vs one "
              f"write per replica per tick = {s['one_write_per_replica_per_tick_per_s']:.0f}/s; "
              f"{s['table_versions_per_s']} table versions/s reached the proxies (leader term {terms['before']} -> "
              f"{terms['after']}); changing loads: {w['delta_bytes_p50']} bytes a delta (p50) against "
              f"{w['table_bytes']} in full, {w['fulls']} full tables")
    if result.get("failure"):
        print(f"FAILED: {result['failure']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.store", description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=5000)
    parser.add_argument("--per-node", type=int, default=8)
    parser.add_argument("--proxies", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=10, help="drain+undrain rounds (and compute runs x3)")
    parser.add_argument("--steady-seconds", type=float, default=20.0)
    parser.add_argument("--compute-only", action="store_true", help="the in-process measurements alone (seconds)")
    parser.add_argument("--out", default=str(ROOT / "bench-results" / "store.json"))
    parser.add_argument("--workdir", default=None,
                        help="keep the control planes' logs and config here (default: a temporary folder)")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                              "commit": head(), "replicas": args.replicas, "replicas_per_node": args.per_node,
                              "proxies": args.proxies, "control_planes": 2, "tick_seconds": TICK, "passed": False}
    try:
        result["compute"] = bench_compute(args.replicas, args.per_node, args.rounds * 3, args.proxies)
        report({"replicas": args.replicas, "compute": result["compute"]}, args.proxies)
        if args.compute_only:
            raise Skipped
        with contextlib.ExitStack() as stack:
            if args.workdir:
                workdir = Path(args.workdir)
                workdir.mkdir(parents=True, exist_ok=True)
            else:
                workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ferry-bench-store-")))
            etcd = stack.enter_context(LocalEtcd())
            asyncio.run(bench_fleet(args, etcd, workdir, result))
        result["passed"] = True
    except FerryFailed as exc:
        result["failure"] = str(exc)
    except Skipped:
        result["passed"] = True
        result["compute_only"] = True
    finally:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        with (out.parent / f"{out.stem}-runs.jsonl").open("a") as runs:
            runs.write(json.dumps(result) + "\n")
    report({k: v for k, v in result.items() if k != "compute"}, args.proxies)
    print(f"wrote {args.out} and appended to {out.parent / f'{out.stem}-runs.jsonl'}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
