"""The control plane's own CPU and memory at scale: 5,000 replicas reporting at the agents' default interval.

One control plane (``ferry controlplane --store etcd://``, the leader, alone)
on a local etcd holds every node's ``Fleet.Connect`` stream: ``--replicas``
(5,000) on nodes of ``--per-node`` (8), as agents batch them (one stream per
node, one ``Telemetry`` message per interval carrying every replica's load,
``--interval`` 0.5 s: the agents' default ``telemetry_interval_seconds``);
loads change at every message, so every tick publishes a new table.
``--proxies`` (50) fake proxies (:class:`tools.bench.store.Proxies`) watch
the region, apply every version and ack it.

Measured on the control plane's process alone, from ``/proc/{pid}/stat``
(user + system CPU seconds over wall seconds: 1.0 is one core;
:func:`ferry.procs.cpu_seconds`) and ``/proc/{pid}/status`` (``VmRSS``,
:func:`tools.drills.rss_bytes`, sampled every 0.1 s: the last and the peak):

1. **steady**: ``--steady-seconds`` (20) of telemetry and table pushes;
2. **burst**: ``--drains`` (100) replicas drained through the Admin API,
   ``--concurrency`` (10) at a time (each call returns once the leader's
   tables reflect it), then undrained the same way; CPU over the whole burst;
   the drains refused (the store said unreachable) are counted, and the store
   verdict is sampled every 0.1 s through ``GetStatus``.

Also, in process: one table computation after one drain, with every row built
and with the rows of the last computation reused
(:class:`controlplane.tables.compute.RouteRows`).

Prints the figures and writes ``bench-results/controlplane.json``. Usage:
``python -m tools.bench.controlplane [--replicas 5000] [--proxies 50]``. One
2-core machine runs everything (etcd, the control plane, every fake agent and
proxy in one load process): the control plane's CPU is its own, but it
competes for the cores with the load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from tomli_w import dumps

from controlplane.fleet.view import FleetView
from controlplane.tables.compute import RouteRows, compute_tables
from ferry.config import ModelConfig
from ferry.procs import Child, cpu_seconds, stop_all
from ferry.v1 import admin_pb2, fleet_pb2
from ferry_cli.ctl.client import AdminClient
from harness.etcd import LocalEtcd
from tools.bench.store import Agents, Proxies, etcd_counters, loads, ms, registration, routed
from tools.drills import rss_bytes

ROOT = Path(__file__).resolve().parents[2]
TICK = 0.5
MIB = 1 << 20


def cpu_of(pid: int) -> float:
    seconds = cpu_seconds(pid)
    if seconds is None:
        raise SystemExit(f"the control plane (pid {pid}) is gone")
    return seconds


class Window:
    """One process's CPU over wall seconds between :meth:`start` and :meth:`close`, with its RSS sampled
    every 0.1 s and, given an Admin client, the store verdict the control plane reports."""

    def __init__(self, pid: int, admin: Any = None) -> None:
        self.pid = pid
        self.admin = admin
        self.rss: list[int] = []
        self.verdicts: list[bool] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.cpu0 = self.wall0 = 0.0

    def start(self) -> Window:
        self.cpu0, self.wall0 = cpu_of(self.pid), time.monotonic()
        self._task = asyncio.create_task(self._sample())
        return self

    async def _sample(self) -> None:
        while not self._stop.is_set():
            self.rss.append(rss_bytes(self.pid))
            if self.admin is not None:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    status = await self.admin.GetStatus(admin_pb2.GetStatusRequest(), timeout=5)
                    self.verdicts.append(status.store.healthy)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.1):
                    await self._stop.wait()

    async def close(self) -> dict[str, Any]:
        cpu, wall = cpu_of(self.pid) - self.cpu0, time.monotonic() - self.wall0
        self._stop.set()
        if self._task is not None:
            await self._task
        result: dict[str, Any] = {
            "cpu_seconds": round(cpu, 2), "wall_seconds": round(wall, 2), "cores": round(cpu / wall, 3),
            "rss_mib": round(self.rss[-1] / MIB, 1), "peak_rss_mib": round(max(self.rss) / MIB, 1)}
        if self.admin is not None:
            result.update(store_verdicts=len(self.verdicts), store_unhealthy=self.verdicts.count(False))
        return result


def bench_rows(replicas: int, per_node: int, rounds: int) -> dict[str, Any]:
    """One computation after one drain: every row built, against the last computation's rows reused."""
    fleet = FleetView(clock=time.monotonic, grace_seconds=3600)
    rng = random.Random(1)
    for n in range(replicas // per_node):
        member = fleet.register(registration(n, per_node))
        fleet.apply_telemetry(member, fleet_pb2.Telemetry(seq=1, replicas=loads(registration(n, per_node), rng)))
    catalog = (ModelConfig(name="chat"),)
    rows = RouteRows()
    compute_tables(fleet.members(), catalog, set(), now=time.monotonic(), grace_seconds=3600, rows=rows)
    full: list[float] = []
    reused: list[float] = []
    for i in range(rounds):
        drains = {f"node-{i:04d}-r0"}
        for out, cache in ((full, None), (reused, rows)):
            started = time.perf_counter()
            compute_tables(fleet.members(), catalog, drains, now=time.monotonic(), grace_seconds=3600, rows=cache)
            out.append(time.perf_counter() - started)
    return {"every_row_built": ms(full), "rows_reused": ms(reused), "rows_built_last": rows.built}


async def burst(admin: Any, ids: list[str], concurrency: int) -> dict[str, Any]:
    """Drain then undrain ``ids`` through the Admin API, ``concurrency`` calls at a time; the refusals."""
    refused: list[str] = []
    gate = asyncio.Semaphore(concurrency)
    times: list[float] = []

    async def one(method: Any, replica_id: str) -> None:
        async with gate:
            t0 = time.monotonic()
            try:
                await method(admin_pb2.DrainRequest(replica_id=replica_id), timeout=30)
                times.append(time.monotonic() - t0)
            except grpc.aio.AioRpcError as exc:
                refused.append(f"{exc.code().name}: {exc.details()}")

    await asyncio.gather(*(one(admin.Drain, r) for r in ids))
    await asyncio.gather(*(one(admin.Undrain, r) for r in ids))
    return {"calls": ms(times) if times else {}, "refused": len(refused),
            "first_refusal": refused[0] if refused else ""}


async def bench_process(args: argparse.Namespace, etcd: LocalEtcd, workdir: Path) -> dict[str, Any]:
    config = workdir / "ferry.toml"
    config.write_text(dumps({"models": [{"name": "chat"}], "controlplane": {"tick_seconds": TICK}}))
    token = secrets.token_hex(16)
    cp = Child("controlplane-1", ["controlplane", "--store", f"etcd://{etcd.endpoint}", "--id", "controlplane-1",
                                  "--config", str(config), "--log-level", "WARNING", "--insecure"], workdir,
               env={"FERRY_ADMIN_TOKEN": token}).start()
    try:
        cp.wait_ready(30)
        address = cp.ready["grpc"]
        idle = round(rss_bytes(cp.pid) / MIB, 1)
        nodes = Agents([address], args.replicas, args.per_node, interval=args.interval, varying=True)
        proxies = Proxies([address], args.proxies)
        channel = grpc.aio.insecure_channel(address)
        admin = AdminClient(channel, token)
        try:
            await nodes.start()
            await proxies.start()
            everyone = {r.replica_id for reg in nodes.regs for r in reg.replicas}
            t0 = time.monotonic()
            seen = await proxies.until(lambda t: routed(t) == everyone, args.register_seconds)
            if len(seen) < args.proxies:
                most = max((len(routed(t)) for t in proxies.latest if t is not None), default=0)
                raise SystemExit(f"only {len(seen)} of {args.proxies} proxies got the full table in "
                                 f"{args.register_seconds:g} s ({len(nodes.registered)} of {len(nodes.regs)} nodes "
                                 f"registered, {nodes.reconnects} registrations retried; at most {most} replicas "
                                 "routed)")
            registered_in = round(time.monotonic() - t0, 1)
            await asyncio.sleep(3.0)  # settle into the steady state
            sent0, window, before = nodes.sent, Window(cp.pid).start(), etcd_counters(etcd)
            await asyncio.sleep(args.steady_seconds)
            steady = await window.close()
            after = etcd_counters(etcd)
            steady["etcd_per_s"] = {k: round((after[k] - before[k]) / steady["wall_seconds"], 1)
                                    for k in ("puts", "txns", "deletes", "lease_grants", "lease_revokes",
                                              "lease_renewals")}
            steady["telemetry_messages_per_s"] = round((nodes.sent - sent0) / steady["wall_seconds"], 1)
            ids = [reg.replicas[1].replica_id for reg in nodes.regs][: args.drains]
            window = Window(cp.pid, admin).start()
            calls = await burst(admin, ids, args.concurrency)
            during = await window.close()
            during.update(calls)
            return {"idle_rss_mib": idle, "registered_in_seconds": registered_in,
                    "registrations_retried": nodes.reconnects, "steady": steady, "burst": during}
        finally:
            await proxies.stop()
            await nodes.stop()
            await channel.close()
    finally:
        stop_all([cp])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.controlplane", description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=5000)
    parser.add_argument("--per-node", type=int, default=8)
    parser.add_argument("--interval", type=float, default=0.5, help="telemetry interval of each node (s)")
    parser.add_argument("--proxies", type=int, default=50)
    parser.add_argument("--drains", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--steady-seconds", type=float, default=20.0)
    parser.add_argument("--register-seconds", type=float, default=300.0,
                        help="how long every proxy may take to get the whole fleet's table")
    parser.add_argument("--out", default=str(ROOT / "bench-results" / "controlplane.json"))
    args = parser.parse_args(argv)
    rows = bench_rows(args.replicas, args.per_node, 20)
    print(f"one computation after one drain, {args.replicas} replicas: every row built p50 "
          f"{rows['every_row_built']['p50_ms']} ms, rows reused p50 {rows['rows_reused']['p50_ms']} ms "
          f"({rows['rows_built_last']} rows built: the last drain's replica, routable again)", flush=True)
    with tempfile.TemporaryDirectory(prefix="ferry-bench-cp-") as tmp, LocalEtcd() as etcd:
        fleet = asyncio.run(bench_process(args, etcd, Path(tmp)))
    result = {"replicas": args.replicas, "replicas_per_node": args.per_node, "nodes": args.replicas // args.per_node,
              "telemetry_interval_seconds": args.interval, "proxies": args.proxies, "tick_seconds": TICK,
              "cpus": os.cpu_count(), "compute_after_one_drain": rows, **fleet}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    s, b = fleet["steady"], fleet["burst"]
    print(f"steady, {args.replicas} replicas on {args.replicas // args.per_node} nodes every {args.interval:g} s "
          f"({s['telemetry_messages_per_s']} messages/s), {args.proxies} proxies: {s['cores']} cores, "
          f"RSS {s['rss_mib']} MiB (peak {s['peak_rss_mib']}; {fleet['idle_rss_mib']} MiB before the fleet); "
          f"etcd per second: {s['etcd_per_s']}")
    print(f"burst of {args.drains} drains + undrains ({args.concurrency} at a time) in {b['wall_seconds']} s: "
          f"{b['cores']} cores, RSS {b['rss_mib']} MiB (peak {b['peak_rss_mib']} MiB); call p50 "
          f"{b['calls'].get('p50_ms')} ms p99 {b['calls'].get('p99_ms')} ms; refused {b['refused']}; "
          f"store unhealthy in {b['store_unhealthy']} of {b['store_verdicts']} samples")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
