"""The tier scenarios through real processes: a control plane, one proxy, one node of simulated replicas.

Started by :class:`tools.process_fleet.Fleet` (loopback, port 0, ready files,
stopped by PID), as the end-to-end tests start theirs. Load comes from this
process over grpc.aio: interactive requests stream (TTFT = time to the first chunk),
batch ones are unary (preemptible at the proxy). Running requests per tier
are the client's in-flight counts less the proxy's
``ferry_proxy_queue_depth``, scraped every 0.2 s. The fleet is small (four
replicas of 4 slots, 2 ms decode steps: a fifth of the slots is one whole
replica, so the noisy tenant can be confined to a shard). The baselines of
isolation and noisy neighbour are taken half before and half after the
loaded window, so both sides of a ratio see the same background load on the
shared cores; work that no figure reads (the capacity probe's queue, the
rest of the reclaim backlog, the noisy tenant's queue) is cancelled rather
than waited for. Isolation and noisy neighbour run ``trials`` times (5) and
report the trial with the median ratio, with every trial's ratio in
``trials``: each compares p99s of about 80 to 130 TTFTs (``samples``), close
to the maximum, so one scheduling stall on the shared cores moves it.
``baseline_halves_ratio`` is the same ratio between the two halves of the
baseline (nothing changed between them): the noise floor of that trial.
Each result also carries ``phase_seconds``.

Cost: one fleet start (about 3 s) and about 85 s of load.
"""

from __future__ import annotations

import asyncio
import math
import re
import secrets
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from ferry.config import hash_api_key
from ferry.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tools.process_fleet import Fleet

TIER = {"interactive": common_pb2.TIER_INTERACTIVE, "standard": common_pb2.TIER_STANDARD,
        "batch": common_pb2.TIER_BATCH}
SLOTS, REPLICAS, TOKENS = 4, 4, 60
STEP = 0.002 + 0.0001 * SLOTS
CAPACITY = REPLICAS * SLOTS / (TOKENS * STEP)  # requests/s at full load
TENANTS = ("paid0", "paid1", "free0", "free1", "t0", "t1", "t2", "t3", "noisy")


def p99(values: Sequence[float]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


class Load:
    """Sends requests and records (tier, tenant, plan, sent, ttft, status) per request."""

    def __init__(self, stubs: list[Any], keys: dict[str, str], metrics_url: str) -> None:
        self.stubs, self.keys, self.metrics_url = stubs, keys, metrics_url
        self.rows: list[dict[str, Any]] = []
        self.inflight = {t: 0 for t in TIER}
        self.samples: list[tuple[float, dict[str, int], int]] = []
        self.t0 = time.monotonic()

    async def one(self, tier: str, tenant: str, tokens: int, deadline: float) -> None:
        row: dict[str, Any] = {"tier": tier, "tenant": tenant, "sent": time.monotonic() - self.t0,
                               "ttft": None, "status": "OK", "retry_after": None}
        self.n = getattr(self, "n", 0) + 1
        stub = self.stubs[self.n % len(self.stubs)]
        tokens = max(1, int(tokens * (0.5 + (self.n * 0.6180339887) % 1.0)))  # output lengths vary: 0.5x..1.5x
        req = inference_pb2.InferRequest(model="chat", prompt="tiers " + secrets.token_hex(4), max_tokens=tokens,
                                         tier=TIER[tier])
        md = (("x-api-key", self.keys[tenant]),)
        self.inflight[tier] += 1
        start = time.monotonic()
        try:
            if tier == "batch":
                await stub.Infer(req, metadata=md, timeout=deadline)
                row["ttft"] = time.monotonic() - start
            else:
                call = stub.InferStream(req, metadata=md, timeout=deadline)
                async for _chunk in call:
                    if row["ttft"] is None:
                        row["ttft"] = time.monotonic() - start
        except grpc.aio.AioRpcError as exc:
            row["status"] = exc.code().name
            row["detail"] = (exc.details() or "")[:120]
            trailing = dict(exc.trailing_metadata() or ())
            row["retry_after"] = float(trailing["retry-after"]) if "retry-after" in trailing else None
            row["ttft"] = None
        except asyncio.CancelledError:  # cut by the harness once its figure is taken: not a result
            row["status"], row["ttft"] = "CANCELLED", None
            raise
        finally:
            self.inflight[tier] -= 1
            row["done"] = time.monotonic() - self.t0
            self.rows.append(row)

    async def rate(self, tier: str, tenants: Sequence[str], rps: float, seconds: float, tokens: int = TOKENS,
                   deadline: float = 10.0, cut: float | None = None) -> None:
        """Send at ``rps`` for ``seconds``; wait for the answers, or ``cut`` seconds more and cancel the rest."""
        tasks: list[asyncio.Future[None]] = []
        begin = time.monotonic()
        n = int(rps * seconds)
        for i in range(n):
            delay = begin + i / rps - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(self.one(tier, tenants[i % len(tenants)], tokens, deadline)))
        await settle(tasks, cut)

    async def burst(self, tier: str, tenant: str, count: int, tokens: int, deadline: float) -> None:
        await asyncio.gather(*(self.one(tier, tenant, tokens, deadline) for _ in range(count)))

    async def sample(self, stop: asyncio.Event) -> None:
        pattern = re.compile(r'ferry_proxy_queue_depth\{model="chat",tier="(\w+)"\} ([0-9.e+]+)')
        quota = re.compile(r'ferry_proxy_tier_quota\{model="chat",tier="batch"\} ([0-9.e+]+)')
        while not stop.is_set():
            text = await asyncio.to_thread(lambda: urllib.request.urlopen(self.metrics_url, timeout=2).read().decode())
            depth = {m.group(1): int(float(m.group(2))) for m in pattern.finditer(text)}
            running = {t: self.inflight[t] - depth.get(t, 0) for t in TIER}
            found = quota.search(text)
            self.samples.append((time.monotonic() - self.t0, running, int(float(found.group(1))) if found else 0))
            await asyncio.sleep(0.2)


async def settle(tasks: Sequence[asyncio.Future[Any]], cut: float | None) -> None:
    """Wait for ``tasks``; with ``cut``, at most that many seconds, then cancel what is left."""
    if tasks and cut is not None:
        _, pending = await asyncio.wait(tasks, timeout=cut)
        for task in pending:
            task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _ttfts(rows: list[dict[str, Any]], **match: Any) -> list[float]:
    lo, hi = match.pop("window", (0.0, math.inf))
    return [r["ttft"] for r in rows if r["ttft"] is not None and lo <= r["sent"] < hi
            and all(r[k] == v for k, v in match.items())]


async def _scenarios(fleet: Fleet, keys: dict[str, str], trials: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # Several connections: the proxy allows 256 concurrent streams per connection ([limits]).
    channels = [grpc.aio.insecure_channel(fleet.data_plane, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(8)]
    stub = [inference_pb2_grpc.InferenceStub(c) for c in channels]
    try:
        url = f"http://{fleet.proxies[0].ready['metrics']}/metrics"
        slots = REPLICAS * SLOTS
        probe = Load(stub, keys, url)  # capacity: completions/s while saturated with standard requests
        await probe.rate("standard", ["t0", "t1", "t2", "t3"], 1.5 * CAPACITY, 2.0, deadline=20.0, cut=0.0)
        done = [r for r in probe.rows if r["status"] == "OK" and 0.5 <= r["done"] < 2.0]
        cap = max(len(done) / 1.5, 1.0)
        out["capacity_rps"] = round(cap, 1)
        phases = out["phase_seconds"] = {"capacity": round(time.monotonic() - probe.t0, 1)}

        def phase(name: str) -> None:
            phases[name] = round(time.monotonic() - probe.t0 - sum(phases.values()), 1)

        out["isolation"] = median_trial([await _isolation(stub, keys, url, cap, slots) for _ in range(trials)],
                                        "interactive_p99_ratio")
        phase("isolation")

        # reclaim
        base = Load(stub, keys, url)
        await base.rate("interactive", ["paid0"], 0.8 * cap, 1.5)
        target = 1.2 * p99(_ttfts(base.rows))
        rec = Load(stub, keys, url)
        stop = asyncio.Event()
        sampler = asyncio.ensure_future(rec.sample(stop))
        backlog = asyncio.ensure_future(rec.burst("batch", "paid1", 4 * slots, 4 * TOKENS, 30.0))
        step = 2.0
        await rec.rate("interactive", ["paid0"], 0.2 * cap, step)
        await rec.rate("interactive", ["paid0"], 0.8 * cap, 4.0)
        stop.set()
        await sampler
        reserve = math.floor(0.1 * slots)
        after = [(t - step, s["batch"], q) for t, s, q in rec.samples if t >= step]
        over = [dt for dt, b, q in after if b > q]
        floor = next((dt for dt, b, _ in after if b <= reserve + max(1, 0.05 * slots)), None)
        steady = p99(_ttfts(rec.rows, tier="interactive", window=(step + 2.5, step + 4.0)))
        bad = [w for w in (step + 0.5 * k for k in range(8))
               if p99(_ttfts(rec.rows, tier="interactive", window=(w, w + 0.5)) or [0.0]) > 1.2 * steady]
        out["reclaim"] = {"seconds": round(over[-1] + 0.2, 2) if over else 0.0,
                          "batch_to_reserve_seconds": None if floor is None else round(floor, 2),
                          "recovery_seconds": round(bad[-1] + 0.5 - step, 2) if bad else 0.0,
                          "steady_p99_ms": round(1000 * steady, 1),
                          "steady_p99_vs_no_batch": round(steady / (target / 1.2), 3)}
        await settle([backlog], 0.0)  # the rest of the backlog is not measured here
        phase("reclaim")

        out["noisy"] = median_trial([await _noisy(stub, keys, url, cap) for _ in range(trials)],
                                    "max_other_p99_ratio")
        phase("noisy")

        # overload at five times capacity
        heavy = Load(stub, keys, url)
        mix = (("interactive", ["paid0"], 0.1, 5.0), ("interactive", ["free0"], 0.1, 5.0),
               ("standard", ["paid1"], 0.2, 8.0), ("standard", ["free1"], 0.2, 8.0),
               ("batch", ["paid1"], 0.2, 15.0), ("batch", ["free1"], 0.2, 15.0))
        await asyncio.gather(*(heavy.rate(t, ten, 5 * cap * share, 3.0, deadline=d) for t, ten, share, d in mix))
        statuses: dict[str, int] = {}
        for r in heavy.rows:
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        no_retry = sum(1 for r in heavy.rows if r["status"] == "RESOURCE_EXHAUSTED" and not r["retry_after"])
        paid = [r["ttft"] for r in heavy.rows if r["tenant"] == "paid0" and r["ttft"] is not None]
        rss = _rss_mb(int(fleet.proxies[0].ready["pid"]))
        out["overload"] = {"paid_interactive_p99_ms": round(1000 * p99(paid), 1),
                           "unanswered": sum(v for k, v in statuses.items() if k not in ("OK", "RESOURCE_EXHAUSTED")),
                           "statuses": statuses, "shed_without_retry_after": no_retry, "max_rss_mb": rss,
                           "requests": len(heavy.rows),
                           "unanswered_details": sorted({r.get("detail", "") for r in heavy.rows
                                                         if r["status"] not in ("OK", "RESOURCE_EXHAUSTED")})[:3]}
        phase("overload")
    finally:
        for channel in channels:
            await channel.close()
    return out


async def _isolation(stub: list[Any], keys: dict[str, str], url: str, cap: float, slots: int) -> dict[str, Any]:
    """One isolation trial: interactive at 40 % alone, with a batch backlog of 3 x the slots, alone again."""
    # isolation: the baseline is taken before and after the backlog, so both see the same background load
    alone = Load(stub, keys, url)
    await alone.rate("interactive", ["paid0"], 0.4 * cap, 1.5)
    half = len(alone.rows)
    mixed = Load(stub, keys, url)
    stop = asyncio.Event()
    sampler = asyncio.ensure_future(mixed.sample(stop))
    backlog = asyncio.ensure_future(mixed.burst("batch", "paid1", 3 * slots, 4 * TOKENS, 30.0))
    await mixed.rate("interactive", ["paid0"], 0.4 * cap, 3.0)
    busy = [s for t, s, _ in mixed.samples if 0.5 <= t <= 3.0]
    await asyncio.wait_for(backlog, 30.0)
    stop.set()
    await sampler
    await alone.rate("interactive", ["paid0"], 0.4 * cap, 1.5)
    with_batch = _ttfts(mixed.rows, tier="interactive", window=(0.5, 9.0))
    ratio = p99(with_batch) / p99(_ttfts(alone.rows))
    util = sum(sum(s.values()) for s in busy) / (len(busy) * slots) if busy else 0.0
    return {"interactive_p99_ratio": round(ratio, 3), "utilisation": round(min(util, 1.0), 3),
            "interactive_p99_ms": round(1000 * p99(with_batch), 1),
            "interactive_alone_p99_ms": round(1000 * p99(_ttfts(alone.rows)), 1),
            "samples": [len(with_batch), len(_ttfts(alone.rows))],
            "baseline_halves_ratio": halves(alone.rows, half),
            "drained": all(r["status"] == "OK" for r in mixed.rows if r["tier"] == "batch")}


async def _noisy(stub: list[Any], keys: dict[str, str], url: str, cap: float) -> dict[str, Any]:
    """One noisy-neighbour trial: four tenants at 48 % alone, with a fifth at 72 %, alone again."""
    # noisy neighbour: the baseline before and after, as for isolation
    others = ["t0", "t1", "t2", "t3"]
    without = Load(stub, keys, url)
    await without.rate("standard", others, 0.4 * 1.2 * cap, 1.5)
    half = len(without.rows)
    noisy = Load(stub, keys, url)
    heavy_tenant = asyncio.ensure_future(noisy.rate("standard", ["noisy"], 0.6 * 1.2 * cap, 3.0, cut=0.0))
    await noisy.rate("standard", others, 0.4 * 1.2 * cap, 3.0)
    await settle([heavy_tenant], 0.0)  # what it still has queued is not measured
    await without.rate("standard", others, 0.4 * 1.2 * cap, 1.5)
    others_with = [r["ttft"] for r in noisy.rows if r["tenant"] != "noisy" and r["ttft"] is not None]
    return {"max_other_p99_ratio": round(p99(others_with) / p99(_ttfts(without.rows)), 3),
            "others_p99_ms": round(1000 * p99(others_with), 1),
            "others_alone_p99_ms": round(1000 * p99(_ttfts(without.rows)), 1),
            "samples": [len(others_with), len(_ttfts(without.rows))],
            "baseline_halves_ratio": halves(without.rows, half),
            "noisy_answered": sum(1 for r in noisy.rows if r["tenant"] == "noisy" and r["status"] == "OK"),
            "others_shed": sum(1 for r in noisy.rows if r["tenant"] != "noisy" and r["status"] != "OK")}


def halves(rows: list[dict[str, Any]], half: int) -> float:
    """p99 of the baseline taken after over the one taken before: the ratio's noise floor with nothing changed."""
    return round(p99(_ttfts(rows[half:])) / p99(_ttfts(rows[:half])), 3)


def median_trial(trials: Sequence[dict[str, Any]], key: str) -> dict[str, Any]:
    """The trial whose ``key`` is the median (the lower middle of an even count), with every trial's ``key``.

    Also every trial's ``baseline_halves_ratio`` (its noise floor).
    """
    ordered = sorted(trials, key=lambda t: t[key])
    return {**ordered[(len(ordered) - 1) // 2], "trials": [t[key] for t in trials],
            "baseline_halves": [t.get("baseline_halves_ratio") for t in trials]}


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return math.nan


def run_real(workdir: Path | None = None, trials: int = 5) -> dict[str, Any]:
    """Start the fleet, run every scenario (isolation and noisy ``trials`` times), stop it; the figures.

    Logs are kept in ``workdir`` when given.
    """
    keys = {t: "fk_" + secrets.token_hex(8) for t in TENANTS}
    tenants = [{"name": t, "api_key_sha256": hash_api_key(k), "plan": "free" if t.startswith("free") else "paid"}
               for t, k in keys.items()]
    engine = {"max_running": SLOTS, "decode_base_seconds": 0.002, "decode_seconds_per_request": 0.0001,
              "prefill_base_seconds": 0.001, "prefill_seconds_per_token": 1e-6}
    with tempfile.TemporaryDirectory() as tmp:
        where = workdir or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        fleet = Fleet(where, {"node-a": ["chat:v1"] * REPLICAS},
                      config={"tenants": tenants, "replica": engine, "limits": {"max_tokens": 4096},
                              "proxy": {"queue_timeouts": [2.0, 5.0, 30.0]}})
        try:
            fleet.start()
            started = time.monotonic()
            result = asyncio.run(_scenarios(fleet, keys, trials))
            result["wall_seconds"] = round(time.monotonic() - started, 1)
            return result
        finally:
            fleet.stop()
