"""The peer benchmark's parts: the load generator against a fake SSE server, the CPU reader, the cache limit, flags."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest

from agent.replica.engine import EngineParams
from ferry.tokens import block_hashes
from tools import trace as tracefile
from tools.bench import peers as bench_peers
from tools.peers import load, procs, routers, simulated
from tools.peers.load import Limits, Planned

ROOT = Path(__file__).resolve().parents[2]


class FakeWorker:
    """A tiny HTTP/1.1 server with an OpenAI-style streaming ``/v1/completions`` and SGLang ``/generate``.

    Each request waits ``first_delay`` seconds, then sends ``max_tokens`` events
    ``step`` seconds apart and ``data: [DONE]``, chunked, on a keep-alive
    connection. A prompt starting with ``fail`` gets a 503; ``error`` an error
    event; ``hang`` no answer at all.
    """

    def __init__(self, first_delay: float = 0.05, step: float = 0.002) -> None:
        self.first_delay, self.step = first_delay, step
        self.server: asyncio.Server | None = None
        self.port = 0
        self.requests = 0
        self.connections = 0

    async def start(self) -> FakeWorker:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, path, _ = line.decode().split(" ", 2)
                headers = {}
                while (h := await reader.readline()) not in (b"\r\n", b""):
                    k, _, v = h.decode().partition(":")
                    headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if method == "GET":
                    self._plain(writer, 200, json.dumps({"status": "ok", "load": 0}))
                    await writer.drain()
                    continue
                await self._generate(writer, path, json.loads(body))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def _plain(self, writer: asyncio.StreamWriter, status: int, text: str) -> None:
        data = text.encode()
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
                     .encode() + data)

    async def _generate(self, writer: asyncio.StreamWriter, path: str, body: dict[str, object]) -> None:
        self.requests += 1
        prompt = str(body.get("prompt") or body.get("text") or "")
        if prompt.startswith("fail"):
            self._plain(writer, 503, '{"error": "overloaded"}')
            return
        if prompt.startswith("hang"):
            await asyncio.sleep(3600)
        sampling = body.get("sampling_params") or {}
        n = int(body.get("max_tokens") or (sampling.get("max_new_tokens") if isinstance(sampling, dict) else 1) or 1)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        await asyncio.sleep(self.first_delay)

        def event(payload: str) -> None:
            data = f"data: {payload}\n\n".encode()
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

        if prompt.startswith("error"):
            event(json.dumps({"error": {"message": "boom"}}))
        else:
            for i in range(n):
                last = i == n - 1
                if path == "/generate":
                    event(json.dumps({"text": "w " * (i + 1), "meta_info": {"finish_reason": "length" if last
                                                                              else None}}))
                else:
                    event(json.dumps({"choices": [{"text": f"w{i} ", "finish_reason": "length" if last else None}]}))
                await writer.drain()
                await asyncio.sleep(self.step)
            event("[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()


def _planned(prompts: list[str], gap: float = 0.01, max_tokens: int = 4) -> list[Planned]:
    return [Planned(i, i * gap, p, max_tokens) for i, p in enumerate(prompts)]


async def test_http_load_measures_ttft_and_counts_errors() -> None:
    worker = await FakeWorker(first_delay=0.08).start()
    try:
        requests = _planned(["hello world"] * 6 + ["fail now", "error now"])
        outcomes, elapsed = await load.run(load.HttpTarget(worker.url), requests, Limits(concurrency=4, timeout=5))
    finally:
        await worker.stop()
    ok = [o for o in outcomes if o.status == "OK"]
    assert len(ok) == 6
    assert all(o.ttft_s is not None and 0.07 <= o.ttft_s < 1.0 for o in ok)
    assert all(o.e2e_s >= o.ttft_s for o in ok if o.ttft_s is not None)
    assert all(o.text_chunks == 4 for o in ok)
    statuses = {o.status for o in outcomes} - {"OK"}
    assert statuses == {"HTTP 503", "STREAM_ERROR"}
    assert worker.connections < len(requests)  # keep-alive: connections reused
    assert elapsed < 5


async def test_http_load_generate_api_timeout_and_time_limit() -> None:
    worker = await FakeWorker(first_delay=0.01).start()
    try:
        requests = [*_planned(["a b c", "hang on"], gap=0.0), Planned(2, 30.0, "never sent", 1)]
        target = load.HttpTarget(worker.url, api="generate")
        started = time.monotonic()
        outcomes, _ = await load.run(target, requests, Limits(concurrency=8, timeout=0.5, time_limit=1.0))
        assert time.monotonic() - started < 5
    finally:
        await worker.stop()
    assert [o.status for o in outcomes] == ["OK", "TIMEOUT", "NOT_SENT"]
    assert outcomes[0].ttft_s is not None


async def test_http_load_connection_refused() -> None:
    target = load.HttpTarget(f"http://127.0.0.1:{procs.free_port()}")
    outcomes, _ = await load.run(target, _planned(["x"]), Limits(timeout=2))
    assert outcomes[0].status == "CONNECTION"


async def test_http_load_against_simulated_replicas() -> None:
    replicas = pytest.importorskip("tools.peers.replicas")
    from agent.replica.engine import EngineParams
    from agent.scrape import Samples, parse

    params = EngineParams(max_running=8, prefill_base_seconds=0.001, prefill_seconds_per_token=1e-6,
                          decode_base_seconds=0.002, decode_seconds_per_request=0.0001)
    started = await replicas.start_replicas(1, "chat", params)
    try:
        rows = [tracefile.TraceRequest(i * 0.1, 700, 8, (1, 2 + i % 2)) for i in range(6)]
        planned = load.plan(rows, speedup=4.0, max_output=4)
        for api in ("completions", "generate"):
            target = load.HttpTarget(started[0].http_url, api=api)
            outcomes, _ = await load.run(target, planned, Limits(concurrency=4, timeout=10))
            assert [o.status for o in outcomes] == ["OK"] * 6, [o.detail for o in outcomes]
            assert all(o.ttft_s is not None and 0 < o.ttft_s <= o.e2e_s for o in outcomes)
        status, text = await asyncio.to_thread(procs.http_get, started[0].metrics_url)
        assert status == 200
        counted = routers.counters(Samples(parse(text)))
        assert counted.success == 12 and counted.lookup_blocks == 24 and counted.hit_blocks >= 12
    finally:
        await replicas.stop_replicas(started)


def test_plan_prompts_follow_blocks() -> None:
    rows = [tracefile.TraceRequest(10.0, 600, 50, (1, 2)), tracefile.TraceRequest(14.0, 700, 3, (1, 2, 3))]
    planned = load.plan(rows, speedup=2.0, max_output=32)
    assert [p.due_s for p in planned] == [0.0, 2.0]
    assert [p.max_tokens for p in planned] == [32, 3]
    assert planned[1].prompt.split()[:600] == planned[0].prompt.split()


def test_cpu_reader_sees_this_process_work() -> None:
    before = procs.cpu_seconds(os.getpid())
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    after = procs.cpu_seconds(os.getpid())
    assert 0.2 <= after - before < 5.0
    meter = procs.CpuMeter({"me": [os.getpid()]})
    meter.start()
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    assert meter.stop()["me"] >= 0.1
    assert os.getpid() in procs.tree([os.getpid()])
    assert procs.cpu_seconds(2 ** 22 + 12345) != procs.cpu_seconds(2 ** 22 + 12345)  # gone: NaN


def test_proc_stops_its_group(tmp_path: Path) -> None:
    proc = procs.Proc("sleeper", [sys.executable, "-c", "import subprocess, time; "
                                  "subprocess.Popen(['sleep', '60']); time.sleep(60)"], tmp_path / "log").start()
    time.sleep(0.3)
    child = [pid for pid in procs.tree([proc.pid]) if pid != proc.pid]
    assert child
    proc.stop(grace=2)
    assert not proc.alive()
    assert all(procs.cpu_seconds(pid) != procs.cpu_seconds(pid) for pid in child)


def test_infinite_cache_limit_on_a_hand_made_slice() -> None:
    words = [f"w{i}" for i in range(1200)]
    a = " ".join(words[:1024])           # blocks A0 A1
    b = " ".join(words[:1200])           # A0 A1 + a partial third block
    c = " ".join(words[512:1024])        # a different first block
    limit = bench_peers.infinite_cache_limit([block_hashes(p, 512) for p in (a, b, a, c)])
    # blocks: a 2 (0 seen), b 3 (2 seen), a 2 (2 seen), c 1 (0 seen) -> 4 / 8
    assert limit == {"hit_blocks": 4, "lookup_blocks": 8, "ratio": 0.5}


def test_arguments_and_router_list() -> None:
    args = bench_peers.parse_args([])
    assert args.replicas == 8 and args.load == 0.8 and args.max_output == 32
    assert [r.label for r in routers.parse_routers(args.routers)] == [
        "ferry", "ferry:envoy", "sglang:cache_aware", "sglang:round_robin", "vllm:cache_aware", "vllm:consistent_hash"]
    assert [r.label for r in routers.parse_routers("ferry:relay,ferry:envoy")] == ["ferry", "ferry:envoy"]
    args = bench_peers.parse_args(["--routers", "ferry,vllm:consistent_hash", "--minutes", "1", "--start-minute",
                                   "2", "--engine", "max_running=30", "--speedup", "3"])
    assert args.minutes == 1.0 and args.start_minute == 2.0 and args.engine == ["max_running=30"]
    assert args.speedup == 3.0
    with pytest.raises(ValueError, match="unknown router"):
        routers.parse_routers("ferry,sglang:consistent_hash")
    with pytest.raises(SystemExit):
        bench_peers.parse_args(["--load", "0"])


def test_trace_choice_falls_back_to_the_bundled_excerpt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(bench_peers.TRACE_ENV, str(tmp_path / "missing.jsonl"))
    path, full = bench_peers.choose_trace(None)
    assert path == bench_peers.BUNDLED and not full
    args = bench_peers.parse_args([])
    start, minutes = bench_peers.window(args, full=False)
    assert (start, minutes) == (0.0, None)
    start, minutes = bench_peers.window(args, full=True)
    assert (start, minutes) == (10.0, 4.0)


def test_capacity_sample_tiles_the_slice_with_fresh_blocks() -> None:
    rows = [tracefile.TraceRequest(float(i), 1000, 10, (0, i + 1)) for i in range(5)]
    sample = bench_peers.capacity_sample(rows, need=12, max_output=32)
    assert len(sample) == 12
    assert sample[0].hash_ids == (0, 1) and sample[5].hash_ids != sample[0].hash_ids
    assert len({r.hash_ids for r in sample}) == 12


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_short_end_to_end_run(tmp_path: Path) -> None:
    out = tmp_path / "peers.json"
    code = bench_peers.main(["--trace", str(bench_peers.BUNDLED), "--replicas", "2", "--limit", "12",
                             "--speedup", "4", "--routers", "ferry,sglang:cache_aware", "--json-out", str(out),
                             "--plot", str(tmp_path / "ttft.png"), "--workdir", str(tmp_path / "work")])
    assert code == 0
    report = json.loads(out.read_text())
    assert [r["router"] for r in report["routers"]] == ["ferry", "sglang:cache_aware"]
    for r in report["routers"]:
        assert r["requests"] == 12 and r["ok"] == 12
        assert r["prefix_hit_ratio"] is not None
    assert (tmp_path / "ttft.png").exists()


@pytest.mark.timeout(180)
def test_envoy_path_end_to_end(tmp_path: Path) -> None:
    """Ferry's Envoy path in front of two HTTP replicas: every request answered, Envoy's and the pickers' CPU."""
    out = tmp_path / "peers.json"
    code = bench_peers.main(["--trace", str(bench_peers.BUNDLED), "--replicas", "2", "--limit", "12",
                             "--speedup", "4", "--routers", "ferry:envoy", "--json-out", str(out),
                             "--plot", str(tmp_path / "ttft.png"), "--workdir", str(tmp_path / "work")])
    assert code == 0
    [row] = json.loads(out.read_text())["routers"]
    assert row["router"] == "ferry:envoy" and row["requests"] == 12 and row["ok"] == 12
    assert row["data_path_roles"] == ["envoy", "picker-1", "picker-2"] and row["envoy_pid"] > 0
    assert row["cpu_seconds"]["envoy"] > 0 and row["cpu_seconds"]["data_path"] > 0
    assert sum(row["proxy_counters"]["picks"].values()) >= 12  # the pickers decided every request
    report = json.loads(out.read_text())
    assert report["criteria"]["ferry:envoy"]["errors"]["pass"] is True


def test_criteria_against_the_best_peer() -> None:
    def row(name: str, ttft: float, e2e: float, hit: float, cpu: float, ok: int = 10) -> dict[str, object]:
        return {"router": name, "requests": 10, "ok": ok, "ttft_ms": {"p99": ttft}, "e2e_ms": {"p99": e2e},
                "prefix_hit_ratio": hit, "cpu_seconds_per_1k": {"data_path": cpu}}
    report = {"routers": [row("ferry:envoy", 700.0, 900.0, 0.49, 0.9),
                          row("sglang:cache_aware", 1000.0, 950.0, 0.5, 2.0),
                          row("vllm:cache_aware", 900.0, 1000.0, 0.5, 3.0), {"router": "x", "failed": "no"}]}
    checks = bench_peers.criteria(report, 0.5)["ferry:envoy"]
    assert checks["ttft_p99_ms"] == {"value": 700.0, "bound": 720.0, "pass": True}
    assert checks["e2e_p99_ms"]["pass"] and checks["hit_ratio"]["pass"] and checks["errors"]["pass"]
    assert checks["cpu_s_per_1k_data_path"] == {"value": 0.9, "bound": 1.0, "pass": True}
    report["routers"][0] = row("ferry:envoy", 800.0, 960.0, 0.4, 1.1, ok=9)
    checks = bench_peers.criteria(report, 0.5)["ferry:envoy"]
    assert not any(c["pass"] for c in checks.values())


def test_the_slice_in_the_simulator_maps_each_router_and_bounds_the_tail() -> None:
    engine = EngineParams(max_running=8, kv_blocks_total=512, prefix_cache_blocks=512)
    reqs = simulated.requests([0.0, 0.05, 0.1, 0.15], [2048, 2048, 600, 1200], [4, 4, 4, 4],
                              [(1, 2, 3, 4), (1, 2, 3, 4), (9, 10), (1, 2, 3)])
    floor = simulated.ttft_floor(reqs, engine)
    assert floor["p99"] == pytest.approx((0.002 + 2048 * 20e-6) * 1000, abs=0.1)  # the first: nothing cached yet
    sim = simulated.simulate("ferry", reqs, replicas=2, engine=engine, seeds=1)
    assert sim is not None and sim["policy"] == "ferry" and sim["rejected"] == 0 and sim["hit_ratio"] > 0
    assert simulated.simulate("someone:else", reqs, replicas=2, engine=engine) is None
    assert simulated.ranking({"a": {"p50": 1.0, "p99": 9.0}, "b": {"p50": 2.0, "p99": 3.0},
                              "c": {"p50": None, "p99": None}}) == ["b", "a", "c"]
