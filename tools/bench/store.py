"""Fleet state in etcd at scale: publish and propagate a 5,000-replica table, and etcd's steady write rate.

Three measurements, written to ``bench-results/store.json``:

1. **compute** (in process, no I/O): :func:`controlplane.tables.compute.compute_tables`
   plus versioning for ``--replicas`` replicas (default 5,000 on nodes of
   ``--per-node``, 8), p50/p99 over ``--rounds`` runs.
2. **publish and propagate** (real processes): a local etcd, two control
   planes (``ferry controlplane --store etcd://``, the first leads), the
   replicas registered by fake agents (one gRPC stream per node, spread over
   both control planes) and ``--proxies`` fake proxies (50, half on each
   control plane) that watch the table and ack every snapshot. Each round
   drains (then undrains) one replica through the leader's Admin API at
   ``t0``; for each proxy, the time from ``t0`` until it holds a table that
   reflects it. p50/p99 over every proxy and round, and apart for the proxies
   of the leader and those of the follower (relayed). Loads are constant
   here, so each table differs from the last by the drain alone.
3. **steady etcd writes**: the agents send changing loads every second (so
   the leader publishes a new version every tick) for ``--steady-seconds``;
   etcd's own counters before and after give puts, transactions, deletes and
   raft proposals per second, and lease keep-alives (not writes in etcd 3.4:
   renewal is leader-local) apart. The bound it is compared with: one write
   per replica per tick.

Usage: ``python -m tools.bench.store [--replicas 5000] [--proxies 50]``.
One 2-core machine runs everything (etcd, both control planes, every fake
agent and proxy): the figures include that contention.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import secrets
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
from tomli_w import dumps

from controlplane.fleet.view import FleetView
from controlplane.tables.compute import TableVersions, compute_tables
from ferry.cli.ctl.main import AdminClient
from ferry.config import ModelConfig
from ferry.etcd import LocalEtcd
from ferry.procs import Child, stop_all
from ferry.v1 import admin_pb2, common_pb2, fleet_pb2, fleet_pb2_grpc, tables_pb2, tables_pb2_grpc
from tools.report import percentile

ROOT = Path(__file__).resolve().parents[2]
READY = common_pb2.REPLICA_STATE_READY
TICK = 0.5
COUNTERS = {
    "puts": "etcd_mvcc_put_total", "txns": "etcd_mvcc_txn_total", "deletes": "etcd_mvcc_delete_total",
    "raft_proposals": "etcd_server_proposals_committed_total",
    "wal_fsyncs": "etcd_disk_wal_fsync_duration_seconds_count",
    "lease_renewals": "etcd_debugging_lease_renewed_total",
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
    return {"p50_ms": round(percentile(values, 50) * 1000, 1), "p99_ms": round(percentile(values, 99) * 1000, 1),
            "max_ms": round(max(values) * 1000, 1), "samples": len(values)}


def bench_compute(replicas: int, per_node: int, rounds: int) -> dict[str, Any]:
    """Pure computation: the fleet view in memory, the table computed and versioned ``rounds`` times."""
    fleet = FleetView(clock=time.monotonic, grace_seconds=3600)
    rng = random.Random(1)
    for n in range(replicas // per_node):
        member = fleet.register(registration(n, per_node))
        fleet.apply_telemetry(member, fleet_pb2.Telemetry(seq=1, replicas=loads(registration(n, per_node), rng)))
    versions = TableVersions(1)
    catalog = (ModelConfig(name="chat"),)
    times = []
    size = 0
    for i in range(rounds):
        drains = {f"node-{i:04d}-r0"}  # a different content each round: a new version is issued
        started = time.perf_counter()
        tables = compute_tables(fleet.members(), catalog, drains, now=time.monotonic(), grace_seconds=3600)
        (published,) = versions.publish(tables, time.time())
        times.append(time.perf_counter() - started)
        size = published.snapshot.ByteSize()
    return {**ms(times), "table_bytes": size}


class Agents:
    """One Fleet.Connect stream per node; commands are read and dropped; telemetry on demand."""

    def __init__(self, addresses: list[str], replicas: int, per_node: int) -> None:
        self.channels = [grpc.aio.insecure_channel(a, options=[("grpc.max_receive_message_length", 64 << 20)])
                         for a in addresses]
        self.regs = [registration(n, per_node) for n in range(replicas // per_node)]
        self.calls: list[Any] = []
        self.varying = False
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for n, reg in enumerate(self.regs):
            call = fleet_pb2_grpc.FleetStub(self.channels[n % len(self.channels)]).Connect()
            await call.write(fleet_pb2.AgentMessage(register=reg))
            self.calls.append(call)
            self._tasks.append(asyncio.create_task(self._drain_commands(call)))
            self._tasks.append(asyncio.create_task(self._telemetry(call, reg, random.Random(n))))

    async def _drain_commands(self, call: Any) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            while await call.read() is not grpc.aio.EOF:
                pass

    async def _telemetry(self, call: Any, reg: fleet_pb2.Register, rng: random.Random) -> None:
        await asyncio.sleep(rng.random())  # spread the agents over the second
        seq = 0
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            while True:
                seq += 1
                body = fleet_pb2.Telemetry(seq=seq, replicas=loads(reg, rng if self.varying else None))
                await call.write(fleet_pb2.AgentMessage(telemetry=body))
                await asyncio.sleep(1.0)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for channel in self.channels:
            await channel.close()


class Proxies:
    """Fake proxies: each watches region ``local`` on one control plane and acks every snapshot."""

    def __init__(self, addresses: list[str], count: int) -> None:
        options = [("grpc.max_receive_message_length", 64 << 20)]
        self.channels = [grpc.aio.insecure_channel(a, options=options) for a in addresses]
        self.count = count
        self.on = [i % len(addresses) for i in range(count)]  # the control plane each one watches from
        self.latest: list[tables_pb2.TableSnapshot | None] = [None] * count
        self.changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for i in range(self.count):
            self._tasks.append(asyncio.create_task(self._watch(i)))

    async def _watch(self, i: int) -> None:
        call = tables_pb2_grpc.TablesStub(self.channels[self.on[i]]).Watch()
        sub = tables_pb2.Subscribe(proxy_id=f"bench-proxy-{i:02d}", region="local")
        await call.write(tables_pb2.WatchRequest(subscribe=sub))
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            while True:
                snapshot = await call.read()
                if snapshot is grpc.aio.EOF:
                    return
                self.latest[i] = snapshot
                self.changed.set()
                ack = tables_pb2.Ack(version=snapshot.version, nonce=snapshot.nonce, applied=True)
                await call.write(tables_pb2.WatchRequest(ack=ack))

    async def until(self, predicate: Any, seconds: float) -> dict[int, float]:
        """Per proxy, when (monotonic) its latest table first satisfied ``predicate``."""
        seen: dict[int, float] = {}
        deadline = time.monotonic() + seconds
        while len(seen) < self.count and time.monotonic() < deadline:
            self.changed.clear()
            now = time.monotonic()
            for i, snapshot in enumerate(self.latest):
                if i not in seen and snapshot is not None and predicate(snapshot):
                    seen[i] = now
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.05):
                    await self.changed.wait()
        return seen

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


async def propagate(args: argparse.Namespace, admin: Any, proxies: Proxies) -> dict[str, Any]:
    """Drain then undrain one replica per round through the leader; per proxy, until its table shows it."""
    every: list[float] = []
    by_role: dict[str, list[float]] = {"leader": [], "follower": []}
    calls: list[float] = []
    for r in range(args.rounds):
        replica_id = f"node-{(r * 7) % (args.replicas // args.per_node):04d}-r1"
        for drain in (True, False):
            method = admin.Drain if drain else admin.Undrain
            t0 = time.monotonic()
            await method(admin_pb2.DrainRequest(replica_id=replica_id), timeout=30)
            calls.append(time.monotonic() - t0)
            seen = await proxies.until(lambda t, rid=replica_id, d=drain: (rid in routed(t)) != d, 30)
            for i, at in seen.items():
                every.append(at - t0)
                by_role["leader" if proxies.on[i] == 0 else "follower"].append(at - t0)
            missing = proxies.count - len(seen)
            if missing:
                raise SystemExit(f"{missing} proxies never saw the {'drain' if drain else 'undrain'} of {replica_id}")
    return {"all": ms(every), "proxies_on_leader": ms(by_role["leader"]),
            "proxies_on_follower": ms(by_role["follower"]), "admin_call": ms(calls)}


async def bench_fleet(args: argparse.Namespace, etcd: LocalEtcd, workdir: Path) -> dict[str, Any]:
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
        seen = await proxies.until(lambda t: routed(t) == everyone, 120)
        if len(seen) < args.proxies:
            raise SystemExit(f"only {len(seen)} of {args.proxies} proxies got the full table")
        admin = AdminClient(channel, token)
        status = await admin.GetStatus(admin_pb2.GetStatusRequest(), timeout=10)
        if status.role != "leader":
            raise SystemExit(f"controlplane-1 is {status.role}, expected leader")
        results: dict[str, Any] = {"propagate": await propagate(args, admin, proxies)}
        agents.varying = True
        await asyncio.sleep(3.0)  # let the changing loads settle into a steady state
        before, t0 = etcd_counters(etcd), time.monotonic()
        version0 = (await admin.GetStatus(admin_pb2.GetStatusRequest(), timeout=10)).regions[0].version
        await asyncio.sleep(args.steady_seconds)
        after, elapsed = etcd_counters(etcd), time.monotonic() - t0
        version1 = (await admin.GetStatus(admin_pb2.GetStatusRequest(), timeout=10)).regions[0].version
        rates = {f"{k}_per_s": round((after[k] - before[k]) / elapsed, 2) for k in after}
        writes = rates["puts_per_s"] + rates["txns_per_s"] + rates["deletes_per_s"]
        bound = args.replicas / TICK
        results["steady"] = {**rates, "writes_per_s": round(writes, 2), "seconds": round(elapsed, 1),
                             "table_versions_per_s": round((version1 - version0) / elapsed, 2),
                             "one_write_per_replica_per_tick_per_s": bound,
                             "fraction_of_that_bound": round(writes / bound, 6)}
        return results
    finally:
        await proxies.stop()
        await agents.stop()
        await channel.close()
        stop_all(cps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.store", description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=5000)
    parser.add_argument("--per-node", type=int, default=8)
    parser.add_argument("--proxies", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=10, help="drain+undrain rounds (and compute runs x3)")
    parser.add_argument("--steady-seconds", type=float, default=20.0)
    parser.add_argument("--out", default=str(ROOT / "bench-results" / "store.json"))
    args = parser.parse_args(argv)
    compute = bench_compute(args.replicas, args.per_node, args.rounds * 3)
    print(f"compute+version of a {args.replicas}-replica table: p50 {compute['p50_ms']} ms, "
          f"p99 {compute['p99_ms']} ms ({compute['table_bytes']} bytes)", flush=True)
    with tempfile.TemporaryDirectory(prefix="ferry-bench-store-") as tmp, LocalEtcd() as etcd:
        fleet = asyncio.run(bench_fleet(args, etcd, Path(tmp)))
    result = {"replicas": args.replicas, "replicas_per_node": args.per_node, "proxies": args.proxies,
              "control_planes": 2, "tick_seconds": TICK, "compute": compute, **fleet}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    p, s = fleet["propagate"], fleet["steady"]
    print(f"drain -> table at all {args.proxies} proxies: p50 {p['all']['p50_ms']} ms, p99 {p['all']['p99_ms']} ms "
          f"(leader's proxies p99 {p['proxies_on_leader']['p99_ms']} ms, follower's p99 "
          f"{p['proxies_on_follower']['p99_ms']} ms)")
    print(f"steady etcd writes with {args.replicas} replicas: {s['writes_per_s']}/s (raft proposals "
          f"{s['raft_proposals_per_s']}/s; lease keep-alives {s['keepalive_messages_per_s']}/s, not writes) vs one "
          f"write per replica per tick = {s['one_write_per_replica_per_tick_per_s']:.0f}/s; "
          f"{s['table_versions_per_s']} table versions/s")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
