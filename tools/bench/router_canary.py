"""Drill: a router config canary under steady load, rolled back by the guard when bad, promoted when good.

Starts a fleet of real processes (:class:`tools.process_fleet.Fleet`, as
``ferry up --proxies 2`` runs them, each proxy on its own port so that the
load reaches both evenly): one control plane, two proxies, two nodes of one
fast simulated replica each. A closed loop of ``--workers`` streams per proxy
(``--max-tokens`` tokens each, interactive tier) runs for the whole drill,
bounded by ``--seconds`` per phase and ``--max-requests`` in all. Then:

1. **bad**: a config that makes TTFT much worse is rolled out at 50 % (one
   proxy of two). The bad config is ``admission_capacity_share`` set so that
   the proxy dispatches a single request at a time (1.5 / the fleet's
   concurrency, rounded down to one slot): its requests queue behind one
   another, so their TTFT grows to several decode times, every window, on
   any load, without a request failing (the tier queue holds them well
   within its timeout). The guard must roll it back by itself.
2. **good**: a harmless config (``detour_factor`` 20) at 50 %: the guard
   must promote it by itself after ``min_seconds``.

The guard runs with ``--window-seconds`` (1) windows, ``--min-requests``
(10), ``--ratio`` (2.0: the bad config is far beyond it, noise on a loaded
2-core machine is not), ``min_seconds`` 3 and ``max_seconds`` ``--seconds``.
Printed and written to ``bench-results/router_canary.json``: per phase the
time from the rollout call to the decision, the windows counted and bad,
the final state and reason; requests sent and failed over the whole drill
(must be 0).

    python -m tools.bench.router_canary [--seconds 40] [--workers 4]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from ferry.v1 import admin_pb2, common_pb2, inference_pb2, inference_pb2_grpc
from tools.process_fleet import Fleet

RESULTS = Path("bench-results") / "router_canary.json"


class Load:
    """A closed loop of streams on each proxy until stopped, at most ``max_requests`` in all."""

    def __init__(self, addresses: list[str], key: str, *, workers: int, max_tokens: int, max_requests: int) -> None:
        self._addresses = addresses
        self._key = key
        self._workers = workers
        self._max_tokens = max_tokens
        self._max_requests = max_requests
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.sent = 0
        self.failed: dict[str, int] = {}
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for address in self._addresses:
            for _ in range(self._workers):
                thread = threading.Thread(target=self._loop, args=(address,), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _loop(self, address: str) -> None:
        with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            metadata = (("x-api-key", self._key),)
            n = 0
            while not self._stop.is_set():
                with self._lock:
                    if self.sent >= self._max_requests:
                        return
                    self.sent += 1
                n += 1
                request = inference_pb2.InferRequest(model="chat", tier=common_pb2.TIER_INTERACTIVE,
                                                     prompt=f"canary drill {n % 40} hello there",
                                                     max_tokens=self._max_tokens)
                try:
                    for _ in stub.InferStream(request, metadata=metadata, timeout=30):
                        pass
                except grpc.RpcError as exc:
                    with self._lock:
                        self.failed[exc.code().name] = self.failed.get(exc.code().name, 0) + 1

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(40)


def _wait(predicate: Any, seconds: float, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None


def phase(admin: Any, text: str, guard: admin_pb2.RouterGuard, seconds: float) -> dict[str, Any]:
    """Roll ``text`` out at 50 % and wait for the guard's decision; the figures of the phase."""
    started = time.monotonic()
    view = admin.RouterRollout(admin_pb2.RouterRolloutRequest(text=text, canary_percent=50, guard=guard),
                               timeout=30).rollout
    rollout_id = view.id

    def decided() -> Any:
        reply = admin.GetRouter(admin_pb2.GetRouterRequest(), timeout=5)
        return reply if reply.rollout.id == rollout_id and reply.rollout.state != "canary" else None
    reply = _wait(decided, seconds + 10) or admin.GetRouter(admin_pb2.GetRouterRequest(), timeout=5)
    took = time.monotonic() - started
    rollout = reply.rollout

    def restored() -> bool:  # every proxy acks the default version again
        now = admin.GetRouter(admin_pb2.GetRouterRequest(), timeout=5)
        return all(p.applied_version == now.default_version for p in now.proxies if p.connected)
    settled = _wait(restored, 10)
    after = admin.GetRouter(admin_pb2.GetRouterRequest(), timeout=5)
    return {"candidate_version": rollout.candidate_version, "baseline_version": rollout.baseline_version,
            "state": rollout.state, "reason": rollout.reason, "seconds_to_decision": round(took, 2),
            "seconds_to_every_proxy_on_default": round(time.monotonic() - started, 2) if settled else None,
            "seconds_rollout_to_decision_recorded": round(rollout.decided_at - rollout.started_at, 2)
            if rollout.decided_at else None,
            "windows": rollout.windows, "bad_windows": rollout.bad_windows, "llr": round(rollout.llr, 3),
            "canary": {"requests": rollout.canary.requests, "errors": rollout.canary.errors,
                       "ttft_p99_seconds": rollout.canary.ttft_p99_seconds},
            "baseline": {"requests": rollout.baseline.requests, "errors": rollout.baseline.errors,
                         "ttft_p99_seconds": rollout.baseline.ttft_p99_seconds},
            "proxies": {p.proxy_id: p.applied_version for p in after.proxies}}  # once all ran the default


def bad_config(admin: Any) -> str:
    """A config that lets a proxy dispatch one request at a time (see the module docstring)."""
    tiers = admin.GetTiers(admin_pb2.GetTiersRequest(), timeout=5).tiers  # the region's slots, by tier
    concurrency = sum(t.reserved_slots for t in tiers) or 32
    return f"[proxy]\nadmission_capacity_share = {min(1.0, 1.5 / concurrency):.6f}\n"


GOOD_CONFIG = "[proxy]\ndetour_factor = 20.0\n"


def run(workdir: Path, *, seconds: float = 40.0, workers: int = 4, max_tokens: int = 16,
        max_requests: int = 200_000, window_seconds: float = 1.0, min_requests: int = 10,
        ratio: float = 2.0, phases: tuple[str, ...] = ("bad", "good")) -> dict[str, Any]:
    """The drill in ``workdir``; returns its figures."""
    fleet = Fleet(workdir, {"n1": ["chat"], "n2": ["chat"]}, proxies=2,
                  config={"proxy": {"usage_report_seconds": 0.5}})
    fleet.start()
    try:
        channel, admin = fleet.admin()
        with channel:
            bad = bad_config(admin)
            load = Load([str(p.ready["grpc"]) for p in fleet.proxies], fleet.keys["ent"], workers=workers,
                        max_tokens=max_tokens, max_requests=max_requests)
            load.start()
            guard = admin_pb2.RouterGuard(ttft_p99_ratio=ratio, min_requests=min_requests,
                                          window_seconds=window_seconds, min_seconds=3.0, max_seconds=seconds)
            out: dict[str, Any] = {"bad_config": bad, "good_config": GOOD_CONFIG}
            try:
                time.sleep(2.0)  # the load settles; both proxies report
                for name in phases:
                    out[name] = phase(admin, bad if name == "bad" else GOOD_CONFIG, guard, seconds)
            finally:
                load.stop()
            out["requests"] = load.sent
            out["failed"] = sum(load.failed.values())
            out["failed_by_code"] = load.failed
            return out
    finally:
        fleet.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=40.0, help="each phase's max_seconds (bound)")
    parser.add_argument("--workers", type=int, default=4, help="streams in flight per proxy")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-requests", type=int, default=200_000)
    parser.add_argument("--window-seconds", type=float, default=1.0)
    parser.add_argument("--min-requests", type=int, default=10)
    parser.add_argument("--ratio", type=float, default=2.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ferry-router-canary-") as tmp:
        figures = run(Path(tmp), seconds=args.seconds, workers=args.workers, max_tokens=args.max_tokens,
                      max_requests=args.max_requests, window_seconds=args.window_seconds,
                      min_requests=args.min_requests, ratio=args.ratio)
    figures["command"] = "python -m tools.bench.router_canary " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items())
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
