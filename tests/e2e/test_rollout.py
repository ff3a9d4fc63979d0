"""A version rollout under load, end to end: v1 to v2 with a 5 % canary, promote, then roll back.

Two nodes, each with a ``chat:v1`` and a ``chat:v2`` replica (the catalog's
default is v1). Worker threads send unary requests and long streams that name
no version, without pause, while ``ferryctl rollout`` (a real subprocess) sets
a 5 % canary, promotes and rolls back. Each request is labelled with the phase
in force when it was sent; a phase starts once the proxy applied the table
published by the rollout call. Checked: no request fails, every stream ends
with its summary and the full token count on the replica it started on (no
cut, no continuation), streams that straddle promote (on v1) and rollback (on
v2) finish on the version that lost its weight, the canary share is about
5 %, and after promote everything goes to v2, after rollback to v1.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from ferry.v1 import admin_pb2, common_pb2, inference_pb2
from tests.e2e.harness import wait_for
from tools.process_fleet import Fleet

STREAM_TOKENS = 1200  # ~2.5 s at the harness's 2 ms decode steps: streams straddle every change
UNARY_WORKERS, STREAM_WORKERS = 3, 2
CANARY_SAMPLES = 400  # unary requests counted in the canary phase
MAX_REQUESTS = 4000  # a bound on the whole run, whatever happens


@dataclass
class Result:
    kind: str  # unary | stream
    phase: str  # the phase when it was sent
    started: float
    ended: float = 0.0
    version: str = ""
    replica_id: str = ""
    tokens: int = 0
    attempts: int = 0
    final: bool = False
    error: str = ""


@dataclass
class Load:
    """Worker threads sending requests until stopped; results in order of completion."""

    fleet: Fleet
    phase: str = "v1"
    stop: threading.Event = field(default_factory=threading.Event)
    results: list[Result] = field(default_factory=list)
    running: list[Result] = field(default_factory=list)  # streams in flight
    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: int = 0

    def _next(self) -> str | None:
        with self.lock:
            if self.stop.is_set() or self.sent >= MAX_REQUESTS:
                return None
            self.sent += 1
            return self.phase

    def _record(self, result: Result) -> None:
        result.ended = time.monotonic()
        with self.lock:
            self.results.append(result)
            if result in self.running:
                self.running.remove(result)

    def unary(self, worker: int) -> None:
        key = (("x-api-key", self.fleet.keys["ent"]),)
        with grpc.insecure_channel(self.fleet.data_plane) as channel:
            stub = self.fleet.inference(channel)
            i = 0
            while (phase := self._next()) is not None:
                i += 1
                result = Result("unary", phase, time.monotonic())
                request = inference_pb2.InferRequest(model="chat", prompt=f"rollout {worker} {i}", max_tokens=4,
                                                     tier=common_pb2.TIER_STANDARD)
                try:
                    reply = stub.Infer(request, metadata=key, timeout=10)
                    result.version, result.replica_id = reply.model_version, reply.replica_id
                    result.tokens, result.attempts, result.final = reply.completion_tokens, reply.attempts, True
                except grpc.RpcError as exc:
                    result.error = f"{exc.code().name}: {exc.details()}"
                self._record(result)

    def stream(self, worker: int) -> None:
        key = (("x-api-key", self.fleet.keys["ent"]),)
        with grpc.insecure_channel(self.fleet.data_plane) as channel:
            stub = self.fleet.inference(channel)
            i = 0
            while (phase := self._next()) is not None:
                i += 1
                result = Result("stream", phase, time.monotonic())
                with self.lock:
                    self.running.append(result)
                request = inference_pb2.InferRequest(model="chat", prompt=f"stream {worker} {i}",
                                                     max_tokens=STREAM_TOKENS, tier=common_pb2.TIER_STANDARD)
                try:
                    for chunk in stub.InferStream(request, metadata=key, timeout=30):
                        if chunk.final:
                            s = chunk.summary
                            result.final, result.version, result.replica_id = True, s.model_version, s.replica_id
                            result.attempts = s.attempts
                        else:
                            result.tokens += chunk.tokens
                except grpc.RpcError as exc:
                    result.error = f"{exc.code().name}: {exc.details()}"
                self._record(result)

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.unary, args=(i,), daemon=True) for i in range(UNARY_WORKERS)]
        threads += [threading.Thread(target=self.stream, args=(i,), daemon=True) for i in range(STREAM_WORKERS)]
        for t in threads:
            t.start()
        return threads

    def running_since(self, phase: str, seconds: float) -> bool:
        """Whether a stream sent in ``phase`` has been running for ``seconds``."""
        with self.lock:
            return any(r.phase == phase and time.monotonic() - r.started >= seconds for r in self.running)

    def done(self, kind: str, phase: str) -> list[Result]:
        with self.lock:
            return [r for r in self.results if r.kind == kind and r.phase == phase]


def ferryctl(fleet: Fleet, *args: str) -> dict[str, Any]:
    code = "import sys; from ferry_cli.ctl.main import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, "--control-plane", fleet.cp_address, "--admin-token",
                           fleet.admin_token, "--json", "rollout", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def switch(fleet: Fleet, load: Load, phase: str, *args: str) -> tuple[dict[str, Any], float]:
    """Run ``ferryctl rollout ARGS``; label requests ``phase`` once the proxy applied the resulting table."""
    load.phase = f"before-{phase}"
    called = time.monotonic()
    row = ferryctl(fleet, *args)
    channel, admin = fleet.admin()
    with channel:
        published = admin.GetTable(admin_pb2.GetTableRequest(region="local"), timeout=5).regions[0].version

        def applied() -> bool:
            proxies = admin.GetTable(admin_pb2.GetTableRequest(region="local"), timeout=5).proxies
            return bool(proxies) and proxies[0].applied_version >= published

        wait_for(applied, 10, f"the proxy to apply table {published} ({phase})")
    load.phase = phase
    return row, called


def straddling(load: Load, at: float) -> list[Result]:
    """Streams started before ``at`` that ended after it."""
    with load.lock:
        return [r for r in load.results if r.kind == "stream" and r.started < at < r.ended]


def test_a_rollout_under_load_fails_no_request_and_cuts_no_stream(make_fleet) -> None:
    fleet = make_fleet({"node-a": ["chat:v1", "chat:v2"], "node-b": ["chat:v1", "chat:v2"]})
    v2 = {r.replica_id for r in fleet.replicas().values() if r.version == "v2"}
    assert len(v2) == 2
    load = Load(fleet)
    threads = load.start()
    try:
        wait_for(lambda: len(load.done("unary", "v1")) >= 40, 15, "unary requests before the rollout")

        row, _ = switch(fleet, load, "canary", "chat", "--version", "v2", "--canary", "5")
        assert (row["state"], row["stable"], row["canary"], row["canary_pct"]) == ("canary", "v1", "v2", 5)
        assert row["regions"][0]["canary_share"] == 0.05
        wait_for(lambda: len(load.done("unary", "canary")) >= CANARY_SAMPLES, 30, "unary requests in the canary")
        wait_for(lambda: load.running_since("canary", 0.3), 15, "a stream sent in the canary to be running")

        row, promoted_at = switch(fleet, load, "promoted", "chat", "--promote")
        assert (row["state"], row["default"]) == ("promoted", "v2")
        wait_for(lambda: len(load.done("unary", "promoted")) >= 100, 15, "unary requests after promote")
        wait_for(lambda: load.running_since("promoted", 0.3), 15, "a stream sent after promote to be running")

        row, rolled_back_at = switch(fleet, load, "rolled_back", "chat", "--rollback")
        assert (row["state"], row["default"]) == ("rolled_back", "v1")
        wait_for(lambda: len(load.done("unary", "rolled_back")) >= 100, 15, "unary requests after rollback")
        wait_for(lambda: straddling(load, rolled_back_at), 15, "a stream running across the rollback to end")
    finally:
        load.stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)

    results = load.results
    failed = [r for r in results if r.error or not r.final]
    assert failed == [], failed[:5]
    streams = [r for r in results if r.kind == "stream"]
    assert streams and all(r.tokens == STREAM_TOKENS and r.attempts == 1 for r in streams), "a stream was cut"
    assert all(r.attempts == 1 for r in results)

    def versions(phase: str) -> set[str]:
        return {r.version for r in results if r.phase == phase}

    assert versions("v1") == {"v1"}
    canary = load.done("unary", "canary")
    share = sum(r.version == "v2" for r in canary) / len(canary)
    assert 0.01 <= share <= 0.12, f"canary share {share:.3f} of {len(canary)} requests"
    assert {r.replica_id for r in canary if r.version == "v2"} <= v2
    assert versions("promoted") == {"v2"}
    assert versions("rolled_back") == {"v1"}

    # Drain safety: streams running when a version lost its weight finished there, whole.
    across_promote = [r for r in straddling(load, promoted_at) if r.version == "v1"]
    across_rollback = [r for r in straddling(load, rolled_back_at) if r.version == "v2"]
    assert across_promote, "no v1 stream ran across the promote"
    assert across_rollback, "no v2 stream ran across the rollback"
    assert all(r.tokens == STREAM_TOKENS for r in across_promote + across_rollback)
    print(f"\nrollout under load: {len(results)} requests ({len(streams)} streams), 0 failed; canary share "
          f"{share:.3f} of {len(canary)}; streams across promote on v1: {len(across_promote)}, across rollback on "
          f"v2: {len(across_rollback)}")
