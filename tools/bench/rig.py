"""The rig of the request-path benchmarks: one cheap replica behind one proxy, and the closed-loop measure.

:func:`one_replica_fleet` starts a control plane, a proxy (and any further
proxies asked, each in front of the same replica) and one node with
one simulated replica whose engine costs almost nothing (1 ms steps, no
prefill cost; the benchmarks ask 1 output token), each its own process, plain
text on loopback, and yields once the proxy routes to the replica.
:func:`compare` measures each named call twice with :func:`measure`: p50/p99
at one request in flight for ``seconds``, then the closed-loop rate at
``concurrency`` in flight; :func:`difference` and :func:`print_rows` report a
pair. Used by :mod:`tools.bench.overhead` (the proxy hop) and
:mod:`tools.bench.http` (the HTTP front door against gRPC).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tomli_w import dumps

from ferry.config import hash_api_key
from ferry.procs import Child, stop_all
from ferry_cli.up.ready import wait_routable
from tools.report import percentile

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "one two three four five six seven eight"
MODEL = "bench-model"
Call = Callable[[], Awaitable[Any]]


@dataclass(frozen=True)
class Fleet:
    """What a benchmark needs of the running rig: the proxy's ready file, the replica's, and the API key."""

    proxy: dict[str, Any]
    replica: dict[str, Any]
    key: str
    others: tuple[dict[str, Any], ...] = ()  # the ready files of the further proxies (``more_proxies``)
    node_pid: int = 0  # the node's process (its agent and the replica)


def proxy_ids(ready: dict[str, Any]) -> list[str]:
    """The proxy ids a proxy's ready file stands for: each worker's under ``--workers N``, else its own."""
    return [w["proxy_id"] for w in ready.get("workers", [])] or [ready["proxy_id"]]


def rig_config(sections: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """A fresh API key and the rig's config file: one enterprise tenant of that key, the model, a near-free
    simulated replica (1,024 slots, 1 ms decode steps, no prefill time), and ``sections`` added."""
    key = "fk_" + secrets.token_hex(16)
    return key, {
        "tenants": [{"name": "bench", "api_key_sha256": hash_api_key(key), "plan": "enterprise"}],
        "models": [{"name": MODEL}],
        "replica": {"max_running": 1024, "max_queue": 8192, "prefill_base_seconds": 0.0,
                    "prefill_seconds_per_token": 0.0, "decode_base_seconds": 0.001,
                    "decode_seconds_per_request": 0.0},
        **(sections or {}),
    }


@contextlib.contextmanager
def one_replica_fleet(proxy_args: Sequence[str] = (), *, sections: Mapping[str, Any] | None = None,
                      more_proxies: Sequence[Sequence[str]] = ()) -> Iterator[Fleet]:
    """The rig's processes (``proxy_args`` added to the proxy's; ``sections`` added to the config file; one more
    proxy per ``more_proxies`` entry, with those arguments, in front of the same replica), stopped on exit
    whatever happens."""
    key, config = rig_config(sections)
    with tempfile.TemporaryDirectory(prefix="ferry-bench-") as tmp:
        work = Path(tmp)
        (work / "ferry.toml").write_text(dumps(config))
        cfg = ["--config", str(work / "ferry.toml"), "--insecure"]  # plain text on loopback
        children: list[Child] = []
        try:
            token = secrets.token_hex(16)  # the Admin API's, for wait_routable
            cp = Child("controlplane", ["controlplane", *cfg], work, env={"FERRY_ADMIN_TOKEN": token}).start()
            children.append(cp)
            cp_addr = cp.wait_ready()["grpc"]
            proxy = Child("proxy", ["proxy", "--control-plane", cp_addr, "--id", "bench-proxy", "--workers", "1",
                                    *proxy_args, *cfg],
                          work).start()
            others = [Child(f"proxy-{k + 2}", ["proxy", "--control-plane", cp_addr, "--id", f"bench-proxy-{k + 2}",
                                               "--workers", "1", *args, *cfg], work).start()
                      for k, args in enumerate(more_proxies)]
            node = Child("node", ["node", "--node", "bench-node", "--control-plane", cp_addr,
                                  "--replica", f"{MODEL}:v1", *cfg], work).start()
            children += [proxy, *others, node]
            ready = proxy.wait_ready()
            node_ready = node.wait_ready()
            replica = node_ready["replicas"][0]
            readies = [ready, *(o.wait_ready() for o in others)]
            for proxy_id in (i for r in readies for i in proxy_ids(r)):
                wait_routable(cp_addr, {replica["replica_id"]}, proxy_id, 30, children, admin_token=token)
            yield Fleet(proxy=ready, replica=replica, key=key, others=tuple(readies[1:]), node_pid=node_ready["pid"])
        finally:
            stop_all(children)


async def measure(call: Call, concurrency: int, seconds: float) -> dict[str, float]:
    """Closed loop: ``concurrency`` workers call for ``seconds``; latency percentiles, rate and errors."""
    latencies: list[float] = []
    errors = 0
    stop_at = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal errors
        while time.monotonic() < stop_at:
            t0 = time.monotonic()
            try:
                await call()
                latencies.append(time.monotonic() - t0)
            except Exception:  # any failed call counts as an error, whatever its client
                errors += 1

    for _ in range(min(concurrency, 8)):  # warm-up
        await call()
    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.monotonic() - t0
    return {"p50_ms": round(percentile(latencies, 50) * 1000, 3), "p99_ms": round(percentile(latencies, 99) * 1000, 3),
            "rps": round(len(latencies) / elapsed, 1), "requests": len(latencies), "errors": errors}


async def compare(calls: Sequence[tuple[str, Call]], concurrency: int, seconds: float) -> dict[str, Any]:
    """Each call at one in flight (p50, p99), then at ``concurrency`` in flight (the rate), one after the other."""
    out: dict[str, Any] = {}
    for name, call in calls:
        idle = await measure(call, 1, seconds)
        loaded = await measure(call, concurrency, seconds)
        out[name] = {"p50_ms": idle["p50_ms"], "p99_ms": idle["p99_ms"], "max_rps": loaded["rps"],
                     "loaded_p50_ms": loaded["p50_ms"], "loaded_p99_ms": loaded["p99_ms"],
                     "errors": idle["errors"] + loaded["errors"]}
    out["concurrency"] = concurrency
    out["seconds_per_measurement"] = seconds
    return out


def difference(result: dict[str, Any], base: str, other: str) -> None:
    """Add what ``other`` adds to ``base``: p50 and p99 at one in flight, and the ratio of their rates."""
    result["added_p50_ms"] = round(result[other]["p50_ms"] - result[base]["p50_ms"], 3)
    result["added_p99_ms"] = round(result[other]["p99_ms"] - result[base]["p99_ms"], 3)
    result["throughput_ratio"] = round(result[other]["max_rps"] / result[base]["max_rps"], 3)


def print_rows(result: dict[str, Any], names: Sequence[str]) -> None:
    """One line per measured call: latency at one in flight, the rate and latency at the concurrency, errors."""
    width = max(len(n) for n in names)
    for name in names:
        r = result[name]
        print(f"{name:<{width}} p50 {r['p50_ms']:7.3f} ms  p99 {r['p99_ms']:7.3f} ms  (1 in flight)   "
              f"max {r['max_rps']:8.1f} req/s  (p50 {r['loaded_p50_ms']:.1f} ms at {result['concurrency']} in "
              f"flight)  errors {r['errors']}")
